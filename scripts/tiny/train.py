#!/usr/bin/env python3
"""Train muse-tiny, the Muse Spark Open decoder of muse-architecture.md section 3.2 scaled down.

The model is scripts/fixtures/muse_spark_reference.py's MuseSparkForConditionalGeneration,
imported unchanged; this script adds only the training loop:
- whole conversations in length buckets (tokenized_data.Batches); the loss is next-token
  cross-entropy on the assistant's tokens (weight 1) plus, with a small weight
  (--context-loss-weight), on every other token of the conversation (system block, tool
  declarations, user messages, tool results). The context tokens are where the model sees
  the most copying (function names repeated in the declarations and the recipients line,
  cities echoed by tool results), which it needs to copy entities into its answers;
- bf16 autocast, fused AdamW (the embedding, which the model RMS-normalises and which starts
  at unit scale, gets --embed-lr-mult times the learning rate so that it moves as fast,
  relative to its size, as the projections), warmup, a constant phase and cosine decay over
  a wall-clock budget, so the run fits its device allowance whatever the throughput;
- --auto-batch: measures tokens/s at the given batch size and at 2x, and keeps the larger batch
  only where it pays (>= 1.6x tokens/s, i.e. the loop was bound by the host);
- auxiliary-loss-free expert balancing: after each step every layer's selection-only
  `e_score_correction_bias` moves by `--bias-rate` toward equal expert load (the bias is the
  mechanism Spark's router exposes for exactly this);
- held-out loss on conversations generated with another seed;
- --init-from DIR: warm start from a saved checkpoint (every tensor, the router's selection bias
  included; a fresh optimizer, so use a short warmup), so that a run continues the shipped
  model instead of starting over;
- --compile on|auto: the decoder layer (fast_reference.layer_forward: the reference's modules,
  returning the chosen experts as a tensor) through torch.compile with dynamic shapes. The
  step is bound by elementwise kernels over the dense experts' [tokens, 16, 320] tensors,
  which inductor fuses. Checked against the eager forward on a real batch first; `auto` also
  times eager and compiled steps on the training stream and keeps the faster.
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


def token_losses(model, hidden, ids, labels, valid):
    """Next-token cross-entropy at every position [B, T-1] (fp32), with the masks of assistant
    targets and of the other (context) targets. No host synchronisation."""
    cfg = model.config
    logits = ref.softcap(model.lm_head(hidden[:, :-1]), cfg.output_multiplier, cfg.final_logit_softcapping)
    target = ids[:, 1:]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                         reduction="none").view_as(target)
    assistant = labels[:, 1:] != -100
    context = valid[:, 1:] & ~assistant
    return ce, assistant, context


def lr_at(frac, peak, warmup=0.03, hold=0.4, floor=0.05):
    """Linear warmup, constant until `hold`, then cosine down to `floor` x peak."""
    if frac < warmup:
        return peak * frac / warmup
    if frac < hold:
        return peak
    t = min(1.0, (frac - hold) / (1 - hold))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def balance_experts(model, experts, valid, rate):
    """Move each layer's selection bias toward uniform load; returns the worst max/mean load.
    `experts`: per layer, the chosen experts [B*T, k]."""
    worst = []
    E = model.config.num_local_experts
    for layer, idx in zip(model.model.language_model.layers, experts):
        chosen = idx.reshape(-1)  # padding counts zero: a boolean gather would sync
        count = valid.reshape(-1, 1).expand(-1, idx.shape[-1]).reshape(-1).float()
        load = torch.zeros(E, device=chosen.device).index_add_(0, chosen, count)
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
    ap.add_argument("--tokens-per-batch", type=int, default=65536)
    ap.add_argument("--auto-batch", action="store_true",
                    help="also try 2x the batch and keep it only if it gives >= 1.6x tokens/s")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=float, default=0.03, help="warmup, as a fraction of the budget")
    ap.add_argument("--hold", type=float, default=0.4, help="end of the constant phase, fraction of the budget")
    ap.add_argument("--init-from", default=None, help="warm start from this saved checkpoint directory")
    ap.add_argument("--compile", choices=("off", "on", "auto"), default="off",
                    help="torch.compile the decoder layer (auto: keep it only if faster than eager)")
    ap.add_argument("--embed-lr-mult", type=float, default=20.0)
    ap.add_argument("--context-loss-weight", type=float, default=0.25,
                    help="loss weight of non-assistant tokens (assistant tokens weigh 1)")
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--evals", type=int, default=4, help="held-out evaluations during training")
    ap.add_argument("--tiny", action="store_true", help="a very small config for local smoke tests")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true",
                    help="profile steps 60-64 (after the batch trials) and print the top operations")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the FP32 router's small matmul
    overrides = dict(hidden_size=32, num_hidden_layers=6, num_local_experts=8, num_experts_per_tok=2,
                     moe_hidden_size=16, moe_intermediate_size=16, num_attention_heads=4, head_dim=8,
                     sliding_window=16) if args.tiny else {}
    cfg = tcfg.spark_config(**overrides)
    err = fast_reference.check(cfg)
    assert err < 1e-12, "dense experts differ from the reference by %g" % err
    fast_reference.enable()
    print("dense experts match the reference (max rel. diff %.1e)" % err, flush=True)
    if device == "cuda":
        print("attention: %s" % fast_reference.enable_fast_attention(device), flush=True)
    if args.init_from:
        model = ref.load_pretrained(args.init_from)
        ours, theirs = cfg.to_hf_dict()["text_config"], model.config.to_hf_dict()["text_config"]
        differ = sorted(k for k in ours if k not in ("max_position_embeddings", "eos_token_id") and ours[k] != theirs.get(k))
        assert not differ, "--init-from checkpoint differs from the config in %s" % differ
        cfg = model.config
        model = model.to(device)
        print("warm start from %s" % args.init_from, flush=True)
    else:
        model = ref.MuseSparkForConditionalGeneration(cfg).to(device)
    if hasattr(F, "scaled_dot_product_attention"):
        model.set_attention_impl("sdpa")
    n_params = sum(p.numel() for p in model.state_dict().values())
    print("params %d (%.2fM); layer types %s" % (n_params, n_params / 1e6, cfg.layer_types), flush=True)

    t_data = time.time()
    train = Batches(args.train, device, args.tokens_per_batch, args.max_len, seed=args.seed)
    held = Batches(args.heldout, device, args.tokens_per_batch, args.max_len, seed=args.seed)
    print("train: %d batches, %d tokens (%d loss), dropped %d long; held-out %d tokens (%.1f s)" % (
        len(train), train.tokens, train.loss_tokens, train.dropped, held.tokens, time.time() - t_data), flush=True)

    embed, decay, no_decay = [], [], []
    for name, p in model.named_parameters():
        (embed if "embed_tokens" in name else decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay, "lr_mult": 1.0},
              {"params": no_decay, "weight_decay": 0.0, "lr_mult": 1.0},
              {"params": embed, "weight_decay": 0.0, "lr_mult": args.embed_lr_mult}]
    opt_kwargs = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if device == "cuda":
        opt_kwargs["fused"] = True
    opt = torch.optim.AdamW(groups, **opt_kwargs)

    def autocast():
        if device == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    log = {"params": n_params, "config": cfg.to_hf_dict()["text_config"], "args": vars(args), "curve": [],
           "heldout": [], "batch_trials": []}
    w_ctx = args.context_loss_weight
    # The training forward: the reference's modules through fast_reference.text_forward (same
    # maths, checked here on real data), its layer optionally compiled.
    ids0 = train.make(train.batches[0])[0]
    err, same = fast_reference.check_text_forward(model, ids0[:2, :512])
    assert err < 1e-5 and same, "text_forward differs from the reference (%g, experts %s)" % (err, same)
    start = time.time()  # the budget includes the compile check and the warm-start evaluation
    if args.init_from:
        h0 = heldout_loss(model, held, autocast, max_tokens=400000)
        log["heldout"].append({"step": 0, "tokens": 0, "loss": round(h0, 4)})
        print("held-out loss %.4f at the warm start" % h0, flush=True)
    compiled_layer = None
    if args.compile != "off":
        try:
            import torch._dynamo as dynamo
            dynamo.config.cache_size_limit = 32  # sliding and full layers, dynamic shapes
            compiled_layer = torch.compile(fast_reference.layer_forward, dynamic=True)
            t_c = time.time()
            with torch.no_grad(), autocast():
                a, ea = fast_reference.text_forward(model, ids0)
                b, eb = fast_reference.text_forward(model, ids0, compiled_layer)
            cerr = float((a.float() - b.float()).abs().max() / a.float().abs().max())
            agree = float(sum((x == y).float().mean() for x, y in zip(ea, eb)) / len(ea))
            rec = {"forward_rel_diff_bf16": cerr, "expert_choice_agreement": round(agree, 5),
                   "compile_seconds": round(time.time() - t_c, 1)}
            log["compile_check"] = rec
            print(json.dumps({"compile_check": rec}), flush=True)
            if not (cerr < 0.05 and agree > 0.99):  # bf16 rounding points move; a bug moves more
                print("compiled forward differs from eager: not used", flush=True)
                compiled_layer = None
        except Exception as e:  # noqa: BLE001 -- any compile failure: train eagerly
            print("torch.compile failed, training eagerly: %s" % str(e).splitlines()[0][:300], flush=True)
            log["compile_check"] = {"error": str(e)[:1000]}
            compiled_layer = None
    use_compiled = compiled_layer is not None and args.compile == "on"
    # --compile auto: eager steps [2, 10) timed, then compiled [13, 21) (its backward compiles
    # at step 10); the faster is kept.
    ctrial = {"marks": {2: "eager_start", 10: "eager_end", 13: "compiled_start", 21: "compiled_end"}, "t": {}} \
        if compiled_layer is not None and args.compile == "auto" else None
    if ctrial:
        args.auto_batch = False  # one trial at a time
    zero = lambda: torch.zeros((), dtype=torch.float32, device=device)  # noqa: E731
    seen_tokens = torch.zeros((), dtype=torch.long, device=device)  # device counters: no syncs
    seen_loss_tokens = torch.zeros((), dtype=torch.long, device=device)
    win = {"loss": zero(), "steps": 0, "a_sum": zero(), "a_n": zero(), "c_sum": zero(), "c_n": zero(),
           "tokens": 0, "start": time.time()}
    # --auto-batch: (tokens per batch, steps to warm up, steps to time); trials run in order,
    # each larger one only while the previous was kept.
    # (Only 2x: at 4x = 256k tokens the dense experts' saved activations, ~0.55 MB a token,
    # would not fit in the H200's memory.)
    trials = [args.tokens_per_batch * m for m in (1, 2)] if args.auto_batch else []
    trial = {"i": 0, "begin": 6, "end": 6 + 14, "rates": []}
    stream = train.stream()
    step, next_eval = 0, 1
    while True:
        frac = (time.time() - start) / args.seconds
        if args.max_steps:
            frac = max(frac, step / args.max_steps)
        if frac >= 1.0:
            break
        if trials and step == trial["begin"]:
            sync()
            trial["t0"], trial["tok0"] = time.time(), 0
        if args.profile and step in (60, 65):
            try:  # the profile is for the record only: never let it stop the training
                if step == 60:
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
                        [torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else []))
                    prof.__enter__()
                else:
                    prof.__exit__(None, None, None)
                    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
                    print(prof.key_averages().table(sort_by=key, row_limit=30), flush=True)
            except Exception as e:  # noqa: BLE001
                print("profiler failed: %s" % e, flush=True)
        lr = lr_at(frac, args.lr, warmup=args.warmup, hold=args.hold)
        for g in opt.param_groups:
            g["lr"] = lr * g["lr_mult"]
        if ctrial and step in ctrial["marks"]:
            sync()
            ctrial["t"][ctrial["marks"][step]] = (time.time(), int(seen_tokens))
            if step == 10:
                use_compiled = True
            elif step == 21:
                rates = {}
                for kind in ("eager", "compiled"):
                    (t0, n0), (t1, n1) = ctrial["t"][kind + "_start"], ctrial["t"][kind + "_end"]
                    rates[kind] = int((n1 - n0) / (t1 - t0))
                use_compiled = rates["compiled"] > 1.05 * rates["eager"]
                log["compile_trial"] = dict(rates, kept="compiled" if use_compiled else "eager")
                print(json.dumps({"compile_trial": log["compile_trial"]}), flush=True)
                ctrial = None
        ids, labels, valid = next(stream)
        batch_tokens = train.last_tokens
        with autocast():
            hidden, routing = fast_reference.text_forward(
                model, ids, compiled_layer if use_compiled else fast_reference.layer_forward)
            ce, assistant, context = token_losses(model, hidden, ids, labels, valid)
        a_sum, c_sum = (ce * assistant).sum(), (ce * context).sum()
        a_n, c_n = assistant.sum(), context.sum()
        loss = (a_sum + w_ctx * c_sum) / (a_n + w_ctx * c_n).clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        imbalance = balance_experts(model, routing, valid, args.bias_rate)
        step += 1
        seen_tokens += batch_tokens
        seen_loss_tokens += a_n
        win["loss"] += loss.detach()
        win["steps"] += 1
        win["a_sum"] += a_sum.detach()
        win["a_n"] += a_n
        win["c_sum"] += c_sum.detach()
        win["c_n"] += c_n
        win["tokens"] += batch_tokens
        if trials and "t0" in trial and step > trial["begin"]:
            trial["tok0"] += batch_tokens
            if step == trial["end"]:
                sync()
                rate = trial["tok0"] / (time.time() - trial["t0"])
                tpb = trials[trial["i"]]
                trial["rates"].append(rate)
                rec = {"step": step, "tokens_per_batch": tpb, "tok_per_s": int(rate)}
                log["batch_trials"].append(rec)
                print(json.dumps({"batch_trial": rec}), flush=True)
                i = trial["i"]
                keep_going = i + 1 < len(trials) and (i == 0 or rate >= 1.6 * trial["rates"][i - 1])
                if keep_going:
                    trial["i"] = i + 1
                    train.bucket(trials[i + 1])
                    stream = train.stream()
                    trial.update(begin=step + 3, end=step + 3 + 10)
                    del trial["t0"]
                else:
                    best = i if (i == 0 or rate >= 1.6 * trial["rates"][i - 1]) else i - 1
                    if best != i:
                        train.bucket(trials[best])
                        stream = train.stream()
                    print("batch: %d tokens per step" % trials[best], flush=True)
                    log["tokens_per_batch"] = trials[best]
                    trials = []
        if step % 50 == 0 or step in (10, 25):
            dt = time.time() - win["start"]
            entry = {"step": step, "seconds": round(time.time() - start, 1), "tokens": int(seen_tokens),
                     "loss": round(float(win["loss"]) / win["steps"], 4),
                     "assistant_loss": round(float(win["a_sum"]) / max(float(win["a_n"]), 1), 4),
                     "context_loss": round(float(win["c_sum"]) / max(float(win["c_n"]), 1), 4),
                     "lr": lr, "tok_per_s": int(win["tokens"] / dt), "batch": train.tokens_per_batch,
                     "expert_load_max_over_mean": round(float(imbalance), 2)}
            log["curve"].append(entry)
            print(json.dumps(entry), flush=True)
            for k in ("loss", "a_sum", "a_n", "c_sum", "c_n"):
                win[k] = zero()
            win.update(steps=0, tokens=0, start=time.time())
        if not trials and not ctrial and frac >= next_eval / (args.evals + 1):  # not while timing batch sizes
            next_eval += 1
            h = heldout_loss(model, held, autocast, max_tokens=400000)
            log["heldout"].append({"step": step, "tokens": int(seen_tokens), "loss": round(h, 4)})
            print("held-out loss %.4f at step %d" % (h, step), flush=True)
    final = heldout_loss(model, held, autocast)
    seen_tokens, seen_loss_tokens = int(seen_tokens), int(seen_loss_tokens)
    log["heldout"].append({"step": step, "tokens": seen_tokens, "loss": round(final, 4)})
    log.update(steps=step, train_tokens=seen_tokens, train_loss_tokens=seen_loss_tokens,
               epochs=round(seen_tokens / max(train.tokens, 1), 2), seconds=round(time.time() - start, 1),
               final_heldout_loss=round(final, 4), compiled=bool(use_compiled))
    print("final held-out loss %.4f after %d steps, %d tokens (%.2f epochs), %.0f s" % (
        final, step, seen_tokens, log["epochs"], time.time() - start), flush=True)
    model = model.float()
    save_model(model, args.out)
    with open(args.log, "w") as f:
        json.dump(log, f, indent=1)


if __name__ == "__main__":
    main()
