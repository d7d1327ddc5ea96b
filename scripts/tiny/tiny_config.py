"""muse-tiny's numbers in one place: tokenizer layout, target decoder, drafter.

Special tokens keep Muse's layout shifted down: id = SPECIAL_BASE + (Muse id - 200000), so
`<|begin_of_text|>` is 3968 (Muse 200000), `<|eot|>` 3976 (200008), `<|start|>` 3990
(200022). The tokenizer has 4096 ids (the generated data saturates byte-level BPE near 5k
merges, so 8k would not fill); the embedding has 4160 rows, the extra rows untrained
and never sampled, like Muse Spark's 201,818 tokenizer ids against 202,048 rows. The drafter's
mask token is the first id past the tokenizer (4096), as the Glimmer assistant's 201818.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

BPE_VOCAB = 3968  # byte-level BPE ids 0..3967
SPECIAL_BASE = BPE_VOCAB
NUM_SPECIAL = 128
TOKENIZER_SIZE = BPE_VOCAB + NUM_SPECIAL  # 4096
EMBED_ROWS = 4160

NAMED_SPECIALS = {  # Muse id offset from 200000 -> name (chat-format.md section 3)
    0: "<|begin_of_text|>", 1: "<|end_of_text|>", 7: "<|eom|>", 8: "<|eot|>",
    18: "<|finetune_right_pad|>", 22: "<|start|>", 23: "<|message|>",
    80: "<|image_start|>", 81: "<|image_end|>", 82: "<|vid_start|>", 83: "<|vid_end|>",
    87: "<|vid_frame_separator|>", 90: "<|image|>", 91: "<|video|>", 92: "<|patch|>",
}


def special_tokens():
    """All 128 special tokens in id order; unnamed slots are reserved, as in Muse."""
    return [NAMED_SPECIALS.get(i, "<|reserved_special_token_%d|>" % i) for i in range(NUM_SPECIAL)]


def special_id(name):
    return SPECIAL_BASE + special_tokens().index(name)


BOS_ID = special_id("<|begin_of_text|>")  # 3968
EOS_ID = special_id("<|end_of_text|>")  # 3969
EOM_ID = special_id("<|eom|>")  # 3975
EOT_ID = special_id("<|eot|>")  # 3976
PAD_ID = special_id("<|finetune_right_pad|>")  # 3986
START_ID = special_id("<|start|>")  # 3990
MESSAGE_ID = special_id("<|message|>")  # 3991
STOP_IDS = [EOS_ID, EOT_ID]
MASK_ID = TOKENIZER_SIZE  # 4096, first id past the tokenizer

# Muse's o200k-style pre-tokenizer split (letters with case classes, digits in runs of at most 3,
# punctuation runs, newlines, whitespace).
PRETOKENIZE_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Target decoder: Muse Spark Open section 3.2 scaled down. 10 layers = 62 mod 4, so the Muse
# rule (full where (L-1-i) % 4 == 0) gives full/NoPE layers 1, 5, 9 and a lone sliding layer 0,
# exactly Spark's pattern in miniature (and equal to the published `i % 4 == 1`).
TARGET = dict(
    vocab_size=EMBED_ROWS, hidden_size=256, num_hidden_layers=10, num_attention_heads=8,
    num_key_value_heads=2, head_dim=32, num_local_experts=16, num_experts_per_tok=4,
    moe_hidden_size=128, moe_intermediate_size=160, sliding_window=128,
    max_position_embeddings=4096, bos_token_id=BOS_ID, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
)

# Drafter: DFlash backbone + DSpark heads (dspark.md sections 2, 3a).
DRAFTER = dict(
    num_hidden_layers=2, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
    head_dim=32, intermediate_size=512, sliding_window=128, block_size=4,
    target_layer_ids=[1, 4, 7], markov_rank=32, rms_norm_eps=1e-6, rope_theta=500000.0,
)


def spark_config(**overrides):
    from muse_spark_reference import SparkConfig
    args = dict(TARGET)
    args.update(overrides)
    return SparkConfig(**args)
