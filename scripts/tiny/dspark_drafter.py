"""muse-tiny's drafter: a DFlash block backbone with DSpark's Markov and confidence heads.

Follows dspark.md sections 2-3 and 5 (DeepSpec / HF tensor names, section 3a):
- Context: the target's residual-stream outputs of `target_layer_ids` layers are concatenated
  per committed position, projected by `fc` (no bias) and normalised by `hidden_norm`:
  c_j in R^H. The same c_j feeds every draft layer's K/V projections.
- Block: [anchor, MASK x (k-1)] at positions a..a+k-1, embedded by a raw lookup in the
  target's embedding table (no embedding norm); row i predicts the token at a+i+1
  (`sample_from_anchor`: k rows emit k drafts).
- Layers: Qwen3-style pre-norm decoder layers. Queries come from the block rows; keys and
  values from concat(context, block) with per-head weighted q_norm/k_norm and rotate-half RoPE
  at absolute positions. Block rows see every block row (no causal mask inside the block) and
  context positions j < a with (a+i) - j < sliding_window, the target's window rule.
- Output: final `norm`, base logits U = target lm_head(h) with neither the target's
  output_multiplier nor its softcap, ids >= the tokenizer size masked.
- Markov head (vanilla, rank r): z_i = U_i + W2 W1[x_{i-1}], x_{-1} := anchor; confidence
  head c_i = sigmoid(w . [h_i ; W1[x_{i-1}]] + b).
Embedding and lm_head are the target's (frozen, not stored): load them from the target.
"""

import json
import math
import os
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

import tiny_config as tcfg
import muse_spark_reference as ref


@dataclass
class DrafterConfig:
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 512
    sliding_window: int = 128
    block_size: int = 4
    target_layer_ids: list = field(default_factory=lambda: [1, 4, 7])
    target_hidden_size: int = 256
    num_target_layers: int = 10
    markov_rank: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 500000.0
    vocab_size: int = tcfg.EMBED_ROWS
    sampling_vocab_size: int = tcfg.TOKENIZER_SIZE
    mask_token_id: int = tcfg.MASK_ID
    num_anchors: int = 64

    def to_hf_dict(self):
        d = asdict(self)
        d.update({
            "architectures": ["MuseSparkDSparkModel"], "model_type": "muse_spark_dspark",
            "markov_head_type": "vanilla", "enable_confidence_head": True,
            "confidence_head_with_markov": True, "sample_from_anchor": True,
            "layer_types": ["sliding_attention"] * self.num_hidden_layers,
            "draft_vocab_size": self.vocab_size, "tie_word_embeddings": False, "hidden_act": "silu",
            "attention_bias": False, "final_hidden_state_tapped": False,
            "embedding_source": "target", "lm_head_source": "target",
            "draft_logits": "target lm_head on the drafter's final norm, no output_multiplier, no softcap",
            "dtype": "bfloat16",
        })
        return d

    @classmethod
    def from_hf_dict(cls, d):
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


class RMSNorm(nn.Module):
    """Weighted RMSNorm, absolute gain (Qwen3 / DeepSpec convention)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class DraftAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nH, nKV, D = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(H, nH * D, bias=False)
        self.k_proj = nn.Linear(H, nKV * D, bias=False)
        self.v_proj = nn.Linear(H, nKV * D, bias=False)
        self.o_proj = nn.Linear(nH * D, H, bias=False)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps)

    def context_kv(self, ctx, ctx_pos):
        """K (normed, RoPE'd) and V of context vectors ctx [..., S, H] at positions ctx_pos [..., S]."""
        cfg = self.cfg
        k = self.k_norm(self.k_proj(ctx).unflatten(-1, (cfg.num_key_value_heads, cfg.head_dim)))
        v = self.v_proj(ctx).unflatten(-1, (cfg.num_key_value_heads, cfg.head_dim))
        return rope(k, ctx_pos, cfg), v

    def forward(self, x, pos, ctx_k, ctx_v, ctx_ok):
        """x [G, k, H] block rows at positions pos [G, k]; ctx_k/ctx_v [G, W, nKV, D];
        ctx_ok [G, k, W] which context slots each row may see."""
        cfg = self.cfg
        G, K, _ = x.shape
        nH, nKV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = rope(self.q_norm(self.q_proj(x).view(G, K, nH, D)), pos, cfg)
        kb = rope(self.k_norm(self.k_proj(x).view(G, K, nKV, D)), pos, cfg)
        vb = self.v_proj(x).view(G, K, nKV, D)
        k = torch.cat([ctx_k, kb], dim=1).repeat_interleave(nH // nKV, dim=2)
        v = torch.cat([ctx_v, vb], dim=1).repeat_interleave(nH // nKV, dim=2)
        mask = torch.cat([ctx_ok, torch.ones(G, K, K, dtype=torch.bool, device=x.device)], dim=-1)
        scores = torch.einsum("gqhd,gshd->ghqs", q.float(), k.float()) * D ** -0.5
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        o = torch.einsum("ghqs,gshd->gqhd", torch.softmax(scores, dim=-1), v.float()).to(x.dtype)
        return self.o_proj(o.reshape(G, K, nH * D))


def rope(x, pos, cfg):
    """Rotate-half RoPE on [..., T, heads, D] at integer positions pos [..., T]."""
    D = x.shape[-1]
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
    ang = pos.to(torch.float32)[..., None] * inv
    emb = torch.cat([ang, ang], dim=-1)[..., None, :]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = D // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DraftLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, I = cfg.hidden_size, cfg.intermediate_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, I, bias=False)
        self.mlp.up_proj = nn.Linear(H, I, bias=False)
        self.mlp.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x, pos, ctx_k, ctx_v, ctx_ok):
        x = x + self.self_attn(self.input_layernorm(x), pos, ctx_k, ctx_v, ctx_ok)
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class DSparkDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        m = len(cfg.target_layer_ids)
        self.fc = nn.Linear(m * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.markov_head = nn.Module()
        self.markov_head.markov_w1 = nn.Embedding(cfg.vocab_size, cfg.markov_rank)
        self.markov_head.markov_w2 = nn.Linear(cfg.markov_rank, cfg.vocab_size, bias=False)
        self.confidence_head = nn.Module()
        self.confidence_head.proj = nn.Linear(cfg.hidden_size + cfg.markov_rank, 1, bias=True)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.ndim == 2:
                    p.normal_(0.0, p.shape[-1] ** -0.5)
            self.markov_head.markov_w2.weight.zero_()  # start as plain DFlash
            self.markov_head.markov_w1.weight.normal_(0.0, 1.0)
            self.confidence_head.proj.bias.zero_()

    def context(self, taps):
        """taps [..., S, m*H_t] -> context vectors [..., S, H]."""
        return self.hidden_norm(self.fc(taps))

    def backbone(self, ctx, ctx_pos, ctx_valid, block_emb, anchor_pos):
        """ctx [G, W, H] context slots at ctx_pos [G, W] (ctx_valid [G, W]); block_emb [G, k, H]
        for the block at anchor_pos [G]. Returns final-normed hidden states [G, k, H]."""
        K = block_emb.shape[1]
        pos = anchor_pos[:, None] + torch.arange(K, device=block_emb.device)[None, :]
        ctx_ok = ctx_valid[:, None, :] & ((pos[:, :, None] - ctx_pos[:, None, :]) < self.cfg.sliding_window)
        x = block_emb
        for layer in self.layers:
            k, v = layer.self_attn.context_kv(ctx, ctx_pos)
            x = layer(x, pos, k, v, ctx_ok)
        return self.norm(x)

    def heads(self, h, prev_tokens, lm_head_weight):
        """Draft logits z [G, k, V] (ids past the tokenizer masked) and confidence logits [G, k]
        given the Markov predecessors prev_tokens [G, k]."""
        e = self.markov_head.markov_w1(prev_tokens)
        z = F.linear(h, lm_head_weight) + self.markov_head.markov_w2(e)
        z = z.float()
        z[..., self.cfg.sampling_vocab_size:] = float("-inf")
        conf = self.confidence_head.proj(torch.cat([h, e], dim=-1)).squeeze(-1).float()
        return z, conf


def gather_context(ctx_all, anchors, window):
    """Context slots a-W+1 .. a-1 (W = window - 1 slots suffice: row 0 at position a sees
    keys down to a-W+1) for anchors [B, N] from ctx_all [B, T, H] -> [B*N, W-1, H] + positions
    and validity."""
    B, T, H = ctx_all.shape
    N = anchors.shape[1]
    W = window - 1
    pos = anchors[:, :, None] - W + torch.arange(W, device=ctx_all.device)[None, None, :]  # [B,N,W]
    valid = pos >= 0
    idx = pos.clamp(min=0)
    ctx = torch.gather(ctx_all, 1, idx.reshape(B, N * W, 1).expand(B, N * W, H)).view(B * N, W, H)
    return ctx, pos.view(B * N, W), valid.view(B * N, W)


def drafter_loss(drafter, taps, target_logits, ids, loss_mask, embed_weight, lm_head_weight, generator=None,
                 with_stats=True):
    """DSpark objective (dspark.md section 5) on a batch of sequences.

    taps [B, T, m*H_t] target tap features; target_logits [B, T, V] the target's (softcapped)
    logits; ids [B, T]; loss_mask [B, T] True where the token is a training target.
    Returns (loss, stats)."""
    cfg = drafter.cfg
    B, T = ids.shape
    K, N = cfg.block_size, cfg.num_anchors
    dev = ids.device
    # Anchors: the token and its successor are both assistant output.
    ok = loss_mask.clone()
    ok[:, :-1] &= loss_mask[:, 1:]
    ok[:, -1] = False
    ok[:, 0] = False
    score = torch.rand(B, T, device=dev, generator=generator).masked_fill(~ok, -1.0)
    top, anchors = score.topk(min(N, T), dim=1)
    anchor_ok = top >= 0  # [B, N]
    N = anchors.shape[1]
    # Labels x_{a+1..a+K}, Markov predecessors x_{a..a+K-1}, valid prefix (cumulative product).
    offs = torch.arange(K + 1, device=dev)
    tpos = (anchors[:, :, None] + offs).clamp(max=T - 1)  # [B,N,K+1]
    toks = torch.gather(ids, 1, tpos.view(B, -1)).view(B, N, K + 1)
    lm = torch.gather(loss_mask, 1, tpos.view(B, -1)).view(B, N, K + 1)
    in_range = (anchors[:, :, None] + offs) < T
    row_ok = (lm[:, :, 1:] & in_range[:, :, 1:]).long().cumprod(-1).bool() & anchor_ok[:, :, None]
    labels, prev = toks[:, :, 1:], toks[:, :, :-1]
    # Backbone.
    ctx_all = drafter.context(taps)
    ctx, ctx_pos, ctx_valid = gather_context(ctx_all, anchors, cfg.sliding_window)
    block = torch.full((B, N, K), cfg.mask_token_id, device=dev, dtype=torch.long)
    block[:, :, 0] = toks[:, :, 0]
    emb = F.embedding(block, embed_weight).view(B * N, K, -1).to(ctx.dtype)
    h = drafter.backbone(ctx, ctx_pos, ctx_valid, emb, anchors.reshape(-1))
    z, conf = drafter.heads(h, prev.reshape(B * N, K), lm_head_weight)
    # Target distribution at positions a..a+K-1 (row i predicts token a+i+1).
    ppos = tpos[:, :, :K]
    p_logits = torch.gather(target_logits, 1, ppos.reshape(B, N * K, 1).expand(B, N * K, target_logits.shape[-1]))
    p_logits = p_logits.view(B * N, K, -1).float()
    p_logits[..., cfg.sampling_vocab_size:] = float("-inf")
    p = torch.softmax(p_logits, dim=-1)
    logq = torch.log_softmax(z, dim=-1)
    q = logq.exp()
    l1 = (q - p).abs().sum(-1)  # = 2 TV
    ce = F.nll_loss(logq.reshape(-1, logq.shape[-1]), labels.reshape(-1), reduction="none").view(B * N, K)
    c_star = (1.0 - 0.5 * l1).detach().clamp(0, 1)
    bce = F.binary_cross_entropy_with_logits(conf, c_star, reduction="none")
    w = torch.exp(-torch.arange(K, device=dev, dtype=torch.float32) / 4.0)[None, :] * row_ok.view(B * N, K).float()
    denom = w.sum().clamp(min=1.0)
    loss = ((0.1 * ce + 0.9 * l1 + 1.0 * bce) * w).sum() / denom
    if not with_stats:  # statistics read back to the host: skip them on most training steps
        return loss, None
    with torch.no_grad():
        match = (z.argmax(-1) == p_logits.argmax(-1)).float()
        valid = row_ok.view(B * N, K).float()
        stats = {"ce": float((ce * w).sum() / denom), "l1": float((l1 * w).sum() / denom),
                 "bce": float((bce * w).sum() / denom),
                 "argmax_match_per_row": [float((match[:, i] * valid[:, i]).sum() / valid[:, i].sum().clamp(min=1))
                                          for i in range(K)]}
    return loss, stats


@torch.no_grad()
def draft_greedy(drafter, ctx_all, anchor_positions, anchor_tokens, embed_weight, lm_head_weight):
    """Greedy drafts for a set of anchors in one sequence.

    ctx_all [T, H] context vectors of the sequence (only positions < anchor are read);
    anchor_positions / anchor_tokens [N]. Returns drafts [N, k] and confidences [N, k]; the
    Markov predecessor of row i is the anchor (i = 0) or the previous greedy draft."""
    cfg = drafter.cfg
    K = cfg.block_size
    ctx, ctx_pos, ctx_valid = gather_context(ctx_all[None], anchor_positions[None], cfg.sliding_window)
    block = torch.full((anchor_tokens.shape[0], K), cfg.mask_token_id, device=ctx_all.device, dtype=torch.long)
    block[:, 0] = anchor_tokens
    h = drafter.backbone(ctx, ctx_pos, ctx_valid, F.embedding(block, embed_weight).to(ctx.dtype), anchor_positions)
    prev = anchor_tokens
    drafts, confs = [], []
    for i in range(K):  # the Markov head runs serially over the rows
        e = drafter.markov_head.markov_w1(prev)
        z = F.linear(h[:, i], lm_head_weight) + drafter.markov_head.markov_w2(e)
        z = z.float()
        z[..., cfg.sampling_vocab_size:] = float("-inf")
        c = torch.sigmoid(drafter.confidence_head.proj(torch.cat([h[:, i], e], dim=-1)).squeeze(-1))
        prev = z.argmax(-1)
        drafts.append(prev)
        confs.append(c)
    return torch.stack(drafts, 1), torch.stack(confs, 1)


def save_drafter(drafter, directory):
    os.makedirs(directory, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in drafter.state_dict().items()}
    ref._write_safetensors(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(drafter.cfg.to_hf_dict(), f, indent=2)
        f.write("\n")


def load_drafter(directory, dtype=torch.float32):
    with open(os.path.join(directory, "config.json")) as f:
        cfg = DrafterConfig.from_hf_dict(json.load(f))
    drafter = DSparkDrafter(cfg)
    tensors = ref.read_safetensors(os.path.join(directory, "model.safetensors"))
    drafter.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=True)
    return drafter.to(dtype)


class TapRecorder:
    """Forward hooks on the target's decoder layers: the residual stream after each tapped layer."""

    def __init__(self, target, layer_ids):
        self.outputs = {}
        self.handles = []
        for l in layer_ids:
            layer = target.model.language_model.layers[l]
            self.handles.append(layer.register_forward_hook(self._hook(l)))
        self.layer_ids = list(layer_ids)

    def _hook(self, l):
        def fn(module, args, output):
            self.outputs[l] = output[0]
        return fn

    def features(self):
        return torch.cat([self.outputs[l] for l in self.layer_ids], dim=-1)

    def close(self):
        for h in self.handles:
            h.remove()
