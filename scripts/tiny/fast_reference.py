"""Dense evaluation of the reference's latent experts, for training and evaluating muse-tiny.

The reference (scripts/fixtures/muse_spark_reference.py) loops over experts and gathers each
expert's tokens, which costs ~15 small operations and a host sync per expert and layer. With
16 tiny experts it is far cheaper to run every expert on every token with two batched
matmuls and give the unchosen experts weight zero: the result is the same sum (only the
summation order differs), and gradients reach exactly the parameters the sparse forward
reaches. `enable()` swaps this in for `SparkExperts.forward`; `check()` compares it with the
original on random inputs before anything relies on it.

`enable_fast_attention()` (training on CUDA): the reference's SDPA path passes an explicit
causal mask also to the full-attention layers, which rules out the flash kernel; with no
cache and no window the mask is exactly `is_causal`, so those layers use that instead. It is
compared with the reference on random inputs first and left off if they differ.
"""

import torch
import torch.nn.functional as F

import muse_spark_reference as ref

_original_forward = ref.SparkExperts.forward
_original_attention_core = ref.attention_core


def dense_experts_forward(self, u, idx, w):
    """u [N, Hm] latent input; idx [N, k] chosen experts; w [N, k] their weights -> [N, Hm]."""
    I = self.cfg.moe_intermediate_size
    gu = self.r(torch.einsum("nh,eoh->neo", u, self.gate_up_proj))  # [N, E, 2I], gate rows first
    act = self.r(F.silu(gu[..., :I]) * gu[..., I:])
    y = self.r(torch.einsum("nei,ehi->neh", act, self.down_proj))  # [N, E, Hm]
    y = self.post_expert_norm(y)  # the shared input-scale norm, per expert output
    dense_w = torch.zeros(u.shape[0], self.cfg.num_local_experts, dtype=y.dtype, device=u.device)
    dense_w = dense_w.scatter(1, idx, w.to(y.dtype))
    return torch.einsum("ne,neh->nh", dense_w, y).to(u.dtype)


def enable():
    ref.SparkExperts.forward = dense_experts_forward


def check(cfg, device="cpu", tokens=64, seed=0):
    """Max relative difference between dense and reference experts on random inputs (fp64)."""
    gen = torch.Generator().manual_seed(seed)
    experts = ref.SparkExperts(cfg).double()
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3)
    experts = experts.to(device)
    u = torch.randn(tokens, cfg.moe_hidden_size, generator=gen, dtype=torch.float64).to(device)
    scores = torch.rand(tokens, cfg.num_local_experts, generator=gen, dtype=torch.float64).to(device)
    idx = ref.top_k_lowest_index(scores, cfg.num_experts_per_tok)
    w = torch.rand(tokens, cfg.num_experts_per_tok, generator=gen, dtype=torch.float64).to(device)
    with torch.no_grad():
        a = _original_forward(experts, u, idx, w)
        b = dense_experts_forward(experts, u, idx, w)
    return float((a - b).abs().max() / a.abs().max())


def fast_attention_core(q, k, v, q_pos, k_pos, window, scale, impl="eager"):
    """The reference's attention_core; full layers without a cache use SDPA's is_causal."""
    if impl == "sdpa" and window is None and q.shape[1] == k.shape[1]:
        group = q.shape[2] // k.shape[2]
        kk = k.repeat_interleave(group, dim=2).transpose(1, 2)
        vv = v.repeat_interleave(group, dim=2).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, is_causal=True, scale=scale)
        return out.transpose(1, 2)
    return _original_attention_core(q, k, v, q_pos, k_pos, window, scale, impl)


def enable_fast_attention(device, tol=2e-2):
    """Swap in fast_attention_core if it matches the reference on random bf16 inputs."""
    try:
        gen = torch.Generator().manual_seed(3)
        B, T, nH, nKV, D = 2, 320, 8, 2, 32
        q, k, v = (torch.randn(B, T, n, D, generator=gen).to(device, torch.bfloat16) for n in (nH, nKV, nKV))
        pos = torch.arange(T, device=device)
        a = _original_attention_core(q, k, v, pos, pos, None, 0.9, "sdpa").float()
        b = fast_attention_core(q, k, v, pos, pos, None, 0.9, "sdpa").float()
        err = float((a - b).abs().max() / a.abs().max())
        if not err < tol:
            return "reference masks (is_causal differs by %.2g)" % err
    except Exception as e:  # an older torch or a kernel that refuses: keep the reference
        return "reference masks (%s)" % e
    ref.attention_core = fast_attention_core
    return "is_causal for full layers (max rel. diff %.1e)" % err


# ---- a training forward that torch.compile can take whole ------------------------------------

def layer_forward(layer, s, positions):
    """SparkDecoderLayer.forward without a cache, returning the chosen experts as a tensor
    (the reference returns them in a SimpleNamespace, around which torch.compile would break
    the graph). Same modules, same order of operations as the reference's layer and MoE."""
    a = layer.self_attn(layer.input_layernorm(s), positions, None)
    s = layer.post_attention_residual_gate(s, layer.r(ref.rms_norm(a, layer.cfg.post_norm_eps)))
    h = layer.pre_feedforward_layernorm(s)
    moe = layer.mlp
    flat = h.reshape(-1, h.shape[-1])
    idx, w, _ = moe.gate(flat)
    u = moe.pre_expert_norm(moe.r(moe.pre_expert_proj(flat)))
    f = moe.r(moe.post_expert_proj(moe.r(moe.experts(u, idx, w)))).view(h.shape)
    s = layer.post_feedforward_residual_gate(s, layer.r(layer.post_feedforward_layernorm(f)))
    return s, idx


def text_forward(model, ids, layer_fn=layer_forward):
    """MuseSparkTextModel.forward without a cache through `layer_fn`: (final hidden [B, T, H],
    chosen experts per layer [B*T, k])."""
    lm = model.model.language_model
    positions = torch.arange(ids.shape[1], device=ids.device)
    s = lm.r(ref.rms_norm(lm.embed_tokens(ids), lm.cfg.rms_norm_eps))
    experts = []
    for layer in lm.layers:
        s, idx = layer_fn(layer, s, positions)
        experts.append(idx)
    return lm.norm(lm.r(s)), experts


@torch.no_grad()
def check_text_forward(model, ids):
    """Max relative difference of text_forward against the reference's text model, and
    whether every expert choice agrees."""
    a, routing = model.model.language_model(ids)
    b, experts = text_forward(model, ids)
    same = all(bool((r.experts.reshape(-1, r.experts.shape[-1]) == e).all()) for r, e in zip(routing, experts))
    return float((a - b).abs().max() / a.abs().max()), same
