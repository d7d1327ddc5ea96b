#!/usr/bin/env python3
"""Train muse-tiny's DSpark drafter against the frozen trained target (dspark.md section 5).

The target (loaded from its saved BF16 checkpoint, so the drafter learns the shipped model)
provides tap features through forward hooks and its output distribution p; the drafter is
trained with L = 0.1 CE + 0.9 L1(q, p) + 1.0 BCE(confidence, 1 - TV), position weights
exp(-i/4), on anchors inside assistant spans. Embedding and lm_head are the target's, frozen.
Reports the held-out greedy agreement per block row and the implied mean accepted length.
"""

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_config as tcfg  # noqa: E402
import muse_spark_reference as ref  # noqa: E402
import fast_reference  # noqa: E402
from dspark_drafter import DrafterConfig, DSparkDrafter, TapRecorder, drafter_loss, save_drafter  # noqa: E402
from tokenized_data import Batches  # noqa: E402


def target_outputs(target, recorder, ids):
    hidden, _ = target.model.language_model(ids)
    cfg = target.config
    logits = ref.softcap(target.lm_head(hidden), cfg.output_multiplier, cfg.final_logit_softcapping)
    return recorder.features(), logits


@torch.no_grad()
def evaluate(drafter, target, recorder, batches, autocast, max_batches=40):
    drafter.eval()
    rows, count = None, 0
    losses = []
    gen = torch.Generator(device=batches.device).manual_seed(1234)
    for members in batches.batches[:max_batches]:
        ids, labels, _ = batches.make(members)
        with autocast():
            taps, logits = target_outputs(target, recorder, ids)
            loss, stats = drafter_loss(drafter, taps, logits, ids, labels != -100,
                                       target.model.language_model.embed_tokens.weight, target.lm_head.weight, gen)
        losses.append(float(loss))
        r = stats["argmax_match_per_row"]
        rows = r if rows is None else [a + b for a, b in zip(rows, r)]
        count += 1
    drafter.train()
    rows = [x / max(count, 1) for x in rows]
    # Greedy acceptance proxy: row i's agreement conditioned on rows < i accepted, rows
    # treated as independent: expected accepted drafts = sum_j prod_{i<=j} match_i.
    expected, run = 0.0, 1.0
    for m in rows:
        run *= m
        expected += run
    return {"loss": sum(losses) / max(len(losses), 1), "argmax_match_per_row": [round(x, 4) for x in rows],
            "expected_accepted_drafts_proxy": round(expected, 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="trained target model directory")
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True, help="drafter directory to write")
    ap.add_argument("--log", required=True)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--tokens-per-batch", type=int, default=32768)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tiny", action="store_true", help="small drafter for local smoke tests")
    args = ap.parse_args()

    torch.manual_seed(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fast_reference.enable()
    target = ref.load_pretrained(args.target).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        target.set_attention_impl("sdpa")
    tc = target.config
    dcfg = dict(tcfg.DRAFTER)
    dcfg.update(target_hidden_size=tc.hidden_size, num_target_layers=tc.num_hidden_layers,
                vocab_size=tc.vocab_size)
    if args.tiny:
        dcfg.update(hidden_size=tc.hidden_size, num_attention_heads=4, head_dim=8, intermediate_size=64,
                    sliding_window=tc.sliding_window, target_layer_ids=[1, 3], markov_rank=8, num_hidden_layers=1)
    rope_theta = dcfg.pop("rope_theta")
    dcfg.pop("rms_norm_eps")
    cfg = DrafterConfig(rope_theta=rope_theta, **{k: v for k, v in dcfg.items() if k in DrafterConfig.__dataclass_fields__})
    drafter = DSparkDrafter(cfg).to(device)
    recorder = TapRecorder(target, cfg.target_layer_ids)
    n_params = sum(p.numel() for p in drafter.state_dict().values())
    print("drafter params %d (%.2fM), taps %s, block %d" % (n_params, n_params / 1e6, cfg.target_layer_ids, cfg.block_size),
          flush=True)
    train = Batches(args.train, device, args.tokens_per_batch, args.max_len, seed=5)
    held = Batches(args.heldout, device, args.tokens_per_batch, args.max_len, seed=5)
    opt_kwargs = dict(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if device == "cuda":
        opt_kwargs["fused"] = True
    opt = torch.optim.AdamW(drafter.parameters(), **opt_kwargs)

    def autocast():
        if device == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    embed, head = target.model.language_model.embed_tokens.weight, target.lm_head.weight
    log = {"params": n_params, "config": cfg.to_hf_dict(), "curve": []}
    start, step, done = time.time(), 0, False
    window = []
    while not done:
        for ids, labels, _ in train.epoch():
            frac = (time.time() - start) / args.seconds
            if args.max_steps:
                frac = max(frac, step / args.max_steps)
            if frac >= 1.0:
                done = True
                break
            lr = args.lr * (frac / 0.04 if frac < 0.04 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (frac - 0.04) / 0.96)))
            for g in opt.param_groups:
                g["lr"] = lr
            with torch.no_grad(), autocast():
                taps, logits = target_outputs(target, recorder, ids)
            with autocast():
                loss, stats = drafter_loss(drafter, taps, logits, ids, labels != -100, embed, head,
                                           with_stats=(step + 1) % 50 == 0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            step += 1
            window.append(loss.detach())
            if step % 50 == 0:
                entry = {"step": step, "seconds": round(time.time() - start, 1),
                         "loss": round(float(torch.stack(window).mean()), 4),
                         "ce": round(stats["ce"], 4), "l1": round(stats["l1"], 4),
                         "match": [round(x, 3) for x in stats["argmax_match_per_row"]]}
                log["curve"].append(entry)
                print(json.dumps(entry), flush=True)
                window = []
    log["heldout"] = evaluate(drafter, target, recorder, held, autocast)
    log.update(steps=step, seconds=round(time.time() - start, 1))
    print("drafter held-out: %s" % json.dumps(log["heldout"]), flush=True)
    save_drafter(drafter.float(), args.out)
    with open(args.log, "w") as f:
        json.dump(log, f, indent=1)


if __name__ == "__main__":
    main()
