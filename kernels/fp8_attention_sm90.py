"""fp8_attention's kernel (step 3 of `fp8_attention`'s module doc) for Hopper in Gluon, with FlashAttention-3's
intra-warpgroup overlap: the candidate launch `fp8_attention.Launch(gluon=True)`, on sm_90 only.

Triton's pipeliner waits for every tensor-core dot right after issuing it (its TTGIR shows `warp_group_dot_wait
{pendings = 0}` after each dot of the key loop, however the loop is written), so the exponentials of a tile never
run while the tensor cores work. Here the waits are explicit (`warpgroup_mma(..., is_async=True)`,
`warpgroup_mma_wait(num_outstanding)`): per key tile j the logits dot of tile j and the P.V dot of tile j-1 are
issued together, the wait leaves the P.V in flight (`num_outstanding=1`, dots complete in order) while tile j's
softmax runs, and the accumulator is rescaled once that P.V lands. K and V tiles arrive by TMA into a ring of
`num_stages` buffers (mbarriers; a buffer is refilled once the dots that read it have completed). P goes to the
P.V dot from registers in bf16 and through a shared tile in e4m3 (`pv_dot` says why).

The maths is `fp8_attention.quantized_tile`'s, operation for operation: the same logits `(q8 . k8) * factor`,
running max and sum, P rounded as `P * 448` to e4m3 or to bf16 (round to nearest even), the accumulator rescaled by
alpha before each P.V is added (the accumulation order per tile is the Triton kernel's), the same epilogue. Only the
order of the row reductions and of the sums inside the dots may differ: the output equals
`fp8_attention.reference(..., block_n=launch.block_n)` up to fp32 rounding, the contract of the Triton kernel.

Operands: `attention_quantize.quantize`'s q8, k8 (B, H, T', D) e4m3 or int8 (T' a multiple of QUANT_BLOCK, zero rows
past T), per-128-token scales; v8 transposed (B, H, D, Tk') e4m3 with per-channel scales (pv="fp8") or v bf16 in
its own strides (pv="bf16"); D in 32, 64, 128. Not interpretable: Gluon has no CPU interpreter
(`tests/kernels/test_gluon_sm90.py` compiles it for sm_90 without a GPU).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from workbench.kernels.attention_quantize import QUANT_BLOCK, Quantized

# the TMA global-to-shared copy: `async_load` in Triton after 3.6 (the H200 image's), the older name before
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def softmax_step(
    s, factor, limit, m_i, l_i,
    MASKED: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr,
):  # fmt: skip
    """One tile's online-softmax step on unscaled logits `s` (M, N) fp32: the new running max and sum (M,), P (M, N)
    fp32 and alpha (M,), the accumulator's rescale. MASKED: keys `limit` and later weigh nothing."""
    s = s * factor  # log2 units
    if MASKED:
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(gl.expand_dims(cols, 0) < limit, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - gl.expand_dims(m_new, 1))  # <= 1
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return m_new, l_i, p, alpha


@gluon.jit
def round_p(p, PV_FP8: gl.constexpr):
    """P rounded for the P.V dot: `P * 448` in e4m3 (PV_FP8), else bf16. Called after the masked/unmasked branch:
    an e4m3 tile in a wgmma layout that leaves a runtime `if` comes back with rows 8..15 of every 16 wrong in Triton
    3.6 (measured on the H200), an fp32 one intact."""
    if PV_FP8:
        rounded = (p * 448.0).to(gl.float8e4nv)
    else:
        rounded = p.to(gl.bfloat16)
    return rounded


@gluon.jit
def load_kv_tile(
    k_desc, v_desc, bar, k_buf, v_buf, tile, pred, PV_FP8: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr
):  # fmt: skip
    """Key tile `tile` (BLOCK_N keys from key tile * BLOCK_N) into one ring buffer when `pred`: K (BLOCK_N, D), and V^T
    (D, BLOCK_N) e4m3 (PV_FP8) or V (BLOCK_N, D) bf16 (rows past Tk arrive as zeros)."""
    mbarrier.expect(bar, (1 + v_desc.dtype.primitive_bitwidth // 8) * BLOCK_N * D, pred=pred)
    tma_load(k_desc, [tile * BLOCK_N, 0], bar, k_buf, pred=pred)
    if PV_FP8:
        tma_load(v_desc, [0, tile * BLOCK_N], bar, v_buf, pred=pred)
    else:
        tma_load(v_desc, [tile * BLOCK_N, 0], bar, v_buf, pred=pred)


@gluon.jit
def v_descriptor(
    v_ptr, bh, b, h, TK, TKP, v_sb, v_sh, v_st, v_block: gl.constexpr, v_layout: gl.constexpr, PV_FP8: gl.constexpr
):  # fmt: skip
    """The TMA descriptor of one head's V: `quantize`'s e4m3 v transposed, (D, TKP) (PV_FP8), or bf16 v in its own
    strides, (TK, D)."""
    if PV_FP8:
        desc = tma.make_tensor_descriptor(
            v_ptr + bh * v_block[0] * TKP, shape=[v_block[0], TKP], strides=[TKP, 1], block_shape=v_block,
            layout=v_layout,
        )  # fmt: skip
    else:
        desc = tma.make_tensor_descriptor(
            v_ptr + b * v_sb + h * v_sh, shape=[TK, v_block[1]], strides=[v_st, 1], block_shape=v_block,
            layout=v_layout,
        )  # fmt: skip
    return desc


@gluon.jit
def pv_dot(p, v_buf, acc, p_smem, PV_FP8: gl.constexpr, p_layout: gl.constexpr):
    """Issue one key tile's P.V dot (async) on its ring buffer `v_buf`. PV_FP8: V^T's e4m3 tile seen back as the
    (N, D) operand (K-major, as FP8 dots need) and P from shared memory, written to `p_smem` first (the previous
    P.V that read it has completed): an e4m3 register operand cannot be named in the async wait's deps (Triton 3.6
    does not lower that wait), and without them its registers may be reused while the dot still reads them. Else V
    (N, D) bf16 and P from registers in `p_layout`. Returns the token and the P operand, for `pv_wait`."""
    if PV_FP8:
        p_smem.store(p)
        fence_async_shared()
        p_op = p_smem
        v_op = v_buf.permute((1, 0))
    else:
        p_op = gl.convert_layout(p, p_layout)
        v_op = v_buf
    return warpgroup_mma(p_op, v_op, acc, is_async=True), p_op


@gluon.jit
def p_buffer(BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, v_smem, PV_FP8: gl.constexpr):
    """`pv_dot`'s shared P tile (BLOCK_M, BLOCK_N) e4m3 when PV_FP8; else `v_smem`, unread."""
    if PV_FP8:
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.float8e4nv)
        buf = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, BLOCK_N], layout)
    else:
        buf = v_smem
    return buf


@gluon.jit
def pv_wait(pv, p_op, PV_FP8: gl.constexpr):
    """Wait for every dot in flight: the accumulator of `pv_dot`'s token, a register P operand kept alive until then."""
    if PV_FP8:
        acc = warpgroup_mma_wait(0, deps=(pv,))
    else:
        acc, p_op = warpgroup_mma_wait(0, deps=(pv, p_op))
    return acc


@gluon.jit
def key_loop(
    q_smem, k_desc, v_desc, k_smem, v_smem, p_smem, kv_bar, idx_row, n, ks_row, q_scale, TK, m_i, l_i, acc,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, QUANT: gl.constexpr, STAGES: gl.constexpr,
    QK_INT8: gl.constexpr, PV_FP8: gl.constexpr, SPARSE: gl.constexpr,
    s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
):  # fmt: skip
    """The online softmax over `n` >= 1 key tiles of BLOCK_N keys (module doc: the overlap), q8 waiting in `q_smem`:
    tiles 0..n-1, only the last masked (keys past TK weigh nothing), or with SPARSE the tiles listed at `idx_row`,
    each masked (any may be the last). K/V come through the ring `k_smem`/`v_smem` guarded by `kv_bar`, the K scale
    of a tile from `ks_row`. Returns the running max, sum and accumulator."""
    s_dtype: gl.constexpr = gl.int32 if QK_INT8 else gl.float32  # an int8 dot accumulates exactly in int32
    for i in gl.static_range(STAGES):  # entry i waits in buffer i % STAGES
        tile = gl.load(idx_row + i, mask=i < n, other=0) if SPARSE else i
        load_kv_tile(k_desc, v_desc, kv_bar.index(i), k_smem.index(i), v_smem.index(i), tile, i < n, PV_FP8, BLOCK_N, D)
    tile = gl.load(idx_row) if SPARSE else 0
    mbarrier.wait(kv_bar.index(0), 0)
    zero = gl.zeros([BLOCK_M, BLOCK_N], s_dtype, layout=s_layout)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,)).to(gl.float32)
    factor = q_scale * gl.load(ks_row + tile * BLOCK_N // QUANT)
    if SPARSE or n == 1:
        m_i, l_i, p32, alpha = softmax_step(s, factor, TK - tile * BLOCK_N, m_i, l_i, True, BLOCK_N, s_layout)
    else:
        m_i, l_i, p32, alpha = softmax_step(s, factor, 0, m_i, l_i, False, BLOCK_N, s_layout)
    p = round_p(p32, PV_FP8)
    for j in range(1, n):
        buf = j % STAGES
        done = (j - 1) % STAGES  # entry j-1's buffer: its P.V is issued below
        mbarrier.wait(kv_bar.index(buf), (j // STAGES) & 1)
        zero = gl.zeros([BLOCK_M, BLOCK_N], s_dtype, layout=s_layout)  # unread: the result's registers
        s = warpgroup_mma(q_smem, k_smem.index(buf).permute((1, 0)), zero, use_acc=False, is_async=True)
        pv, p_op = pv_dot(p, v_smem.index(done), acc, p_smem, PV_FP8, p_layout)
        s = warpgroup_mma_wait(1, deps=(s,)).to(gl.float32)  # the logits; entry j-1's P.V still in flight
        tile = gl.load(idx_row + j) if SPARSE else j
        factor = q_scale * gl.load(ks_row + tile * BLOCK_N // QUANT)
        if SPARSE or j == n - 1:
            m_i, l_i, p32, alpha = softmax_step(s, factor, TK - tile * BLOCK_N, m_i, l_i, True, BLOCK_N, s_layout)
        else:
            m_i, l_i, p32, alpha = softmax_step(s, factor, 0, m_i, l_i, False, BLOCK_N, s_layout)
        p = round_p(p32, PV_FP8)
        acc = pv_wait(pv, p_op, PV_FP8)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        refill = j - 1 + STAGES  # both dots that read buffer `done` have completed
        tile = gl.load(idx_row + refill, mask=refill < n, other=0) if SPARSE else refill
        load_kv_tile(k_desc, v_desc, kv_bar.index(done), k_smem.index(done), v_smem.index(done), tile, refill < n,
                     PV_FP8, BLOCK_N, D)  # fmt: skip
    pv, p_op = pv_dot(p, v_smem.index((n - 1) % STAGES), acc, p_smem, PV_FP8, p_layout)
    return m_i, l_i, pv_wait(pv, p_op, PV_FP8)


@gluon.jit
def _fp8_attention_sm90(
    q_ptr, qs_ptr, k_ptr, ks_ptr, v_ptr, vs_ptr, out_ptr,
    H, TQ, TK, TQP, TKP, qk_scale,
    v_sb, v_sh, v_st,
    o_sb, o_sh, o_st,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, QUANT: gl.constexpr, STAGES: gl.constexpr,
    QK_INT8: gl.constexpr, PV_FP8: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    pid = gl.program_id(0)
    bh = gl.program_id(1).to(gl.int64)
    b = bh // H
    h = bh % H
    # wgmma's accumulator layouts: logits (BLOCK_M, BLOCK_N) and output (BLOCK_M, D); P enters the P.V dot from
    # registers in the output's operand layout (32 bits of P per k step: 4 e4m3 or 2 bf16 values)
    v_dtype: gl.constexpr = gl.float8e4nv if PV_FP8 else gl.bfloat16
    pv_k: gl.constexpr = 256 // v_dtype.primitive_bitwidth
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 32]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, D, pv_k]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=pv_k // 8)
    qk_dtype: gl.constexpr = gl.int8 if QK_INT8 else gl.float8e4nv
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], qk_dtype)
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], qk_dtype)
    v_block: gl.constexpr = [D, BLOCK_N] if PV_FP8 else [BLOCK_N, D]
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(v_block, v_dtype)
    q_desc = tma.make_tensor_descriptor(
        q_ptr + bh * TQP * D, shape=[TQP, D], strides=[D, 1], block_shape=[BLOCK_M, D], layout=q_layout
    )
    k_desc = tma.make_tensor_descriptor(
        k_ptr + bh * TKP * D, shape=[TKP, D], strides=[D, 1], block_shape=[BLOCK_N, D], layout=k_layout
    )
    v_desc = v_descriptor(v_ptr, bh, b, h, TK, TKP, v_sb, v_sh, v_st, v_block, v_layout, PV_FP8)
    q_smem = gl.allocate_shared_memory(qk_dtype, [BLOCK_M, D], q_layout)
    k_smem = gl.allocate_shared_memory(qk_dtype, [STAGES, BLOCK_N, D], k_layout)
    v_smem = gl.allocate_shared_memory(v_dtype, [STAGES, v_block[0], v_block[1]], v_layout)
    p_smem = p_buffer(BLOCK_M, BLOCK_N, v_smem, PV_FP8)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_bar.index(i), count=1)

    mbarrier.expect(q_bar, BLOCK_M * D)
    tma_load(q_desc, [pid * BLOCK_M, 0], q_bar, q_smem)
    q_scale = gl.load(qs_ptr + bh * (TQP // QUANT) + (pid * BLOCK_M) // QUANT) * qk_scale
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
    mbarrier.wait(q_bar, 0)
    m_i, l_i, acc = key_loop(
        q_smem, k_desc, v_desc, k_smem, v_smem, p_smem, kv_bar, qs_ptr, gl.cdiv(TK, BLOCK_N),
        ks_ptr + bh * (TKP // QUANT), q_scale, TK, m_i, l_i, acc,
        BLOCK_M, BLOCK_N, D, QUANT, STAGES, QK_INT8, PV_FP8, False, s_layout, o_layout, p_layout,
    )  # fmt: skip
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bar.index(i))

    d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout)).to(gl.int64)
    rows = pid * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    if PV_FP8:
        acc = acc * gl.expand_dims(gl.load(vs_ptr + bh * D + d), 0)
    out = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    optr = out_ptr + b * o_sb + h * o_sh + gl.expand_dims(rows.to(gl.int64), 1) * o_st + gl.expand_dims(d, 0)
    gl.store(optr, out.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(rows < TQ, 1))


def attend_sm90(z: Quantized, out: torch.Tensor, tk: int, qk_scale: float, block_m: int, block_n: int,
                num_warps: int, num_stages: int) -> None:  # fmt: skip
    """The kernel on `quantize`'s operands of Tk = `tk` keys into `out` (B, H, Tq, D) of any strides;
    `qk_scale` is the softmax scale times log2(e). `fp8_attention.attend` checks the launch, installs Triton's
    scratch allocator for the device-side descriptors and calls this."""
    b, h, tq, d = out.shape
    _fp8_attention_sm90[(triton.cdiv(tq, block_m), b * h)](
        z.q8, z.q_scale, z.k8, z.k_scale, z.v, z.q_scale if z.v_scale is None else z.v_scale, out,
        h, tq, tk, z.q8.shape[2], z.k8.shape[2], qk_scale,
        *z.v.stride()[:3], *out.stride()[:3],
        BLOCK_M=block_m, BLOCK_N=block_n, D=d, QUANT=QUANT_BLOCK, STAGES=num_stages, QK_INT8=z.qk == "int8",
        PV_FP8=z.pv == "fp8", num_warps=num_warps,
    )  # fmt: skip
