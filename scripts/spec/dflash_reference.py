"""DFlash reference fixture: a tiny random Muse Glimmer target and a tiny random
MuseGlimmerAssistantModel made with transformers 5.17, greedy generation with the assistant
through transformers' own DFlashTokenCandidateGenerator, and every draft block it proposed with
the hidden-state taps it was given.

    python3 scripts/spec/dflash_reference.py --out tests/data/fixtures/dflash

How transformers picks the generator: `generate(..., assistant_model=A)` routes to
AssistedCandidateGenerator (which needs `A.generation_config`, which the assistant lacks) unless
the generation config says `speculation_type="dflash"`; then `_get_candidate_generator` builds
DFlashTokenCandidateGenerator(A, target input embeddings, target output embeddings, ...). This
script passes `speculation_type="dflash"` to `generate`, so transformers drives the generator
exactly as a user's call would, and records what the generator does by wrapping
`get_candidates`, the assistant's `forward` and (eager attention) the assistant's attention
function.

Writes
  OUT/target/      save_pretrained of the target (MuseGlimmerForConditionalGeneration, BF16)
  OUT/assistant/   save_pretrained of the assistant (MuseGlimmerAssistantModel, BF16)
  OUT/taps-R.f32   run R's context hidden states exactly as the generator passed them to the
                   assistant, little-endian float32 [positions, len(target_layer_ids) * hidden],
                   positions 0.. in order (the calls' context rows concatenated)
  OUT/blocks.json  {"source", "versions", "tap_sources", "runs": [{"prompt_len", "tokens",
                   "taps_file", "taps_rows", "same_as_plain_greedy", "blocks": [{"anchor_pos",
                   "anchor", "context_first", "context_rows", "n_last_matches", "drafts",
                   "returned", "top", "margin", "max_abs_logit", "masks", "rederived"}]}]}
  OUT/reference_sources/  the transformers sources the semantics depend on (output capture,
                   DFlashCache, masks), for reading; not part of the fixture

tests/speculative/dflash_fixture_test.cc replays it: muse's drafter must propose the same
blocks from the same committed context, from these taps and from muse's own. Needs torch and
transformers 5.17 (the GPU machine has them; the CI machine does not); runs on the CPU in
float32 with eager attention, from weights rounded to BF16 (the storage dtype, so the files
are small and both sides compute from exactly the stored values). Deterministic: the same
seed gives byte-identical files.

Checks printed (and recorded) so that one run on the GPU machine answers the semantic
questions the C++ side depends on:
  - tap_sources: for each tap slot, which target tensor it equals (the embedding output,
    "layer j output", or the final norm), found by hooking every decoder layer;
  - noise embeddings: raw rows of the target's embedding table, or normed;
  - masks: per assistant layer, how many keys each block row could see (eager attention);
  - rederived: the block recomputed without the cache from all committed context, with the
    sliding window read as "distance < window" (lt) or "distance <= window" (le);
  - same_as_plain_greedy: the output equals target.generate without the assistant.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

# The target: the shape of the Glimmer fixtures (glimmer_fixture.make_config adds the Muse keys,
# randomize_ the weights the way those fixtures do). Window 8, so every prompt spans windows.
TARGET_SPEC = {
    "eos_ids": [2, 3], "presoftcap_std": 10.0,
    "config": {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8,
               "max_position_embeddings": 4096},
}
# The assistant: DFlash, mask rows emit. One full-attention layer between two sliding ones (the
# window is per layer type), a window shorter than the longer prompts, a non-default RoPE base,
# and taps at two interior target layers.
ASSISTANT = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
    "sliding_window": 12, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    "block_size": 8, "mask_token_id": 511, "target_layer_ids": [1, 4],
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
PROMPT_LENS = [9, 24, 40]  # inside one assistant window, two windows, past three
TOP_K = 5  # reference logits kept per draft row (ids and values)
STORAGE = torch.bfloat16


@torch.no_grad()
def round_to_storage_(model) -> None:
    for p in model.parameters():
        p.copy_(p.to(STORAGE).to(torch.float32))


def rounded(obj):
    """Floats to 8 significant digits (float32 needs at most 9 to round-trip; the test compares
    with tolerances far above that), so blocks.json stays small."""
    if isinstance(obj, float):
        return float(f"{obj:.8g}")
    if isinstance(obj, dict):
        return {k: rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v) for v in obj]
    return obj


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.no_grad()
def randomize_assistant_(model, gen: torch.Generator) -> None:
    """Every RMSNorm gain (all absolute: x * w) in [0.6, 1.4], so a missing or misplaced norm
    changes the drafts; every Linear N(0, 1/fan_in), so rows differ from one another."""
    for name, p in model.named_parameters():
        if p.ndim == 1:
            p.uniform_(0.6, 1.4, generator=gen)
        else:
            p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)


def set_eager(model) -> str:
    try:
        model.set_attn_implementation("eager")
    except Exception:
        try:
            model.config._attn_implementation = "eager"
        except Exception:
            pass
    return str(getattr(model.config, "_attn_implementation", "unknown"))


def cache_lengths(cache) -> list:
    """Per-layer stored key length of a cache, where the cache exposes it."""
    out = []
    for layer in getattr(cache, "layers", []) or []:
        keys = getattr(layer, "keys", None)
        out.append(int(keys.shape[-2]) if isinstance(keys, torch.Tensor) and keys.dim() >= 2 else None)
    return out


class Recorder:
    """What the candidate generator did in the current get_candidates call."""

    def __init__(self):
        self.current = None
        self.calls = []


def install_recording(rec: Recorder, assistant, cg_module, assistant_module) -> None:
    gen_cls = cg_module.DFlashTokenCandidateGenerator
    original_get = gen_cls.get_candidates

    def get_candidates(self, input_ids, *args, **kwargs):
        rec.current = {"input_len": int(input_ids.shape[1]), "anchor": int(input_ids[0, -1]),
                       "n_last_matches": int(kwargs.get("n_last_matches", -1)),
                       "cache_before": cache_lengths(getattr(self, "cache", None))}
        try:
            out = original_get(self, input_ids, *args, **kwargs)
        finally:
            call, rec.current = rec.current, None
        candidates = out[0] if isinstance(out, tuple) else out
        call["returned"] = candidates[0, call["input_len"]:].tolist()
        call["cache_after"] = cache_lengths(getattr(self, "cache", None))
        if "hidden" in call:  # the assistant ran (the first call and the last ones do not)
            rec.calls.append(call)
        return out

    gen_cls.get_candidates = get_candidates

    original_forward = assistant.forward

    def forward(*args, **kwargs):
        out = original_forward(*args, **kwargs)
        if rec.current is not None:
            rec.current["context"] = kwargs["context_hidden_states"].detach().float().cpu()[0]
            rec.current["noise_embeds"] = kwargs["noise_embeds"].detach().float().cpu()[0]
            rec.current["position_ids"] = kwargs["position_ids"][0].tolist()
            mask = kwargs.get("attention_mask")
            rec.current["attention_mask_len"] = None if mask is None else int(mask.shape[-1])
            rec.current["hidden"] = out.last_hidden_state.detach().float().cpu()[0]
        return out

    assistant.forward = forward

    original_eager = assistant_module.eager_attention_forward

    def eager_attention_forward(module, query, key, value, attention_mask, *args, **kwargs):
        if rec.current is not None:
            entry = {"layer": int(getattr(module, "layer_idx", -1)), "kv_len": int(key.shape[-2])}
            if attention_mask is None:
                entry["visible"] = None  # no mask: every key
            else:
                m = attention_mask[0, 0]
                allowed = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
                entry["visible"] = allowed.sum(-1).tolist()
                entry["first_visible"] = [int(r.nonzero()[0]) if r.any() else -1 for r in allowed]
            rec.current.setdefault("masks", []).append(entry)
        return original_eager(module, query, key, value, attention_mask, *args, **kwargs)

    assistant_module.eager_attention_forward = eager_attention_forward


@torch.no_grad()
def rederive_block(assistant, context_taps: torch.Tensor, noise: torch.Tensor, rule: str) -> torch.Tensor:
    """The block's last hidden state from all committed context at positions 0..s-1 and the block
    at s..s+k-1, without any cache, using the assistant's own modules; the sliding window (on
    sliding layers only) keeps keys at distance < window ("lt") or <= window ("le")."""
    cfg = assistant.config
    s, k = context_taps.shape[0], noise.shape[0]
    D = cfg.head_dim
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    c = assistant.encoder(context_taps[None])
    pos = torch.arange(s + k)
    cos, sin = assistant.rotary_emb(c, pos[None])
    cos, sin = cos[:, None], sin[:, None]  # [1, 1, s+k, D]
    distance = (pos[s:, None] - pos[None, :]).abs()
    h = noise[None]
    for li, layer in enumerate(assistant.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        kv_in = torch.cat([c, x], dim=1)
        q = attn.q_norm(attn.q_proj(x).view(1, k, -1, D).transpose(1, 2))
        key = attn.k_norm(attn.k_proj(kv_in).view(1, s + k, -1, D).transpose(1, 2))
        val = attn.v_proj(kv_in).view(1, s + k, -1, D).transpose(1, 2)
        q = q * cos[..., s:, :] + rotate_half(q) * sin[..., s:, :]
        key = key * cos + rotate_half(key) * sin
        key, val = key.repeat_interleave(rep, dim=1), val.repeat_interleave(rep, dim=1)
        scores = (q @ key.transpose(2, 3)) * D ** -0.5
        if cfg.layer_types[li] == "sliding_attention":
            W = cfg.sliding_window
            allowed = distance < W if rule == "lt" else distance <= W
            scores = scores.masked_fill(~allowed, float("-inf"))
        o = (scores.softmax(-1) @ val).transpose(1, 2).reshape(1, k, -1)
        h = h + attn.o_proj(o)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return assistant.norm(h)[0]


@torch.no_grad()
def layer_outputs(target, tokens: list) -> dict:
    """Every candidate tap source over the whole sequence, one no-cache forward."""
    lm = target.model.language_model
    got, hooks = {}, []
    hooks.append(lm.embed_tokens.register_forward_hook(lambda m, i, o: got.__setitem__("embedding output", o[0])))
    for j, layer in enumerate(lm.layers):
        def hook(m, i, o, j=j):
            got[f"layer {j} output"] = (o[0] if isinstance(o, tuple) else o)[0]
        hooks.append(layer.register_forward_hook(hook))
    hooks.append(lm.norm.register_forward_hook(lambda m, i, o: got.__setitem__("final norm output", o[0])))
    try:
        target(input_ids=torch.tensor([tokens]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {k: v.float() for k, v in got.items()}


def identify_taps(taps: torch.Tensor, sources: dict, hidden: int) -> list:
    """For each tap slot, the source it equals best (and the max abs difference)."""
    n = taps.shape[0]
    out = []
    for t in range(taps.shape[1] // hidden):
        slot = taps[:, t * hidden:(t + 1) * hidden]
        diffs = {name: float((v[:n] - slot).abs().max()) for name, v in sources.items()}
        best = min(diffs, key=diffs.get)
        out.append({"slot": t, "best": best, "max_abs_diff": diffs[best],
                    "scale": float(slot.abs().max()), "all": diffs})
    return out


def dump_sources(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for name in ("transformers.utils.output_capturing", "transformers.cache_utils", "transformers.masking_utils",
                 "transformers.utils.generic"):
        try:
            module = __import__(name, fromlist=["_"])
            with open(os.path.join(out_dir, name + ".py"), "w") as f:
                f.write(inspect.getsource(module))
        except Exception as e:  # informative only
            print(f"could not dump {name}: {type(e).__name__}: {e}")


def run_one(target, assistant, rec: Recorder, prompt: list, new_tokens: int, out_dir: str, index: int) -> dict:
    rec.calls = []
    with torch.no_grad():
        out = target.generate(torch.tensor([prompt]), assistant_model=assistant, speculation_type="dflash",
                              do_sample=False, max_new_tokens=new_tokens)
        plain = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens)
    tokens = out[0].tolist()
    cfg = assistant.config
    embed = target.get_input_embeddings().weight.detach().float()
    lm_head = target.get_output_embeddings()

    # The context rows, in call order, must tile positions 0.. without gaps.
    rows, blocks, next_pos = [], [], 0
    for call in rec.calls:
        n = call["context"].shape[0]
        ctx_pos = call["position_ids"][:n]
        block_pos = call["position_ids"][n:]
        if ctx_pos != list(range(next_pos, next_pos + n)):
            raise RuntimeError(f"context positions {ctx_pos} do not follow on from {next_pos}")
        s = next_pos + n
        if block_pos != list(range(s, s + cfg.block_size)) or call["input_len"] != s + 1:
            raise RuntimeError(f"block positions {block_pos} / input length {call['input_len']} for anchor at {s}")
        rows.append(call["context"])
        next_pos = s
        with torch.no_grad():
            logits = lm_head(call["hidden"][1:].to(lm_head.weight.dtype)).float()
        drafts = logits.argmax(-1).tolist()
        top = logits.topk(TOP_K, dim=-1)
        noise_ids = [call["anchor"]] + [cfg.mask_token_id] * (cfg.block_size - 1)
        raw = embed[noise_ids]
        block = {
            "anchor_pos": s, "anchor": call["anchor"], "context_first": s - n, "context_rows": n,
            "n_last_matches": call["n_last_matches"], "drafts": drafts, "returned": call["returned"],
            "top": [[[int(i), float(v)] for i, v in zip(ti, tv)] for ti, tv in zip(top.indices, top.values)],
            "margin": (top.values[:, 0] - top.values[:, 1]).tolist(),
            "max_abs_logit": logits.abs().max(-1).values.tolist(),
            "noise_vs_raw_embedding": float((call["noise_embeds"] - raw).abs().max()),
            "cache_before": call["cache_before"], "cache_after": call["cache_after"],
            "attention_mask_len": call["attention_mask_len"], "masks": call.get("masks", []),
        }
        context_all = torch.cat(rows, dim=0)
        block["rederived"] = {}
        for rule in ("lt", "le"):
            h = rederive_block(assistant, context_all, call["noise_embeds"], rule)
            block["rederived"][rule] = float((h - call["hidden"]).abs().max())
        blocks.append(block)

    taps = torch.cat(rows, dim=0).contiguous()
    taps_file = f"taps-{index}.f32"
    taps.numpy().astype("<f4").tofile(os.path.join(out_dir, taps_file))
    return {"prompt_len": len(prompt), "tokens": tokens, "taps_file": taps_file, "taps_rows": int(taps.shape[0]),
            "same_as_plain_greedy": tokens == plain[0].tolist(), "blocks": blocks, "_taps": taps}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--new-tokens", type=int, default=40)
    args = ap.parse_args()
    import transformers
    from transformers.generation import candidate_generator as cg
    from transformers.models.muse_glimmer_assistant import modeling_muse_glimmer_assistant as mga_modeling
    from transformers.models.muse_glimmer_assistant import configuration_muse_glimmer_assistant as mga_config

    import fixture_common as fc
    import glimmer_fixture as gf

    transformers.logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    target = gf._transformers().MuseGlimmerForConditionalGeneration(gf.make_config(TARGET_SPEC)).float().eval()
    target_attn = set_eager(target)
    gf.randomize_(target, gen, TARGET_SPEC["presoftcap_std"])
    round_to_storage_(target)
    # No EOS: generation runs its full length and the generator never crops a block at an EOS.
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0

    assistant = mga_modeling.MuseGlimmerAssistantModel(mga_config.MuseGlimmerAssistantConfig(**ASSISTANT)).float().eval()
    assistant_attn = set_eager(assistant)
    randomize_assistant_(assistant, gen)
    round_to_storage_(assistant)

    rec = Recorder()
    install_recording(rec, assistant, cg, mga_modeling)
    os.makedirs(args.out, exist_ok=True)
    dump_sources(os.path.join(args.out, "reference_sources"))

    vocab = TARGET_SPEC["config"]["vocab_size"]
    runs = []
    for index, length in enumerate(PROMPT_LENS):
        prompt = fc.random_prompt(gen, length, vocab - 1)  # never the mask id (vocab - 1)
        runs.append(run_one(target, assistant, rec, prompt, args.new_tokens, args.out, index))

    hidden = TARGET_SPEC["config"]["hidden_size"]
    longest = max(runs, key=lambda r: r["taps_rows"])
    tap_sources = identify_taps(longest["_taps"], layer_outputs(target, longest["tokens"]), hidden)
    for r in runs:
        del r["_taps"]

    target.to(STORAGE).save_pretrained(os.path.join(args.out, "target"))
    assistant.to(STORAGE).save_pretrained(os.path.join(args.out, "assistant"))
    doc = {
        "source": f"transformers {transformers.__version__} DFlashTokenCandidateGenerator "
                  "(generate(..., assistant_model=assistant, speculation_type='dflash'))",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "attn_implementation": {"target": target_attn, "assistant": assistant_attn},
        "seed": args.seed, "storage_dtype": str(STORAGE).replace("torch.", ""), "assistant_config": ASSISTANT,
        "tap_sources": tap_sources, "runs": runs,
    }
    fc.write_json(os.path.join(args.out, "blocks.json"), rounded(doc))

    # The summary the C++ side depends on.
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, attention {target_attn}/{assistant_attn}")
    for t in tap_sources:
        print(f"tap slot {t['slot']} (target_layer_ids[{t['slot']}] = {ASSISTANT['target_layer_ids'][t['slot']]}): "
              f"{t['best']} (max diff {t['max_abs_diff']:.2e} of {t['scale']:.2e})")
    for i, r in enumerate(runs):
        b = r["blocks"]
        worst = {rule: max((x["rederived"][rule] for x in b), default=0.0) for rule in ("lt", "le")}
        returned_ok = all(x["returned"] == x["drafts"][:len(x["returned"])] for x in b)
        noise = max((x["noise_vs_raw_embedding"] for x in b), default=0.0)
        accepted = sum(1 for x in b if x["n_last_matches"] > 0)
        print(f"run {i}: prompt {r['prompt_len']}, {len(r['tokens']) - r['prompt_len']} new tokens, {len(b)} blocks, "
              f"taps {r['taps_rows']} rows, same as plain greedy: {r['same_as_plain_greedy']}, "
              f"returned drafts = argmax of recorded logits: {returned_ok}, noise vs raw embedding {noise:.1e}, "
              f"blocks after an acceptance {accepted}, rederived max diff lt {worst['lt']:.2e} le {worst['le']:.2e}, "
              f"min margin {min((min(x['margin']) for x in b), default=0.0):.3e}")
    first = runs[-1]["blocks"][0] if runs[-1]["blocks"] else None
    if first:
        print(f"run {len(runs) - 1} block 0 masks: {json.dumps(first['masks'])}")
        print(f"cache lengths before/after: {first['cache_before']} / {first['cache_after']}")
    print(f"{sum(len(r['blocks']) for r in runs)} blocks -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
