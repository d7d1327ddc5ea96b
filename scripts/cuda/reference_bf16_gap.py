#!/usr/bin/env python3
"""How far the reference itself moves when it runs in bf16 on the GPU: the yardstick for
muse's CUDA backend (issue 11: CUDA logits within twice this gap of the fp32 reference).

For every fixture under tests/data/fixtures (reference.json + logits.f32, the fp32 reference
rows), run the reference again in bf16 on the GPU, teacher-forced with the recorded ids, and
write <out>/<name>/bf16_reference.json with max |bf16 - fp32| / max|logit| overall, for the
prompt rows and the decode rows, per range of positions, and the rows where the bf16
reference's own greedy pick differs from the fp32 one (recorded near-ties: the engine may
differ there too).

- Glimmer: transformers 5.17 `MuseGlimmerForConditionalGeneration.from_pretrained(dir,
  dtype=torch.bfloat16)`, eager attention, on cuda (numerics-testing.md trap 2: load the bf16
  model directly, never cast an fp32 one, which would round RoPE's inv_freq buffer).
- Spark: the project's reference (scripts/fixtures/muse_spark_reference.py) in its
  production-rounding mode (`bf16_rounding=True`: every GEMM and norm output rounded to bf16,
  the residual stream, gates and router in fp32, as the published ports run), on cuda.

Run on the GPU machine (torch 2.11 + transformers 5.17):
    python3 scripts/cuda/reference_bf16_gap.py --out $OUT/fixtures
"""
import argparse
import datetime
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))


def glimmer_rows(model_dir: str, ids: list, device: str) -> np.ndarray:
    from transformers.models import muse_glimmer as tf
    model = tf.MuseGlimmerForConditionalGeneration.from_pretrained(model_dir, dtype=torch.bfloat16)
    try:
        model.set_attn_implementation("eager")
    except Exception:
        pass
    model = model.to(device).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    return out.logits[0].float().cpu().numpy()


def spark_rows(model_dir: str, ids: list, device: str) -> np.ndarray:
    import muse_spark_reference as msr
    model = msr.load_pretrained(model_dir, dtype=torch.float32, bf16_rounding=True).eval().to(device)
    model.set_attention_impl("eager")
    with torch.no_grad():
        out = model(torch.tensor([ids], device=device))
    return out.logits[0].float().cpu().numpy()


def gap(ref: np.ndarray, got: np.ndarray, rows: range, scale: float) -> float:
    if len(rows) == 0:
        return 0.0
    return float(np.abs(got[rows.start:rows.stop] - ref[rows.start:rows.stop]).max() / scale)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "tests", "data", "fixtures"))
    ap.add_argument("--out", required=True, help="writes <out>/<name>/bf16_reference.json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.set_float32_matmul_precision("highest")
    names = sorted(n for n in os.listdir(args.fixtures)
                   if os.path.exists(os.path.join(args.fixtures, n, "reference.json")))
    summary = {}
    for name in names:
        d = os.path.join(args.fixtures, name)
        with open(os.path.join(d, "reference.json")) as f:
            ref = json.load(f)
        model_dir = os.path.join(ROOT, ref["model_dir"]) if ref.get("model_dir") else d
        P, V, R = len(ref["prompt_ids"]), ref["vocab_size"], ref["num_rows"]
        ids = ref["prompt_ids"] + ref["generated_ids"][:-1]
        fp32 = np.fromfile(os.path.join(d, ref.get("logits_file", "logits.f32")), dtype="<f4").reshape(R, V)
        rows = (glimmer_rows if ref["family"] == "glimmer" else spark_rows)(model_dir, ids, args.device)
        scale = float(np.abs(fp32).max())
        sampled = ref.get("sampled_vocab_size", V)
        ranges = []
        step = max(1, R // 8)
        for a in range(0, R, step):
            ranges.append({"rows": [a, min(R, a + step)], "max_rel": gap(fp32, rows, range(a, min(R, a + step)), scale)})
        fp32_pick = fp32[P - 1:, :sampled].argmax(-1)
        bf16_pick = rows[P - 1:, :sampled].argmax(-1)
        result = {
            "fixture": name,
            "reference": ("transformers MuseGlimmerForConditionalGeneration bf16 (eager)" if ref["family"] == "glimmer"
                          else "scripts/fixtures/muse_spark_reference.py bf16_rounding"),
            "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "max_abs_logit": scale,
            "bf16_vs_fp32_max_rel": gap(fp32, rows, range(0, R), scale),
            "prompt_max_rel": gap(fp32, rows, range(0, P), scale),
            "decode_max_rel": gap(fp32, rows, range(P, R), scale),
            "per_range": ranges,
            # Decode steps k (0-based) where the bf16 reference's own greedy pick differs
            # from the fp32 one: recorded near-ties.
            "greedy_differs_at": [int(k) for k in np.nonzero(fp32_pick != bf16_pick)[0]],
        }
        try:
            import transformers
            result["transformers"] = transformers.__version__
        except ImportError:
            pass
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        with open(os.path.join(args.out, name, "bf16_reference.json"), "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        summary[name] = {k: result[k] for k in ("bf16_vs_fp32_max_rel", "prompt_max_rel", "decode_max_rel",
                                                 "greedy_differs_at")}
        print(f"{name:10s} bf16 reference vs fp32: {result['bf16_vs_fp32_max_rel']:.3e} of max|logit| "
              f"(prompt {result['prompt_max_rel']:.3e}, decode {result['decode_max_rel']:.3e}); "
              f"greedy differs at {result['greedy_differs_at']}", flush=True)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
