"""block_sparse_attend's low-precision kernel for Hopper in Gluon (`block_sparse_attend.Launch(gluon=True)`, sm_90):
the exact key blocks with `fp8_attention_sm90`'s overlap, then the folded blocks as the Triton kernel does them.

One program per (64-row query block, batch*head), as `block_sparse_attend`'s. Its exact pass walks the query block's
key list (`idx`, the first `count` entries) like `fp8_attention_sm90`'s key loop: the logits dot of list entry j and
the P.V dot of entry j-1 in flight together, the softmax of entry j while the P.V runs, K and V tiles (64 keys, from the
list's block indices) by TMA into a ring of buffers; every tile's keys past Tk weigh nothing (any block may be the last
one). Then, after the accumulator takes v's per-channel e4m3 scale (pv="fp8"), the folded pass: the mean keys and
values of the blocks not in the list, 64 at a time (chunks with none skipped), as pseudo-keys with log(length) on the
logit, on q in bf16 with bf16 dots (synchronous: about one chunk per eight exact blocks at 20 % density).

The maths is the Triton kernel's low-precision path (`quantized_tile` per exact block, then its folded pass),
operation for operation; only the order of row reductions and of the sums inside the dots may differ, so the output
matches `block_sparse_attend.attend(..., quantized=z)` up to fp32 rounding and `block_sparse_attention.reference`
within its contract. Needs q with unit last stride and bf16 q, mean keys and values. Not interpretable (Gluon has no
CPU interpreter); `tests/kernels/test_gluon_sm90.py` compiles it for sm_90 without a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
)

from workbench.kernels.attention_quantize import QUANT_BLOCK, Quantized
from workbench.kernels.block_sparse_routing import BLOCK
from workbench.kernels.fp8_attention_sm90 import key_loop, p_buffer, tma_load, v_descriptor

if TYPE_CHECKING:
    from workbench.kernels.block_sparse_attend import Plan

# a barrier of the block's threads: `thread_barrier` in the H200's Triton 3.6, `barrier` after
_block_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def _block_sparse_sm90(
    q_ptr, km_ptr, vm_ptr, loglen_ptr, mask_ptr, idx_ptr, count_ptr, out_ptr,
    q8_ptr, qs_ptr, k8_ptr, ks_ptr, v_ptr, vs_ptr,
    H, TQ, TK, KB, QB, qk_scale, TQP, TKP,
    q_sb, q_sh, q_st,
    v_sb, v_sh, v_st,
    BLOCK: gl.constexpr, D: gl.constexpr, QUANT: gl.constexpr, STAGES: gl.constexpr,
    QK_INT8: gl.constexpr, PV_FP8: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    g = gl.program_id(0)  # query block
    bh = gl.program_id(1).to(gl.int64)
    b = bh // H
    h = bh % H
    v_dtype: gl.constexpr = gl.float8e4nv if PV_FP8 else gl.bfloat16
    pv_k: gl.constexpr = 256 // v_dtype.primitive_bitwidth
    wgmma: gl.constexpr = [num_warps, 1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=wgmma, instr_shape=[16, BLOCK, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=wgmma, instr_shape=[16, D, pv_k])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=pv_k // 8)
    # the folded pass: bf16 dots
    f_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=wgmma, instr_shape=[16, BLOCK, 16])
    fo_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=wgmma, instr_shape=[16, D, 16])
    rows_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # (BLOCK, D) plain loads
    qk_dtype: gl.constexpr = gl.int8 if QK_INT8 else gl.float8e4nv
    q8_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, D], qk_dtype)
    v_block: gl.constexpr = [D, BLOCK] if PV_FP8 else [BLOCK, D]
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(v_block, v_dtype)
    q8_desc = tma.make_tensor_descriptor(
        q8_ptr + bh * TQP * D, shape=[TQP, D], strides=[D, 1], block_shape=[BLOCK, D], layout=q8_layout
    )
    k_desc = tma.make_tensor_descriptor(
        k8_ptr + bh * TKP * D, shape=[TKP, D], strides=[D, 1], block_shape=[BLOCK, D], layout=q8_layout
    )
    v_desc = v_descriptor(v_ptr, bh, b, h, TK, TKP, v_sb, v_sh, v_st, v_block, v_layout, PV_FP8)
    q_smem = gl.allocate_shared_memory(qk_dtype, [BLOCK, D], q8_layout)
    k_smem = gl.allocate_shared_memory(qk_dtype, [STAGES, BLOCK, D], q8_layout)
    v_smem = gl.allocate_shared_memory(v_dtype, [STAGES, v_block[0], v_block[1]], v_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_bar.index(i), count=1)

    row = bh * QB + g  # this query block's row of mask, idx and count
    n_exact = gl.load(count_ptr + row)
    mbarrier.expect(q_bar, BLOCK * D)
    tma_load(q8_desc, [g * BLOCK, 0], q_bar, q_smem)
    q_scale = gl.load(qs_ptr + bh * (TQP // QUANT) + (g * BLOCK) // QUANT) * qk_scale
    m_i = gl.full([BLOCK], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BLOCK], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK, D], gl.float32, layout=o_layout)
    mbarrier.wait(q_bar, 0)
    # 1. exact key blocks, in low precision
    if n_exact > 0:
        m_i, l_i, acc = key_loop(
            q_smem, k_desc, v_desc, k_smem, v_smem, p_buffer(BLOCK, BLOCK, v_smem, PV_FP8), kv_bar, idx_ptr + row * KB, n_exact,
            ks_ptr + bh * (TKP // QUANT), q_scale, TK, m_i, l_i, acc,
            BLOCK, BLOCK, D, QUANT, STAGES, QK_INT8, PV_FP8, True, s_layout, o_layout, p_layout,
        )  # fmt: skip
    d = gl.arange(0, D, layout=gl.SliceLayout(0, fo_layout)).to(gl.int64)
    acc = gl.convert_layout(acc, fo_layout, assert_trivial=True)
    if PV_FP8:  # P.V ran on e4m3 v without its per-channel scale; the folded pass adds real values
        acc = acc * gl.expand_dims(gl.load(vs_ptr + bh * D + d), 0)
    # 2. folded key blocks: their mean keys, BLOCK at a time, as pseudo-keys with log(length) on the logit
    m_i = gl.convert_layout(m_i, gl.SliceLayout(1, f_layout))
    l_i = gl.convert_layout(l_i, gl.SliceLayout(1, f_layout))
    load_rows = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, rows_layout))
    load_d = gl.arange(0, D, layout=gl.SliceLayout(0, rows_layout)).to(gl.int64)
    q_rows = g * BLOCK + load_rows
    q = gl.load(q_ptr + b * q_sb + h * q_sh + gl.expand_dims(q_rows.to(gl.int64), 1) * q_st + gl.expand_dims(load_d, 0),
                mask=gl.expand_dims(q_rows < TQ, 1), other=0.0)  # fmt: skip
    mean_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, D], gl.bfloat16)
    q_bf16 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK, D], mean_layout, q.to(gl.bfloat16))  # the dots' A
    km_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK, D], mean_layout)
    vm_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK, D], mean_layout)
    km_desc = tma.make_tensor_descriptor(
        km_ptr + bh * KB * D, shape=[KB, D], strides=[D, 1], block_shape=[BLOCK, D], layout=mean_layout
    )
    vm_desc = tma.make_tensor_descriptor(
        vm_ptr + bh * KB * D, shape=[KB, D], strides=[D, 1], block_shape=[BLOCK, D], layout=mean_layout
    )
    m_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(m_bar, count=1)
    phase = 0
    fence_async_shared()
    _block_barrier()  # q_bf16 written by every thread before the dots read it
    for c in range(0, KB, BLOCK):
        blocks = c + gl.arange(0, BLOCK, layout=gl.SliceLayout(0, f_layout))
        block_ok = blocks < KB
        folded = gl.load(mask_ptr + row * KB + blocks, mask=block_ok, other=1) == 0  # (BLOCK,)
        if gl.sum(folded.to(gl.int32), axis=0) > 0:  # skip chunks that are all exact
            # the mean keys and values of blocks c..c+BLOCK (rows past KB arrive as zeros); the previous chunk's
            # dots have completed (synchronous), so the buffers are free
            mbarrier.expect(m_bar, 2 * BLOCK * D * 2)
            tma_load(km_desc, [c, 0], m_bar, km_smem)
            tma_load(vm_desc, [c, 0], m_bar, vm_smem)
            mbarrier.wait(m_bar, phase)
            phase ^= 1
            s = warpgroup_mma(q_bf16, km_smem.permute((1, 0)), gl.zeros([BLOCK, BLOCK], gl.float32, layout=f_layout),
                              use_acc=False)  # fmt: skip
            bias = gl.load(loglen_ptr + blocks, mask=block_ok, other=0.0) * 1.4426950408889634
            s = gl.where(gl.expand_dims(folded, 0), s * qk_scale + gl.expand_dims(bias, 0), float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s - gl.expand_dims(m_use, 1))
            l_i = l_i * alpha + gl.sum(p, axis=1)
            p_op = gl.convert_layout(
                p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=fo_layout, k_width=2)
            )
            pv = warpgroup_mma(p_op, vm_smem, gl.zeros([BLOCK, D], gl.float32, layout=fo_layout), use_acc=False)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, fo_layout)), 1) + pv
            m_i = m_new
    mbarrier.invalidate(q_bar)
    mbarrier.invalidate(m_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bar.index(i))
    rows = g * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, fo_layout))
    out = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, fo_layout)), 1)
    optr = out_ptr + gl.expand_dims((bh * TQ + rows.to(gl.int64)), 1) * D + gl.expand_dims(d, 0)
    gl.store(optr, out.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(rows < TQ, 1))


def attend_sm90(
    q: torch.Tensor, route: Plan, z: Quantized, tk: int, qk_scale: float, num_stages: int
) -> torch.Tensor:  # fmt: skip
    """The kernel on a routing plan `route` of q (B, H, Tq, D) bf16 with unit last stride and `quantize`'s operands `z`
    of the same q, k, v (Tk = `tk`); `qk_scale` is the softmax scale times log2(e): (B, H, Tq, D) contiguous in q's
    dtype. `block_sparse_attend.attend` checks the launch, installs Triton's scratch allocator for the device-side
    descriptors and calls this."""
    b, h, tq, d = q.shape
    qb, kb = route.mask.shape[-2:]
    out = torch.empty((b, h, tq, d), dtype=q.dtype, device=q.device)
    v_strides = z.v.stride()[:3] if z.pv == "bf16" else (0, 0, 0)
    means = route.k_mean.contiguous(), route.v_mean.contiguous()  # (B, H, Kb, D) bf16, read by TMA
    _block_sparse_sm90[(qb, b * h)](
        q, *means, route.log_len, route.mask.view(torch.uint8), route.idx, route.count, out,
        z.q8, z.q_scale, z.k8, z.k_scale, z.v, z.q_scale if z.v_scale is None else z.v_scale,
        h, tq, tk, kb, qb, qk_scale, z.q8.shape[2], z.k8.shape[2],
        *q.stride()[:3], *v_strides,
        BLOCK=BLOCK, D=d, QUANT=QUANT_BLOCK, STAGES=num_stages, QK_INT8=z.qk == "int8", PV_FP8=z.pv == "fp8",
        num_warps=4,
    )  # fmt: skip
    return out
