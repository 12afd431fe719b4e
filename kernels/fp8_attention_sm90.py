"""The low-bit attention kernel for Hopper in CuTe DSL (sm_90a): warp-specialized, FlashAttention-3's schedule.

Same maths and operands as `fp8_attention.attend` with pv="fp8" (`attention_quantize.quantize`'s q8, k8 in e4m3 or
int8, v8 in e4m3 transposed with its keys in `v_slot` order, the per-block and per-channel scales), or with pv="int8"
(`pv_int8` below); the output is the same up to fp32 summation order inside the dots, exp2's last bit, and l, which
sums P as rounded to e4m3 (int8) here (`Fp8AttentionSm90`: under 5e-3 relative L2 from the Triton kernel, which
sums it unrounded as `reference` does; tests/kernels/test_fp8_attention_sm90.py holds the bound).

One CTA per (128 query rows, head, batch): 3 warpgroups of 128 threads.
- Warpgroup 0, the producer (24 registers a thread): one warp issues the TMA loads, q8's 128 x 128 tile once, then
  the 128-key tiles of k8 (128 x 128) and v8 (128 channels x 128 keys) into rings of `stages` buffers, each guarded
  by a full / empty mbarrier pair (`cutlass.pipeline.PipelineTmaAsync`).
- Warpgroups 1 and 2, the consumers (240 registers a thread): 64 query rows each. Per key tile j, in one warpgroup:
  issue S_j = q8 . k8_j^T (wgmma, FP8 with fp32 accumulation or INT8 with int32), issue O += P_{j-1} . v8_{j-1}
  (wgmma, P from registers), wait for S_j only, do tile j's online softmax (written to run under that P.V),
  then wait for it, rescale O and l by the max's change and turn P_j into the next P.V's register operand. ptxas
  places that wait at the top of the softmax's block, so a warpgroup's softmax runs under the other warpgroup's
  dots, not its own (evidence for this schedule: benchmarks/results/probes/2026-12-06-fp8-attention-schedule-h100.json,
  benchmarks/results/fp8-attention-cute-bounce.json).

The softmax, per logit: one FFMA `s * factor - (m - log2 448)` (factor = scale_q * scale_k * softmax scale *
log2 e), one ex2.approx and half an F2FP (fp32 pairs to e4m3 pairs); the row sum comes from the P.V dot (a ones
channel of v8). The row max is taken on the unscaled logits (factor > 0), reduced over the 4 lanes that share a row
by two butterfly shuffles. P is made as `P * 448` (e4m3's top) and l sums it so; the epilogue divides it out.
INT8 Q.K^T's int32 logits S become fp32 without a conversion: S plus the bits of 1.5 * 2^23 (one IADD) reads as the
fp32 1.5 * 2^23 + S (exact: |S| <= 127 * 127 * 128 < 2^22), the max less 1.5 * 2^23 is exact, and the FFMA takes
1.5 * 2^23 * factor off with the shift, which rounds once (at most half an ulp of 1.5 * 2^23 * factor, the same
for a row's whole tile), instead of an I2FP a logit (evidence: benchmarks/results/fp8-attention-cute-options.json).

pv_int8 (`attention_quantize.quantize` with pv="int8": v8 in int8; `fp8_attention`'s pv="int8" maths): P is made
per tile against the tile's own row max, `127 * P / P_max` (P_max = exp2(top - m), kept per row), rounded to int8
by adding 1.5 * 2^23 (the integer lands in the float's low byte, which the operand takes: no F2I), and the P.V dot is
an INT8 wgmma (N = 144: an INT8 dot's N is a multiple of 16) into an int32 accumulator that each tile's first k-block
overwrites, converted to fp32 by I2FP (exact: |P . v| < 2^22) in the fold (evidence:
benchmarks/results/fp8-attention-cute-bounce.json, `bias`). O is then a plain fp32 register tile:
`O = (O + product * P_max) * alpha` per tile, the ones channel (l) alike, so l sums P as rounded to int8 and carries
127 as O does. What `fp8_attention.attend` runs for pv="int8" on sm_90 (`sm90_kernel`; evidence:
benchmarks/results/fp8-attention.json, the `...,triton` arms).

Register operand P: the accumulator gives a thread keys 2t, 2t+1 (+8, +16, +24) of each 32 (t = lane % 4), the FP8
A operand wants keys 4t..4t+3 and 4t+16..4t+19; with v8's keys stored in `v_slot` order the thread's own values are
exactly the ones its operand slots need, so the conversion is a renaming of registers (`_P_FROM_S`), no shuffle.

Block-sparse (`sparse`, `attend_sparse`): block_sparse_attention with its exact key blocks in low precision, the whole
attention in this kernel. Warpgroup w of a CTA runs query block 2 * m_block + w (64 rows; the last CTA's second
warpgroup repeats the last block when Qb is odd, its rows unwritten) from its own ring of `stages` (2) 128-key K/V
buffers, which producer warp w fills by TMA:
- the exact pass, this loop over the block's list of 64-key blocks two a buffer (`steps`: the visits of
  `block_sparse_attention.visits`, pairs, an odd one out alone, the ragged last block alone; a one-block step loads
  its block twice and masks the copy). A step's two blocks may have different k scales, so the softmax takes the max
  of each block's logits scaled by its own factor. v8's buffers are 64-key halves (64-byte swizzle), since TMA writes
  whole swizzle rows;
- then O and l in real units (v's per-channel scale in, l's factor 448 or 127 out), and the folded pass (`fold_pass`) as
  block_sparse_attend runs it: every key block's smoothed mean key and mean value, 64 a buffer in bf16 (the same
  bytes as the K and V buffers), the warpgroup's q rows in bf16 (their own tile), logits plus log2 of the block's
  length (-inf where the block is exact), P rounded to bf16 for a bf16 P.V dot, l from FADDs; then O / l.

`attend(z, out, tk, scale)`: the host entry on torch tensors, compiled once per configuration and shapes (for
sm_90a: `cute.compile(..., options="--gpu-arch sm_90a")`, so a CPU without a GPU builds it too) and launched on torch's
current stream. Needs the CuTe DSL (nvidia-cutlass-dsl, the `flash4` extra); not imported by the package otherwise.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90
import torch
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.runtime import from_dlpack
from cutlass.cutlass_dsl import T, dsl_user_op

from workbench.kernels.attention_quantize import FP8_MAX, Quantized
from workbench.kernels.block_sparse_attend import Plan
from workbench.kernels.block_sparse_routing import BLOCK as SPARSE_BLOCK
from workbench.kernels.fp8_attention import LOG2E

TILE_M = 128  # query rows a CTA: two consumer warpgroups of 64
TILE_N = 128  # keys a tile (the quantization block: one k scale a tile)
HEAD_DIM = 128
THREADS = 384
LOG2_FP8_MAX = math.log2(FP8_MAX)
LOG2_INT8_MAX = math.log2(127.0)
_MAGIC = 12582912.0  # 1.5 * 2^23: fp32 steps of 1 from 2^23 to 2^24, so x + _MAGIC keeps round(x) in the low bits
_BIAS = 0x4B400000  # the bits of _MAGIC as an int32

# _P_FROM_S[a] = s: register a of the P.V operand (one 32-key k-block: 4 keys x 2 rows x 2 halves) takes accumulator
# value s of the logits' fragment (2 columns x 2 rows x 4 groups of 8 columns of the same 32 keys). Slot 16g + 4t +
# 2h + e of the operand holds key 16g + 8h + 2t + e (attention_quantize.v_slot), which the accumulator keeps at value
# e + 2r + 4(2g + h) for row half r.
_P_FROM_S = tuple(e + 2 * r + 4 * (2 * g + h) for g in range(2) for r in range(2) for h in range(2) for e in range(2))


@dsl_user_op
def _ex2(x: Float32, *, loc=None, ip=None) -> Float32:
    """ex2.approx.ftz.f32, free to be scheduled (the library's `cute.arch.exp2` is marked as having side effects)."""
    return Float32(
        llvm.inline_asm(
            T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], "ex2.approx.ftz.f32 $0, $1;", "=f,f",
            has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )  # fmt: skip


def _sum_tree(values: list) -> Float32:
    """The sum of `values` (a power of two of them) by a tree of FADD. Plain Python, run while the kernel is
    traced."""
    while len(values) > 1:
        values = [values[k] + values[k + 1] for k in range(0, len(values), 2)]
    return values[0]


def _max_tree(values: list) -> Float32:
    """The max of `values` (a power of two of them) by a tree of FMNMX (independent instructions, not a chain).
    Plain Python, run while the kernel is traced."""
    while len(values) > 1:
        values = [cute.arch.fmax(values[k], values[k + 1]) for k in range(0, len(values), 2)]
    return values[0]


def _tma_tiles(atom: cute.CopyAtom, smem: cute.Tensor, gmem: cute.Tensor) -> tuple:
    """TMA's (shared, global) partitions of a tile's buffers and a tensor's tiles (one CTA, no multicast)."""
    one = cute.make_layout(1)
    return cpasync.tma_partition(atom, 0, one, cute.group_modes(smem, 0, 2), cute.group_modes(gmem, 0, 2))


class Fp8AttentionSm90:
    """The kernel for one configuration: `qk_int8` (INT8 Q.K^T with int32 accumulation, else e4m3 with fp32),
    `pv_int8`, `sparse`; `stages` K/V ring buffers follow from `sparse` (evidence for 3:
    benchmarks/results/probes/fp8-attention-cute-stages-lazy.json). `cute.compile` it once per configuration and
    shape.

    The row sums l come from the P.V dot itself, as an extra output channel (N = 136: each v8 stage holds 8 more rows,
    a row of ones and 7 of zeros, written once), instead of 64 FADDs a tile; l is then the sum of P as rounded to
    e4m3, the weights the dot used (the reference sums it unrounded: under 5e-3 relative L2 between the two). The
    channel is moved into fp32 l and zeroed after every tile: an e4m3 dot's accumulator keeps only about 14 bits
    against its running value, so a whole row's sum of P carried in it loses the small terms
    (benchmarks/results/probes/fp8-attention-cute-probes.json has the carried variant's error)."""

    def __init__(self, qk_int8: bool, pv_int8: bool = False, sparse: bool = False):
        """`pv_int8`: INT8 P.V on int8 v (module doc), else e4m3 P.V on e4m3 v. `sparse`: block_sparse_attention
        (module doc: block-sparse). `stages`: 3 K/V buffers, or sparse 2 a consumer warpgroup (what fits in shared
        memory beside the bf16 q tiles)."""
        self.qk_int8 = qk_int8
        self.pv_int8 = pv_int8
        self.stages = 2 if sparse else 3
        self.sparse = sparse
        self.rings = 2 if sparse else 1  # K/V rings: sparse, one a consumer warpgroup (each has its own key list)
        self.key_block = SPARSE_BLOCK if sparse else TILE_N  # keys a TMA load: a 128-key stage is two sparse blocks
        # the P.V dot's N: v8's channels and the ones row (+ 7 zero rows; 15 for an INT8 dot, whose N is a multiple of
        # 16 past 32)
        self.v_rows = HEAD_DIM + (16 if pv_int8 else 8)
        self.qk_dtype = cutlass.Int8 if qk_int8 else cutlass.Float8E4M3FN
        self.s_dtype = Int32 if qk_int8 else Float32
        self.v_dtype = cutlass.Int8 if pv_int8 else cutlass.Float8E4M3FN
        self.o_dtype = Int32 if pv_int8 else Float32  # the P.V dot's accumulator

    def _mmas(self) -> tuple[cute.TiledMma, cute.TiledMma]:
        k_major = OperandMajorMode.K
        qk = sm90.make_trivial_tiled_mma(
            self.qk_dtype, self.qk_dtype, k_major, k_major, self.s_dtype, (2, 1, 1), tiler_mn=(64, TILE_N)
        )
        pv = sm90.make_trivial_tiled_mma(
            self.v_dtype, self.v_dtype, k_major, k_major, self.o_dtype, (2, 1, 1),
            tiler_mn=(64, self.v_rows), a_source=warpgroup.OperandSource.RMEM,
        )  # fmt: skip
        return qk, pv

    def _storage(self, sQ_layout, sK_layout, sV_layout, sQb_layout) -> type:
        """The kernel's shared memory as a cute.struct: mbarriers, then q8, the K and V buffers and (sparse) the bf16
        q tiles with their mbarriers (a full / empty pair per warpgroup)."""
        buffers = self.rings * self.stages
        memory = cute.struct.MemRange

        def tile(dtype, layout):
            return cute.struct.Align[memory[dtype, cute.cosize(layout)], 1024]

        fields = {"bar_q": memory[cutlass.Int64, 2]}
        if sQb_layout is not None:
            fields["bar_qb"] = memory[cutlass.Int64, 4]
        fields |= {
            "bar_k": memory[cutlass.Int64, buffers * 2],
            "bar_v": memory[cutlass.Int64, buffers * 2],
            "sQ": tile(self.qk_dtype, sQ_layout),
            "sK": tile(self.qk_dtype, sK_layout),
            "sV": tile(self.v_dtype, sV_layout),
        }
        if sQb_layout is not None:
            fields["sQb"] = tile(cutlass.BFloat16, sQb_layout)
        return cute.struct(type("Storage", (), {"__annotations__": fields}))

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (Tq', 128, H, B) q8, channels contiguous
        mK: cute.Tensor,  # (Tk', 128, H, B) k8
        mV: cute.Tensor,  # (128, Tk', H, B) v8 transposed, keys contiguous (v_slot order)
        mQs: cute.Tensor,  # (Tq'/128, H, B) fp32 q scales
        mKs: cute.Tensor,  # (Tk'/128, H, B) fp32 k scales
        mVs: cute.Tensor,  # (128, H, B) fp32 scale_v / 448 (pv_int8: / 127)
        mO: cute.Tensor,  # (Tq, 128, H, B) bf16 or fp32 output, channels contiguous
        qk_scale: Float32,  # softmax scale * log2(e)
        tk: Int32,  # real keys (Tk <= Tk')
        stream: cuda.CUstream,  # the launch's stream (the caller's current torch stream)
        mIdx: cute.Tensor | None = None,  # sparse: (Kb, Qb, H, B) int32 exact key blocks, ascending
        mCount: cute.Tensor | None = None,  # sparse: (Qb, H, B) int32 how many of them
        mMask: cute.Tensor | None = None,  # sparse: (Kb, Qb, H, B) uint8, 1 where exact
        mLogLen: cute.Tensor | None = None,  # sparse: (Kb,) fp32 log of each key block's length
        mQb: cute.Tensor | None = None,  # sparse: (Tq, 128, H, B) bf16 q, channels contiguous
        mKm: cute.Tensor | None = None,  # sparse: (Kb, 128, H, B) bf16 smoothed mean keys
        mVm: cute.Tensor | None = None,  # sparse: (Kb, 128, H, B) bf16 mean values
    ):
        # e4m3 operands may come as uint8 views (DLPack without float8 types): the same bytes, read as e4m3
        if const_expr(mQ.element_type == cutlass.Uint8):
            mQ, mK = cute.recast_tensor(mQ, cutlass.Float8E4M3FN), cute.recast_tensor(mK, cutlass.Float8E4M3FN)
        if const_expr(mV.element_type == cutlass.Uint8):
            mV = cute.recast_tensor(mV, self.v_dtype)
        qk_mma, pv_mma = self._mmas()
        row_major = utils.LayoutEnum.ROW_MAJOR
        buffers = self.rings * self.stages  # 128-key K/V buffers
        loads = buffers * TILE_N // self.key_block  # TMA loads of key_block keys that fill them
        sQ_layout = sm90.make_smem_layout_a(row_major, (TILE_M, TILE_N, HEAD_DIM), self.qk_dtype, 1)
        sK_layout = sm90.make_smem_layout_b(row_major, (TILE_M, TILE_N, HEAD_DIM), self.qk_dtype, buffers)
        # the same bytes as key_block-row buffers (a 128-byte row a key: rows stack): what TMA writes
        sK_load = sm90.make_smem_layout_b(row_major, (TILE_M, self.key_block, HEAD_DIM), self.qk_dtype, loads)
        # v8: the P.V view's buffers are key_block keys wide (sparse: two 64-key halves a stage, each its own
        # 64-byte-swizzled tile, as TMA can only write whole swizzle rows)
        sV_layout = sm90.make_smem_layout_b(row_major, (TILE_M, self.v_rows, self.key_block), self.v_dtype, loads)
        # TMA writes the first 128 rows of each v8 buffer: that layout with the P.V view's buffer stride
        sV_load = sm90.make_smem_layout_b(row_major, (TILE_M, HEAD_DIM, self.key_block), self.v_dtype, loads)
        sV_load = cute.make_composed_layout(
            sV_load.inner,
            0,
            cute.make_layout(sV_load.outer.shape, stride=(*sV_load.outer.stride[:2], sV_layout.outer.stride[2])),
        )
        tma_load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(tma_load, mQ, cute.select(sQ_layout, mode=[0, 1]), (TILE_M, HEAD_DIM))
        tma_k, tK = cpasync.make_tiled_tma_atom(
            tma_load, mK, cute.select(sK_load, mode=[0, 1]), (self.key_block, HEAD_DIM)
        )
        tma_v, tV = cpasync.make_tiled_tma_atom(
            tma_load, mV, cute.select(sV_load, mode=[0, 1]), (HEAD_DIM, self.key_block)
        )
        # sparse, the folded pass: each warpgroup's 64 bf16 q rows (its own buffer), and 64 mean keys and their mean
        # values a step in bf16 (64 x 128, the same layout for both), in the K and V buffers of its ring
        sQb_layout = sKm_layout = sVm_layout = tma_qb = tQb = tma_km = tKm = tma_vm = tVm = None
        if const_expr(self.sparse):
            bf16 = cutlass.BFloat16
            sQb_layout = sm90.make_smem_layout_a(row_major, (SPARSE_BLOCK, SPARSE_BLOCK, HEAD_DIM), bf16, 2)
            sKm_layout = sm90.make_smem_layout_b(row_major, (SPARSE_BLOCK, SPARSE_BLOCK, HEAD_DIM), bf16, buffers)
            # the mean values' tiles with the V buffers' stride (in bf16 elements): 64 x 128 fits in 136 x 128 bytes
            v_stride = cute.cosize(sV_layout) // buffers // 2
            sVm_layout = cute.make_composed_layout(
                sKm_layout.inner,
                0,
                cute.make_layout(sKm_layout.outer.shape, stride=(*sKm_layout.outer.stride[:2], (0, v_stride))),
            )
            tile = (SPARSE_BLOCK, HEAD_DIM)
            tma_qb, tQb = cpasync.make_tiled_tma_atom(tma_load, mQb, cute.select(sQb_layout, mode=[0, 1]), tile)
            tma_km, tKm = cpasync.make_tiled_tma_atom(tma_load, mKm, cute.select(sKm_layout, mode=[0, 1]), tile)
            tma_vm, tVm = cpasync.make_tiled_tma_atom(tma_load, mVm, cute.select(sVm_layout, mode=[0, 1]), tile)

        self.storage = self._storage(sQ_layout, sK_layout, sV_layout, sQb_layout)
        grid = (cute.ceil_div(cute.size(mO, mode=[0]), TILE_M), cute.size(mO, mode=[2]), cute.size(mO, mode=[3]))
        self.kernel(
            tma_q, tQ, tma_k, tK, tma_v, tV, mQs, mKs, mVs, mO, qk_scale, tk,
            sQ_layout, sK_layout, sK_load, sV_layout, sV_load, qk_mma, pv_mma, mIdx, mCount, mMask, mLogLen,
            tma_qb, tQb, tma_km, tKm, tma_vm, tVm, sQb_layout, sKm_layout, sVm_layout,
        ).launch(grid=grid, block=[THREADS, 1, 1], min_blocks_per_mp=1, stream=stream)  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        mQs: cute.Tensor,
        mKs: cute.Tensor,
        mVs: cute.Tensor,
        mO: cute.Tensor,
        qk_scale: Float32,
        tk: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sK_load: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sV_load: cute.ComposedLayout,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        mIdx: cute.Tensor | None,
        mCount: cute.Tensor | None,
        mMask: cute.Tensor | None,
        mLogLen: cute.Tensor | None,
        tma_qb: cute.CopyAtom | None,
        mQb: cute.Tensor | None,
        tma_km: cute.CopyAtom | None,
        mKm: cute.Tensor | None,
        tma_vm: cute.CopyAtom | None,
        mVm: cute.Tensor | None,
        sQb_layout: cute.ComposedLayout | None,
        sKm_layout: cute.ComposedLayout | None,
        sVm_layout: cute.ComposedLayout | None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, h, b = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            for atom in (tma_q, tma_k, tma_v):
                cpasync.prefetch_descriptor(atom)

        storage = cutlass.utils.SmemAllocator().allocate(self.storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sK_tma = storage.sK.get_tensor(sK_load.outer, swizzle=sK_load.inner)  # the same buffers, as TMA fills them
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sV_tma = storage.sV.get_tensor(sV_load.outer, swizzle=sV_load.inner)  # the same buffers, 128 rows a stage
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 8)  # one arrive per consumer warp
        ring_consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 8 // self.rings)  # a ring's warps
        warpgroup_consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4)  # a bf16 q tile's warps
        q_bytes = cute.size_in_bytes(self.qk_dtype, cute.select(sQ_layout, mode=[0, 1]))
        k_bytes = cute.size_in_bytes(self.qk_dtype, cute.select(sK_layout, mode=[0, 1]))
        v_bytes = cute.size_in_bytes(self.v_dtype, cute.select(sV_load, mode=[0, 1])) * (TILE_N // self.key_block)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.bar_q.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=q_bytes, defer_sync=True,
        )  # fmt: skip
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.bar_k.data_ptr(), num_stages=self.rings * self.stages, producer_group=producer,
            consumer_group=ring_consumers, tx_count=k_bytes, defer_sync=True,
        )  # fmt: skip
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.bar_v.data_ptr(), num_stages=self.rings * self.stages, producer_group=producer,
            consumer_group=ring_consumers, tx_count=v_bytes, defer_sync=True,
        )  # fmt: skip
        folded = None  # sparse: the folded pass's smem tensors and q tiles' pipeline (`fold_pass`)
        if const_expr(self.sparse):
            bf16 = cutlass.BFloat16
            sQb = storage.sQb.get_tensor(sQb_layout.outer, swizzle=sQb_layout.inner)
            sKm = storage.sK.get_tensor(sKm_layout.outer, swizzle=sKm_layout.inner, dtype=bf16)
            sVm = storage.sV.get_tensor(sVm_layout.outer, swizzle=sVm_layout.inner, dtype=bf16)
            qb_bytes = cute.size_in_bytes(bf16, cute.select(sQb_layout, mode=[0, 1]))
            pipe_qb = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.bar_qb.data_ptr(), num_stages=2, producer_group=producer,
                consumer_group=warpgroup_consumers, tx_count=qb_bytes, defer_sync=True,
            )  # fmt: skip
            folded = (sQb, sKm, sVm, pipe_qb)
        # v8's extra rows: channel 128 all ones, the rest zeros, in every buffer (key_block keys: THREADS / key_block
        # (row, buffer) pairs a pass). Before the first TMA: sparse, the folded pass's bf16 tiles reuse these bytes.
        extra = self.v_rows - HEAD_DIM
        for buffer in cutlass.range_constexpr(cute.size(sV, mode=[2])):
            for r in cutlass.range_constexpr(extra):
                if tidx // self.key_block == (buffer * extra + r) % (THREADS // self.key_block):
                    sV[HEAD_DIM + r, tidx % self.key_block, buffer] = self.v_dtype(1 if r == 0 else 0)
        cute.arch.fence_view_async_shared()  # these generic-proxy writes, seen by TMA's and the dots' async proxy
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        n_tiles = cute.ceil_div(tk, TILE_N)
        if warp < 4:  # the producer warpgroup: its first warp issues every load (sparse: warp w, ring w's)
            cute.arch.setmaxregister_decrease(24)
            if const_expr(self.sparse):
                if warp < 2:
                    self.load_blocks(
                        tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK_tma, sV_tma, pipe_q, pipe_k, pipe_v, m_block, h, b,
                        tk, mIdx, mCount, warp, tma_qb, mQb, tma_km, mKm, tma_vm, mVm, folded,
                    )  # fmt: skip
            elif warp == 0:
                self.load(
                    tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV_tma, pipe_q, pipe_k, pipe_v, m_block, h, b, n_tiles
                )
        else:
            cute.arch.setmaxregister_increase(240)
            self.consume(
                mQs, mKs, mVs, mO, qk_scale, tk, sQ, sK, sV, qk_mma, pv_mma, pipe_q, pipe_k, pipe_v,
                tidx - 128, m_block, h, b, n_tiles, mIdx, mCount, mMask, mLogLen, folded,
            )  # fmt: skip

    @cute.jit
    def load(self, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipe_q, pipe_k, pipe_v, m_block, h, b, n_tiles):
        """TMA: q8's tile once, then k8 and v8 tile by tile into their rings (waiting for a free buffer)."""
        gQ = cute.local_tile(mQ[None, None, h, b], (TILE_M, HEAD_DIM), (m_block, 0))
        gK = cute.local_tile(mK[None, None, h, b], (TILE_N, HEAD_DIM), (None, 0))  # (128, 128, tiles)
        gV = cute.local_tile(mV[None, None, h, b], (HEAD_DIM, TILE_N), (0, None))  # (128, 128, tiles)
        tQs, tQg = _tma_tiles(tma_q, sQ, gQ)
        tKs, tKg = _tma_tiles(tma_k, sK, gK)
        tVs, tVg = _tma_tiles(tma_v, sV, gV)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_q.producer_acquire(q_state)
        cute.copy(tma_q, tQg, tQs[None, 0], tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for j in cutlass.range(n_tiles, unroll=1):
            pipe_k.producer_acquire(state)
            cute.copy(tma_k, tKg[None, j], tKs[None, state.index], tma_bar_ptr=pipe_k.producer_get_barrier(state))
            pipe_v.producer_acquire(state)
            cute.copy(tma_v, tVg[None, j], tVs[None, state.index], tma_bar_ptr=pipe_v.producer_get_barrier(state))
            state.advance()

    @cute.jit
    def load_blocks(
        self, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipe_q, pipe_k, pipe_v, m_block, h, b, tk, mIdx, mCount,
        ring, tma_qb, mQb, tma_km, mKm, tma_vm, mVm, folded,
    ):  # fmt: skip
        """Sparse, producer warp `ring` (0 or 1) for consumer warpgroup `ring`: its bf16 q tile; then its ring's
        steps (`steps` of the warpgroup's list), two 64-key blocks a 128-key buffer (one block twice where a step has
        one: the copy is masked, its bytes are real v8), and the mean keys and values of all key blocks, 64 a buffer,
        for the folded pass. Warp 0 loads q8's tile first."""
        sQb, sKm, sVm, pipe_qb = folded
        tQs, tQg = _tma_tiles(tma_q, sQ, cute.local_tile(mQ[None, None, h, b], (TILE_M, HEAD_DIM), (m_block, 0)))
        if ring == 0:
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_q, tQg, tQs[None, 0], tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        tile = (SPARSE_BLOCK, HEAD_DIM)
        tQbs, tQbg = _tma_tiles(tma_qb, sQb, cute.local_tile(mQb[None, None, h, b], tile, (None, 0)))
        qb_state = pipeline.PipelineState(2, Int32(0), ring, Int32(1))  # a producer starts on phase 1 (empty)
        pipe_qb.producer_acquire(qb_state)
        cute.copy(
            tma_qb, tQbg[None, m_block * 2 + ring], tQbs[None, ring], tma_bar_ptr=pipe_qb.producer_get_barrier(qb_state)
        )
        tKs, tKg = _tma_tiles(tma_k, sK, cute.local_tile(mK[None, None, h, b], tile, (None, 0)))  # 64-key blocks
        tVs, tVg = _tma_tiles(tma_v, sV, cute.local_tile(mV[None, None, h, b], (HEAD_DIM, SPARSE_BLOCK), (0, None)))
        block, n_steps, n_pairs = self.steps(mIdx, mCount, m_block * 2 + ring, h, b, tk)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for t in cutlass.range(n_steps, unroll=1):
            first, second, _ = self.step_blocks(mIdx, block, h, b, t, n_pairs)
            slot = self.ring_slot(state, ring)
            pipe_k.producer_acquire(slot)
            bar = pipe_k.producer_get_barrier(slot)
            cute.copy(tma_k, tKg[None, first], tKs[None, 2 * slot.index], tma_bar_ptr=bar)
            cute.copy(tma_k, tKg[None, second], tKs[None, 2 * slot.index + 1], tma_bar_ptr=bar)
            pipe_v.producer_acquire(slot)
            bar = pipe_v.producer_get_barrier(slot)
            cute.copy(tma_v, tVg[None, first], tVs[None, 2 * slot.index], tma_bar_ptr=bar)
            cute.copy(tma_v, tVg[None, second], tVs[None, 2 * slot.index + 1], tma_bar_ptr=bar)
            state.advance()
        tKms, tKmg = _tma_tiles(tma_km, sKm, cute.local_tile(mKm[None, None, h, b], tile, (None, 0)))
        tVms, tVmg = _tma_tiles(tma_vm, sVm, cute.local_tile(mVm[None, None, h, b], tile, (None, 0)))
        for c in cutlass.range(cute.ceil_div(cute.size(mKm, mode=[0]), SPARSE_BLOCK), unroll=1):
            slot = self.ring_slot(state, ring)
            pipe_k.producer_acquire(slot)
            cute.copy(tma_km, tKmg[None, c], tKms[None, slot.index], tma_bar_ptr=pipe_k.producer_get_barrier(slot))
            pipe_v.producer_acquire(slot)
            cute.copy(tma_vm, tVmg[None, c], tVms[None, slot.index], tma_bar_ptr=pipe_v.producer_get_barrier(slot))
            state.advance()

    def ring_slot(self, state: pipeline.PipelineState, ring) -> pipeline.PipelineState:
        """Sparse: the pipelines' state (and buffer index) of position `state` in ring `ring`'s stages."""
        return pipeline.PipelineState(
            self.rings * self.stages, state.count, state.index + ring * self.stages, state.phase
        )

    def steps(self, mIdx, mCount, block, h, b, tk):
        """Sparse: (block, steps, pairs) of query block `block`'s visits (`block_sparse_attention.visits`): its
        ascending exact list in pairs, an odd one out alone, then alone the last key block when it ends past tk.
        A block past the last (the last CTA's second warpgroup when Qb is odd) is the last one again."""
        block = cutlass.min(block, cute.size(mCount, mode=[0]) - 1)
        n = mCount[block, h, b]
        ragged = Int32((mIdx[n - 1, block, h, b] + 1) * SPARSE_BLOCK > tk)  # the list's last block ends past tk
        full = n - ragged
        return block, full // 2 + full % 2 + ragged, full // 2

    def step_blocks(self, mIdx, block, h, b, t, n_pairs):
        """Sparse: step t's key blocks (first, second) and 1 where it has two (else 0, second = first): entries
        2t, 2t + 1 of the list while t < n_pairs, then entry t + n_pairs alone."""
        pair = Int32(t < n_pairs)
        entry = t + cutlass.min(t, n_pairs)
        return mIdx[entry, block, h, b], mIdx[entry + pair, block, h, b], pair

    @cute.jit
    def consume(
        self, mQs, mKs, mVs, mO, qk_scale, tk, sQ, sK, sV, qk_mma, pv_mma, pipe_q, pipe_k, pipe_v,
        ctid, m_block, h, b, n_tiles, mIdx, mCount, mMask, mLogLen, folded,
    ):  # fmt: skip
        """The two consumer warpgroups (module doc): ctid in 0..255. Sparse: warpgroup w runs query block
        2 * m_block + w over its exact list from ring w, then the folded pass (module doc: block-sparse)."""
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)  # O (pv_int8: the tile's product after k-block 0) accumulates
        if const_expr(self.pv_int8):  # the same dot that overwrites its accumulator: each tile's first k-block
            self.pv_zero = self._mmas()[1]
            self.pv_zero.set(warpgroup.Field.ACCUMULATE, False)
        qk_thr = qk_mma.get_slice(ctid)
        pv_thr = pv_mma.get_slice(ctid)
        rQ = qk_mma.make_fragment_A(qk_thr.partition_A(sQ))  # smem descriptors
        rK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))
        rV = pv_mma.make_fragment_B(pv_thr.partition_B(sV))
        acc_s = cute.make_rmem_tensor(qk_thr.partition_shape_C((TILE_M, TILE_N)), self.s_dtype)  # ((2,2,16),1,1)
        acc_o = cute.make_rmem_tensor(pv_thr.partition_shape_C((TILE_M, self.v_rows)), Float32)  # ((2,2,16|17),1,1)
        # pv_int8: the P.V dot's int32 accumulator, one tile's product at a time (acc_o is then plain fp32 O)
        acc_r = cute.make_rmem_tensor(acc_o.layout, self.o_dtype) if const_expr(self.pv_int8) else acc_o
        p_shape = pv_thr.partition_shape_A((TILE_M, TILE_N))  # ((4,2,2),1,4): 4 k-blocks of 32 keys
        p32 = cute.make_rmem_tensor(p_shape, Float32)
        p8 = pv_mma.make_fragment_A(p_shape)  # the dot's own element type (an INT8 dot's is signed i8)
        p = cute.make_rmem_tensor(acc_s.layout, Float32)  # P * 448 (pv_int8: 127 P / P_max + 1.5 * 2^23)
        acc_o.fill(0.0)
        m = cute.make_rmem_tensor((2,), Float32)  # running max (log2 units) of this thread's two rows
        l = cute.make_rmem_tensor((2,), Float32)  # noqa: E741  row sums of P * 448 before the last P.V's tile
        alpha = cute.make_rmem_tensor((2,), Float32)
        beta = cute.make_rmem_tensor((2,), Float32)  # pv_int8: P_max of the tile just made into P
        weight = cute.make_rmem_tensor((2,), Float32)  # pv_int8: P_max of the tile whose P.V is in acc_r
        m.fill(-Float32.inf)
        l.fill(0.0)
        lane_col = 2 * (ctid % 4)  # this thread's first key column within each group of 8
        q_factor = mQs[m_block, h, b] * qk_scale

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_q.consumer_wait(q_state)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

        wg = ctid // 128  # this consumer warpgroup: 0 or 1
        n_steps, n_pairs, block = n_tiles, None, None
        if const_expr(self.sparse):
            block, n_steps, n_pairs = self.steps(mIdx, mCount, m_block * 2 + wg, h, b, tk)

        # tile 0: its logits and softmax, no P.V yet
        step = self.step(mIdx, block, h, b, 0, n_pairs)
        pipe_k.consumer_wait(self.slot(k_state, wg))
        self.logits(qk_mma, acc_s, rQ, rK, self.slot(k_state, wg))
        warpgroup.wait_group(0)
        pipe_k.consumer_release(self.slot(k_state, wg))
        k_state.advance()
        self.softmax(
            acc_s, p, m, alpha, beta, self.factors(mKs, q_factor, step, h, b), self.limits(tk, step), lane_col, True
        )
        self.to_operand(p, p32, p8)
        for j in cutlass.range(1, n_steps, unroll=1):
            step = self.step(mIdx, block, h, b, j, n_pairs)
            factors = self.factors(mKs, q_factor, step, h, b)
            # P_{j-1}.V_{j-1} runs under tile j's softmax
            pipe_k.consumer_wait(self.slot(k_state, wg))
            self.logits(qk_mma, acc_s, rQ, rK, self.slot(k_state, wg))
            pipe_v.consumer_wait(self.slot(v_state, wg))
            if const_expr(self.pv_int8):
                weight[0], weight[1] = beta[0], beta[1]
            self.values(pv_mma, acc_r, p8, rV, self.slot(v_state, wg))
            warpgroup.wait_group(1)  # the logits are in; P.V still runs
            pipe_k.consumer_release(self.slot(k_state, wg))
            k_state.advance()
            self.softmax(acc_s, p, m, alpha, beta, factors, self.limits(tk, step), lane_col, False)
            warpgroup.wait_group(0)
            pipe_v.consumer_release(self.slot(v_state, wg))
            v_state.advance()
            if const_expr(not self.pv_int8):
                for r in cutlass.range_constexpr(2):  # the ones channel holds tile j-1's sum only: into fp32 l, zeroed
                    l[r] = l[r] + acc_o[64 + 2 * r]
                    acc_o[64 + 2 * r] = Float32(0.0)
            self.rescale(acc_o, l, weight, alpha)
            if const_expr(self.pv_int8):  # O += R * P_max * alpha, the ones channel (l) alike
                self.fold(acc_o, acc_r, weight)
            self.to_operand(p, p32, p8)
        pipe_v.consumer_wait(self.slot(v_state, wg))
        self.values(pv_mma, acc_r, p8, rV, self.slot(v_state, wg))
        warpgroup.wait_group(0)
        pipe_v.consumer_release(self.slot(v_state, wg))
        if const_expr(self.pv_int8):
            self.fold(acc_o, acc_r, beta)
        if const_expr(self.sparse):
            v_state.advance()  # the folded pass goes on in the same ring
            self.fold_pass(
                acc_o, l, m, alpha, mVs, mO, mMask, mLogLen, folded, pipe_k, pipe_v, k_state, v_state, pv_thr,
                qk_scale, block, wg, ctid % 128, m_block, h, b,
            )  # fmt: skip
        else:
            self.epilogue(acc_o, l, mVs, mO, pv_thr, m_block, h, b)

    def slot(self, state: pipeline.PipelineState, wg) -> pipeline.PipelineState:
        """The pipelines' state of a consumer's position `state`: itself, or (sparse) in warpgroup wg's ring."""
        return self.ring_slot(state, wg) if self.sparse else state

    def step(self, mIdx, block, h, b, j, n_pairs):
        """Key tile j, or (sparse) step j's (first, second, pair) (`step_blocks`)."""
        return self.step_blocks(mIdx, block, h, b, j, n_pairs) if self.sparse else j

    def factors(self, mKs, q_factor, step, h, b) -> tuple:
        """A tile's (`step`'s) logit factors, q's scale times softmax scale * log2 e times the k scale: one per 128
        keys (sparse: per 64-key block; a k scale covers 128 keys)."""
        if self.sparse:
            return tuple(q_factor * mKs[block // 2, h, b] for block in step[:2])
        return (q_factor * mKs[step, h, b],)

    def limits(self, tk, step) -> tuple:
        """A tile's (`step`'s) key limits, one per factor: its keys at or past a limit weigh nothing (past tk, or
        the second block of a one-block step)."""
        if self.sparse:
            first, second, pair = step
            return (tk - first * SPARSE_BLOCK, (tk - second * SPARSE_BLOCK) * pair)
        return (tk - step * TILE_N,)

    @cute.jit
    def logits(self, qk_mma, acc_s, rQ, rK, k_state):
        """Issue S = q8 . k8^T on the k8 tile in k_state's buffer (committed, not waited for)."""
        warpgroup.fence()
        qk_mma.set(warpgroup.Field.ACCUMULATE, False)
        for kb in cutlass.range_constexpr(HEAD_DIM // 32):
            cute.gemm(qk_mma, acc_s, rQ[None, None, kb, 0], rK[None, None, kb, k_state.index], acc_s)
            qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()

    @cute.jit
    def values(self, pv_mma, acc, p8, rV, v_state):
        """Issue acc += P . v8 on the v8 tile in v_state's buffer (committed, not waited for)."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(TILE_N // 32):
            mma = self.pv_zero if const_expr(self.pv_int8 and kb == 0) else pv_mma  # pv_int8: k-block 0 overwrites
            if const_expr(self.sparse):  # two 64-key buffers a stage, two k-blocks each
                v = rV[None, None, kb % 2, 2 * v_state.index + kb // 2]
            else:
                v = rV[None, None, kb, v_state.index]
            cute.gemm(mma, acc, p8[None, None, kb], v, acc)
        warpgroup.commit_group()

    @cute.jit
    def rescale(self, acc_o, l, weight, alpha):  # noqa: E741
        """O and l (pv_int8: O and the P_max of the product about to be folded in) times alpha, per row."""
        for r in cutlass.range_constexpr(2):
            if const_expr(self.pv_int8):
                weight[r] = weight[r] * alpha[r]
            else:
                l[r] = l[r] * alpha[r]
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[i] = acc_o[i] * alpha[(i // 2) % 2]

    @cute.jit
    def fold(self, acc_o, acc_r, weight):
        """pv_int8: O += R * weight per row, R the exact int32 product in acc_r (module doc); O and weight already
        rescaled."""
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[i] = Float32(acc_r[i]) * weight[(i // 2) % 2] + acc_o[i]

    @cute.jit
    def softmax(self, acc_s, p, m, alpha, beta, factors, limits, lane_col, first: cutlass.Constexpr):
        """One tile's online softmax: p (fp32, the logits' fragment) = P * 448 of the logits in acc_s (pv_int8:
        127 * P / P_max + 1.5 * 2^23, P_max = exp2(top - m) into beta, top the tile's row max); m (this thread's
        two rows) updated in place, alpha (the rows' rescale of O and l) set. `factors` and `limits` (the methods of
        those names): one per 128 keys, sparse one per 64-key block; a block's logit factor, and its keys at column
        >= its limit weigh nothing (padding past tk; sparse: a one-block step's second block too)."""
        if const_expr(self.qk_int8):  # int32 logits + the bits of 1.5 * 2^23, read as fp32: 1.5 * 2^23 + S (no I2FP)
            bits = cute.recast_tensor(acc_s, Float32)
            for i in cutlass.range_constexpr(cute.size(p)):
                acc_s[i] = acc_s[i] + Int32(_BIAS)
                p[i] = bits[i]
        else:
            for i in cutlass.range_constexpr(cute.size(p)):
                p[i] = Float32(acc_s[i])
        width = TILE_N // len(factors)  # keys a factor: value i's column is lane_col + i % 2 + 8 * (i // 4)
        if const_expr(len(factors) == 1):
            if limits[0] < TILE_N:
                for i in cutlass.range_constexpr(cute.size(p)):
                    if lane_col + i % 2 + 8 * (i // 4) >= limits[0]:
                        p[i] = -Float32.inf
        else:
            if cutlass.min(limits[0], limits[1]) < width:
                for i in cutlass.range_constexpr(cute.size(p)):
                    if lane_col + (i % 2 + 8 * (i // 4)) % width >= limits[8 * (i // 4) // width]:
                        p[i] = -Float32.inf
        for r in cutlass.range_constexpr(2):
            mine = [i for i in range(cute.size(p)) if (i // 2) % 2 == r]  # this row's 32 values
            tops = []
            for half in cutlass.range_constexpr(len(factors)):  # the max of each factor's logits, scaled (factor > 0)
                top = _max_tree([p[i] for i in mine if 8 * (i // 4) // width == half])
                if const_expr(len(factors) == 1):
                    top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=1))
                    top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=2))
                if const_expr(self.qk_int8):
                    top = top - Float32(_MAGIC)  # exact: both are integers below 2^24
                tops.append(top * factors[half])
            top = tops[0]
            if const_expr(len(factors) == 2):
                top = cute.arch.fmax(tops[0], tops[1])
                top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=1))
                top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=2))
            m_new = cute.arch.fmax(m[r], top)
            alpha[r] = Float32(1.0) if const_expr(first) else _ex2(m[r] - m_new)
            m[r] = m_new
            if const_expr(self.pv_int8):
                beta[r] = _ex2(top - m_new)
                shift = top - LOG2_INT8_MAX
            else:
                shift = m_new - LOG2_FP8_MAX
            # qk_int8: p * factor is the logit plus 1.5 * 2^23 * factor, which the FFMA takes off with the shift
            shifts = [shift + Float32(_MAGIC) * f if const_expr(self.qk_int8) else shift for f in factors]
            for i in mine:
                half = 8 * (i // 4) // width
                p[i] = _ex2(p[i] * factors[half] - shifts[half])
                if const_expr(self.pv_int8):  # 1.5 * 2^23 + P: P rounded to an integer in the low bits (module doc)
                    p[i] = p[i] + Float32(_MAGIC)

    @cute.jit
    def to_operand(self, p, p32, p8):
        """P (fp32, in the logits' fragment) to the P.V operand: a renaming of registers (_P_FROM_S), then e4m3, or
        (pv_int8) the low byte of each value's bits (softmax left the integer there)."""
        for kb in cutlass.range_constexpr(TILE_N // 32):
            for a in cutlass.range_constexpr(16):
                p32[a + 16 * kb] = p[_P_FROM_S[a] + 16 * kb]
        if const_expr(self.pv_int8):
            # into the operand's signed bytes through a signless view of them (what .to(Int8) yields)
            cute.recast_tensor(p8, cutlass.Int8).store(cute.recast_tensor(p32, Int32).load().to(cutlass.Int8))
        else:
            p8.store(p32.load().to(cutlass.Float8E4M3FN))

    @cute.jit
    def epilogue(self, acc_o, l, mVs, mO, pv_thr, m_block, h, b):  # noqa: E741
        """O * scale_v / l, rounded to the output's dtype and stored (rows past Tq skipped). A row's l is l plus the
        last tile's channel 128 of O (pv_int8: channel 128 of O alone), both held by the row's first lane (value
        64 + 2r)."""
        inv = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            if const_expr(self.pv_int8):
                total = cute.arch.shuffle_sync(acc_o[64 + 2 * r], offset=cute.arch.lane_idx() & ~3)
                inv[r] = Float32(127.0) / total  # O and l carry 127; v's scale is scale_v / 127
            else:
                total = cute.arch.shuffle_sync(l[r] + acc_o[64 + 2 * r], offset=cute.arch.lane_idx() & ~3)
                inv[r] = Float32(448.0) / total  # l carries 448; v's scale is scale_v / 448
        tOc = pv_thr.partition_C(cute.make_identity_tensor((TILE_M, self.v_rows)))  # (row, channel) in the tile
        self.store(mO, tOc, acc_o, inv, m_block, h, b, mVs)

    @cute.jit
    def store(self, mO, tOc, acc_o, inv, m_block, h, b, mVs=None):
        """O's 128 real channels times their row's inv (and, given mVs, v's per-channel scale), rounded to the
        output's dtype and stored at their (row, channel) of tOc in query tile m_block, rows past Tq skipped."""
        rows = cute.size(mO, mode=[0])
        for i in cutlass.range_constexpr(64):
            row, col = tOc[i]
            row = row + m_block * TILE_M
            if row < rows:
                value = acc_o[i] * mVs[col, h, b] if const_expr(mVs is not None) else acc_o[i]
                mO[row, col, h, b] = (value * inv[(i // 2) % 2]).to(mO.element_type)

    @cute.jit
    def fold_pass(
        self, acc_o, l, m, alpha, mVs, mO, mMask, mLogLen, folded, pipe_k, pipe_v,  # noqa: E741
        k_state, v_state, pv_thr, qk_scale, block, wg, tid, m_block, h, b,
    ):  # fmt: skip
        """Sparse: after warpgroup wg's exact blocks (of query block `block`), O and l in real units (O times v's
        per-channel scale, l less its factor 448 or 127), then the online softmax over every key block's pseudo-key,
        64 a step in bf16 from its ring as block_sparse_attend's folded pass does (module doc: block-sparse), then
        O / l into mO. tid in 0..127."""
        sQb, sKm, sVm, pipe_qb = folded
        (qk0, pv0), (qk1, pv1) = self._fold_mmas(False), self._fold_mmas(True)
        qk, pv = (qk0, qk1), (pv0, pv1)  # each dot's first k-block (overwrites), then the rest (accumulate)
        qk_thr, pv_one = qk1.get_slice(tid), pv1.get_slice(tid)
        rQ = qk1.make_fragment_A(qk_thr.partition_A(sQb))  # (.., k-blocks of 16, 2 warpgroups' tiles)
        rK = qk1.make_fragment_B(qk_thr.partition_B(sKm))  # (.., k-blocks, buffers): mean keys (64, 128)
        buffers = cute.size(sVm, mode=[2])
        sVt = cute.composition(sVm, cute.make_ordered_layout((HEAD_DIM, SPARSE_BLOCK, buffers), order=(1, 0, 2)))
        rV = pv1.make_fragment_B(pv_one.partition_B(sVt))  # mean values as (128 channels, 64 keys), MN-major
        acc_s = cute.make_rmem_tensor(qk_thr.partition_shape_C((64, SPARSE_BLOCK)), Float32)  # ((2,2,8),1,1)
        acc_f = cute.make_rmem_tensor(pv_one.partition_shape_C((64, HEAD_DIM)), Float32)  # ((2,2,16),1,1)
        p_shape = pv_one.partition_shape_A((64, SPARSE_BLOCK))  # ((2,2,2),1,4): acc_s's order, 16 keys a k-block
        p32 = cute.make_rmem_tensor(p_shape, Float32)
        p16 = pv1.make_fragment_A(p_shape)
        bias = cute.make_rmem_tensor((16,), Float32)  # this thread's 16 pseudo-keys' logit bias
        tOc = pv_thr.partition_C(cute.make_identity_tensor((TILE_M, self.v_rows)))  # (row, channel) in the tile
        for i in cutlass.range_constexpr(64):  # O's 128 real channels (value i of acc_f is value i of acc_o)
            acc_o[i] = acc_o[i] * mVs[tOc[i][1], h, b]
        for r in cutlass.range_constexpr(2):  # a row's l: its first lane's (the others hold zeros until now)
            if const_expr(self.pv_int8):
                l[r] = acc_o[64 + 2 * r] / Float32(127.0)
            else:
                l[r] = (l[r] + acc_o[64 + 2 * r]) / Float32(448.0)
        pipe_qb.consumer_wait(pipeline.PipelineState(2, Int32(0), wg, Int32(0)))
        n_blocks = cute.size(mMask, mode=[0])
        n_chunks = cute.ceil_div(n_blocks, SPARSE_BLOCK)
        lane_col = 2 * (tid % 4)
        for c in cutlass.range(n_chunks, unroll=1):
            self.fold_bias(bias, mLogLen, mMask, c, n_blocks, lane_col, block, h, b)
            slot = self.ring_slot(k_state, wg)
            pipe_k.consumer_wait(slot)
            self.fold_logits(qk, acc_s, rQ, rK, slot, wg)
            warpgroup.wait_group(0)
            pipe_k.consumer_release(slot)
            k_state.advance()
            self.fold_softmax(acc_s, bias, m, l, alpha, qk_scale)
            self.fold_operand(acc_s, p32, p16)
            slot = self.ring_slot(v_state, wg)
            pipe_v.consumer_wait(slot)
            self.fold_values(pv, acc_f, p16, rV, slot)
            warpgroup.wait_group(0)
            pipe_v.consumer_release(slot)
            v_state.advance()
            for i in cutlass.range_constexpr(cute.size(acc_f)):
                acc_o[i] = acc_o[i] * alpha[(i // 2) % 2] + acc_f[i]
        inv = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):  # a row's l: the sum of its 4 lanes'
            total = l[r] + cute.arch.shuffle_sync_bfly(l[r], offset=1)
            total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
            inv[r] = Float32(1.0) / total
        self.store(mO, tOc, acc_o, inv, m_block, h, b)

    @cute.jit
    def fold_bias(self, bias, mLogLen, mMask, c, n_blocks, lane_col, block, h, b):
        """The folded pass's chunk c: this thread's 16 pseudo-keys' logit bias, log2 of each key block's length,
        -inf for the blocks exact for query block `block` and past the last block."""
        for j in cutlass.range_constexpr(16):
            key = c * SPARSE_BLOCK + lane_col + j % 2 + 8 * (j // 2)
            kept = cutlass.min(key, n_blocks - 1)
            bias[j] = mLogLen[kept] * Float32(LOG2E)
            if key >= n_blocks:
                bias[j] = -Float32.inf
            if mMask[kept, block, h, b] != 0:
                bias[j] = -Float32.inf

    def _fold_mmas(self, accumulate: bool) -> tuple[cute.TiledMma, cute.TiledMma]:
        """The folded pass's bf16 dots, one warpgroup each: q . mean_k^T (64 x 64) and P . mean_v (64 x 128, P from
        registers), accumulating or not (`accumulate`): a dot's first k-block overwrites, the rest accumulate."""
        bf16, k_major = cutlass.BFloat16, OperandMajorMode.K
        qk = sm90.make_trivial_tiled_mma(bf16, bf16, k_major, k_major, Float32, (1, 1, 1), tiler_mn=(64, SPARSE_BLOCK))
        pv = sm90.make_trivial_tiled_mma(
            bf16, bf16, k_major, OperandMajorMode.MN, Float32, (1, 1, 1),
            tiler_mn=(64, HEAD_DIM), a_source=warpgroup.OperandSource.RMEM,
        )  # fmt: skip
        for mma in (qk, pv):
            mma.set(warpgroup.Field.ACCUMULATE, accumulate)
        return qk, pv

    @cute.jit
    def fold_logits(self, qk, acc_s, rQ, rK, slot, wg):
        """Issue the folded pass's S = q . mean_k^T (bf16) on the mean keys in slot's buffer (committed); qk: the
        dot's (first k-block, rest) (`_fold_mmas`)."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(HEAD_DIM // 16):
            cute.gemm(qk[min(kb, 1)], acc_s, rQ[None, None, kb, wg], rK[None, None, kb, slot.index], acc_s)
        warpgroup.commit_group()

    @cute.jit
    def fold_softmax(self, acc_s, bias, m, l, alpha, qk_scale):  # noqa: E741
        """The folded pass's online softmax on a chunk's logits in acc_s, in place: P = exp2(s * scale + bias - m),
        m and l (this thread's part of the row sum) updated, alpha (the rescale of O) set."""
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            acc_s[i] = acc_s[i] * qk_scale + bias[i % 2 + 2 * (i // 4)]
        for r in cutlass.range_constexpr(2):
            mine = [i for i in range(cute.size(acc_s)) if (i // 2) % 2 == r]  # this row's 16 values
            top = _max_tree([acc_s[i] for i in mine])
            top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=1))
            top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=2))
            m_new = cute.arch.fmax(m[r], top)  # finite: every query block has an exact block
            alpha[r] = _ex2(m[r] - m_new)
            m[r] = m_new
            for i in mine:
                acc_s[i] = _ex2(acc_s[i] - m_new)
            l[r] = l[r] * alpha[r] + _sum_tree([acc_s[i] for i in mine])

    @cute.jit
    def fold_operand(self, acc_s, p32, p16):
        """The folded pass's P (fp32 in acc_s) to its P.V operand in bf16 (the same fragment order)."""
        for i in cutlass.range_constexpr(cute.size(p32)):
            p32[i] = acc_s[i]
        p16.store(p32.load().to(cutlass.BFloat16))

    @cute.jit
    def fold_values(self, pv, acc_f, p16, rV, slot):
        """Issue the folded pass's acc_f = P . mean_v (bf16, a fresh accumulator) on slot's buffer (committed); pv: the
        dot's (first k-block, rest)."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(SPARSE_BLOCK // 16):
            cute.gemm(pv[min(kb, 1)], acc_f, p16[None, None, kb], rV[None, None, kb, slot.index], acc_f)
        warpgroup.commit_group()


def operands(z: Quantized, out: torch.Tensor) -> list:
    """`attention_quantize.quantize`'s operands (a one-byte pv) and the output (B, H, Tq, 128) as the kernel's cute
    tensors, (T, D, H, B) and v (D, T, H, B); e4m3 as uint8 views (DLPack of float8 types is not in every torch)."""
    tensors = (z.q8.permute(2, 3, 1, 0), z.k8.permute(2, 3, 1, 0), z.v.permute(2, 3, 1, 0),
               z.q_scale.permute(2, 1, 0), z.k_scale.permute(2, 1, 0), z.v_scale.permute(2, 1, 0),
               out.permute(2, 3, 1, 0))  # fmt: skip
    return [
        from_dlpack(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x, assumed_align=16) for x in tensors
    ]


_COMPILED: dict = {}  # (qk, pv, sparse, operands' shapes, strides and dtypes) -> the compiled kernel


def _run(z: Quantized, args: list, tensors: tuple, tk: int, scale: float, stream, sparse: bool) -> None:
    """Compile (once per configuration and the tensors' shapes, strides and dtypes) and launch the kernel on the cute
    tensors `args` (`operands`, then the sparse ones) made from the torch `tensors`, on `stream` (None: torch's
    current stream on the output's device; a CPU output compiles without launching)."""
    out = tensors[0]
    key = (z.qk, z.pv, sparse)
    key += tuple((tuple(x.shape), x.stride(), x.dtype) for x in tensors)  # a build is specialised to all three
    if stream is None:
        stream = cuda.CUstream(torch.cuda.current_stream(out.device).cuda_stream if out.is_cuda else 0)
    if key not in _COMPILED:
        kernel = Fp8AttentionSm90(qk_int8=z.qk == "int8", pv_int8=z.pv == "int8", sparse=sparse)
        _COMPILED[key] = cute.compile(
            kernel, *args[:7], scale * LOG2E, tk, stream, *args[7:], options="--gpu-arch sm_90a"
        )
    if out.is_cuda:
        _COMPILED[key](*args[:7], scale * LOG2E, tk, stream, *args[7:])


def attend(z: Quantized, out: torch.Tensor, tk: int, scale: float, stream: cuda.CUstream | None = None) -> None:
    """`fp8_attention.attend`'s contract with this kernel (a one-byte pv, head dim 128, sm_90a) on `quantize`'s
    operands `z` of Tk = `tk` keys into `out` (B, H, Tq, 128) bf16 or fp32 with unit last stride. Compiled once per
    (qk, pv), shapes, strides and output dtype, then launched on `stream` (a cuda.CUstream; default: torch's current
    stream on out's device, or a placeholder when out is on the CPU, which compiles without launching)."""
    _run(z, operands(z, out), (out, z.q8, z.k8, z.v), tk, scale, stream, False)


def attend_sparse(
    z: Quantized, q: torch.Tensor, route: Plan, tk: int, out: torch.Tensor, stream: cuda.CUstream | None = None
) -> None:
    """block_sparse_attention with its exact blocks in low precision (`block_sparse_attend.attend`'s contract with a
    `quantized`, module doc: block-sparse) into `out` (B, H, Tq, 128) bf16 with unit last stride: `quantize`'s
    operands `z` (a one-byte pv) of Tk = `tk` keys, q (B, H, Tq, 128) bf16 (unit last stride, 16-byte aligned strides)
    for the folded pass, and `route` (`block_sparse_attention.plan`, its bf16 mean keys smoothed by z's key mean).
    Compiling and `stream` as `attend`."""
    tensors = (out, z.q8, z.k8, z.v, route.idx, route.count, route.mask, q, route.k_mean, route.v_mean, route.log_len)
    sparse = [
        from_dlpack(route.idx.permute(3, 2, 1, 0), assumed_align=4),
        from_dlpack(route.count.permute(2, 1, 0), assumed_align=4),
        from_dlpack(route.mask.view(torch.uint8).permute(3, 2, 1, 0), assumed_align=1),
        from_dlpack(route.log_len, assumed_align=4),
        *(from_dlpack(x.permute(2, 3, 1, 0), assumed_align=16) for x in (q, route.k_mean, route.v_mean)),
    ]
    _run(z, operands(z, out) + sparse, tensors, tk, route.scale, stream, True)
