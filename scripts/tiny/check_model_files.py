#!/usr/bin/env python3
"""Consistency checks of the shipped models/muse-tiny directory (pure Python, no torch).

- every expected file is present and the directory is at most 40 MB;
- config.json is a Muse Spark config whose layer pattern follows the Muse rule, with the
  special-token ids of tiny_config.py; generation_config.json stops on <|end_of_text|> and
  <|eot|>;
- model.safetensors holds exactly the published Spark tensor names for that config, BF16
  except the FP32 router, with the shapes the config implies; the drafter's tensors match
  its config;
- tokenizer.json has the 4096 ids of the layout with every Muse special token at its id, and
  tokenizer_config.json embeds the same chat template as chat_template.jinja.
Exit status 0 when all hold; every failure is printed.
"""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny_config as tcfg  # noqa: E402

MODEL = os.path.join(HERE, "..", "..", "models", "muse-tiny")
LAYER_SUFFIXES = (  # checkpoint-formats.md section 5.4
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.gate_proj.weight", "self_attn.o_proj.weight",
    "post_attention_residual_gate.gate", "pre_feedforward_layernorm.weight",
    "post_feedforward_layernorm.weight", "post_feedforward_residual_gate.gate", "mlp.gate.weight",
    "mlp.gate.e_score_correction_bias", "mlp.pre_expert_proj.weight", "mlp.pre_expert_norm.weight",
    "mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.experts.post_expert_norm.weight",
    "mlp.post_expert_proj.weight")
problems = []


def expect(cond, message):
    if not cond:
        problems.append(message)


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def spark_shapes(t):
    H, V, L = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"]
    nH, nKV, D = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    E, Hm, I = t["num_local_experts"], t["moe_hidden_size"], t["moe_intermediate_size"]
    p = "model.language_model."
    shapes = {p + "embed_tokens.weight": [V, H], p + "norm.weight": [H], "lm_head.weight": [V, H]}
    per = {"input_layernorm.weight": [H], "self_attn.q_proj.weight": [nH * D, H],
           "self_attn.k_proj.weight": [nKV * D, H], "self_attn.v_proj.weight": [nKV * D, H],
           "self_attn.gate_proj.weight": [nH * D, H], "self_attn.o_proj.weight": [H, nH * D],
           "post_attention_residual_gate.gate": [H], "pre_feedforward_layernorm.weight": [H],
           "post_feedforward_layernorm.weight": [H], "post_feedforward_residual_gate.gate": [H],
           "mlp.gate.weight": [E, H], "mlp.gate.e_score_correction_bias": [E],
           "mlp.pre_expert_proj.weight": [Hm, H], "mlp.pre_expert_norm.weight": [Hm],
           "mlp.experts.gate_up_proj": [E, 2 * I, Hm], "mlp.experts.down_proj": [E, Hm, I],
           "mlp.experts.post_expert_norm.weight": [Hm], "mlp.post_expert_proj.weight": [H, Hm]}
    assert set(per) == set(LAYER_SUFFIXES)
    for i in range(L):
        for k, v in per.items():
            shapes["%slayers.%d.%s" % (p, i, k)] = v
    return shapes


def check_target():
    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    t = cfg["text_config"]
    expect(cfg.get("model_type") == "muse_spark", "config.json: model_type is not muse_spark")
    n = t["num_hidden_layers"]
    for i in range(n):
        full = (n - 1 - i) % 4 == 0
        expect(t["layer_types"][i] == ("full_attention" if full else "sliding_attention"), "layer %d type" % i)
        expect((t["layer_rope_theta"][i] == 0.0) == full, "layer %d rope theta" % i)
    expect(n >= 8 and t["layer_types"].count("full_attention") >= 2, "fewer than two full/sliding cycles")
    expect(t["num_local_experts"] >= 8, "fewer than 8 experts")
    for key, want in (("bos_token_id", tcfg.BOS_ID), ("pad_token_id", tcfg.PAD_ID), ("eos_token_id", tcfg.EOS_ID),
                      ("vocab_size", tcfg.EMBED_ROWS)):
        expect(t.get(key) == want, "text_config.%s is %r, expected %r" % (key, t.get(key), want))
    with open(os.path.join(MODEL, "generation_config.json")) as f:
        gen = json.load(f)
    expect(gen.get("eos_token_id") == tcfg.STOP_IDS, "generation_config stops %r" % gen.get("eos_token_id"))
    h = header(os.path.join(MODEL, "model.safetensors"))
    shapes = spark_shapes(t)
    expect(set(h) == set(shapes), "model.safetensors names differ: missing %s, extra %s" % (
        sorted(set(shapes) - set(h))[:3], sorted(set(h) - set(shapes))[:3]))
    for name, entry in h.items():
        router = name.endswith(("mlp.gate.weight", "mlp.gate.e_score_correction_bias"))
        expect(entry["dtype"] == ("F32" if router else "BF16"), "%s dtype %s" % (name, entry["dtype"]))
        expect(entry["shape"] == shapes.get(name), "%s shape %s" % (name, entry["shape"]))
    return t


def check_drafter(t):
    d = os.path.join(MODEL, "drafter")
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    H, nH, nKV, D, I, r = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                           c["intermediate_size"], c["markov_rank"])
    V, m = c["vocab_size"], len(c["target_layer_ids"])
    expect(V == t["vocab_size"] and c["mask_token_id"] == tcfg.MASK_ID, "drafter vocab/mask id")
    expect(all(0 <= l < t["num_hidden_layers"] for l in c["target_layer_ids"]), "drafter taps out of range")
    shapes = {"fc.weight": [H, m * c["target_hidden_size"]], "hidden_norm.weight": [H], "norm.weight": [H],
              "markov_head.markov_w1.weight": [V, r], "markov_head.markov_w2.weight": [V, r],
              "confidence_head.proj.weight": [1, H + r], "confidence_head.proj.bias": [1]}
    for i in range(c["num_hidden_layers"]):
        p = "layers.%d." % i
        shapes.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                       p + "self_attn.q_proj.weight": [nH * D, H], p + "self_attn.k_proj.weight": [nKV * D, H],
                       p + "self_attn.v_proj.weight": [nKV * D, H], p + "self_attn.o_proj.weight": [H, nH * D],
                       p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D],
                       p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                       p + "mlp.down_proj.weight": [H, I]})
    h = header(os.path.join(d, "model.safetensors"))
    expect({k: v["shape"] for k, v in h.items()} == shapes, "drafter tensors differ from its config")
    expect(all(v["dtype"] == "BF16" for v in h.values()), "drafter tensors are not all BF16")


def check_tokenizer():
    with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    for i, name in enumerate(tcfg.special_tokens()):
        expect(added.get(name) == tcfg.SPECIAL_BASE + i, "special token %s id %r" % (name, added.get(name)))
    expect(len(tok["model"]["vocab"]) == tcfg.BPE_VOCAB, "BPE vocabulary size %d" % len(tok["model"]["vocab"]))
    with open(os.path.join(MODEL, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)
    with open(os.path.join(MODEL, "chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    expect(tc.get("chat_template") == template, "tokenizer_config.json chat_template differs from chat_template.jinja")
    with open(os.path.join(HERE, "..", "..", "models", "muse-tiny", "chat_template.jinja"), encoding="utf-8") as f:
        expect(f.read() == template, "chat template changed after training")


def main():
    required = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja", "drafter/config.json", "drafter/model.safetensors"]
    for r in required:
        expect(os.path.exists(os.path.join(MODEL, r)), "missing models/muse-tiny/" + r)
    if problems:
        print("\n".join(problems))
        return 1
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(MODEL) for f in fs)
    expect(total <= 40 * 1000 * 1000, "models/muse-tiny is %d bytes (> 40 MB)" % total)
    t = check_target()
    check_drafter(t)
    check_tokenizer()
    for p in problems:
        print("FAIL " + p)
    print("models/muse-tiny: %d bytes; %s" % (total, "consistent" if not problems else "%d problems" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
