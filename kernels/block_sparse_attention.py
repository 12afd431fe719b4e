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

Kernel structure: `plan` does the routing (torch, fp32) and compacts each row's exact key blocks into an
ascending index list (one small Triton kernel); with `Launch.fused_means` / `fused_route` the block means,
then the scores, threshold and lists, are one Triton launch each instead (fp32 as well). `attend` runs one
program per (batch*head, group of `group` query blocks of 64 rows; `Launch`): it first walks the compacted
list of that group's exact key blocks (FlashAttention-2 style online softmax over (64 * group) x 64 tiles,
exp2 with log2(e) folded into the scale; with group 2 the list is the union of the two blocks' lists and
each row masks the blocks not exact for its own block), then the folded blocks' mean keys 64 at a time (one
tensor-core dot per chunk, exact blocks masked out, chunks with no folded block skipped), in the same
running max / sum / accumulator. Query blocks vary fastest over the grid so the programs resident at once
read one head's K/V (L2 reuse).

Launch tuning (`Launch`, swept by benchmarks/sparse_attention_h200.py through `CANDIDATES`; measured on the H200 in
2026-11-30-sparse-attention-h200-run2/3/4.json, where every launch passed its GPU correctness check and `tma` was
the one flag that paid, ~15 % on the kernel; DEFAULT's docstring has the numbers): group, warps, stages, grid order and the fused routing launches; and, for
group 1, a second copy of the exact loop selected by any of: `unroll=2` (two list entries per iteration, one joint
max/rescale for both tiles, odd tail masked), `wide` (the pair as one 128-key tile), `dot_acc` (P @ V accumulated
into the rescaled acc by the dot), `k_transposed` (K loaded (D, 64) through its strides), `tma` (K/V by TMA tensor
descriptors), and the exact loop's `tl.range` options `exact_stages`, `loop_unroll_factor`, `warp_specialize`.
Launches without them (DEFAULT, PREVIOUS) compile the original loop. Compiled for sm_90 with Triton 3.9 without a
GPU (3.6 may differ): DEFAULT 221 registers, 80 KB shared memory (two programs per SM); dot_acc, k_transposed, tma,
warp_specialize the same footprint (warp_specialize gave dot_acc's PTX: no warp split on sm_90 there);
num_stages=4 gave DEFAULT's PTX; unroll2 255 registers and 147 KB (one program per SM), 64 KB with exact_stages=1.
Two routing flags, `means_split` (DEFAULT since run 8) and `threshold_rows`, are described in `Launch`.

Higher `tau` means fewer exact blocks. Density is the fraction of exact (query block, key block) pairs,
averaged over batch and heads.

Layout: q (B, H, Tq, 128), k and v (B, H, Tk, 128), any strides; the output is contiguous
(B, H, Tq, 128) in q's dtype. Non-causal, forward only. Head dim 128 only. bfloat16 is the production
dtype; float32 is accepted (for tests: on a GPU the fp32 dots run in IEEE precision).

INTERPRETER_BF16: the Triton CPU interpreter computes `tl.dot` on bfloat16 operands wrongly (numpy has
no bfloat16; the result is off by orders of magnitude), so under `TRITON_INTERPRET=1` the kernel widens
q, k, v to fp32 (exact) and runs fp32 dots. The bf16 tensor-core path (bf16 Q K^T, bf16 P @ V, fp32
accumulation) runs only on a GPU, where it is checked against the reference by benchmarks/sparse_attention_h200.py
(bf16 max-abs 9.8e-4 for every launch, 2026-11-30).

The routing is computed in torch (fp32) by `routing` and shared by the kernel and `reference`, so the two
agree on which blocks are exact (the fused routing launches sum and dot in another fp32 order: a block
whose score ties its row's threshold within rounding could route differently); they differ only in rounding
(fp32: ~1e-6; bf16 on a GPU: the kernel feeds bf16 probabilities to the P @ V dot, as flash attention does,
and rounds the fp32 mean keys/values to bf16 for the folded dots; expected ~1e-2 absolute on unit-scale
values; the output itself is rounded to bf16).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size, interpreting

BLOCK = 64
HEAD_DIM = 128
DTYPES = (torch.float32, torch.bfloat16)
LOG2E = 1.4426950408889634


def _block_sparse_fwd(
    q_ptr, k_ptr, v_ptr, km_ptr, vm_ptr, loglen_ptr, mask_ptr, idx_ptr, count_ptr, out_ptr,
    H, TQ, TK, KB, QB, NG, qk_scale,
    q_sb, q_sh, q_st, q_sd,
    k_sb, k_sh, k_st, k_sd,
    v_sb, v_sh, v_st, v_sd,
    F32: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
    HEADS_OUTER: tl.constexpr,
    TUNED: tl.constexpr = False, UNROLL: tl.constexpr = 1, WIDE: tl.constexpr = False,
    DOT_ACC: tl.constexpr = False, K_T: tl.constexpr = False, TMA: tl.constexpr = False,
    EXACT_STAGES: tl.constexpr = None, UNROLL_FACTOR: tl.constexpr = None, WARP_SPEC: tl.constexpr = False,
):  # fmt: skip
    # Reductions are tl.reduce with tl.standard's combines, and zeros are tl.full: tl.sum/tl.max/tl.zeros are
    # JITFunctions decorated when triton was imported, which the interpreter cannot call when
    # TRITON_INTERPRET was set later (LazyKernel's case).
    # One program: GROUP consecutive query blocks (BLOCK_M = GROUP * BLOCK rows) of one (batch, head).
    # HEADS_OUTER (the d9ed842 order) walks the heads fastest, so the programs resident at once read the K/V
    # of every head; otherwise the query blocks are fastest and resident programs share one head's K/V in L2.
    if HEADS_OUTER:
        bh = tl.program_id(0)
        g = tl.program_id(1)
    else:
        g = tl.program_id(0)
        bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = g * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK)
    d = tl.arange(0, D).to(tl.int64)
    row_ok = rows < TQ
    q = tl.load(
        q_ptr + b * q_sb + h * q_sh + rows.to(tl.int64)[:, None] * q_st + d[None, :] * q_sd,
        mask=row_ok[:, None],
        other=0.0,
    )  # (BLOCK_M, D)
    if F32:
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.full((BLOCK_M,), 0.0, tl.float32)
    acc = tl.full((BLOCK_M, D), 0.0, tl.float32)
    row = bh.to(tl.int64) * NG + g
    # mask row of each query row's own block (GROUP > 1: the exact list is the union over the group)
    mask_rows = mask_ptr + (bh.to(tl.int64) * QB + (rows // BLOCK).to(tl.int64)) * KB  # (BLOCK_M,)
    # 1. Exact key blocks, from the compacted list of this (batch*head, group) row.
    n_exact = tl.load(count_ptr + row)
    if not TUNED:
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
            # keys past TK get -inf through one fused multiply-add (a (BLOCK,) bias, not a select per element)
            s = s * qk_scale + tl.where(key_ok, 0.0, float("-inf"))[None, :]  # (BLOCK_M, BLOCK), log2 units
            if GROUP > 1:  # rows whose own block does not list j as exact
                exact = tl.load(mask_rows + j, mask=row_ok, other=0) != 0
                s = s + tl.where(exact, 0.0, float("-inf"))[:, None]
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
    else:  # the Launch tuning flags (group 1): see Launch; same maths, another schedule
        k_base = b * k_sb + h * k_sh
        if TMA:  # per-head 2-D descriptors: TMA loads, rows past TK read as zeros (the bias masks them)
            k_desc = tl.make_tensor_descriptor(
                k_ptr + b * k_sb + h * k_sh, shape=[TK, D], strides=[k_st, 1], block_shape=[BLOCK, D]
            )
            v_desc = tl.make_tensor_descriptor(
                v_ptr + b * v_sb + h * v_sh, shape=[TK, D], strides=[v_st, 1], block_shape=[BLOCK, D]
            )
        for n in tl.range(
            0, n_exact, UNROLL, num_stages=EXACT_STAGES, loop_unroll_factor=UNROLL_FACTOR, warp_specialize=WARP_SPEC
        ):
            j = tl.load(idx_ptr + row * KB + n)
            if UNROLL == 2:  # the pair's second entry; past the list's end (odd n_exact) it is masked out
                has2 = n + 1 < n_exact
                j2 = tl.load(idx_ptr + row * KB + n + 1, mask=has2, other=0)
                tk2 = tl.where(has2, TK, 0)  # the second tile's key limit: none of its keys when it is missing
            if WIDE:  # the pair as one (2 * BLOCK)-key tile: one QK^T and one P @ V dot of twice the width
                cols2 = tl.arange(0, 2 * BLOCK)
                second = cols2 >= BLOCK
                keys = tl.where(second, j2 * BLOCK + cols2 - BLOCK, j * BLOCK + cols2)  # (2 * BLOCK,)
                key_ok = keys < tl.where(second, tk2, TK)
            else:
                keys = j * BLOCK + cols
                key_ok = keys < TK
            koff = keys.to(tl.int64)
            if TMA:
                k = k_desc.load([j * BLOCK, 0])
                v = v_desc.load([j * BLOCK, 0])
            elif K_T:  # K loaded as (D, BLOCK) through its strides: the dot's B operand without a transpose
                kt = tl.load(k_ptr + k_base + d[:, None] * k_sd + koff[None, :] * k_st, mask=key_ok[None, :], other=0.0)
                v = tl.load(
                    v_ptr + b * v_sb + h * v_sh + koff[:, None] * v_st + d[None, :] * v_sd,
                    mask=key_ok[:, None],
                    other=0.0,
                )
            else:
                k = tl.load(k_ptr + k_base + koff[:, None] * k_st + d[None, :] * k_sd, mask=key_ok[:, None], other=0.0)
                v = tl.load(
                    v_ptr + b * v_sb + h * v_sh + koff[:, None] * v_st + d[None, :] * v_sd,
                    mask=key_ok[:, None],
                    other=0.0,
                )
            if K_T:
                if F32:
                    s = tl.dot(q, kt.to(tl.float32), input_precision="ieee")
                else:
                    s = tl.dot(q, kt)
            elif F32:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * qk_scale + tl.where(key_ok, 0.0, float("-inf"))[None, :]  # (BLOCK_M, BLOCK or 2 * BLOCK)
            row_max = tl.reduce(s, 1, tl.standard._elementwise_max)
            if UNROLL == 2 and not WIDE:  # second tile: its own dot, one joint max and rescale for both
                keys2 = j2 * BLOCK + cols
                key2_ok = keys2 < tk2
                koff2 = keys2.to(tl.int64)[:, None]
                k2 = tl.load(k_ptr + k_base + koff2 * k_st + d[None, :] * k_sd, mask=key2_ok[:, None], other=0.0)
                v2 = tl.load(
                    v_ptr + b * v_sb + h * v_sh + koff2 * v_st + d[None, :] * v_sd, mask=key2_ok[:, None], other=0.0
                )
                if F32:
                    s2 = tl.dot(q, tl.trans(k2.to(tl.float32)), input_precision="ieee")
                else:
                    s2 = tl.dot(q, tl.trans(k2))
                s2 = s2 * qk_scale + tl.where(key2_ok, 0.0, float("-inf"))[None, :]
                row_max = tl.maximum(row_max, tl.reduce(s2, 1, tl.standard._elementwise_max))
            m_new = tl.maximum(m_i, row_max)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            if UNROLL == 2 and not WIDE:
                p2 = tl.exp2(s2 - m_use[:, None])
                l_i = l_i + tl.reduce(p2, 1, tl.standard._sum_combine)
            if F32:
                p = p.to(tl.float32)
                v = v.to(tl.float32)
                if UNROLL == 2 and not WIDE:
                    p2 = p2.to(tl.float32)
                    v2 = v2.to(tl.float32)
            else:
                p = p.to(v.dtype)
                if UNROLL == 2 and not WIDE:
                    p2 = p2.to(v2.dtype)
            if DOT_ACC:  # rescale, then the tensor-core dot accumulates into acc itself
                acc = acc * alpha[:, None]
                if F32:
                    acc = tl.dot(p, v, acc, input_precision="ieee")
                    if UNROLL == 2 and not WIDE:
                        acc = tl.dot(p2, v2, acc, input_precision="ieee")
                else:
                    acc = tl.dot(p, v, acc)
                    if UNROLL == 2 and not WIDE:
                        acc = tl.dot(p2, v2, acc)
            else:
                if F32:
                    pv = tl.dot(p, v, input_precision="ieee")
                    if UNROLL == 2 and not WIDE:
                        pv += tl.dot(p2, v2, input_precision="ieee")
                else:
                    pv = tl.dot(p, v)
                    if UNROLL == 2 and not WIDE:
                        pv += tl.dot(p2, v2)
                acc = acc * alpha[:, None] + pv
            m_i = m_new
    # 2. Folded key blocks: their mean keys, BLOCK at a time, as pseudo-keys with log(length) on the logit.
    # km/vm arrive in the dot's dtype (bf16 rounded once on the host, or fp32); .to() is then a no-op.
    means = bh.to(tl.int64) * KB * D
    for c in range(0, KB, BLOCK):
        blocks = c + cols
        block_ok = blocks < KB
        if GROUP > 1:
            folded = tl.load(mask_rows[:, None] + blocks[None, :], mask=row_ok[:, None] & block_ok[None, :], other=1)
            folded = folded == 0  # (BLOCK_M, BLOCK)
            n_folded = tl.reduce(
                tl.reduce(folded.to(tl.int32), 1, tl.standard._sum_combine), 0, tl.standard._sum_combine
            )
        else:
            folded = tl.load(mask_ptr + row * KB + blocks, mask=block_ok, other=1) == 0  # (BLOCK,)
            n_folded = tl.reduce(folded.to(tl.int32), 0, tl.standard._sum_combine)
        if n_folded > 0:  # skip chunks that are all exact
            moff = means + blocks.to(tl.int64)[:, None] * D + d[None, :]
            km = tl.load(km_ptr + moff, mask=block_ok[:, None], other=0.0)  # (BLOCK, D)
            vm = tl.load(vm_ptr + moff, mask=block_ok[:, None], other=0.0)
            if F32:
                s = tl.dot(q, tl.trans(km), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(km.to(q.dtype)))
            bias = tl.load(loglen_ptr + blocks, mask=block_ok, other=0.0) * 1.4426950408889634
            if GROUP > 1:
                s = tl.where(folded, s * qk_scale + bias[None, :], float("-inf"))
            else:
                s = tl.where(folded[None, :], s * qk_scale + bias[None, :], float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            if DOT_ACC:
                acc = acc * alpha[:, None]
                if F32:
                    acc = tl.dot(p, vm, acc, input_precision="ieee")
                else:
                    acc = tl.dot(p.to(q.dtype), vm.to(q.dtype), acc)
            else:
                if F32:
                    pv = tl.dot(p, vm, input_precision="ieee")
                else:
                    pv = tl.dot(p.to(q.dtype), vm.to(q.dtype))
                acc = acc * alpha[:, None] + pv
            m_i = m_new
    out = acc / l_i[:, None]
    optr = out_ptr + (bh.to(tl.int64) * TQ + rows.to(tl.int64))[:, None] * D + d[None, :]
    tl.store(optr, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def _compact(mask_ptr, idx_ptr, count_ptr, QB, KB, NG, GROUP: tl.constexpr, KB_P2: tl.constexpr):
    """One program per (batch*head, group of GROUP query blocks): the ascending list of key blocks exact for
    any of the group's rows, written to the front of its idx row, and its length (replaces a stable argsort)."""
    bh = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    cols = tl.arange(0, KB_P2)
    col_ok = cols < KB
    exact = tl.full((KB_P2,), 0, tl.int32)
    for r in range(0, GROUP):
        qb = g * GROUP + r
        m = tl.load(mask_ptr + (bh * QB + qb) * KB + cols, mask=col_ok & (cols * 0 + qb < QB), other=0)
        exact = exact | (m != 0).to(tl.int32)
    pos = tl.associative_scan(exact, 0, tl.standard._sum_combine) - 1  # inclusive prefix sum - 1
    row = bh * NG + g
    tl.store(idx_ptr + row * KB + pos, cols, mask=exact != 0)
    tl.store(count_ptr + row, tl.reduce(exact, 0, tl.standard._sum_combine))


def _block_means_qkv(
    q_ptr, k_ptr, v_ptr, qm_ptr, km_ptr, km_dot_ptr, vm_dot_ptr, loglen_ptr,
    H, TQ, TK, QB, KB, log_full, log_last,
    q_sb, q_sh, q_st, q_sd,
    k_sb, k_sh, k_st, k_sd,
    v_sb, v_sh, v_st, v_sd,
    BLOCK: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr, PER_TENSOR: tl.constexpr,
):  # fmt: skip
    """One program per (batch*head, block index): the fp32 means of query block `blk` and of key/value block
    `blk` (each where it exists; Tq may differ from Tk), dividing by the block's true length with IEEE
    division as torch does. One launch reads q, k and v once, at any strides, in place of `_block_means`
    three times (7 torch launches each with a partial last block), the log and the bf16 casts. The routing
    reads the fp32 q/k means; the attention kernel reads the k/v means in its dot dtype: with SPLIT the k
    means are stored a second time, rounded, in km_dot's dtype (else km_dot is km). Programs of batch*head 0
    also write the (KB,) log block lengths (host-rounded `math.log`, fp32).

    PER_TENSOR (Launch.means_split): a third grid axis picks one tensor per program (0: q, 1: k, 2: v), so a
    program loads and reduces one (BLOCK, D) tile instead of three in turn (a smaller program, more of them
    resident to keep loads in flight). Each tile goes through the same load, fp32 reduce over axis 0 and IEEE
    division as without it, so every output is bitwise the same; the k programs write the log lengths."""
    bh = tl.program_id(0)
    blk = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    tokens = blk * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    toff = tokens.to(tl.int64)[:, None]
    d = tl.arange(0, D).to(tl.int64)
    q_here = blk < QB
    if PER_TENSOR:
        part = tl.program_id(2)
        q_here = q_here & (part == 0)
    if q_here:
        n = tl.minimum(TQ - blk * BLOCK, BLOCK).to(tl.float32)
        x = tl.load(
            q_ptr + b * q_sb + h * q_sh + toff * q_st + d[None, :] * q_sd, mask=(tokens < TQ)[:, None], other=0.0
        )  # (BLOCK, D)
        mean = tl.fdiv(tl.reduce(x.to(tl.float32), 0, tl.standard._sum_combine), n, ieee_rounding=True)  # (D,)
        tl.store(qm_ptr + (bh.to(tl.int64) * QB + blk) * D + d, mean)
    if PER_TENSOR:  # the k block (part 1) or the v block (part 2), as below
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
    elif blk < KB:
        n = tl.minimum(TK - blk * BLOCK, BLOCK).to(tl.float32)
        key_ok = (tokens < TK)[:, None]
        x = tl.load(k_ptr + b * k_sb + h * k_sh + toff * k_st + d[None, :] * k_sd, mask=key_ok, other=0.0)
        k_mean = tl.fdiv(tl.reduce(x.to(tl.float32), 0, tl.standard._sum_combine), n, ieee_rounding=True)
        x = tl.load(v_ptr + b * v_sb + h * v_sh + toff * v_st + d[None, :] * v_sd, mask=key_ok, other=0.0)
        v_mean = tl.fdiv(tl.reduce(x.to(tl.float32), 0, tl.standard._sum_combine), n, ieee_rounding=True)
        out = (bh.to(tl.int64) * KB + blk) * D + d
        tl.store(km_ptr + out, k_mean)
        if SPLIT:
            tl.store(km_dot_ptr + out, k_mean.to(km_dot_ptr.dtype.element_ty))
        tl.store(vm_dot_ptr + out, v_mean.to(vm_dot_ptr.dtype.element_ty))
        if bh == 0:
            tl.store(loglen_ptr + blk, tl.where(blk == KB - 1, log_last, log_full))


def _route_rows(
    qm_ptr, km_ptr, mask_ptr, idx_ptr, count_ptr,
    QB, KB, scale, tau, sink_tokens,
    RULE: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """One program per (batch*head, ROWS query blocks): `_route` and `_compact` (group 1) for those rows in
    one launch, in place of `_route`'s 18 torch launches over (B, H, Qb, Kb) tensors and `_compact`.

    The rows' proxy scores against all key blocks are computed CHUNK key blocks at a time, twice (a dot is
    cheaper than a round trip of the scores through memory): the first pass merges per-chunk means and
    squared deviations (Chan et al.'s pairwise update: stable, one pass) into each row's mean and population
    std; the second compares against `mean + tau * std` (RULE 0; RULE 1: tau = -inf, all exact; RULE 2:
    tau = +inf, none by score), adds the diagonal band and the sink blocks, stores the mask row and appends
    the exact key blocks, ascending, to the row's idx list (prefix sum per chunk after the running count)."""
    bh = tl.program_id(0).to(tl.int64)
    qbs = tl.program_id(1) * ROWS + tl.arange(0, ROWS)  # (ROWS,) query blocks
    q_ok = qbs < QB
    rows = bh * QB + qbs.to(tl.int64)  # (ROWS,) rows of mask, idx and count
    d = tl.arange(0, D)
    qm = tl.load(qm_ptr + rows[:, None] * D + d[None, :], mask=q_ok[:, None], other=0.0)  # (ROWS, D) fp32
    km_head = km_ptr + bh * KB * D
    if RULE == 0:
        mean = tl.full((ROWS,), 0.0, tl.float32)
        m2 = tl.full((ROWS,), 0.0, tl.float32)  # sum of squared deviations from the running mean
        for c in range(0, KB, CHUNK):
            cols = c + tl.arange(0, CHUNK)
            col_ok = cols < KB
            km = tl.load(km_head + cols[:, None] * D + d[None, :], mask=col_ok[:, None], other=0.0)  # (CHUNK, D)
            s = tl.dot(qm, tl.trans(km), input_precision="ieee") * scale  # (ROWS, CHUNK)
            n_seen = c * 1.0  # fp32 count of the key blocks before this chunk (all earlier chunks are full)
            n_chunk = tl.minimum(KB - c, CHUNK).to(tl.float32)
            chunk_sum = tl.reduce(tl.where(col_ok[None, :], s, 0.0), 1, tl.standard._sum_combine)
            chunk_mean = tl.fdiv(chunk_sum, n_chunk, ieee_rounding=True)
            dev = tl.where(col_ok[None, :], s - chunk_mean[:, None], 0.0)
            n_total = n_seen + n_chunk
            delta = chunk_mean - mean
            mean = mean + delta * (n_chunk / n_total)
            m2 = m2 + tl.reduce(dev * dev, 1, tl.standard._sum_combine) + delta * delta * (n_seen * n_chunk / n_total)
        threshold = mean + tau * tl.math.sqrt_rn(tl.fdiv(m2, KB * 1.0, ieee_rounding=True))  # (ROWS,)
    count = tl.full((ROWS,), 0, tl.int32)
    for c in range(0, KB, CHUNK):
        cols = c + tl.arange(0, CHUNK)
        col_ok = cols < KB
        if RULE == 0:
            km = tl.load(km_head + cols[:, None] * D + d[None, :], mask=col_ok[:, None], other=0.0)
            s = tl.dot(qm, tl.trans(km), input_precision="ieee") * scale
            exact = s > threshold[:, None]  # (ROWS, CHUNK)
        elif RULE == 1:
            exact = tl.full((ROWS, CHUNK), 1, tl.int1)
        else:
            exact = tl.full((ROWS, CHUNK), 0, tl.int1)
        band = tl.abs(qbs[:, None] - cols[None, :]) <= 1
        sinks = cols * BLOCK < sink_tokens
        inside = q_ok[:, None] & col_ok[None, :]
        exact = (exact | band | sinks[None, :]) & inside
        tl.store(mask_ptr + rows[:, None] * KB + cols[None, :], exact.to(tl.uint8), mask=inside)
        flags = exact.to(tl.int32)
        pos = count[:, None] + tl.associative_scan(flags, 1, tl.standard._sum_combine) - 1  # (ROWS, CHUNK)
        tl.store(idx_ptr + rows[:, None] * KB + pos, cols[None, :], mask=exact)
        count += tl.reduce(flags, 1, tl.standard._sum_combine)
    tl.store(count_ptr + rows, count, mask=q_ok)


def _threshold_rows(
    scores_ptr, mask_ptr, idx_ptr, count_ptr, QB, KB, scale, tau, sink_tokens,
    RULE: tl.constexpr, KB_P2: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per (batch*head, query block) row of the (unscaled) proxy scores from torch's matmul: the
    scale, the row's mean and population std (two passes over the row in registers), the rule of `_route_rows`
    (RULE 0 threshold, 1 all exact, 2 none by score), the band and sinks, the mask row, and the row's exact key
    blocks compacted to the front of its idx row (prefix sum) with their count."""
    row = tl.program_id(0).to(tl.int64)
    qb = (row % QB).to(tl.int32)
    cols = tl.arange(0, KB_P2)
    ok = cols < KB
    s = tl.load(scores_ptr + row * KB + cols, mask=ok, other=0.0) * scale  # torch's `scores * scale`, same rounding
    if RULE == 0:
        mean = tl.fdiv(tl.reduce(tl.where(ok, s, 0.0), 0, tl.standard._sum_combine), KB * 1.0, ieee_rounding=True)
        dev = tl.where(ok, s - mean, 0.0)
        var = tl.fdiv(tl.reduce(dev * dev, 0, tl.standard._sum_combine), KB * 1.0, ieee_rounding=True)
        exact = s > mean + tau * tl.math.sqrt_rn(var)
    elif RULE == 1:
        exact = tl.full((KB_P2,), 1, tl.int1)
    else:
        exact = tl.full((KB_P2,), 0, tl.int1)
    exact = (exact | (tl.abs(qb - cols) <= 1) | (cols * BLOCK < sink_tokens)) & ok
    tl.store(mask_ptr + row * KB + cols, exact.to(tl.uint8), mask=ok)
    flags = exact.to(tl.int32)
    pos = tl.associative_scan(flags, 0, tl.standard._sum_combine) - 1  # inclusive prefix sum - 1
    tl.store(idx_ptr + row * KB + pos, cols, mask=exact)
    tl.store(count_ptr + row, tl.reduce(flags, 0, tl.standard._sum_combine))


_KERNEL = LazyKernel(_block_sparse_fwd)
_THRESHOLD = LazyKernel(_threshold_rows)
_COMPACT = LazyKernel(_compact)
_MEANS = LazyKernel(_block_means_qkv)
_ROUTE = LazyKernel(_route_rows)
ROUTE_ROWS = 16  # query blocks per routing program (the smallest tl.dot M)
ROUTE_CHUNK = 32  # key blocks per routing step
# Warps of the two routing launches on a GPU: compiled for sm_90 (no GPU at hand), the route kernel needs 78
# registers and no stack at 16 x 32 tiles and 8 warps (4 warps, or chunks of 64, spill), the means kernel 109.
ROUTING_WARPS = 8
# Warps of the means launch with Launch.means_split (one (64, 128) tile per program): unmeasured until the H200
# sweep; fewer warps per program leave room for more programs per SM (loads in flight) than the 8 above.
MEANS_SPLIT_WARPS = 4
# Warps of `_threshold_rows` (one row of Kb scores per program): unmeasured until the H200 sweep.
THRESHOLD_WARPS = 4


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


def _routing_tuning(num_warps: int = ROUTING_WARPS) -> dict[str, int]:
    """Launch options of the fused routing kernels (the interpreter takes none)."""
    return {} if interpreting() else {"num_warps": num_warps}


def _fused_means(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dot_dtype: torch.dtype, per_tensor: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_block_means` of q, k and v and the log block lengths in one launch (`_block_means_qkv`).

    Returns q_mean (B, H, Qb, D) and k_mean (B, H, Kb, D) in fp32 for the routing, k_mean and v_mean
    (B, H, Kb, D) in `dot_dtype` for the attention kernel (the fp32 k_mean itself when dot_dtype is fp32),
    and log_len (Kb,) fp32. The means equal `_block_means`' up to fp32 sum order; log_len is `math.log` of
    each length rounded once to fp32, where torch's fp32 log can be an ulp off (on CPU: lengths 7, 47, 49).
    `per_tensor` (Launch.means_split): one program per tile of q, k or v, MEANS_SPLIT_WARPS each; the same
    bits."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    qb, kb = -(-tq // BLOCK), -(-tk // BLOCK)
    q_mean = torch.empty((b, h, qb, d), dtype=torch.float32, device=q.device)
    k_mean = torch.empty((b, h, kb, d), dtype=torch.float32, device=q.device)
    split = dot_dtype != torch.float32
    k_mean_dot = torch.empty_like(k_mean, dtype=dot_dtype) if split else k_mean
    v_mean_dot = torch.empty_like(k_mean, dtype=dot_dtype)
    log_len = torch.empty((kb,), dtype=torch.float32, device=q.device)
    last = tk - (kb - 1) * BLOCK  # the last key block's length
    grid = (b * h, max(qb, kb), 3) if per_tensor else (b * h, max(qb, kb))
    _MEANS[grid](
        q, k, v, q_mean, k_mean, k_mean_dot, v_mean_dot, log_len,
        h, tq, tk, qb, kb, math.log(BLOCK), math.log(last),
        *q.stride(), *k.stride(), *v.stride(),
        BLOCK=BLOCK, D=d, SPLIT=split, PER_TENSOR=per_tensor,
        **_routing_tuning(MEANS_SPLIT_WARPS if per_tensor else ROUTING_WARPS),
    )  # fmt: skip
    return q_mean, k_mean, k_mean_dot, v_mean_dot, log_len


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


def _fused_route(
    q_mean: torch.Tensor, k_mean: torch.Tensor, tau: float, sink_tokens: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_route` plus the group-1 compaction in one launch (`_route_rows`) on contiguous fp32 means:
    (mask bool (B, H, Qb, Kb), idx int32 (B, H, Qb, Kb), count int32 (B, H, Qb)), as `plan` lays them out.

    Same rule as `_route`; the scores' dot order and the mean/std merge differ from torch's in fp32
    rounding, so a block whose score ties its row's threshold within rounding could route differently."""
    b, h, qb, d = q_mean.shape
    kb = k_mean.shape[2]
    mask = torch.empty((b, h, qb, kb), dtype=torch.bool, device=q_mean.device)
    idx = torch.empty((b, h, qb, kb), dtype=torch.int32, device=q_mean.device)
    count = torch.empty((b, h, qb), dtype=torch.int32, device=q_mean.device)
    rule = 1 if tau == float("-inf") else 2 if tau == float("inf") else 0  # 1: all exact, 2: none by score
    _ROUTE[(b * h, -(-qb // ROUTE_ROWS))](
        q_mean, k_mean, mask.view(torch.uint8), idx, count,
        qb, kb, float(scale), float(tau) if rule == 0 else 0.0, sink_tokens,
        RULE=rule, ROWS=ROUTE_ROWS, CHUNK=ROUTE_CHUNK, BLOCK=BLOCK, D=d, **_routing_tuning(),
    )  # fmt: skip
    return mask, idx, count


def _threshold_route(
    q_mean: torch.Tensor, k_mean: torch.Tensor, tau: float, sink_tokens: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_route` plus the group-1 compaction in two launches: the scores by torch's batched matmul (the same call
    as `_route`'s), then `_threshold_rows` for every row. Returns what `_fused_route` does. The mean and std are
    two fp32 passes in the kernel where torch.std_mean runs its own reduction, so a block whose score ties its
    row's threshold within rounding could route differently."""
    b, h, qb, _ = q_mean.shape
    kb = k_mean.shape[2]
    scores = (q_mean @ k_mean.transpose(-1, -2)).contiguous()  # (B, H, Qb, Kb) fp32, scaled in the kernel
    mask = torch.empty((b, h, qb, kb), dtype=torch.bool, device=q_mean.device)
    idx = torch.empty((b, h, qb, kb), dtype=torch.int32, device=q_mean.device)
    count = torch.empty((b, h, qb), dtype=torch.int32, device=q_mean.device)
    rule = 1 if tau == float("-inf") else 2 if tau == float("inf") else 0
    _THRESHOLD[(b * h * qb,)](
        scores, mask.view(torch.uint8), idx, count, qb, kb, float(scale), float(tau) if rule == 0 else 0.0,
        sink_tokens, RULE=rule, KB_P2=triton.next_power_of_2(kb), BLOCK=BLOCK, **_routing_tuning(THRESHOLD_WARPS),
    )  # fmt: skip
    return mask, idx, count


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


@dataclass(frozen=True)
class Launch:
    """How the kernel is launched. The maths does not depend on it: every choice computes the same exact
    and folded terms in the same order; only float rounding inside the dots may differ (bf16 tolerance), and
    with the fused routing flags the routing's rounding too (see fused_means, fused_route).

    group: query blocks per program (1 or 2). 2 runs 128-row tiles (8 warps suit it) over the union of the
    two blocks' exact key lists, masking per row: half the K/V traffic per query row, paid for by the union's
    extra tiles. heads_outer: the d9ed842 grid order (program id 0 walks the heads). bf16_means: round the
    mean K/V to bf16 once on the host (the kernel rounded them per program anyway; ignored for fp32 inputs).
    triton_compaction: the exact-block lists by a small Triton kernel instead of torch's stable argsort.
    fused_means: the block means of q, k, v and the log block lengths by one Triton launch (`_fused_means`)
    instead of up to 24 torch launches (strided reductions, divisions, concatenations, the log, bf16 casts).
    fused_route: the proxy scores, threshold, band, sinks and index lists by one Triton launch
    (`_fused_route`) and the density by one torch mean, instead of 18 torch launches and the compaction
    kernel (group 1 only; it writes its own lists, so triton_compaction does not apply). Both change the
    routing's fp32 rounding (sum and dot order), so a block whose score ties its threshold within rounding
    could route differently from `routing`; the torch routing stays the one `routing` and `reference` use.

    Exact-loop tuning (group 1 only; any of them selects a second copy of the exact loop, so launches without
    them compile the loop as before). Unmeasured until the H200 sweep; each is its own candidate so the sweep
    can attribute a gain. unroll=2: two list entries per iteration, two K/V tiles and QK^T dots, one joint row
    max and one rescale of acc and l for both, two P @ V dots (odd lists: the missing second tile is masked to
    -inf and not loaded). wide (needs unroll=2): the pair as one gathered 128-key tile, one dot each of twice
    the width. dot_acc: rescale acc, then `acc = tl.dot(p, v, acc)` (the tensor core accumulates in place; no
    separate (64, 128) fp32 product and add; the folded loop likewise). k_transposed: K loaded as (D, 64)
    through its strides, so the QK^T dot takes it without `tl.trans`. tma: K/V tiles by per-head TMA tensor
    descriptors (`tl.make_tensor_descriptor`; needs unit last stride and 16-byte aligned base and strides,
    else ValueError; a Triton global-scratch allocator is installed on the GPU). exact_stages /
    loop_unroll_factor / warp_specialize: the exact loop's `tl.range` options (software-pipeline depth of
    that loop alone, Triton's loop unroller, automatic warp specialization); the interpreter ignores them.

    means_split (needs fused_means): the means launch runs one program per (batch*head, block, tensor) on
    MEANS_SPLIT_WARPS warps, each reducing one (64, 128) tile of q, k or v instead of all three in turn (that launch
    read q/k/v at ~37 % of copy bandwidth, ~2 programs per SM); the same sums and divisions, so bitwise the same
    means. Run 8 (2026-11-30-sparse-attention-h200-run8.json): 0.08-0.09 ms off the routing (DEFAULT since).

    threshold_rows (group 1, not with fused_route): the routing in two launches after the means, the scores by
    torch's matmul and `_threshold_rows` (scale, mean/std, threshold, band, sinks, mask and index lists per row),
    instead of the torch route's six small launches and the compaction kernel (`_threshold_route`). The same
    rounding caveat as fused_route. Unmeasured until the H200 sweep."""

    group: int = 1
    num_warps: int = 4
    num_stages: int = 3
    heads_outer: bool = False
    bf16_means: bool = True
    triton_compaction: bool = True
    fused_means: bool = False
    fused_route: bool = False
    unroll: int = 1
    wide: bool = False
    dot_acc: bool = False
    k_transposed: bool = False
    tma: bool = False
    exact_stages: int | None = None
    loop_unroll_factor: int | None = None
    warp_specialize: bool = False
    means_split: bool = False
    threshold_rows: bool = False

    @property
    def tuned(self) -> bool:
        """Whether any exact-loop tuning flag is set (the kernel then runs its second exact loop)."""
        return (
            self.unroll != 1
            or self.wide
            or self.dot_acc
            or self.k_transposed
            or self.tma
            or self.exact_stages is not None
            or self.loop_unroll_factor is not None
            or self.warp_specialize
        )

    def __post_init__(self) -> None:
        if self.group not in (1, 2):
            raise ValueError(f"block_sparse_attention: Launch.group must be 1 or 2, got {self.group!r}")
        if self.fused_route and self.group != 1:
            raise ValueError(f"block_sparse_attention: Launch.fused_route needs group 1, got group {self.group!r}")
        if self.threshold_rows and (self.group != 1 or self.fused_route):
            raise ValueError(
                f"block_sparse_attention: Launch.threshold_rows needs group 1 and not fused_route, got group "
                f"{self.group!r}, fused_route={self.fused_route!r}"
            )
        if self.num_warps not in (1, 2, 4, 8, 16) or not 1 <= self.num_stages <= 8:
            raise ValueError(
                f"block_sparse_attention: Launch num_warps must be a power of two <= 16 and num_stages 1..8, "
                f"got {self.num_warps!r}, {self.num_stages!r}"
            )
        name = "block_sparse_attention: Launch"
        if self.unroll not in (1, 2):
            raise ValueError(f"{name}.unroll must be 1 or 2, got {self.unroll!r}")
        if self.tuned and self.group != 1:
            raise ValueError(f"{name} exact-loop tuning flags need group 1, got group {self.group!r}")
        if self.wide and self.unroll != 2:
            raise ValueError(f"{name}.wide needs unroll=2, got unroll={self.unroll!r}")
        if self.k_transposed and self.unroll == 2 and not self.wide:
            raise ValueError(f"{name}.k_transposed needs unroll=1 or wide, got unroll=2 without wide")
        if self.tma and (self.unroll != 1 or self.k_transposed):
            raise ValueError(
                f"{name}.tma needs unroll=1 and not k_transposed, got {self.unroll!r}, {self.k_transposed!r}"
            )
        if self.exact_stages is not None and not 1 <= self.exact_stages <= 8:
            raise ValueError(f"{name}.exact_stages must be None or 1..8, got {self.exact_stages!r}")
        if self.loop_unroll_factor is not None and not 2 <= self.loop_unroll_factor <= 8:
            raise ValueError(f"{name}.loop_unroll_factor must be None or 2..8, got {self.loop_unroll_factor!r}")
        if self.means_split and not self.fused_means:
            raise ValueError(f"{name}.means_split needs fused_means=True, got fused_means={self.fused_means!r}")


PREVIOUS = Launch(group=1, num_warps=4, num_stages=2, heads_outer=True, bf16_means=False, triton_compaction=False)
"""The launch measured at d9ed842 (kept for side-by-side timing; the kernel body has since changed only in
how the out-of-range key mask is applied: a fused bias instead of a select)."""
TMA = Launch(fused_means=True, tma=True)
"""g1_w4_s3_fused_means_tma: the block means in one Triton launch, the torch route, K/V tiles through TMA descriptors.
In the H200 sweep of 2026-11-30 (e523ab7, benchmarks/results/2026-11-30-sparse-attention-h200-run3.json) the fastest
whole call at 10 % (2.52 ms, 4.64x cuDNN) and within 1.3 % of the fastest at 20 % (4.20 ms, 2.79x; kernel 3.50 ms,
401 TFLOP/s on the exact pairs) and 40 % (7.61 ms, 1.54x). The g1_w4_s3 launch it replaces: 5.00 / 8.91 ms at 20 /
40 %. After the routing's static band/sink mask was cached and its threshold made in two launches (run 5, 67f14a0):
20 % in 4.14 ms (2.87x) on structured q/k/v and 3.80 ms (3.07x) on q/k/v captured from the Wan model, each call
synchronised; queued back to back (as in a forward) 2.83x / 3.30x; kernel 3.55 ms, routing 0.30 ms. TMA needs K/V
with unit last stride and 16-byte aligned base and strides (the launcher refuses others)."""
DEFAULT = replace(TMA, means_split=True)
"""TMA with the means launch split per q/k/v tile (`means_split`). Sweep of run 8 (a60cd14,
benchmarks/results/2026-11-30-sparse-attention-h200-run8.json): the routing 0.28-0.29 vs 0.37-0.40 ms on structured
q/k/v and 0.48-0.53 vs 0.52-0.57 ms on captured ones, the kernel the same; the fastest call in 5 of the 6 sweep
points. A longest-first order of each head's programs (`lpt`, since removed) was slower there in 5 of 6 (kernel
+1-4 %, and its sort adds to the routing)."""
FUSED_ROUTING = Launch(fused_means=True, fused_route=True)
"""DEFAULT with the routing fused: the base of the exact-loop tuning candidates."""
CANDIDATES = {
    "previous": PREVIOUS,
    "g1_w4_s3": Launch(group=1, num_warps=4, num_stages=3),
    "g1_w4_s2": Launch(group=1, num_warps=4, num_stages=2),
    "g1_w8_s3": Launch(group=1, num_warps=8, num_stages=3),
    "g2_w8_s3": Launch(group=2, num_warps=8, num_stages=3),
    "g2_w8_s2": Launch(group=2, num_warps=8, num_stages=2),
    # DEFAULT with the routing fused (measured 2026-11-30): the means alone, then means and route
    "g1_w4_s3_fused_means": Launch(fused_means=True),
    "g1_w4_s3_fused_routing": FUSED_ROUTING,
    # the fused-routing launch with one exact-loop tuning flag each (measured 2026-11-30)
    "g1_w4_s3_fused_routing_dotacc": replace(FUSED_ROUTING, dot_acc=True),
    "g1_w4_s3_fused_routing_unroll2": replace(FUSED_ROUTING, unroll=2),
    "g1_w4_s3_fused_routing_unroll2_dotacc": replace(FUSED_ROUTING, unroll=2, dot_acc=True),
    "g1_w4_s3_fused_routing_wide_dotacc": replace(FUSED_ROUTING, unroll=2, wide=True, dot_acc=True),
    "g1_w4_s3_fused_routing_kt": replace(FUSED_ROUTING, k_transposed=True),
    "g1_w4_s3_fused_routing_tma": replace(FUSED_ROUTING, tma=True),
    "g1_w4_s4_fused_routing": replace(FUSED_ROUTING, num_stages=4),
    "g1_w4_s3_fused_routing_xs4": replace(FUSED_ROUTING, exact_stages=4),
    "g1_w4_s3_fused_routing_lu2": replace(FUSED_ROUTING, loop_unroll_factor=2),
    "g1_w4_s3_fused_routing_ws_dotacc": replace(FUSED_ROUTING, warp_specialize=True, dot_acc=True),
    # unroll2 holds four K/V tiles per stage (147 KB of shared memory at 3 stages: one program per SM); without
    # pipelining its loop it needs 64 KB (two per SM, as DEFAULT), the pair's two loads still in flight together
    "g1_w4_s3_fused_routing_unroll2_dotacc_xs1": replace(FUSED_ROUTING, unroll=2, dot_acc=True, exact_stages=1),
    # 2026-11-30 sweep: TMA the fastest kernel (3.50 ms at 20 %), the torch route after fused means the fastest
    # routing (0.54 vs 0.77 ms): the two together, and with in-place dot accumulation (measured 2026-11-30)
    "g1_w4_s3_fused_means_tma": TMA,
    "g1_w4_s3_fused_means_tma_dotacc": Launch(fused_means=True, tma=True, dot_acc=True),
    # the TMA launch's pipelining, one knob each (measured 2026-11-30)
    "g1_w4_s2_fused_means_tma": Launch(num_stages=2, fused_means=True, tma=True),
    "g1_w4_s4_fused_means_tma": Launch(num_stages=4, fused_means=True, tma=True),
    "g1_w4_s3_fused_means_tma_xs4": Launch(fused_means=True, tma=True, exact_stages=4),
    "g1_w4_s3_fused_means_tma_lu2": Launch(fused_means=True, tma=True, loop_unroll_factor=2),
    # DEFAULT with the means launch one tile per program, with each head's heaviest groups first, and both
    # (unmeasured until the H200 sweep)
    "g1_w4_s3_fused_means_tma_split_means": replace(TMA, means_split=True),
    # DEFAULT with the routing's threshold and lists in one kernel after torch's score matmul (unmeasured)
    "g1_w4_s3_fused_means_tma_split_means_rows": replace(TMA, means_split=True, threshold_rows=True),
}


@dataclass
class Plan:
    """Everything the kernel reads besides q, k, v (the routing and its compacted lists), for one call.

    k_mean/v_mean (B, H, Kb, D) in the dot dtype; log_len (Kb,) fp32; mask bool (B, H, Qb, Kb);
    idx int32 (B, H, G, Kb) whose first count[b, h, g] entries are the group's exact key blocks, ascending;
    count int32 (B, H, G); density: fraction of exact pairs (0-dim tensor, no host sync)."""

    k_mean: torch.Tensor
    v_mean: torch.Tensor
    log_len: torch.Tensor
    mask: torch.Tensor
    idx: torch.Tensor
    count: torch.Tensor
    density: torch.Tensor
    scale: float
    group: int

    def computed_density(self) -> float:
        """Fraction of (query block, key block) tiles the kernel computes exactly (>= density when group > 1)."""
        b, h, qb, kb = self.mask.shape
        groups = self.count.shape[-1]
        rows = torch.full((groups,), self.group, dtype=torch.int64, device=self.count.device)
        rows[-1] = qb - (groups - 1) * self.group  # the last group may hold fewer query blocks
        return float((self.count * rows).sum()) / (b * h * qb * kb)


def plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tau: float,
    sink_tokens: int,
    scale: float | None = None,
    launch: Launch = DEFAULT,
) -> Plan:
    """The routing and the kernel's index lists (the part of a call before the attention kernel)."""
    _check(q, k, v)
    _check_tau(tau, sink_tokens)
    check_runtime("block_sparse_attention", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bf16 = q.dtype == torch.bfloat16 and launch.bf16_means and not interpreting()
    if launch.fused_means:
        q_mean, k_mean, k_mean_dot, v_mean_dot, log_len = _fused_means(
            q, k, v, torch.bfloat16 if bf16 else torch.float32, launch.means_split
        )
    else:
        k_mean, lengths = _block_means(k, BLOCK)
        v_mean, _ = _block_means(v, BLOCK)
        q_mean = _block_means(q, BLOCK)[0]
        k_mean_dot, v_mean_dot = (x.to(torch.bfloat16) if bf16 else x for x in (k_mean, v_mean))
        log_len = lengths.log()
    if launch.fused_route or launch.threshold_rows:
        route = _fused_route if launch.fused_route else _threshold_route
        mask, idx, count = route(q_mean.contiguous(), k_mean.contiguous(), tau, sink_tokens, scale)
        density = torch.mean(mask, dtype=torch.float32)  # = mask.float().mean(), without the fp32 copy
    else:
        mask, density = _route(q_mean, k_mean, tau, sink_tokens, BLOCK, scale)
        mask = mask.contiguous()
        idx, count = _lists(mask, launch)
    return Plan(
        k_mean_dot.contiguous(), v_mean_dot.contiguous(), log_len, mask, idx, count, density, scale, launch.group
    )


def _lists(mask: torch.Tensor, launch: Launch) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact key blocks of each group of `launch.group` query blocks, from the contiguous (B, H, Qb, Kb)
    mask: (idx int32 (B, H, G, Kb) whose first count entries list them ascending, count int32 (B, H, G))."""
    b, h, qb, kb = mask.shape
    groups = -(-qb // launch.group)
    if launch.triton_compaction:
        idx = torch.empty((b, h, groups, kb), dtype=torch.int32, device=mask.device)
        count = torch.empty((b, h, groups), dtype=torch.int32, device=mask.device)
        _COMPACT[(b * h, groups)](
            mask.view(torch.uint8), idx, count, qb, kb, groups, GROUP=launch.group, KB_P2=triton.next_power_of_2(kb)
        )
        return idx, count
    union = mask
    if launch.group > 1:
        pad = groups * launch.group - qb
        union = torch.cat([mask, mask.new_zeros((b, h, pad, kb))], 2) if pad else mask
        union = union.unflatten(2, (groups, launch.group)).any(3)
    count = union.sum(-1, dtype=torch.int32).contiguous()  # (B, H, G)
    # exact block indices first, ascending (a stable sort of 0 = exact, 1 = folded)
    idx = torch.argsort((~union).to(torch.int8), dim=-1, stable=True).to(torch.int32).contiguous()
    return idx, count


def _tuned_args(k: torch.Tensor, v: torch.Tensor, launch: Launch) -> dict[str, object]:
    """The kernel's exact-loop tuning constexprs for `launch` (none for an untuned launch: the defaults)."""
    if not launch.tuned:
        return {}
    if launch.tma:
        for arg, x in (("k", k), ("v", v)):
            size = x.element_size()
            if x.stride(-1) != 1 or x.data_ptr() % 16 or any(st * size % 16 for st in x.stride()[:-1]):
                raise ValueError(
                    f"block_sparse_attention: Launch.tma needs {arg} with unit last stride and 16-byte aligned base "
                    f"and strides, got strides {tuple(x.stride())} ({x.dtype}) at address {x.data_ptr():#x}"
                )
        if not interpreting():  # device-side descriptors need Triton's global scratch (128 bytes a program)
            triton.set_allocator(_tma_scratch)
    return {
        "TUNED": True, "UNROLL": launch.unroll, "WIDE": launch.wide, "DOT_ACC": launch.dot_acc,
        "K_T": launch.k_transposed, "TMA": launch.tma, "EXACT_STAGES": launch.exact_stages,
        "UNROLL_FACTOR": launch.loop_unroll_factor, "WARP_SPEC": launch.warp_specialize,
    }  # fmt: skip


def _tma_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator for the tensor descriptors `tl.make_tensor_descriptor` builds on the device."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, route: Plan, launch: Launch = DEFAULT) -> torch.Tensor:
    """The attention kernel alone on a `plan(...)` of the same q, k, v (made with the same launch.group)."""
    if route.group != launch.group:
        raise ValueError(f"block_sparse_attention: plan made for group {route.group}, launch has {launch.group}")
    b, h, tq, d = q.shape
    qb, kb = route.mask.shape[-2:]
    groups = route.count.shape[-1]
    out = torch.empty((b, h, tq, d), dtype=q.dtype, device=q.device)
    tuning = {} if interpreting() else {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
    grid = (b * h, groups) if launch.heads_outer else (groups, b * h)
    _KERNEL[grid](
        q, k, v, route.k_mean, route.v_mean, route.log_len, route.mask.view(torch.uint8), route.idx, route.count, out,
        h, tq, k.shape[2], kb, qb, groups, route.scale * LOG2E,
        *q.stride(), *k.stride(), *v.stride(),
        F32=q.dtype == torch.float32 or interpreting(), BLOCK=BLOCK, D=d, GROUP=launch.group,
        BLOCK_M=launch.group * BLOCK, HEADS_OUTER=launch.heads_outer,
        **tuning, **_tuned_args(k, v, launch),
    )  # fmt: skip
    return out


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tau: float,
    sink_tokens: int,
    scale: float | None = None,
    return_density: bool = False,
    launch: Launch = DEFAULT,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`reference(q, k, v, tau, sink_tokens)`: `plan` (routing, in torch plus one small Triton kernel) then
    one Triton pass per (batch*head, group of query blocks) (`attend`).

    Exact key blocks load their 64 keys (only those: a compacted index list per row); folded ones enter as
    mean keys/values, 64 pseudo-keys per tensor-core dot, with the log-length bias. With `return_density`,
    also the routing density as a 0-dim tensor on q's device (no host sync: `float()` it when needed)."""
    route = plan(q, k, v, tau, sink_tokens, scale, launch)
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
