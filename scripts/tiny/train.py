#!/usr/bin/env python3
"""Train muse-tiny, the Muse Spark Open decoder of muse-architecture.md section 3.2 scaled down.

The model is scripts/fixtures/muse_spark_reference.py's MuseSparkForConditionalGeneration,
imported unchanged; this script adds only the training loop:
- whole conversations in length buckets (tokenized_data.Batches), loss on assistant tokens;
- the head and softcap applied only at loss positions (same maths as the reference forward);
- bf16 autocast, fused AdamW, warmup then cosine decay over a wall-clock budget, so the run
  fits its device allowance whatever the throughput;
- auxiliary-loss-free expert balancing: after each step every layer's selection-only
  `e_score_correction_bias` moves by `--bias-rate` toward equal expert load (the bias is the
  mechanism Spark's router exposes for exactly this);
- held-out loss on conversations generated with another seed.
Saves BF16 safetensors under the published names (router FP32) with config.json and
generation_config.json, and a JSON training log.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_config as tcfg  # noqa: E402
from tokenized_data import Batches  # noqa: E402
import muse_spark_reference as ref  # noqa: E402
import fast_reference  # noqa: E402


def head_loss(model, hidden, labels, reduction="mean"):
    """Cross-entropy of next-token prediction at labelled positions (-100 elsewhere). The head
    runs on every position: cheaper here than the host sync a boolean gather would cost."""
    cfg = model.config
    logits = ref.softcap(model.lm_head(hidden[:, :-1]), cfg.output_multiplier, cfg.final_logit_softcapping)
    target = labels[:, 1:]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=-100, reduction=reduction)
    return loss, (target != -100).sum()


def lr_at(frac, peak, warmup=0.03, floor=0.1):
    if frac < warmup:
        return peak * frac / warmup
    t = min(1.0, (frac - warmup) / (1 - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def balance_experts(model, routing, valid, rate):
    """Move each layer's selection bias toward uniform load; returns the worst max/mean load."""
    worst = []
    E = model.config.num_local_experts
    for layer, r in zip(model.model.language_model.layers, routing):
        chosen = r.experts[valid]  # [tokens, k]
        load = torch.zeros(E, device=chosen.device).index_add_(  # bincount would sync
            0, chosen.reshape(-1), torch.ones(chosen.numel(), device=chosen.device))
        layer.mlp.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)
        worst.append(load.max() / load.mean().clamp(min=1))
    return torch.stack(worst).max()  # a device tensor: read it only when logging


@torch.no_grad()
def heldout_loss(model, batches, autocast, max_tokens=None):
    model.eval()
    total, count, used = 0.0, 0, 0
    for members in batches.batches:
        used += int(batches.lengths[members].sum())
        if max_tokens and used > max_tokens:
            break
        ids, labels, _ = batches.make(members)
        with autocast():
            hidden, _ = model.model.language_model(ids)
            loss, n = head_loss(model, hidden, labels, reduction="sum")
        total += float(loss)
        count += int(n)
    model.train()
    return total / max(count, 1)


def save_model(model, out_dir):
    gen = {"bos_token_id": tcfg.BOS_ID, "eos_token_id": list(tcfg.STOP_IDS), "pad_token_id": tcfg.PAD_ID,
           "do_sample": False}
    ref.save_pretrained(model, out_dir, dtype=torch.bfloat16, generation_config=gen)
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    text = config["text_config"]
    text["max_position_embeddings"] = tcfg.TARGET["max_position_embeddings"]
    text["eos_token_id"] = tcfg.EOS_ID
    config["bos_token_id"], config["eos_token_id"], config["pad_token_id"] = tcfg.BOS_ID, tcfg.EOS_ID, tcfg.PAD_ID
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True, help="tokenized .npz (tokenized_data.py)")
    ap.add_argument("--heldout", required=True, help="tokenized held-out .npz")
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--log", required=True, help="training log JSON to write")
    ap.add_argument("--seconds", type=float, default=240.0, help="wall-clock training budget")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time only)")
    ap.add_argument("--tokens-per-batch", type=int, default=131072)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--evals", type=int, default=4, help="held-out evaluations during training")
    ap.add_argument("--tiny", action="store_true", help="a very small config for local smoke tests")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="profile steps 20-24 and print the top operations")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    overrides = dict(hidden_size=32, num_hidden_layers=6, num_local_experts=8, num_experts_per_tok=2,
                     moe_hidden_size=16, moe_intermediate_size=16, num_attention_heads=4, head_dim=8,
                     sliding_window=16) if args.tiny else {}
    cfg = tcfg.spark_config(**overrides)
    err = fast_reference.check(cfg)
    assert err < 1e-12, "dense experts differ from the reference by %g" % err
    fast_reference.enable()
    print("dense experts match the reference (max rel. diff %.1e)" % err, flush=True)
    model = ref.MuseSparkForConditionalGeneration(cfg).to(device)
    if hasattr(F, "scaled_dot_product_attention"):
        model.set_attention_impl("sdpa")
    n_params = sum(p.numel() for p in model.state_dict().values())
    print("params %d (%.2fM); layer types %s" % (n_params, n_params / 1e6, cfg.layer_types), flush=True)

    train = Batches(args.train, device, args.tokens_per_batch, args.max_len, seed=args.seed)
    held = Batches(args.heldout, device, args.tokens_per_batch, args.max_len, seed=args.seed)
    print("train: %d batches, %d tokens (%d loss), dropped %d long; held-out %d tokens" % (
        len(train), train.tokens, train.loss_tokens, train.dropped, held.tokens), flush=True)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed_tokens" not in name else no_decay).append(p)
    opt_kwargs = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if device == "cuda":
        opt_kwargs["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kwargs)

    def autocast():
        if device == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    log = {"params": n_params, "config": cfg.to_hf_dict()["text_config"], "curve": [], "heldout": []}
    start = time.time()
    step, epoch = 0, 0
    seen_tokens = torch.zeros((), dtype=torch.long, device=device)  # device counters: no syncs
    seen_loss_tokens = torch.zeros((), dtype=torch.long, device=device)
    window, window_tokens, window_start = [], torch.zeros((), dtype=torch.long, device=device), time.time()
    next_eval = 1
    done = False
    while not done:
        epoch += 1
        for ids, labels, valid in train.epoch():
            frac = (time.time() - start) / args.seconds
            if args.max_steps:
                frac = max(frac, step / args.max_steps)
            if frac >= 1.0:
                done = True
                break
            if args.profile and step == 20:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
                    [torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else []))
                prof.__enter__()
            if args.profile and step == 25:
                prof.__exit__(None, None, None)
                key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
                print(prof.key_averages().table(sort_by=key, row_limit=25), flush=True)
            lr = lr_at(frac, args.lr)
            for g in opt.param_groups:
                g["lr"] = lr
            with autocast():
                hidden, routing = model.model.language_model(ids)
                loss, n = head_loss(model, hidden, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            imbalance = balance_experts(model, routing, valid, args.bias_rate)
            step += 1
            seen_tokens += valid.sum()
            seen_loss_tokens += n
            window.append(loss.detach())
            window_tokens += valid.sum()
            if step % 50 == 0:
                dt = time.time() - window_start
                entry = {"step": step, "seconds": round(time.time() - start, 1), "tokens": int(seen_tokens),
                         "loss": round(float(torch.stack(window).mean()), 4), "lr": lr,
                         "tok_per_s": int(int(window_tokens) / dt),
                         "expert_load_max_over_mean": round(float(imbalance), 2)}
                log["curve"].append(entry)
                print(json.dumps(entry), flush=True)
                window, window_start = [], time.time()
                window_tokens.zero_()
            if frac >= next_eval / (args.evals + 1):
                next_eval += 1
                h = heldout_loss(model, held, autocast, max_tokens=400000)
                log["heldout"].append({"step": step, "tokens": int(seen_tokens), "loss": round(h, 4)})
                print("held-out loss %.4f at step %d" % (h, step), flush=True)
    final = heldout_loss(model, held, autocast)
    seen_tokens, seen_loss_tokens = int(seen_tokens), int(seen_loss_tokens)
    log["heldout"].append({"step": step, "tokens": seen_tokens, "loss": round(final, 4)})
    log.update(steps=step, epochs=epoch, train_tokens=seen_tokens, train_loss_tokens=seen_loss_tokens,
               seconds=round(time.time() - start, 1), final_heldout_loss=round(final, 4))
    print("final held-out loss %.4f after %d steps, %d tokens, %.0f s" % (final, step, seen_tokens, time.time() - start),
          flush=True)
    model = model.float()
    save_model(model, args.out)
    with open(args.log, "w") as f:
        json.dump(log, f, indent=1)


if __name__ == "__main__":
    main()
