#!/usr/bin/env python3
"""The peer figure for muse bench --device cuda: PyTorch (cuBLAS) bf16 products of each of a
model's layer shapes at small batches, as bytes read per second against an HBM read measured
by torch in the same run. Run on the GPU machine next to `muse bench --device cuda`:

    python3 scripts/cuda/peer_matmuls.py --model glimmer-30b --batch 1,4,16,64
"""
import argparse
import json
import statistics

import torch

SHAPES = {
    # name: [(label, out, in), ...] per layer, then the head
    "glimmer-30b": {
        "layer": [("qkv+gate", 32 * 128 + 2 * 2 * 128 + 32 * 128, 6656), ("o", 6656, 32 * 128),
                  ("gate+up", 2 * 19968, 6656), ("down", 6656, 19968)],
        "layers": 52,
        "head": ("lm_head", 202048, 6656),
    },
    "spark-slice": {
        "layer": [("qkv+gate", 128 * 64 + 2 * 16 * 64 + 128 * 64, 8192), ("o", 8192, 128 * 64),
                  ("pre_expert", 4096, 8192), ("expert gate_up", 2 * 4096, 4096), ("expert down", 4096, 4096),
                  ("post_expert", 8192, 4096)],
        "layers": 4,
        "head": ("lm_head", 202048, 8192),
    },
}


def time_it(fn, reps=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(ts)


def hbm_read_gb_per_second():
    """HBM read rate: an 8 GiB reduction, median of 5 (also peer_transformers.py's ceiling)."""
    buf = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    read = 8 * 2**30 / time_it(lambda: buf.view(torch.int64).sum(), reps=5) / 1e9
    del buf
    torch.cuda.empty_cache()
    return read


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="glimmer-30b", choices=sorted(SHAPES))
    ap.add_argument("--batch", default="1,16,64")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    read = hbm_read_gb_per_second()
    spec = SHAPES[args.model]
    out = {"model": args.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "hbm_read_gb_per_second": read, "batches": {}}
    for b in [int(x) for x in args.batch.split(",")]:
        rows, layer_bytes, layer_s = [], 0, 0.0
        for label, n, k in spec["layer"] + [spec["head"]]:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16)
            t = time_it(lambda: torch.matmul(x, w.t()))
            bytes_ = n * k * 2
            rows.append({"matrix": label, "shape": [n, k], "seconds": t, "gb_per_second": bytes_ / t / 1e9,
                         "fraction_of_hbm": bytes_ / t / 1e9 / read})
            if (label, n, k) != spec["head"]:
                layer_bytes += bytes_
                layer_s += t
            del w, x
        out["batches"][b] = {"matrices": rows, "layer_fraction_of_hbm": layer_bytes / layer_s / 1e9 / read}
        print(f"batch {b}: " + ", ".join(f"{r['matrix']} {100 * r['fraction_of_hbm']:.0f}%" for r in rows) +
              f"; whole layer {100 * out['batches'][b]['layer_fraction_of_hbm']:.0f}% of {read:.0f} GB/s", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
