"""Block-sparse attention with Sol-style routing and folded mean blocks (contract: approximate).

A call is two stages, each in its own module:
- `block_sparse_routing`: q, k, v are cut into blocks of `BLOCK` = 64 tokens and reduced to block means; a key
  block j is exact for query block i when its proxy score `mean_q(i) . mean_k(j) * scale` exceeds
  `mean + tau * std` of that row's scores, or `|i - j| <= 1`, or it overlaps the sinks `[0, sink_tokens)`; each
  query block's exact key blocks are compacted into an ascending list (`plan` returns them as a `Plan`).
- `block_sparse_attend`: one softmax per query row over the exact keys plus one pseudo-key per folded (not exact)
  key block, with key `mean_k(j)`, value `mean_v(j)` and `log(length_j)` on its logit, so it weighs as `length_j`
  identical keys (`attend`).

Higher `tau` means fewer exact blocks; `tau = -inf` makes every block exact (dense attention). Density is the
fraction of exact (query block, key block) pairs, averaged over batch and heads.

Layout: q (B, H, Tq, 128), k and v (B, H, Tk, 128); q any strides, k and v with unit last stride and 16-byte
aligned base and strides (the kernel reads them through TMA descriptors; ValueError otherwise). The output is
contiguous (B, H, Tq, 128) in q's dtype. Non-causal, forward only. Head dim 128 only. bfloat16 is the production
dtype; float32 is accepted (on a GPU its dots run in IEEE precision).

Contract against `reference` (dense fp32 torch maths of the same method on torch's routing, `routing`): the kernel's
plan makes its block means in one Triton launch (fp32, another sum order), so a block whose score ties its row's
threshold within rounding could route differently; otherwise the two differ only in rounding (fp32: ~1e-6; bf16 on
a GPU: the kernel feeds bf16 probabilities to the P @ V dot, as flash attention does, and rounds the fp32 mean
keys/values to bf16 for the folded dots; ~1e-2 absolute on unit-scale values; the output itself is rounded to
bf16).
"""

from __future__ import annotations

import torch

from workbench.kernels._runtime import check_qkv, check_runtime, dtype_size, interpreting
from workbench.kernels.block_sparse_attend import AMPERE_ADA, DEFAULT, Launch, Plan, attend, launch_for
from workbench.kernels.block_sparse_routing import (
    BLOCK,
    block_means,
    block_means_torch,
    check_tau,
    exact_lists,
    route,
    routing,
)

HEAD_DIM = 128
DTYPES = (torch.float32, torch.bfloat16)

__all__ = [
    "AMPERE_ADA",
    "BLOCK",
    "DEFAULT",
    "DTYPES",
    "HEAD_DIM",
    "Launch",
    "Plan",
    "attend",
    "block_sparse_attention",
    "cost",
    "launch_for",
    "plan",
    "reference",
    "routing",
]


def _layout(arg: str, tensor: torch.Tensor) -> str | None:
    if tensor.ndim != 4:
        return f"{arg} must be (B, H, T, D), got shape {tuple(tensor.shape)}"
    if tensor.shape[-1] != HEAD_DIM:
        return f"{arg} has head dim {tensor.shape[-1]}; only {HEAD_DIM} is supported"
    return None


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_qkv("block_sparse_attention", q, k, v, DTYPES, _layout)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: float, sink_tokens: int, scale: float | None = None
) -> torch.Tensor:
    """Dense fp32 torch maths of the same method (torch's routing): exact keys plus one pseudo-key per folded
    block, in one softmax. Returns (B, H, Tq, D) in q's dtype."""
    _check(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask, _ = routing(q, k, tau, sink_tokens, scale=scale)
    tq, tk = q.shape[2], k.shape[2]
    k_mean, lengths = block_means_torch(k, BLOCK)
    v_mean, _ = block_means_torch(v, BLOCK)
    qf = q.float()
    row_block = torch.arange(tq, device=q.device) // BLOCK
    col_block = torch.arange(tk, device=q.device) // BLOCK
    exact_tokens = mask[:, :, row_block][:, :, :, col_block]  # (B, H, Tq, Tk)
    exact_rows = mask[:, :, row_block]  # (B, H, Tq, Kb)
    logits = (qf @ k.float().transpose(-1, -2) * scale).masked_fill(~exact_tokens, float("-inf"))
    pseudo = (qf @ k_mean.transpose(-1, -2) * scale + lengths.log()).masked_fill(exact_rows, float("-inf"))
    probs = torch.softmax(torch.cat([logits, pseudo], -1), -1)
    out = probs[..., :tk] @ v.float() + probs[..., tk:] @ v_mean
    return out.to(q.dtype)


def plan(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: float, sink_tokens: int, scale: float | None = None
) -> Plan:
    """The routing and the kernel's index lists (the part of a call before the attention kernel): block means in
    one Triton launch (k/v means rounded once to bf16 for a bf16 GPU call), torch's threshold, Triton compaction."""
    _check(q, k, v)
    check_tau(tau, sink_tokens)
    check_runtime("block_sparse_attention", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bf16 = q.dtype == torch.bfloat16 and not interpreting()
    q_mean, k_mean, k_mean_dot, v_mean_dot, log_len = block_means(q, k, v, torch.bfloat16 if bf16 else torch.float32)
    mask, density = route(q_mean, k_mean, tau, sink_tokens, BLOCK, scale)
    mask = mask.contiguous()
    idx, count = exact_lists(mask)
    return Plan(k_mean_dot.contiguous(), v_mean_dot.contiguous(), log_len, mask, idx, count, density, scale)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tau: float,
    sink_tokens: int,
    scale: float | None = None,
    return_density: bool = False,
    launch: Launch | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`reference(q, k, v, tau, sink_tokens)` up to the contract (module doc): `plan`, then `attend`.

    Exact key blocks load their 64 keys (only those: a compacted index list per query block); folded ones enter
    as mean keys/values, 64 pseudo-keys per dot, with the log-length bias. With `return_density`, also the routing
    density as a 0-dim tensor on q's device (no host sync: `float()` it when needed). `launch` defaults to
    `launch_for(q.device)` (the H200's launch on sm_90+, AMPERE_ADA below)."""
    route = plan(q, k, v, tau, sink_tokens, scale)
    out = attend(q, k, v, route, launch)
    return (out, route.density) if return_density else out


def cost(shape: tuple[int, int, int, int], density: float, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(bytes_moved, flops) for q, k, v of `shape` (B, H, T, D) at routing `density` (fraction of exact
    block pairs). Bytes: q read and output written once, K/V of each exact block pair read once per
    query block, the fp32 mean K/V of the folded blocks read once per query block. Flops: 4*D per exact
    (query, key) pair (QK^T and PV), 4*D per (query, folded block) pair. Both are lower bounds: the folded
    pass works in chunks of 64 mean keys and computes a chunk whole when any block in it is folded.
    Routing and softmax exponentials are not counted."""
    b, h, t, d = shape
    nb = -(-t // BLOCK)
    size = dtype_size(dtype)
    exact_pairs = density * nb * nb
    folded_pairs = (1.0 - density) * nb * nb
    bytes_moved = b * h * (2 * t * d * size + exact_pairs * 2 * BLOCK * d * size + folded_pairs * 2 * d * 4)
    flops = b * h * (exact_pairs * BLOCK * BLOCK * 4 * d + folded_pairs * BLOCK * 4 * d)
    return int(bytes_moved), int(flops)
