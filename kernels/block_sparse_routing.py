"""Block-sparse attention, stage 1: the routing (block means, proxy scores, threshold -> per-query-block key lists).

The maths (public facts about Sol-Attn, written here from scratch):

- Tokens are cut into blocks of `BLOCK` = 64 (the last block may be partial; every mean divides by a block's true
  length).
- q, k and v are reduced to per-block means. The proxy score of (query block i, key block j) is the mean over the
  query rows of i of `q . mean_k(j) * scale`, which equals `mean_q(i) . mean_k(j) * scale`.
- Key block j is exact for query block i when (any of): its score exceeds `mean + tau * std` of the row's block
  scores (per batch, head and query block; `std` is the population standard deviation over the key blocks), or
  `|i - j| <= 1` (the diagonal band), or the block overlaps the sink range `[0, sink_tokens)`. `tau = -inf` makes
  every block exact, `tau = +inf` none by score. Every other key block is folded (see block_sparse_attend).
- Density: the fraction of exact (query block, key block) pairs, averaged over batch and heads. The threshold is
  invariant to `scale` (for scale > 0).

Two ways to the same routing, both fp32:
- `routing(q, k, ...)` (used by `reference`): torch block means (`block_means_torch`, strided sums in fp32 without
  an fp32 copy of the input), torch scores and `std_mean`.
- the kernel's plan: `block_means` computes the q/k/v means and the log block lengths in one Triton launch (one
  program per (batch*head, block, tensor), the same fp32 sum over a block's tokens and IEEE division; the sum order
  is Triton's, so the means equal torch's up to fp32 sum order), then the same torch `route`, then `exact_lists`
  compacts each row's exact key blocks into an ascending index list (one small Triton kernel; replaces a stable
  argsort). A block whose score ties its row's threshold within rounding could route differently in the two.

Layout: q (B, H, Tq, D), k (B, H, Tk, D), any strides. Means (B, H, nb, D) contiguous; mask bool (B, H, Qb, Kb);
idx int32 (B, H, Qb, Kb) whose first count[b, h, i] entries are the exact key blocks of query block i, ascending;
count int32 (B, H, Qb).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from workbench.kernels._runtime import LazyKernel, interpreting

BLOCK = 64
MEANS_WARPS = 4  # warps of the means launch on a GPU: one (64, D) tile per program


def _block_means_qkv(
    q_ptr, k_ptr, v_ptr, qm_ptr, km_ptr, km_dot_ptr, vm_dot_ptr, loglen_ptr, vamax_ptr,
    H, TQ, TK, QB, KB, log_full, log_last,
    q_sb, q_sh, q_st, q_sd,
    k_sb, k_sh, k_st, k_sd,
    v_sb, v_sh, v_st, v_sd,
    BLOCK: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr, V_AMAX: tl.constexpr,
):  # fmt: skip
    """One program per (batch*head, block index, tensor): program axis 2 picks q (0), k (1) or v (2) and the program
    reduces that tensor's block `blk` (where it exists; Tq may differ from Tk) to its fp32 mean, dividing by the
    block's true length with IEEE division as torch does. The routing reads the fp32 q/k means, the attention
    kernel the k/v means in its dot dtype: with SPLIT the k means are stored a second time, rounded, in km_dot's
    dtype (else km_dot is km). The k programs of batch*head 0 also write the (KB,) log block lengths. With V_AMAX
    the v programs also store the block's per-channel max of |v| (fp32, exact), NaN where the block's channel
    holds a NaN or an inf."""
    # tl.reduce with tl.standard's combine, not tl.sum: tl.sum is a JITFunction decorated when triton was imported,
    # which the interpreter cannot call when TRITON_INTERPRET was set later (LazyKernel's case)
    bh = tl.program_id(0)
    blk = tl.program_id(1)
    part = tl.program_id(2)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    tokens = blk * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    toff = tokens.to(tl.int64)[:, None]
    d = tl.arange(0, D).to(tl.int64)
    if (blk < QB) & (part == 0):
        n = tl.minimum(TQ - blk * BLOCK, BLOCK).to(tl.float32)
        x = tl.load(
            q_ptr + b * q_sb + h * q_sh + toff * q_st + d[None, :] * q_sd, mask=(tokens < TQ)[:, None], other=0.0
        )  # (BLOCK, D)
        mean = tl.fdiv(tl.reduce(x.to(tl.float32), 0, tl.standard._sum_combine), n, ieee_rounding=True)  # (D,)
        tl.store(qm_ptr + (bh.to(tl.int64) * QB + blk) * D + d, mean)
    if (blk < KB) & (part != 0):
        n = tl.minimum(TK - blk * BLOCK, BLOCK).to(tl.float32)
        key_ok = (tokens < TK)[:, None]
        out = (bh.to(tl.int64) * KB + blk) * D + d
        if part == 1:
            x = tl.load(k_ptr + b * k_sb + h * k_sh + toff * k_st + d[None, :] * k_sd, mask=key_ok, other=0.0)
            k_mean = tl.fdiv(tl.reduce(x.to(tl.float32), 0, tl.standard._sum_combine), n, ieee_rounding=True)
            tl.store(km_ptr + out, k_mean)
            if SPLIT:
                tl.store(km_dot_ptr + out, k_mean.to(km_dot_ptr.dtype.element_ty))
            if bh == 0:
                tl.store(loglen_ptr + blk, tl.where(blk == KB - 1, log_last, log_full))
        else:
            x = tl.load(v_ptr + b * v_sb + h * v_sh + toff * v_st + d[None, :] * v_sd, mask=key_ok, other=0.0)
            v_mean = tl.fdiv(tl.reduce(x.to(tl.float32), 0, tl.standard._sum_combine), n, ieee_rounding=True)
            tl.store(vm_dot_ptr + out, v_mean.to(vm_dot_ptr.dtype.element_ty))
            if V_AMAX:  # rows past Tk are zeros; a sum of x * 0 is NaN iff a NaN or inf is there (max skips NaN)
                xf = x.to(tl.float32)
                amax = tl.reduce(tl.abs(xf), 0, tl.standard._elementwise_max)
                tl.store(vamax_ptr + out, amax + tl.reduce(xf * 0.0, 0, tl.standard._sum_combine))


def _compact(mask_ptr, idx_ptr, count_ptr, KB, KB_P2: tl.constexpr):
    """One program per (batch*head, query block) row of the mask: the ascending list of its exact key blocks,
    written to the front of its idx row (inclusive prefix sum - 1 as the position), and its length."""
    row = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
    cols = tl.arange(0, KB_P2)
    exact = (tl.load(mask_ptr + row * KB + cols, mask=cols < KB, other=0) != 0).to(tl.int32)
    pos = tl.associative_scan(exact, 0, tl.standard._sum_combine) - 1
    tl.store(idx_ptr + row * KB + pos, cols, mask=exact != 0)
    tl.store(count_ptr + row, tl.reduce(exact, 0, tl.standard._sum_combine))


_MEANS = LazyKernel(_block_means_qkv)
_COMPACT = LazyKernel(_compact)


def block_means_torch(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, T, D) of any strides -> per-block means (B, H, nb, D) in fp32 and the block lengths (nb,) as fp32.

    Sums accumulate in fp32 without an fp32 copy of `x` (a 32k-token bf16 K would otherwise cost ~200 MB)."""
    t = x.shape[2]
    full, rest = divmod(t, block)
    parts = []
    if full:
        parts.append(x[:, :, : full * block].unflatten(2, (full, block)).sum(3, dtype=torch.float32) / block)
    if rest:
        parts.append(x[:, :, full * block :].sum(2, keepdim=True, dtype=torch.float32) / rest)
    lengths = torch.full((full + (rest > 0),), float(block), device=x.device)
    if rest:
        lengths[-1] = float(rest)
    return torch.cat(parts, 2) if len(parts) > 1 else parts[0], lengths


class Means(NamedTuple):
    """`block_means`' results: q_mean (B, H, Qb, D) and k_mean (B, H, Kb, D) fp32 for the routing; k_mean_dot and
    v_mean_dot (B, H, Kb, D) in the attention kernel's dot dtype (k_mean_dot is k_mean itself when that is fp32);
    log_len (Kb,) fp32; with `stats`, the low-precision quantizer's statistics, else None: key_mean (B, H, 1, D) fp32
    (`key_mean_from_blocks`) and v_amax (B, H, D) fp32, v's per-channel max of |v| over its tokens."""

    q_mean: torch.Tensor
    k_mean: torch.Tensor
    k_mean_dot: torch.Tensor
    v_mean_dot: torch.Tensor
    log_len: torch.Tensor
    key_mean: torch.Tensor | None
    v_amax: torch.Tensor | None


def key_mean_from_blocks(block_means: torch.Tensor) -> torch.Tensor:
    """The key smoothing vector of block_sparse's low precision (`attention_quantize`'s step 1), (B, H, 1, D) fp32:
    the mean of k's fp32 block means (B, H, Kb, D), each block weighing alike (k's token mean but for a ragged last
    block's weight; any vector common to a head's keys leaves the softmax unchanged)."""
    return block_means.mean(2, keepdim=True)


def block_means(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dot_dtype: torch.dtype, stats: bool = False
) -> Means:
    """The block means of q, k and v and the log block lengths in one launch (`_block_means_qkv`), with `stats` also
    what `attention_quantize.quantize` would otherwise read k and v again for: `key_mean_from_blocks` of k's means,
    and v's per-channel amax (each block's from the same read of v, then torch's max over the blocks).

    The means equal `block_means_torch`' up to fp32 sum order; log_len is `math.log` of each length rounded once to
    fp32, where torch's fp32 log can be an ulp off (on CPU: lengths 7, 47, 49); v_amax equals `v.abs().amax(2)` in
    fp32 (a max is exact in any order) on finite v, and is NaN in a channel holding a NaN or an inf."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    qb, kb = -(-tq // BLOCK), -(-tk // BLOCK)
    q_mean = torch.empty((b, h, qb, d), dtype=torch.float32, device=q.device)
    k_mean = torch.empty((b, h, kb, d), dtype=torch.float32, device=q.device)
    split = dot_dtype != torch.float32
    k_mean_dot = torch.empty_like(k_mean, dtype=dot_dtype) if split else k_mean
    v_mean_dot = torch.empty_like(k_mean, dtype=dot_dtype)
    log_len = torch.empty((kb,), dtype=torch.float32, device=q.device)
    block_amax = torch.empty_like(k_mean) if stats else log_len  # (B, H, Kb, D); a placeholder when not asked
    last = tk - (kb - 1) * BLOCK  # the last key block's length
    _MEANS[(b * h, max(qb, kb), 3)](
        q, k, v, q_mean, k_mean, k_mean_dot, v_mean_dot, log_len, block_amax,
        h, tq, tk, qb, kb, math.log(BLOCK), math.log(last),
        *q.stride(), *k.stride(), *v.stride(),
        BLOCK=BLOCK, D=d, SPLIT=split, V_AMAX=stats, **({} if interpreting() else {"num_warps": MEANS_WARPS}),
    )  # fmt: skip
    if not stats:
        return Means(q_mean, k_mean, k_mean_dot, v_mean_dot, log_len, None, None)
    return Means(q_mean, k_mean, k_mean_dot, v_mean_dot, log_len, key_mean_from_blocks(k_mean), block_amax.amax(2))


def check_tau(tau: float, sink_tokens: int) -> None:
    if isinstance(tau, bool) or not isinstance(tau, int | float) or math.isnan(tau):
        raise ValueError(f"block_sparse_attention: tau must be a number (not NaN), got {tau!r}")
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, int) or sink_tokens < 0:
        raise ValueError(f"block_sparse_attention: sink_tokens must be an int >= 0, got {sink_tokens!r}")


def route(
    q_mean: torch.Tensor, k_mean: torch.Tensor, tau: float, sink_tokens: int, block: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing from block means: (mask bool (B, H, Qb, Kb), density as a 0-dim fp32 tensor, no host sync)."""
    scores = q_mean @ k_mean.transpose(-1, -2) * scale  # (B, H, Qb, Kb)
    qb, kb = scores.shape[-2:]
    if tau == float("-inf"):
        mask = torch.ones_like(scores, dtype=torch.bool)
    elif tau == float("inf"):
        mask = torch.zeros_like(scores, dtype=torch.bool)
    else:
        std, mean = torch.std_mean(scores, -1, correction=0, keepdim=True)
        mask = scores > torch.add(mean, std, alpha=tau)
    # never cache a tensor made during CUDA graph capture (it would live in the graph's private pool)
    capturing = scores.is_cuda and torch.cuda.is_current_stream_capturing()
    always = (_always_exact.__wrapped__ if capturing else _always_exact)(qb, kb, block, sink_tokens, scores.device)
    mask = mask | always
    density = torch.mean(mask, dtype=torch.float32) if mask.numel() else torch.ones((), device=scores.device)
    return mask, density


@functools.lru_cache(maxsize=16)
def _always_exact(qb: int, kb: int, block: int, sink_tokens: int, device: torch.device) -> torch.Tensor:
    """(Qb, Kb) bool: the diagonal band (|i - j| <= 1) and the sink key blocks, exact whatever the scores say.
    Made once per shape (a call would otherwise spend eight small launches on it)."""
    i = torch.arange(qb, device=device)[:, None]
    j = torch.arange(kb, device=device)[None, :]
    return ((i - j).abs() <= 1) | (j * block < sink_tokens)


def exact_lists(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact key blocks of each query block, from the contiguous (B, H, Qb, Kb) mask: (idx int32 (B, H, Qb, Kb)
    whose first count entries list them ascending, count int32 (B, H, Qb))."""
    b, h, qb, kb = mask.shape
    idx = torch.empty((b, h, qb, kb), dtype=torch.int32, device=mask.device)
    count = torch.empty((b, h, qb), dtype=torch.int32, device=mask.device)
    _COMPACT[(b * h, qb)](mask.view(torch.uint8), idx, count, kb, KB_P2=triton.next_power_of_2(kb))
    return idx, count


def routing(
    q: torch.Tensor, k: torch.Tensor, tau: float, sink_tokens: int, scale: float | None = None
) -> tuple[torch.Tensor, float]:
    """Which (query block, key block) pairs are exact: (mask bool (B, H, Qb, Kb), density in [0, 1]), from torch's
    means of BLOCK-token blocks. q (B, H, Tq, D), k (B, H, Tk, D). `scale` defaults to 1/sqrt(D); the threshold
    `mean + tau * std` is invariant to it (for scale > 0), it only sets the units of the scores."""
    check_tau(tau, sink_tokens)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask, density = route(
        block_means_torch(q, BLOCK)[0], block_means_torch(k, BLOCK)[0], tau, sink_tokens, BLOCK, scale
    )
    return mask, float(density)
