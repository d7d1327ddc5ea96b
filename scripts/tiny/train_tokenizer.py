#!/usr/bin/env python3
"""Train muse-tiny's byte-level BPE tokenizer on generated conversations (HF `tokenizers`).

Layout (tiny_config.py): 3968 BPE ids, then 128 special tokens at Muse's offsets
(`<|begin_of_text|>` 3968, `<|eot|>` 3976, `<|start|>` 3990, ...), added as special tokens
so their spelling in a rendered prompt is read as one id. Pre-tokenizer: Muse's o200k-style
regex split followed by byte-level mapping; decoder: byte-level. The post-processor prepends
`<|begin_of_text|>` when special tokens are added, as Muse's does (the server tokenizes
rendered prompts without adding special tokens; chat-format.md requirement 3).

Writes tokenizer.json, tokenizer_config.json (chat template embedded as well as shipped as
chat_template.jinja) and special_tokens_map.json into --out.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_config as tcfg  # noqa: E402


def iter_texts(path, limit):
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            yield json.loads(line)["text"]


def build_tokenizer(texts):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tcfg.PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = tcfg.special_tokens()
    trainer = trainers.BpeTrainer(vocab_size=tcfg.BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])

    def strip_specials(stream):
        # Train on text only: special-token spellings never become BPE merges.
        for t in stream:
            for s in tcfg.NAMED_SPECIALS.values():
                t = t.replace(s, "\n")
            yield t

    tok.train_from_iterator(strip_specials(texts), trainer=trainer)
    if tok.get_vocab_size() != tcfg.BPE_VOCAB:
        raise SystemExit("BPE trained %d ids, expected %d (too little data?)" % (tok.get_vocab_size(), tcfg.BPE_VOCAB))
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    for i, s in enumerate(specials):
        assert tok.token_to_id(s) == tcfg.SPECIAL_BASE + i, s
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(
        single=bos + " $A", pair=bos + " $A " + bos + " $B", special_tokens=[(bos, tcfg.BOS_ID)])
    return tok


def write_configs(out_dir, template_text):
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "pad_token": "<|finetune_right_pad|>",
        "model_max_length": tcfg.TARGET["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": template_text,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": config["bos_token"], "eos_token": config["eos_token"],
                   "pad_token": config["pad_token"]}, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="JSONL from gen_data.py")
    ap.add_argument("--limit", type=int, default=60000, help="conversations to train on")
    ap.add_argument("--out", required=True, help="model directory")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = build_tokenizer(iter_texts(args.data, args.limit))
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "muse-tiny",
                           "chat_template.jinja"), encoding="utf-8") as f:
        write_configs(args.out, f.read())
    sample = "<|begin_of_text|><|start|>user<|message|>What's the weather in Paris?<|eot|><|start|>assistant to=self"
    enc = tok.encode(sample, add_special_tokens=False)
    print("tokenizer: %d ids; sample -> %s" % (tok.get_vocab_size(), enc.tokens))


if __name__ == "__main__":
    main()
