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

Layout: q (B, H, Tq, D), k and v (B, H, Tk, D); q any strides, k and v with unit last stride and 16-byte
aligned base and strides (the kernel reads them through TMA descriptors; ValueError otherwise). The output is
contiguous (B, H, Tq, D) in q's dtype. Non-causal, forward only. D is the kernel's for 32, 64 and 128 (128 is the
production case); another D up to 128 is zero-padded to the next of them
(`_runtime.pad_head_dim`: a copy of q, k, v; routing, softmax and the first D output columns are unchanged). bfloat16
is the production dtype; float32 is accepted (on a GPU its dots run in IEEE precision).

Low precision (`precision="int8"` or `"e4m3"`, with `pv` "fp8", "int8" or "bf16"; default "exact"): the routing and the
folded blocks are unchanged; the exact blocks run `fp8_attention`'s quantized steps (`quantized_pair` and
`quantized_tile`, the same device functions) on `attention_quantize.quantize`'s operands of the same call: q and the
mean-smoothed k per 128 tokens in int8 or e4m3, v in e4m3, int8 or bf16, P rounded per step of the online softmax (two
64-key blocks of a query block's list, or one: `visits`). The key mean is `key_mean_from_blocks` of the plan's k
block means and v's amax comes from the same launch (`plan(..., stats=True)`), so the quantizer reads k and v once
each. The folded blocks' mean keys are smoothed by the same key mean (in fp32, then rounded to the dot dtype), so
exact and folded logits shift by the same `q . mean(k)` and the softmax is unchanged. Needs FP8 tensor cores (sm_89+,
RuntimeError below). Its contract: `reference(..., precision, pv, key_mean=plan(..., stats=True).key_mean)`
(`_lowbit_reference`: the same quantized operands, the same block order, fp32 torch maths) up to fp32 summation order
and exp2's last bit crossing a rounding boundary of P (fp32 inputs: under 5e-4 relative L2, the bound
tests/kernels/test_block_sparse_attention.py holds); without the plan's key mean, the reference takes it from torch's
block means, whose fp32 sum order can move a quantized key by one step. Against the exact path its error is fp8_attention's at the same precisions.

Contract against `reference` (dense fp32 torch maths of the same method on torch's routing, `routing`): the kernel's
plan makes its block means in one Triton launch (fp32, another sum order), so a block whose score ties its row's
threshold within rounding could route differently; otherwise the two differ only in rounding (fp32: ~1e-6; bf16 on
a GPU: the kernel feeds bf16 probabilities to the P @ V dot, as flash attention does, and rounds the fp32 mean
keys/values to bf16 for the folded dots; ~1e-2 absolute on unit-scale values; the output itself is rounded to
bf16).
"""

from __future__ import annotations

import dataclasses

import torch

from workbench.kernels import attention_quantize
from workbench.kernels._runtime import (
    MAX_HEAD_DIM,
    check_fp8,
    check_qkv,
    check_runtime,
    dtype_size,
    head_dim_problem,
    interpreting,
    pad_head_dim,
)
from workbench.kernels.attention_quantize import quantize, quantize_reference
from workbench.kernels.block_sparse_attend import AMPERE_ADA, DEFAULT, Launch, Plan, attend, launch_for
from workbench.kernels.block_sparse_routing import (
    BLOCK,
    block_means,
    block_means_torch,
    check_tau,
    exact_lists,
    key_mean_from_blocks,
    route,
    routing,
)
from workbench.kernels.fp8_attention import LOG2E, PV_MODES, QK_MODES, check_kernel, online_step, reference_logits

DTYPES = (torch.float32, torch.bfloat16)
PRECISIONS = ("exact", *QK_MODES)

__all__ = [
    "AMPERE_ADA",
    "BLOCK",
    "DEFAULT",
    "DTYPES",
    "MAX_HEAD_DIM",
    "PRECISIONS",
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


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_qkv("block_sparse_attention", q, k, v, DTYPES, head_dim_problem)


def _check_precision(precision: str, pv: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"block_sparse_attention: precision: {precision!r}; allowed: {list(PRECISIONS)}")
    if pv not in PV_MODES:
        raise ValueError(f"block_sparse_attention: pv: {pv!r}; allowed: {list(PV_MODES)}")


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tau: float,
    sink_tokens: int,
    scale: float | None = None,
    precision: str = "exact",
    pv: str = "fp8",
    return_density: bool = False,
    key_mean: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Dense fp32 torch maths of the same method (torch's routing): exact keys plus one pseudo-key per folded
    block, in one softmax; with a low `precision`, `_lowbit_reference` (`key_mean` (B, H, 1, D') fp32, D' >= D: the
    smoothing vector, its first D channels; default `key_mean_from_blocks` of torch's block means). Returns
    (B, H, Tq, D) in q's dtype; with `return_density`, also the routing density as a 0-dim tensor, as
    `block_sparse_attention` returns it."""
    _check(q, k, v)
    _check_precision(precision, pv)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask, density = routing(q, k, tau, sink_tokens, scale=scale)
    if precision != "exact":
        out = _lowbit_reference(q, k, v, mask, scale, precision, pv, key_mean)
    else:
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
        out = (probs[..., :tk] @ v.float() + probs[..., tk:] @ v_mean).to(q.dtype)
    return (out, torch.tensor(density, device=q.device)) if return_density else out


def _lowbit_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    qk: str,
    pv: str,
    key_mean: torch.Tensor | None,
) -> torch.Tensor:
    """The low-precision kernel's maths in fp32 torch on routing `mask` (B, H, Qb, Kb): `quantize_reference` with the
    key mean `key_mean` (`reference`), then the online softmax over the exact key blocks in ascending order (P
    rounded per block as `quantized_tile` does, v's one-byte scale applied after them), then the folded blocks'
    smoothed mean keys 64 at a time, unrounded."""
    k_mean, lengths = block_means_torch(k, BLOCK)
    smoothing = key_mean_from_blocks(k_mean) if key_mean is None else key_mean[..., : k.shape[-1]]
    z = quantize_reference(q, k, v, pv, qk=qk, k_mean=smoothing)
    tq = q.shape[2]
    logits, values = reference_logits(z, tq, k.shape[2], scale)
    exact_rows = mask[:, :, torch.arange(tq, device=q.device) // BLOCK]  # (B, H, Tq, Kb)
    v_mean, _ = block_means_torch(v, BLOCK)
    qk_scale = torch.tensor(scale * LOG2E, dtype=torch.float32)
    folded = (q.float() @ (k_mean - z.k_mean).transpose(-1, -2) * qk_scale + lengths.log() * LOG2E).masked_fill(
        exact_rows, float("-inf")
    )  # (B, H, Tq, Kb) in log2 units
    b, h, qb = mask.shape[:3]
    rows = qb * BLOCK  # the query rows in whole blocks (B, H, Qb, 64, ...) while the exact blocks are visited
    logits = torch.nn.functional.pad(logits, (0, 0, 0, rows - tq)).view(b, h, qb, BLOCK, -1)
    m = torch.full((b, h, qb, BLOCK), float("-inf"), device=q.device)
    l = torch.zeros((b, h, qb, BLOCK), device=q.device)  # noqa: E741
    acc = torch.zeros((b, h, qb, BLOCK, q.shape[-1]), device=q.device)
    values = values[:, :, None].expand(-1, -1, qb, -1, -1)  # (B, H, Qb, Tk, D), a view
    tk, offsets = k.shape[2], torch.arange(BLOCK, device=q.device)
    for step in visits(mask, tk).unbind(3):  # (B, H, Qb, 2) key blocks of each query block's step, -1 none
        keys = (step.clamp(min=0)[..., None] * BLOCK + offsets).flatten(-2)  # (B, H, Qb, 128) key indices
        real = (step[..., None] >= 0).expand(-1, -1, -1, -1, BLOCK).flatten(-2) & (keys < tk)
        keys = keys.clamp(max=tk - 1)
        s = torch.gather(logits, 4, keys[:, :, :, None, :].expand(-1, -1, -1, BLOCK, -1))
        s = s.masked_fill(~real[:, :, :, None, :], float("-inf"))  # (B, H, Qb, 64, 128)
        step_values = torch.gather(values, 3, keys[..., None].expand(-1, -1, -1, -1, values.shape[-1]))
        m, l, acc = online_step(s, step_values, m, l, acc, pv)  # noqa: E741
    m, l, acc = (x.flatten(2, 3)[:, :, :tq] for x in (m, l, acc))  # noqa: E741
    if pv != "bf16":
        acc = acc * z.v_scale[:, :, None, :]
    for c in range(0, mask.shape[-1], BLOCK):  # folded blocks' pseudo-keys
        m, l, acc = online_step(folded[..., c : c + BLOCK], v_mean[:, :, c : c + BLOCK], m, l, acc, None)  # noqa: E741
    return (acc / l[..., None]).to(q.dtype)


def visits(mask: torch.Tensor, tk: int) -> torch.Tensor:
    """The low-precision kernel's steps over each query block's exact key blocks (mask (B, H, Qb, Kb)): its
    ascending list in pairs, an odd one out alone, then alone the last key block when it is exact and ends past Tk
    (`tk` keys; masked). (B, H, Qb, S, 2) block indices, -1 where a step holds one block or a query block has fewer
    steps."""
    b, h, qb, kb = mask.shape
    partial = tk % BLOCK != 0
    steps = []
    for blocks in mask.reshape(-1, kb).tolist():
        exact = [j for j, keep in enumerate(blocks) if keep]
        last = [[exact.pop(), -1]] if partial and exact and exact[-1] == kb - 1 else []
        pairs = [exact[i : i + 2] + [-1] * (i + 2 > len(exact)) for i in range(0, len(exact), 2)]
        steps.append(pairs + last)
    width = max(1, max(len(step) for step in steps))
    padded = [step + [[-1, -1]] * (width - len(step)) for step in steps]
    return torch.tensor(padded, dtype=torch.long, device=mask.device).view(b, h, qb, width, 2)


def plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tau: float,
    sink_tokens: int,
    scale: float | None = None,
    stats: bool = False,
) -> Plan:
    """The routing and the kernel's index lists (the part of a call before the attention kernel): block means in
    one Triton launch (k/v means rounded once to bf16 for a bf16 GPU call), torch's threshold, Triton compaction.
    The plan's means have the kernel's head dim (`_runtime.kernel_head_dim`). `stats`: also the low-precision
    quantizer's statistics from the same launch (`Plan.key_mean`, `Plan.v_amax`)."""
    _check(q, k, v)
    check_tau(tau, sink_tokens)
    check_runtime("block_sparse_attention", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v = pad_head_dim(q, k, v)
    bf16 = q.dtype == torch.bfloat16 and not interpreting()
    means = block_means(q, k, v, torch.bfloat16 if bf16 else torch.float32, stats)
    mask, density = route(means.q_mean, means.k_mean, tau, sink_tokens, BLOCK, scale)
    mask = mask.contiguous()
    idx, count = exact_lists(mask)
    k_mean, v_mean = means.k_mean_dot.contiguous(), means.v_mean_dot.contiguous()
    return Plan(k_mean, v_mean, means.log_len, mask, idx, count, density, scale, means.key_mean, means.v_amax)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tau: float,
    sink_tokens: int,
    scale: float | None = None,
    return_density: bool = False,
    launch: Launch | None = None,
    precision: str = "exact",
    pv: str = "fp8",
    kernel: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`reference(q, k, v, tau, sink_tokens)` up to the contract (module doc): `plan`, then `attend`.

    Exact key blocks load their 64 keys (only those: a compacted index list per query block); folded ones enter
    as mean keys/values, 64 pseudo-keys per dot, with the log-length bias. With `return_density`, also the routing
    density as a 0-dim tensor on q's device (no host sync: `float()` it when needed). `kernel` and `launch` as
    `attend` takes them (a launch needs kernel="triton"; default `launch_for(q.device)`: DEFAULT on sm_90+,
    AMPERE_ADA below). `precision` "int8" / "e4m3" with `pv`: the exact blocks in low precision (module doc),
    `reference(..., precision, pv)` up to its contract."""
    _check_precision(precision, pv)
    check_kernel("block_sparse_attention", kernel, launch, Launch)
    _check(q, k, v)
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else scale
    q, k, v = pad_head_dim(q, k, v)
    route = plan(q, k, v, tau, sink_tokens, scale, stats=precision != "exact")
    if precision == "exact":
        out = attend(q, k, v, route, launch, kernel=kernel)
    else:
        check_fp8("block_sparse_attention", q.device)
        z = quantize(q, k, v, pv, qk=precision, k_mean=route.key_mean, v_amax=route.v_amax)
        smoothed = (route.k_mean.float() - z.k_mean).to(route.k_mean.dtype)  # the shift the exact keys took
        out = attend(q, k, v, dataclasses.replace(route, k_mean=smoothed), launch, z, kernel)
    out = out if d == out.shape[-1] else out[..., :d].contiguous()
    return (out, route.density) if return_density else out


def cost(
    shape: tuple[int, int, int, int],
    density: float,
    dtype: torch.dtype = torch.bfloat16,
    precision: str = "exact",
    pv: str = "fp8",
) -> tuple[int, int]:
    """(bytes_moved, flops) for q, k, v of `shape` (B, H, T, D) at routing `density` (fraction of exact
    block pairs), both lower bounds, so `bytes / bandwidth` and `flops / peak` bound the time from below. Bytes: what
    must cross DRAM once: q, k, v read and the output written in `dtype`, the fp32 mean K/V of every block read once
    (re-reads of K/V blocks by other query blocks are assumed to hit L2, as `fp8_attention.cost` assumes); with a low
    `precision` the kernel reads q8, one-byte keys and one-byte (pv "fp8", "int8") or two-byte values besides q, and the
    quantization (`attention_quantize.cost`) is added. Flops: 4*D per exact (query, key) pair (QK^T and PV), 4*D per
    (query, folded block) pair; the folded pass works in chunks of 64 mean keys and computes a chunk whole when any
    block in it is folded. Routing and softmax exponentials are not counted."""
    _check_precision(precision, pv)
    b, h, t, d = shape
    nb = -(-t // BLOCK)
    size = dtype_size(dtype)
    exact_pairs = density * nb * nb
    folded_pairs = (1.0 - density) * nb * nb
    if precision == "exact":
        kernel = 4 * t * d * size  # q, k, v in, out
    else:
        kernel = 2 * t * d * size + (4 if pv == "bf16" else 3) * t * d  # q in, out; q8, k8, v in
    means = nb * 2 * d * 4
    bytes_moved = b * h * (kernel + means) + (0 if precision == "exact" else attention_quantize.cost(shape, pv, dtype))
    flops = b * h * (exact_pairs * BLOCK * BLOCK * 4 * d + folded_pairs * BLOCK * 4 * d)
    return int(bytes_moved), int(flops)
