"""Block-sparse attention with Sol-style routing and folded mean blocks (contract: approximate).

The maths (public facts about Sol-Attn, written here from scratch):

- Tokens are cut into blocks of `BLOCK` = 64 (the last block may be partial; every mean below divides by
  a block's true length).
- K and V are reduced to per-block means. The proxy score of (query block i, key block j) is the mean
  over the query rows of i of `q . mean_k(j) * scale`, which equals `mean_q(i) . mean_k(j) * scale`.
- Key block j is computed exactly for query block i when (any of):
  its score exceeds `mean + tau * std` of the row's block scores (per batch, head and query block; `std`
  is the population standard deviation over the key blocks), or `|i - j| <= 1` (the diagonal band), or
  the block overlaps the sink range `[0, sink_tokens)`. `tau = -inf` makes every block exact.
- Every other key block is not dropped: it enters the same softmax as ONE pseudo-key with key
  `mean_k(j)`, value `mean_v(j)` and `log(length_j)` added to its logit, so it weighs as `length_j`
  identical keys.

Kernel structure: one program per (batch*head, query block of 64 rows). It first walks the compacted list
of that row's exact key blocks (FlashAttention-2 style online softmax over 64x64 tiles), then the folded
blocks' mean keys 64 at a time (one tensor-core dot per chunk, exact blocks masked out, chunks with no
folded block skipped), in the same running max / sum / accumulator.

Higher `tau` means fewer exact blocks. Density is the fraction of exact (query block, key block) pairs,
averaged over batch and heads.

Layout: q (B, H, Tq, 128), k and v (B, H, Tk, 128), any strides; the output is contiguous
(B, H, Tq, 128) in q's dtype. Non-causal, forward only. Head dim 128 only. bfloat16 is the production
dtype; float32 is accepted (for tests: on a GPU the fp32 dots run in IEEE precision).

INTERPRETER_BF16: the Triton CPU interpreter computes `tl.dot` on bfloat16 operands wrongly (numpy has
no bfloat16; the result is off by orders of magnitude), so under `TRITON_INTERPRET=1` the kernel widens
q, k, v to fp32 (exact) and runs fp32 dots. The bf16 tensor-core path (bf16 Q K^T, bf16 P @ V, fp32
accumulation) therefore runs only on a GPU and is **unverified until measured there**.

The routing is computed in torch (fp32) by `routing` and shared by the kernel and `reference`, so the two
agree on which blocks are exact; they differ only in rounding (fp32: ~1e-6; bf16 on a GPU: the kernel
feeds bf16 probabilities to the P @ V dot, as flash attention does, and rounds the fp32 mean keys/values to
bf16 for the folded dots; expected ~1e-2 absolute on unit-scale values; the output itself is rounded to bf16).
"""

from __future__ import annotations

import math

import torch
import triton.language as tl

from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size, interpreting

BLOCK = 64
HEAD_DIM = 128
DTYPES = (torch.float32, torch.bfloat16)
LOG2E = 1.4426950408889634


def _block_sparse_fwd(
    q_ptr, k_ptr, v_ptr, km_ptr, vm_ptr, loglen_ptr, mask_ptr, idx_ptr, count_ptr, out_ptr,
    H, TQ, TK, KB, QB, qk_scale,
    q_sb, q_sh, q_st, q_sd,
    k_sb, k_sh, k_st, k_sd,
    v_sb, v_sh, v_st, v_sd,
    F32: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    # Reductions are tl.reduce with tl.standard's combines, and zeros are tl.full: tl.sum/tl.max/tl.zeros are
    # JITFunctions decorated when triton was imported, which the interpreter cannot call when
    # TRITON_INTERPRET was set later (LazyKernel's case).
    bh = tl.program_id(0)
    qb = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = qb * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK)
    d = tl.arange(0, D).to(tl.int64)
    row_ok = rows < TQ
    q = tl.load(
        q_ptr + b * q_sb + h * q_sh + rows.to(tl.int64)[:, None] * q_st + d[None, :] * q_sd,
        mask=row_ok[:, None],
        other=0.0,
    )  # (BLOCK, D)
    if F32:
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK,), float("-inf"), tl.float32)
    l_i = tl.full((BLOCK,), 0.0, tl.float32)
    acc = tl.full((BLOCK, D), 0.0, tl.float32)
    row = bh.to(tl.int64) * QB + qb
    # 1. Exact key blocks, from the compacted list of this (batch*head, query block) row.
    n_exact = tl.load(count_ptr + row)
    for n in range(0, n_exact):
        j = tl.load(idx_ptr + row * KB + n)
        keys = j * BLOCK + cols
        key_ok = keys < TK
        koff = keys.to(tl.int64)[:, None]
        k = tl.load(k_ptr + b * k_sb + h * k_sh + koff * k_st + d[None, :] * k_sd, mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + b * v_sb + h * v_sh + koff * v_st + d[None, :] * v_sd, mask=key_ok[:, None], other=0.0)
        if F32:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(key_ok[None, :], s * qk_scale, float("-inf"))  # (BLOCK, BLOCK), log2 units
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no finite logit yet stays at zero weight
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        if F32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    # 2. Folded key blocks: their mean keys, BLOCK at a time, as pseudo-keys with log(length) on the logit.
    means = bh.to(tl.int64) * KB * D
    mask_row = mask_ptr + row * KB
    for c in range(0, KB, BLOCK):
        blocks = c + cols
        block_ok = blocks < KB
        folded = tl.load(mask_row + blocks, mask=block_ok, other=1) == 0
        if tl.reduce(folded.to(tl.int32), 0, tl.standard._sum_combine) > 0:  # skip chunks that are all exact
            moff = means + blocks.to(tl.int64)[:, None] * D + d[None, :]
            km = tl.load(km_ptr + moff, mask=block_ok[:, None], other=0.0)  # (BLOCK, D) fp32
            vm = tl.load(vm_ptr + moff, mask=block_ok[:, None], other=0.0)
            if F32:
                s = tl.dot(q, tl.trans(km), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(km.to(q.dtype)))
            bias = tl.load(loglen_ptr + blocks, mask=block_ok, other=0.0) * 1.4426950408889634
            s = tl.where(folded[None, :], s * qk_scale + bias[None, :], float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            if F32:
                pv = tl.dot(p, vm, input_precision="ieee")
            else:
                pv = tl.dot(p.to(q.dtype), vm.to(q.dtype))
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    out = acc / l_i[:, None]
    optr = out_ptr + (bh.to(tl.int64) * TQ + rows.to(tl.int64))[:, None] * D + d[None, :]
    tl.store(optr, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


_KERNEL = LazyKernel(_block_sparse_fwd)


def _block_means(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
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


def _check_tau(tau: float, sink_tokens: int) -> None:
    if isinstance(tau, bool) or not isinstance(tau, int | float) or math.isnan(tau):
        raise ValueError(f"block_sparse_attention: tau must be a number (not NaN), got {tau!r}")
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, int) or sink_tokens < 0:
        raise ValueError(f"block_sparse_attention: sink_tokens must be an int >= 0, got {sink_tokens!r}")


def _route(
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
        mean = scores.mean(-1, keepdim=True)
        std = scores.std(-1, keepdim=True, correction=0)
        mask = scores > mean + tau * std
    i = torch.arange(qb, device=scores.device)[:, None]
    j = torch.arange(kb, device=scores.device)[None, :]
    mask = mask | ((i - j).abs() <= 1) | (j * block < sink_tokens)
    density = mask.float().mean() if mask.numel() else torch.ones((), device=scores.device)
    return mask, density


def routing(
    q: torch.Tensor, k: torch.Tensor, tau: float, sink_tokens: int, block: int = BLOCK, scale: float | None = None
) -> tuple[torch.Tensor, float]:
    """Which (query block, key block) pairs are exact: (mask bool (B, H, Qb, Kb), density in [0, 1]).

    q (B, H, Tq, D), k (B, H, Tk, D). `scale` defaults to 1/sqrt(D); the threshold `mean + tau * std`
    is invariant to it (for scale > 0), it only sets the units of the scores."""
    _check_tau(tau, sink_tokens)
    if block < 1:
        raise ValueError(f"block_sparse_attention: block must be >= 1, got {block}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask, density = _route(_block_means(q, block)[0], _block_means(k, block)[0], tau, sink_tokens, block, scale)
    return mask, float(density)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    name = "block_sparse_attention"
    for arg, tensor in (("q", q), ("k", k), ("v", v)):
        check_float(name, arg, tensor, DTYPES)
        if tensor.ndim != 4:
            raise ValueError(f"{name}: {arg} must be (B, H, T, D), got shape {tuple(tensor.shape)}")
        if tensor.shape[-1] != HEAD_DIM:
            raise ValueError(f"{name}: {arg} has head dim {tensor.shape[-1]}; only {HEAD_DIM} is supported")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"{name}: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2]:
        raise ValueError(f"{name}: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"{name}: empty sequence: q {tuple(q.shape)}, k {tuple(k.shape)}")


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: float, sink_tokens: int, scale: float | None = None
) -> torch.Tensor:
    """Dense fp32 torch maths of the same method (same routing): exact keys plus one pseudo-key per folded
    block, in one softmax. Returns (B, H, Tq, D) in q's dtype."""
    _check(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask, _ = routing(q, k, tau, sink_tokens, scale=scale)
    tq, tk = q.shape[2], k.shape[2]
    k_mean, lengths = _block_means(k, BLOCK)
    v_mean, _ = _block_means(v, BLOCK)
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


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tau: float,
    sink_tokens: int,
    scale: float | None = None,
    return_density: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`reference(q, k, v, tau, sink_tokens)` in one Triton pass per (batch*head, query block).

    Exact key blocks load their 64 keys (only those: a compacted index list per row); folded ones enter as
    mean keys/values, 64 pseudo-keys per tensor-core dot, with the log-length bias. With `return_density`,
    also the routing density as a 0-dim tensor on q's device (no host sync: `float()` it when needed)."""
    _check(q, k, v)
    _check_tau(tau, sink_tokens)
    check_runtime("block_sparse_attention", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k_mean, lengths = _block_means(k, BLOCK)
    v_mean, _ = _block_means(v, BLOCK)
    mask, density = _route(_block_means(q, BLOCK)[0], k_mean, tau, sink_tokens, BLOCK, scale)
    b, h, tq, d = q.shape
    qb, kb = mask.shape[-2:]
    count = mask.sum(-1, dtype=torch.int32).contiguous()  # (B, H, Qb)
    # exact block indices first, ascending (a stable sort of 0 = exact, 1 = folded)
    idx = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(torch.int32).contiguous()
    out = torch.empty((b, h, tq, d), dtype=q.dtype, device=q.device)
    launch = {} if interpreting() else {"num_warps": 4, "num_stages": 2}
    _KERNEL[(b * h, qb)](
        q, k, v, k_mean.contiguous(), v_mean.contiguous(), lengths.log().contiguous(),
        mask.to(torch.int8).contiguous(), idx, count, out,
        h, tq, k.shape[2], kb, qb, scale * LOG2E,
        *q.stride(), *k.stride(), *v.stride(),
        F32=q.dtype == torch.float32 or interpreting(), BLOCK=BLOCK, D=d, **launch,
    )  # fmt: skip
    return (out, density) if return_density else out


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
