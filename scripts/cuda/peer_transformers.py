#!/usr/bin/env python3
"""The transformers peer of `muse bench --device cuda --model glimmer-30b` (issue 12): Hugging Face
transformers' own MuseGlimmerForConditionalGeneration with random BF16 weights of the same shape,
decoding and prefilling on the same GPU in the same device call, with the HBM read rate and the
bf16 GEMM rate measured here by torch, so its figures sit beside muse's as the same fractions.

Counting follows tools/muse/bench_cuda.cc:
- decode: bytes a step = every 2-D weight of the language model and the head once (the embedding
  row is not counted) + the KV rows attention reads (every layer: 2 · kv_heads · head_dim · 2 bytes
  per visible key per sequence; sliding layers see at most the window); a step's time is the
  median of --tokens single-token forwards through transformers' cache after a --context prefill;
- prefill: 2 FLOPs per weight per token, the head once (only the last row's logits), plus causal
  attention 4 · visible keys · q_dim per layer; median of --runs after a warm-up.

Modes:
- eager (default): no compilation, transformers' default attention (reported);
- --compile: `generate` with a static cache and `torch.compile(mode="reduce-overhead",
  fullgraph=True)` on the forward, batch 1 only; a decode step is (t(n2) − t(n1)) / (n2 − n1) of
  two generate calls of n1 and n2 new tokens. Run it under `timeout`: the issue asks for it only
  "if it completes".

Run on the GPU machine (torch 2.11, transformers 5.17), beside `muse bench`, never at the same time:
    python3 scripts/cuda/peer_transformers.py --batch 1,16,64 --context 1024 --tokens 8 --prefill-tokens 8192
    timeout 600 python3 scripts/cuda/peer_transformers.py --compile --context 1024 --tokens 8
Prints one line per figure and a JSON object last.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "fixtures"))
sys.path.insert(0, HERE)  # peer_matmuls: the HBM read and the timer

# Muse Glimmer 30B's shape: the numbers of glimmer_30b_json() in tools/muse/bench_cuda.cc, as the keys
# the fixtures give transformers' config (scripts/fixtures/make_fixtures.py); the rest keep
# transformers' defaults, which change no shape and so no time.
GLIMMER_30B = {
    "vocab_size": 202048, "hidden_size": 6656, "num_hidden_layers": 52, "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 19968, "sliding_window": 2048,
    "max_position_embeddings": 131072,
}


def sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, r


def ceilings():
    """HBM read (peer_matmuls.py's) and the bf16 GEMM rate (8192³, median of 10)."""
    from peer_matmuls import hbm_read_gb_per_second, time_it
    read = hbm_read_gb_per_second()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    gemm = 2 * 8192**3 / time_it(lambda: a @ b, reps=10) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return read, gemm


def is_full(layer: int, n: int) -> bool:
    return (n - 1 - layer) % 4 == 0  # the Muse rule (src/muse/model/config.cc)


def build(layers: int):
    import glimmer_fixture as gf
    text = dict(GLIMMER_30B, num_hidden_layers=layers)
    cfg = gf.make_config({"config": text, "eos_ids": [2]})
    tf = gf._transformers()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):  # initialised on the GPU: seconds, not the minutes of a CPU init
        model = tf.MuseGlimmerForConditionalGeneration(cfg)
    torch.set_default_dtype(torch.float32)
    model = model.eval()  # not .to(bf16): that would round RoPE's fp32 buffer (numerics-testing.md, trap 2)
    with torch.no_grad():  # the init's values are not the point, but keep them finite and bounded
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return model


def weight_counts(model):
    lm, head = 0, 0
    for name, p in model.named_parameters():
        if p.ndim != 2 or "vision" in name or "multi_modal" in name or "projector" in name:
            continue
        if name.endswith("embed_tokens.weight"):
            continue
        if name.startswith("lm_head"):
            head += p.numel()
        else:
            lm += p.numel()
    return lm, head


def kv_bytes(tc, batch: int, context: int) -> float:
    n, total = tc.num_hidden_layers, 0.0
    for l in range(n):
        keys = context if is_full(l, n) else min(context, tc.sliding_window)
        total += 2.0 * tc.num_key_value_heads * tc.head_dim * 2 * keys * batch
    return total


def forward_last(model, ids, past=None):
    """One forward keeping only the last row's logits where transformers allows it."""
    try:
        return model(input_ids=ids, past_key_values=past, use_cache=True, logits_to_keep=1)
    except TypeError:
        return model(input_ids=ids, past_key_values=past, use_cache=True)


@torch.no_grad()
def decode_step_seconds(model, batch: int, context: int, tokens: int):
    gen = torch.Generator(device="cuda").manual_seed(batch)
    ids = torch.randint(4, 200000, (batch, context), device="cuda", generator=gen)
    past, chunk = None, max(1, 8192 // batch)  # chunked prefill: bounded activations (and logits) at batch 64
    for a in range(0, context, chunk):
        out = forward_last(model, ids[:, a:a + chunk], past)
        past = out.past_key_values
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    ts = []
    for _ in range(tokens + 1):
        t, out = sync_time(lambda: model(input_ids=nxt, past_key_values=past, use_cache=True))
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        ts.append(t)
    del past, out
    torch.cuda.empty_cache()
    return statistics.median(ts[1:])  # the first step is a warm-up


@torch.no_grad()
def prefill_seconds(model, tokens: int, runs: int):
    ids = torch.randint(4, 200000, (1, tokens), device="cuda")
    ts = []
    for _ in range(runs + 1):
        try:
            t, _ = sync_time(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))
        except TypeError:
            t, _ = sync_time(lambda: model(input_ids=ids, use_cache=False))
        ts.append(t)
    torch.cuda.empty_cache()
    return statistics.median(ts[1:])


def prefill_flops(tc, lm: int, head: int, tokens: int) -> float:
    attn, n, W, P = 0.0, tc.num_hidden_layers, float(tc.sliding_window), float(tokens)
    for l in range(n):
        keys = P * (P + 1) / 2 if is_full(l, n) or P <= W else W * (W + 1) / 2 + (P - W) * W
        attn += 4.0 * keys * tc.num_attention_heads * tc.head_dim
    return 2.0 * lm * P + 2.0 * head + attn


@torch.no_grad()
def compiled_decode_seconds(model, context: int, tokens: int, runs: int):
    import transformers
    extra = {}
    if hasattr(transformers, "CompileConfig"):  # generate compiles its decode forward itself
        extra["compile_config"] = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    else:  # the older recipe: the forward compiled by hand
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    ids = torch.randint(4, 200000, (1, context), device="cuda")
    mask = torch.ones_like(ids)

    def gen(n):
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, cache_implementation="static", pad_token_id=0, **extra)

    n1, n2 = 4, 4 + tokens
    t0 = time.perf_counter()
    gen(n2), gen(n1)  # compilation and CUDA-graph recording of both shapes
    compile_s = time.perf_counter() - t0
    d = []
    for _ in range(runs):
        a, _ = sync_time(lambda: gen(n1))
        b, _ = sync_time(lambda: gen(n2))
        d.append((b - a) / (n2 - n1))
    return statistics.median(d), compile_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=52)
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefill-tokens", type=int, default=8192, help="0: no prefill figure")
    ap.add_argument("--compile", action="store_true", help="torch.compile + static cache, batch 1, decode only")
    args = ap.parse_args()
    import transformers
    transformers.logging.set_verbosity_error()
    torch.backends.cuda.matmul.allow_tf32 = False
    read, gemm = ceilings()
    t_build, model = sync_time(lambda: build(args.layers))
    tc = model.config.text_config
    lm, head = weight_counts(model)
    attn_impl = str(getattr(tc, "_attn_implementation", None) or getattr(model.config, "_attn_implementation", "default"))
    out = {"peer": "transformers " + transformers.__version__ + " MuseGlimmerForConditionalGeneration",
           "mode": "torch.compile reduce-overhead, static cache" if args.compile else "eager",
           "attention": attn_impl, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "layers": args.layers, "weights_read": lm + head, "hbm_read_gb_per_second": read,
           "bf16_gemm_tflops": gemm, "build_seconds": t_build, "decode": []}
    print(f"peer: {out['peer']} ({out['mode']}, attention {attn_impl}) on {out['device']}; HBM read {read:.0f} GB/s, "
          f"bf16 GEMM {gemm:.0f} TFLOP/s; {(lm + head) / 1e9:.2f}B weights read a step; built in {t_build:.1f} s",
          flush=True)
    batches = [1] if args.compile else [int(b) for b in args.batch.split(",")]
    for b in batches:
        try:
            if args.compile:
                t, compile_s = compiled_decode_seconds(model, args.context, args.tokens, args.runs)
            else:
                t, compile_s = decode_step_seconds(model, b, args.context, args.tokens), None
        except Exception as e:  # e.g. out of memory at batch 64 on an 80 GB card: say so, go on
            print(f"batch {b}: did not complete: {type(e).__name__}: {str(e)[:300]}", flush=True)
            out["decode"].append({"batch": b, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            torch.cuda.empty_cache()
            continue
        bytes_ = 2.0 * (lm + head) + kv_bytes(tc, b, args.context)
        row = {"batch": b, "context": args.context, "step_seconds": t, "tokens_per_second": b / t,
               "bytes_per_step": bytes_, "fraction_of_hbm": bytes_ / t / 1e9 / read}
        if compile_s is not None:
            row["compile_seconds"] = compile_s
        out["decode"].append(row)
        print(f"batch {b} context {args.context}: {t * 1e3:.2f} ms a step, {b / t:.1f} tok/s, "
              f"{100 * row['fraction_of_hbm']:.1f}% of HBM" +
              (f" (compiled in {compile_s:.0f} s)" if compile_s is not None else ""), flush=True)
    if args.prefill_tokens > 0 and not args.compile:
        try:
            t = prefill_seconds(model, args.prefill_tokens, max(2, args.runs // 2 + 1))
            tf = prefill_flops(tc, lm, head, args.prefill_tokens) / t / 1e12
            out["prefill"] = {"tokens": args.prefill_tokens, "seconds": t, "tflops": tf, "fraction_of_bf16_gemm": tf / gemm}
            print(f"prefill {args.prefill_tokens} tokens: {t:.3f} s, {tf:.1f} TFLOP/s = {100 * tf / gemm:.1f}% of the "
                  f"bf16 GEMM rate", flush=True)
        except Exception as e:
            out["prefill"] = {"tokens": args.prefill_tokens, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"prefill: did not complete: {type(e).__name__}: {str(e)[:300]}", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
