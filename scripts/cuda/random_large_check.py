#!/usr/bin/env python3
"""Larger random models with the real head sizes, checked on the GPU (issue 11):

  glimmer: head_dim 128, 32 / 2 heads, hidden 2048, 8 layers (transformers 5.17)
  spark:   head_dim 64, 128 / 16 heads, 256 experts top-8, hidden 2048, 6 layers
           (the project's PyTorch reference, scripts/fixtures/muse_spark_reference.py)

Built contractive (specs/numerics-testing.md, trap 1): Glimmer's post-attention /
post-feedforward gains ~0.3, Spark's residual gates shifted negative with a small spread, so
that the reference's own bf16-vs-fp32 gap is a meaningful yardstick. `build` saves each model
(BF16 safetensors) with a prompt and the reference's fp32 and bf16 rows for every prompt
position; `compare` reads muse's rows (`muse run --device cuda --dump-logits`) and reports
max |muse - fp32| / max|logit| against the bf16 reference's own gap, over the rows before the
first router near-tie (trap 3; margin between the 8th and 9th selection score < 1e-5).

    python3 scripts/cuda/random_large_check.py build --dir /tmp/muse_large
    muse run /tmp/muse_large/glimmer --prompt-ids "$(cat /tmp/muse_large/glimmer/prompt.txt)" \
        --max-tokens 1 --device cuda --language-model-only --dump-logits /tmp/muse_large/glimmer/muse.f32
    python3 scripts/cuda/random_large_check.py compare --dir /tmp/muse_large
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))

PROMPT_LEN = 300  # > 2 windows of 128
VOCAB = 8192


def build_glimmer(out: str, device: str):
    import glimmer_fixture as gf
    spec = {"eos_ids": [2, 3], "config": {
        "vocab_size": VOCAB, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 8,
        "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "sliding_window": 128,
        "max_position_embeddings": 4096}}
    cfg = gf.make_config(spec)
    tf = gf._transformers()
    torch.manual_seed(0)
    model = tf.MuseGlimmerForConditionalGeneration(cfg).float()
    gen = torch.Generator().manual_seed(1234)
    gf.randomize_(model, gen, presoftcap_std=3.0)
    with torch.no_grad():  # contractive: each block adds less than the residual holds
        for name, p in model.named_parameters():
            if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
                p.normal_(-0.7, 0.05, generator=gen)
    gf.round_to_storage_(model, torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    ids = [int(x) for x in torch.randint(4, VOCAB, (PROMPT_LEN,), generator=gen)]
    fp32 = tf.MuseGlimmerForConditionalGeneration.from_pretrained(out, dtype=torch.float32).to(device).eval()
    gf._set_eager(fp32)
    with torch.no_grad():
        rows32 = fp32(input_ids=torch.tensor([ids], device=device)).logits[0].float().cpu().numpy()
    del fp32
    bf16 = tf.MuseGlimmerForConditionalGeneration.from_pretrained(out, dtype=torch.bfloat16).to(device).eval()
    gf._set_eager(bf16)
    with torch.no_grad():
        rows16 = bf16(input_ids=torch.tensor([ids], device=device)).logits[0].float().cpu().numpy()
    return ids, rows32, rows16, PROMPT_LEN


def first_near_tie(routing, k: int, prompt_len: int, eps: float = 1e-5) -> int:
    """First position whose k-th and (k+1)-th selection scores differ by less than eps in any layer."""
    first = prompt_len
    for layer in routing:
        sel = layer.get("selection") if isinstance(layer, dict) else getattr(layer, "selection", None)
        if sel is None:
            continue
        s = torch.sort(sel[0].float(), dim=-1, descending=True).values
        margin = (s[:, k - 1] - s[:, k]).cpu()
        bad = torch.nonzero(margin < eps)
        if len(bad):
            first = min(first, int(bad[0, 0]))
    return first


def build_spark(out: str, device: str):
    import muse_spark_reference as msr
    import spark_fixture as sf
    cfg = msr.SparkConfig.from_hf_dict({"text_config": {
        "vocab_size": VOCAB, "hidden_size": 2048, "num_hidden_layers": 6, "num_attention_heads": 128,
        "num_key_value_heads": 16, "head_dim": 64, "num_local_experts": 256, "num_experts_per_tok": 8,
        "moe_hidden_size": 512, "moe_intermediate_size": 256, "sliding_window": 128,
        "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}})
    torch.manual_seed(0)
    model = msr.MuseSparkForConditionalGeneration(cfg)
    gen = torch.Generator().manual_seed(4321)
    sf.randomize_(model, gen, presoftcap_std=3.0)
    with torch.no_grad():  # contractive residual gates: beta = sigmoid(gate / 0.3) ~ 0.05-0.1
        for name, p in model.named_parameters():
            if name.endswith("residual_gate.gate"):
                p.normal_(-0.8, 0.1, generator=gen)
    sf.round_to_storage_(model, torch.bfloat16)
    msr.save_pretrained(model, out, dtype=torch.bfloat16)
    ids = [int(x) for x in torch.randint(4, VOCAB, (PROMPT_LEN,), generator=gen)]
    r32 = msr.load_pretrained(out, dtype=torch.float32).eval().to(device)
    r32.set_attention_impl("eager")
    with torch.no_grad():
        o32 = r32(torch.tensor([ids], device=device))
    rows32 = o32.logits[0].float().cpu().numpy()
    tie = first_near_tie(o32.routing, cfg.num_experts_per_tok, PROMPT_LEN)
    del r32
    r16 = msr.load_pretrained(out, dtype=torch.float32, bf16_rounding=True).eval().to(device)
    r16.set_attention_impl("eager")
    with torch.no_grad():
        rows16 = r16(torch.tensor([ids], device=device)).logits[0].float().cpu().numpy()
    return ids, rows32, rows16, tie


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["build", "compare"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.set_float32_matmul_precision("highest")
    results = {}
    for name, builder in (("glimmer", build_glimmer), ("spark", build_spark)):
        d = os.path.join(args.dir, name)
        if args.mode == "build":
            os.makedirs(d, exist_ok=True)
            ids, r32, r16, rows_ok = builder(d, args.device)
            r32.astype("<f4").tofile(os.path.join(d, "ref_fp32.f32"))
            r16.astype("<f4").tofile(os.path.join(d, "ref_bf16.f32"))
            with open(os.path.join(d, "prompt.txt"), "w") as f:
                f.write(",".join(str(i) for i in ids))
            with open(os.path.join(d, "check.json"), "w") as f:
                json.dump({"rows_before_near_tie": rows_ok, "vocab": int(r32.shape[1])}, f)
            print(f"{name}: built, {len(ids)} prompt ids, rows before the first router near-tie {rows_ok}", flush=True)
            continue
        with open(os.path.join(d, "check.json")) as f:
            meta = json.load(f)
        V, n = meta["vocab"], meta["rows_before_near_tie"]
        r32 = np.fromfile(os.path.join(d, "ref_fp32.f32"), dtype="<f4").reshape(-1, V)
        r16 = np.fromfile(os.path.join(d, "ref_bf16.f32"), dtype="<f4").reshape(-1, V)
        got = np.fromfile(os.path.join(d, "muse.f32"), dtype="<f4").reshape(-1, V)[: r32.shape[0]]
        scale = float(np.abs(r32[:n]).max())
        gap = float(np.abs(r16[:n] - r32[:n]).max()) / scale
        err = float(np.abs(got[:n] - r32[:n]).max()) / scale
        agree = float((got[:n].argmax(-1) == r32[:n].argmax(-1)).mean())
        ref_agree = float((r16[:n].argmax(-1) == r32[:n].argmax(-1)).mean())
        results[name] = {"rows_compared": n, "muse_cuda_vs_fp32": err, "reference_bf16_vs_fp32": gap,
                         "ratio": err / gap if gap > 0 else None, "within_2x": err <= 2 * gap,
                         "argmax_agreement_muse": agree, "argmax_agreement_reference_bf16": ref_agree}
        print(f"{name}: muse cuda vs fp32 {err:.3e} of max|logit|, reference bf16 vs fp32 {gap:.3e} "
              f"(ratio {err / gap:.2f}) over {n} rows; argmax agreement muse {agree:.3f}, bf16 reference "
              f"{ref_agree:.3f}", flush=True)
    if args.mode == "compare":
        print(json.dumps(results, indent=2))
        return 0 if all(r["within_2x"] for r in results.values()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
