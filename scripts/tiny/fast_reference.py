"""Dense evaluation of the reference's latent experts, for training and evaluating muse-tiny.

The reference (scripts/fixtures/muse_spark_reference.py) loops over experts and gathers each
expert's tokens, which costs ~15 small operations and a host sync per expert and layer. With
16 tiny experts it is far cheaper to run every expert on every token with two batched
matmuls and give the unchosen experts weight zero: the result is the same sum (only the
summation order differs), and gradients reach exactly the parameters the sparse forward
reaches. `enable()` swaps this in for `SparkExperts.forward`; `check()` compares it with the
original on random inputs before anything relies on it.
"""

import torch
import torch.nn.functional as F

import muse_spark_reference as ref

_original_forward = ref.SparkExperts.forward


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
