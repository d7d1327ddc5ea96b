"""DFlash reference fixture: a tiny random Muse Glimmer target and a tiny random
MuseGlimmerAssistantModel made with transformers 5.17, greedy generation with the assistant
through transformers' own DFlashTokenCandidateGenerator, and every draft block it proposed.

    python3 scripts/spec/dflash_reference.py --out tests/data/fixtures/dflash

writes OUT/target/ (save_pretrained of the target), OUT/assistant/ (save_pretrained of the
assistant) and OUT/blocks.json:
    {"source": ..., "tokens": [prompt + generated ids], "prompt_len": P,
     "blocks": [{"anchor_pos": s, "anchor": id, "drafts": [ids...]}, ...]}
tests/speculative/dflash_fixture_test.cc replays it: muse's drafter must propose the same
blocks from the same committed context (it skips when OUT is absent). Needs torch and
transformers 5.17 (the GPU machine has them; the CI machine does not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))

TEXT = {  # a tiny Glimmer text config (the shape of tests/data/fixtures/glimmer-a)
    "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"] * 3, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
}
ASSISTANT = {  # DFlash: mask rows emit; taps at target layers 1 and 4
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 128, "block_size": 4, "mask_token_id": 511,
    "target_layer_ids": [1, 4], "sliding_window": 16, "rms_norm_eps": 1e-5, "vocab_size": 512,
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()
    import transformers
    from transformers.generation import candidate_generator as cg
    from transformers.models import muse_glimmer, muse_glimmer_assistant as mga

    torch.manual_seed(args.seed)
    target_cfg = muse_glimmer.MuseGlimmerConfig(text_config=dict(TEXT), tie_word_embeddings=False)
    target = muse_glimmer.MuseGlimmerForConditionalGeneration(target_cfg).eval()
    assistant_cfg = mga.MuseGlimmerAssistantConfig(**ASSISTANT)
    assistant = mga.MuseGlimmerAssistantModel(assistant_cfg).eval()

    # Record every block the candidate generator proposes (whatever its signature).
    blocks = []
    original = cg.DFlashTokenCandidateGenerator.get_candidates

    def recording(self, input_ids, *a, **kw):
        out = original(self, input_ids, *a, **kw)
        candidates = out[0] if isinstance(out, tuple) else out
        ids = candidates[0].tolist()
        s = input_ids.shape[-1] - 1  # the anchor: the last committed token
        blocks.append({"anchor_pos": s, "anchor": ids[s], "drafts": ids[s + 1:]})
        return out

    cg.DFlashTokenCandidateGenerator.get_candidates = recording
    g = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(2, TEXT["vocab_size"] - 1, (1, 24), generator=g)
    with torch.no_grad():
        out = target.generate(prompt, assistant_model=assistant, do_sample=False, max_new_tokens=args.new_tokens)
    os.makedirs(args.out, exist_ok=True)
    target.save_pretrained(os.path.join(args.out, "target"))
    assistant.save_pretrained(os.path.join(args.out, "assistant"))
    with open(os.path.join(args.out, "blocks.json"), "w") as f:
        json.dump({"source": f"transformers {transformers.__version__} DFlashTokenCandidateGenerator",
                   "tokens": out[0].tolist(), "prompt_len": prompt.shape[-1], "blocks": blocks}, f, indent=1)
    print(f"{len(blocks)} blocks -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
