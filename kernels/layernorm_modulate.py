"""fp32 LayerNorm of a bf16/fp32 row, optionally after a residual add and followed by an affine and/or AdaLN
modulation, in one pass (contract: reduction).

diffusers' Wan block (0.42.x) normalises its residual stream three times per block, each time as a chain of
torch kernels around `FP32LayerNorm` (which upcasts input, weight and bias to fp32 and casts back):

    norm1/norm3: (F.layer_norm(x.float(), (C,), None, None, eps) * (1 + scale) + shift).type_as(x)
    norm2:        F.layer_norm(x.float(), (C,), weight.float(), bias.float(), eps).type_as(x)
    before norm3: x = x + attn2_output                  # in x's dtype: fp32 add, then rounded to x's dtype

`layernorm_modulate(x, eps, ...)` is one such chain; `add_layernorm_modulate(x, residual, eps, ...)` first forms
`x + residual` exactly as torch does (fp32 add, round to nearest even to x's dtype), writes that sum (the block's
new residual stream) and normalises it. One program owns BLOCK_R rows (b, t) and the whole row of C channels
(BLOCK_C = next power of two >= C, at most MAX_C), so x is read once and each output written once.

What is torch's and what is not:
- Everything after the row statistics keeps torch's rounding boundaries: `(x - mean) * rstd`, then `* weight`,
  `+ bias`, `1 + scale`, the product and the sum are each their own fp32 rounding (the launcher passes
  `enable_fp_fusion=False`: no contracted multiply-add), then one cast to `out_dtype` (round to nearest even).
- The row statistics are not torch's. Here, on the row held in registers: mean = sum(x) / C, corrected once by
  the mean of (x - mean) (the first sum's rounding error is a few ulps of a large mean; a row with a large offset
  would otherwise shift every output by it), then the biased variance var = sum((x - mean)^2) / C (no Welford),
  rstd = 1 / sqrt_rn(var + eps); each sum a Triton tree reduction (numpy's pairwise sum under the interpreter).
  torch's CPU kernel uses its own cascade/Welford moments and forms `x * rstd + (-mean * rstd)`; its CUDA kernel
  Welford and `rsqrt`. So mean and rstd can differ from torch's by an ulp or so, and the output by about an ulp
  of its dtype.
- Bound (tested on the interpreter, tests/kernels/test_layernorm_modulate.py): against a float64 ground truth of
  the chain, the kernel's max-abs and relative-L2 errors are each at most 2x those of torch's own op sequence
  (`reference`) in the working dtype, plus 2 fp32 ulps (2 * 2^-23) of the output scale (max-abs) or 2 fp32 ulps
  (relative L2); the floor matters only for fp32 rows so short that torch's own error is zero by luck. The
  residual sum is torch.equal to `x + r`. On the GPU the bound is exercised through the Wan forward (fused_block_norms:
  output relative L2 4.9e-3 against stock on random weights, the same as any other non-bitwise change measured
  there); the kernel itself was not compared with float64 on the GPU.

BF16_ROUNDING: under the interpreter fp32 -> bf16 is written out in integers (round to nearest even, as
c10::BFloat16; NaN becomes 0x7FC0) because the interpreter's `.to(tl.bfloat16)` truncates. Compiled, the kernel
uses `.to(tl.bfloat16)` (`cvt.rn.bf16.f32`): the same value for every non-NaN input, in one instruction instead
of six (a NaN's payload may differ). Offsets are int32 unless some tensor reaches 2^31 elements (`IDX64`).

Shapes: x (B, T, C) in float32/bfloat16/float16, any strides; residual the same shape and dtype, any strides;
weight, bias (C,) any float dtype (upcast to fp32, as FP32LayerNorm does); scale, shift float32 (B, 1, C) or
(B, T, C), any strides (Wan passes chunks of its (B, 6, C) table). Output: contiguous (B, T, C) in `out_dtype`
(default x's dtype); the sum: contiguous (B, T, C) in x's dtype.

Launches (`LaunchConfig`: rows per program, num_warps, persistent programs, chunks; `CANDIDATES` is what
benchmarks/norm_kernels_gpu.py times). Each row is reduced on its own, so the rows per program never mix rows. Under
the interpreter the whole-row launches are bit-equal (each sum is numpy's over one row; tested). On a GPU
the shape of the fp32 reduction tree follows the register layout Triton picks for the tile (elements per thread,
threads and warps along C), which num_warps (and possibly BLOCK_R) can change, so a launch can move a row statistic
by an ulp; every launch is held to the float64 bound above (the benchmark checks it on the GPU), not to one launch's
bits. `per_sm`: a grid-stride loop, the next tiles' loads pipelined (`num_stages`). A launch forming the mean
correction and the squares in one sweep (two reductions, not three) was measured no faster and removed.
Measured (H200, x (1, 32760, 1536) bf16, runs 3-4 of 2026-11-30-norm-kernels-gpu, two machines; the 4.17 TB/s copy
bandwidth; a device copy of the same bytes took 54 us (201 MB) and 101 us (402 MB) under the same clock):
- modulated (norm1/norm3): `DEFAULT` (2 rows, 2 warps) 85 / 91 us = 57 / 53 %; `FIRST` (2 rows, 8 warps, the launch
  before) 104 / 119 us; one warp per row 87 / 93 us; the persistent launches no faster.
- affine (norm2): 82 / 149 us (the second machine's affine times were noisy); one warp per row 80 / 116 us.
- with the residual add (before norm3; twice the bytes): 110 / 163 us = 88 / 59 %; best 106 / 158 us.
- the chunked kernel (`chunk=512`, runs 5-6, one H200; these kernels' times moved by up to 2x between runs on one
  machine while the same-bytes copy did not, so compare within a run): modulated 75 us against DEFAULT's 92 (65 %);
  affine 73 us against 86 (66 %); with the residual 117 us, tied with DEFAULT (82 %). The fastest launch of each run
  3-6: modulated 39-65 %, affine 27-66 %, with the residual 38-91 %.
So no launch reliably reaches 80 % of copy bandwidth at C = 1536: the row statistics' dependent reductions and the
SM clock bound these kernels, not the bytes (a 3 s warm-up before timing, run 6, made every kernel slower and the
copy no faster; it was dropped). DEFAULT stays the launch the exact-fast forward was measured with; the chunked one
would change the forward's statistics again. Every launch met the float64 bound on the GPU. `row_vectors`: broadcast scale/shift of one batch loaded once
per program; the per-element loads took 201 / 261 us (run 1), same output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from workbench.kernels._runtime import (
    FLOAT_DTYPES,
    INTERPRET_TILE,
    ROUNDING,
    LazyKernel,
    broadcast_rows,
    check_float,
    check_runtime,
    dtype_size,
    interpreting,
)

MAX_C = 16384  # one row of fp32 values per program, in registers
ROW_ELEMENTS = 4096  # DEFAULT, compiled: rows per program = max(1, ROW_ELEMENTS // BLOCK_C)


@dataclass(frozen=True)
class LaunchConfig:
    """How `_layernorm_modulate` is launched (module doc: what it may change). rows: rows (b, t) per program, a
    power of two; None: max(1, ROW_ELEMENTS // BLOCK_C) compiled, up to INTERPRET_TILE elements under the
    interpreter. num_warps: warps per program; None: 4 / 8 / 16 for BLOCK_C <= 1024 / <= 4096 / more.
    per_sm: None launches one program per row tile; k launches k programs per streaming multiprocessor (2 under
    the interpreter), each looping over tiles with `num_stages`-deep load pipelining (1: none). chunk: None holds
    each row whole; a power of two runs the chunked kernel (`_layernorm_modulate_chunked`: three passes over the
    row in pieces of `chunk` channels)."""

    rows: int | None = None
    num_warps: int | None = None
    row_vectors: bool = True  # scale/shift broadcast over the tokens of one batch: one (C,) load per program
    per_sm: int | None = None
    num_stages: int = 1
    chunk: int | None = None

    def __post_init__(self) -> None:
        if self.chunk is not None and (
            isinstance(self.chunk, bool)
            or not isinstance(self.chunk, int)
            or self.chunk < 16
            or self.chunk & (self.chunk - 1)
        ):
            raise ValueError(f"LaunchConfig.chunk: {self.chunk!r}; expected None or a power of two >= 16")
        if self.chunk is not None and self.per_sm is not None:
            raise ValueError("LaunchConfig.chunk: the chunked kernel has no persistent launch (per_sm)")
        if self.per_sm is not None and (
            isinstance(self.per_sm, bool) or not isinstance(self.per_sm, int) or self.per_sm < 1
        ):
            raise ValueError(f"LaunchConfig.per_sm: {self.per_sm!r}; expected None or an int >= 1")
        if self.num_stages not in (1, 2, 3, 4):
            raise ValueError(f"LaunchConfig.num_stages: {self.num_stages!r}; allowed: 1, 2, 3, 4")
        if self.rows is not None and (not isinstance(self.rows, int) or self.rows < 1 or self.rows & (self.rows - 1)):
            raise ValueError(f"LaunchConfig.rows: {self.rows!r}; expected None or a power of two >= 1")
        if self.num_warps not in (None, 1, 2, 4, 8, 16):
            raise ValueError(f"LaunchConfig.num_warps: {self.num_warps!r}; allowed: None, 1, 2, 4, 8, 16")


# 2 rows, 2 warps: the fastest or within 3 % of it for every form in both H200 runs of 2026-11-30 (module doc)
DEFAULT = LaunchConfig(rows=2, num_warps=2)
FIRST = LaunchConfig()  # the first version's launch (at C = 1536, BLOCK_C 2048: 2 rows, 8 warps)
CANDIDATES = {  # what benchmarks/norm_kernels_gpu.py times side by side (measured: module doc)
    "default": DEFAULT,
    "first": FIRST,
    "r1_w1": LaunchConfig(rows=1, num_warps=1),  # one warp per row: the row sums in warp shuffles only
    "r4_w4": LaunchConfig(rows=4, num_warps=4),
    "r2_w4": LaunchConfig(rows=2, num_warps=4),
    # persistent: a grid-stride loop per program, the next tiles' loads in flight while this one is reduced
    "p4_s2_r2_w2": LaunchConfig(rows=2, num_warps=2, per_sm=4, num_stages=2),
    "p8_s2_r2_w2": LaunchConfig(rows=2, num_warps=2, per_sm=8, num_stages=2),
    "p8_s3_r2_w2": LaunchConfig(rows=2, num_warps=2, per_sm=8, num_stages=3),
    "p4_s2_r4_w4": LaunchConfig(rows=4, num_warps=4, per_sm=4, num_stages=2),
    "p8_s2_r1_w1": LaunchConfig(rows=1, num_warps=1, per_sm=8, num_stages=2),
    "p16_s2_r1_w1": LaunchConfig(rows=1, num_warps=1, per_sm=16, num_stages=2),
    "p8_s1_r2_w2": LaunchConfig(rows=2, num_warps=2, per_sm=8),
    "p4_s2_r2_w4": LaunchConfig(rows=2, num_warps=4, per_sm=4, num_stages=2),
    # chunked: two passes over 512-channel pieces (at C = 1536 no padded lanes; few registers, many programs)
    "c512_r1_w1": LaunchConfig(rows=1, num_warps=1, chunk=512),
    "c512_r2_w2": LaunchConfig(rows=2, num_warps=2, chunk=512),
    "c512_r4_w4": LaunchConfig(rows=4, num_warps=4, chunk=512),
    "c512_r1_w2": LaunchConfig(rows=1, num_warps=2, chunk=512),
    "c512_r4_w2": LaunchConfig(rows=4, num_warps=2, chunk=512),
    "c256_r2_w2": LaunchConfig(rows=2, num_warps=2, chunk=256),
    "c512_r8_w4": LaunchConfig(rows=8, num_warps=4, chunk=512),
}


def _layernorm_modulate(
    x_ptr, r_ptr, w_ptr, bias_ptr, scale_ptr, shift_ptr, out_ptr, sum_ptr,
    R, T, C, eps,
    x_sb, x_st, x_sc,
    r_sb, r_st, r_sc,
    w_s, bias_s,
    sc_sb, sc_st, sc_sc,
    sh_sb, sh_st, sh_sc,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MOD: tl.constexpr,
    SUM_ROUND: tl.constexpr, OUT_ROUND: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    MOD_VEC: tl.constexpr, NATIVE_BF16: tl.constexpr, IDX64: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    # SUM_ROUND / OUT_ROUND: what the residual sum / the output is rounded to (0: fp32, 1: bf16, 2: fp16).
    # NATIVE_BF16: compiled, `.to(tl.bfloat16)` is cvt.rn (BF16_ROUNDING's result for every non-NaN value).
    # IDX64: some offset needs int64; otherwise the address arithmetic stays int32 (half the integer work).
    # One program per row tile, or (persistent launch) a grid-stride loop over the tiles whose loads Triton's
    # pipeliner issues NUM_STAGES - 1 tiles ahead, so a program's next rows are in flight while it reduces these.
    for tile in tl.range(tl.program_id(0), (R + BLOCK_R - 1) // BLOCK_R, tl.num_programs(0), num_stages=NUM_STAGES):
        rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)  # flattened (b, t), int32
        cols = tl.arange(0, BLOCK_C)
        b = rows // T
        t = rows - b * T
        if IDX64:
            rows = rows.to(tl.int64)
            b = b.to(tl.int64)
            t = t.to(tl.int64)
            cols = cols.to(tl.int64)
        b = b[:, None]
        t = t[:, None]
        c = cols[None, :]
        col_ok = (cols < C)[None, :]
        mask = (rows < R)[:, None] & col_ok
        x = tl.load(x_ptr + b * x_sb + t * x_st + c * x_sc, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:  # torch's `x + r` in x's dtype: one fp32 add, then rounded to that dtype
            x = x + tl.load(r_ptr + b * r_sb + t * r_st + c * r_sc, mask=mask, other=0.0).to(tl.float32)
            at = sum_ptr + rows[:, None] * C + c
            if SUM_ROUND == 1 and NATIVE_BF16:  # x keeps the rounded value for the norm
                rounded = x.to(tl.bfloat16)
                x = rounded.to(tl.float32)
                tl.store(at, rounded, mask=mask)
            elif SUM_ROUND == 1:  # BF16_ROUNDING
                bits = x.to(tl.uint32, bitcast=True)
                bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
                bits = tl.where(x != x, 0x7FC0, bits)
                x = (bits << 16).to(tl.float32, bitcast=True)
                tl.store(at, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
            elif SUM_ROUND == 2:
                x = x.to(tl.float16).to(tl.float32)
                tl.store(at, x.to(tl.float16), mask=mask)
            else:
                tl.store(at, x, mask=mask)
        # row statistics (not torch's order, see the module doc). tl.reduce with tl.standard's combine, not tl.sum:
        # tl.sum is decorated at triton import, which the interpreter cannot call if TRITON_INTERPRET came later
        width = tl.cast(C, tl.float32)
        mean = tl.math.div_rn(tl.reduce(x, 1, tl.standard._sum_combine), width)[:, None]
        # the rounding error of the sum above (a few ulps of a large mean) is the mean of d = x - mean, summed over
        # small values; without that correction a row with a large offset would shift every output by the error
        d = tl.where(col_ok, x - mean, 0.0)
        mean = mean + tl.math.div_rn(tl.reduce(d, 1, tl.standard._sum_combine), width)[:, None]
        centred = tl.where(col_ok, x - mean, 0.0)
        var = tl.math.div_rn(tl.reduce(centred * centred, 1, tl.standard._sum_combine), width)
        rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn((var + eps).to(tl.float32)))[
            :, None
        ]  # eps arrives fp64 under compile
        y = centred * rstd  # from here every op is its own fp32 rounding (enable_fp_fusion=False)
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols * w_s, mask=cols < C, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + cols * bias_s, mask=cols < C, other=0.0).to(tl.float32)[None, :]
        if HAS_MOD and MOD_VEC:  # one batch, rows broadcast over tokens: the (C,) vectors once, not per element
            scale = tl.load(scale_ptr + cols * sc_sc, mask=cols < C, other=0.0).to(tl.float32)[None, :]
            shift = tl.load(shift_ptr + cols * sh_sc, mask=cols < C, other=0.0).to(tl.float32)[None, :]
        elif HAS_MOD:
            scale = tl.load(scale_ptr + b * sc_sb + t * sc_st + c * sc_sc, mask=mask, other=0.0).to(tl.float32)
            shift = tl.load(shift_ptr + b * sh_sb + t * sh_st + c * sh_sc, mask=mask, other=0.0).to(tl.float32)
        if HAS_MOD:
            one_plus = 1.0 + scale
            y = y * one_plus
            y = y + shift
        out = out_ptr + rows[:, None] * C + c
        if OUT_ROUND == 1 and NATIVE_BF16:
            tl.store(out, y.to(tl.bfloat16), mask=mask)
        elif OUT_ROUND == 1:  # BF16_ROUNDING
            bits = y.to(tl.uint32, bitcast=True)
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
            bits = tl.where(y != y, 0x7FC0, bits)
            tl.store(out, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        else:
            tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


def _layernorm_modulate_chunked(
    x_ptr, r_ptr, w_ptr, bias_ptr, scale_ptr, shift_ptr, out_ptr, sum_ptr,
    R, T, C, eps,
    x_sb, x_st, x_sc,
    r_sb, r_st, r_sc,
    w_s, bias_s,
    sc_sb, sc_st, sc_sc,
    sh_sb, sh_st, sh_sc,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MOD: tl.constexpr,
    SUM_ROUND: tl.constexpr, OUT_ROUND: tl.constexpr, BLOCK_R: tl.constexpr, CHUNK: tl.constexpr,
    MOD_VEC: tl.constexpr, NATIVE_BF16: tl.constexpr, IDX64: tl.constexpr,
):  # fmt: skip
    # LaunchConfig.chunk: the row in CHUNK-wide pieces, three times. Pass 1 forms (and stores) the residual sum and
    # the mean, summed about the row's first value (so the sum stays small whatever the row's offset); pass 2 the
    # moments about that mean (var = mean(d^2) - mean(d)^2, d small); pass 3 the output. Passes 2 and 3 read rows
    # this program just read (L1/L2). A thread holds CHUNK / (32 * num_warps) values per row, not the row.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # flattened (b, t), int32
    b = rows // T
    t = rows - b * T
    if IDX64:
        rows = rows.to(tl.int64)
        b = b.to(tl.int64)
        t = t.to(tl.int64)
    b = b[:, None]
    t = t[:, None]
    live = (rows < R)[:, None]
    x_row = x_ptr + b * x_sb + t * x_st
    r_row = r_ptr + b * r_sb + t * r_st
    s_row = sum_ptr + rows[:, None] * C
    o_row = out_ptr + rows[:, None] * C
    first = tl.load(x_row, mask=live, other=0.0).to(tl.float32)  # [BLOCK_R, 1]
    if HAS_RESIDUAL:  # the shift only needs to be near the row's values: the unrounded sum will do
        first = first + tl.load(r_row, mask=live, other=0.0).to(tl.float32)
    s1 = tl.full([BLOCK_R, CHUNK], 0.0, tl.float32)  # tl.zeros is decorated at import (interpreter: see above)
    for start in range(0, C, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        if IDX64:
            cols = cols.to(tl.int64)
        c = cols[None, :]
        ok = live & (c < C)
        x = tl.load(x_row + c * x_sc, mask=ok, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:  # torch's `x + r` in x's dtype: one fp32 add, then rounded to that dtype
            x = x + tl.load(r_row + c * r_sc, mask=ok, other=0.0).to(tl.float32)
            if SUM_ROUND == 1 and NATIVE_BF16:
                rounded = x.to(tl.bfloat16)
                x = rounded.to(tl.float32)
                tl.store(s_row + c, rounded, mask=ok)
            elif SUM_ROUND == 1:  # BF16_ROUNDING
                bits = x.to(tl.uint32, bitcast=True)
                bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
                bits = tl.where(x != x, 0x7FC0, bits)
                x = (bits << 16).to(tl.float32, bitcast=True)
                tl.store(s_row + c, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=ok)
            elif SUM_ROUND == 2:
                x = x.to(tl.float16).to(tl.float32)
                tl.store(s_row + c, x.to(tl.float16), mask=ok)
            else:
                tl.store(s_row + c, x, mask=ok)
        s1 += tl.where(ok, x - first, 0.0)
    if HAS_RESIDUAL:  # passes 2 and 3 read the stored sum: make every thread's stores visible to the program
        tl.debug_barrier()
    width = tl.cast(C, tl.float32)
    mean = first + tl.math.div_rn(tl.reduce(s1, 1, tl.standard._sum_combine), width)[:, None]
    # pass 2: the moments about that mean (var = mean(d^2) - mean(d)^2: d is small, the subtraction loses nothing)
    s1 = tl.full([BLOCK_R, CHUNK], 0.0, tl.float32)
    s2 = tl.full([BLOCK_R, CHUNK], 0.0, tl.float32)
    for start in range(0, C, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        if IDX64:
            cols = cols.to(tl.int64)
        c = cols[None, :]
        ok = live & (c < C)
        if HAS_RESIDUAL:  # the rounded sum this thread stored in pass 1
            x = tl.load(s_row + c, mask=ok, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_row + c * x_sc, mask=ok, other=0.0).to(tl.float32)
        d = tl.where(ok, x - mean, 0.0)
        s1 += d
        s2 += d * d
    step = tl.math.div_rn(tl.reduce(s1, 1, tl.standard._sum_combine), width)
    var = tl.math.div_rn(tl.reduce(s2, 1, tl.standard._sum_combine), width) - step * step
    mean = mean + step[:, None]
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn((var + eps).to(tl.float32)))[:, None]  # eps arrives fp64 under compile
    for start in range(0, C, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        if IDX64:
            cols = cols.to(tl.int64)
        c = cols[None, :]
        ok = live & (c < C)
        if HAS_RESIDUAL:  # the rounded sum this thread stored in pass 1
            x = tl.load(s_row + c, mask=ok, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_row + c * x_sc, mask=ok, other=0.0).to(tl.float32)
        y = (x - mean) * rstd  # from here every op is its own fp32 rounding (enable_fp_fusion=False)
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + c * w_s, mask=c < C, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + c * bias_s, mask=c < C, other=0.0).to(tl.float32)
        if HAS_MOD and MOD_VEC:
            scale = tl.load(scale_ptr + c * sc_sc, mask=c < C, other=0.0).to(tl.float32)
            shift = tl.load(shift_ptr + c * sh_sc, mask=c < C, other=0.0).to(tl.float32)
        elif HAS_MOD:
            scale = tl.load(scale_ptr + b * sc_sb + t * sc_st + c * sc_sc, mask=ok, other=0.0).to(tl.float32)
            shift = tl.load(shift_ptr + b * sh_sb + t * sh_st + c * sh_sc, mask=ok, other=0.0).to(tl.float32)
        if HAS_MOD:
            one_plus = 1.0 + scale
            y = y * one_plus
            y = y + shift
        if OUT_ROUND == 1 and NATIVE_BF16:
            tl.store(o_row + c, y.to(tl.bfloat16), mask=ok)
        elif OUT_ROUND == 1:  # BF16_ROUNDING
            bits = y.to(tl.uint32, bitcast=True)
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
            bits = tl.where(y != y, 0x7FC0, bits)
            tl.store(o_row + c, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=ok)
        else:
            tl.store(o_row + c, y.to(out_ptr.dtype.element_ty), mask=ok)


_KERNEL = LazyKernel(_layernorm_modulate)
_CHUNKED = LazyKernel(_layernorm_modulate_chunked)


def reference(
    x: torch.Tensor,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """diffusers' op sequence: `FP32LayerNorm(x.float())`, then `* (1 + scale) + shift` if given, cast to
    `out_dtype` (default x's dtype). float64 operands stay float64 (a ground truth of the same chain)."""
    up = x.to(torch.promote_types(x.dtype, torch.float32))  # x.float()
    weight = None if weight is None else weight.to(up.dtype)
    bias = None if bias is None else bias.to(up.dtype)
    n = F.layer_norm(up, (x.shape[-1],), weight, bias, eps)
    if scale is not None:
        n = n * (1 + scale) + shift
    return n.to(out_dtype or x.dtype)


def add_reference(
    x: torch.Tensor, residual: torch.Tensor, eps: float, **norm: torch.Tensor | torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(`x + residual` in x's dtype, `reference` of that sum): the Wan block's residual add before norm3."""
    summed = x + residual
    return summed, reference(summed, eps, **norm)


def layernorm_modulate(
    x: torch.Tensor,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """`reference(x, eps, weight, bias, scale, shift, out_dtype)` in one pass (contract: reduction, module doc).
    `config`: the launch (None: `DEFAULT`)."""
    name = "layernorm_modulate"
    args = _check(name, x, None, eps, weight, bias, scale, shift, out_dtype)
    return _launch(x, None, *args, _config(name, config))[0]


def add_layernorm_modulate(
    x: torch.Tensor,
    residual: torch.Tensor,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`add_reference(x, residual, eps, ...)` in one pass: (the sum, bit-equal to `x + residual`; its normed
    output, contract reduction). `config`: the launch (None: `DEFAULT`)."""
    name = "add_layernorm_modulate"
    args = _check(name, x, residual, eps, weight, bias, scale, shift, out_dtype)
    out, summed = _launch(x, residual, *args, _config(name, config))
    return summed, out


def _check(name, x, residual, eps, weight, bias, scale, shift, out_dtype):
    check_float(name, "x", x)
    if x.ndim != 3:
        raise ValueError(f"{name}: x must be (B, T, C), got shape {tuple(x.shape)}")
    c = x.shape[2]
    if c > MAX_C:
        raise ValueError(f"{name}: x has C={c} channels; one program holds at most {MAX_C}")
    tensors = [x]
    if residual is not None:
        check_float(name, "residual", residual, (x.dtype,))
        if residual.shape != x.shape:
            raise ValueError(f"{name}: residual has shape {tuple(residual.shape)}; expected {tuple(x.shape)}")
        tensors.append(residual)
    for arg, tensor in (("weight", weight), ("bias", bias)):
        if tensor is not None:
            check_float(name, arg, tensor)
            if tensor.shape != (c,):
                raise ValueError(f"{name}: {arg} has shape {tuple(tensor.shape)}; expected ({c},)")
            tensors.append(tensor)
    if (scale is None) != (shift is None):
        raise ValueError(f"{name}: scale and shift go together; got only {'scale' if shift is None else 'shift'}")
    if scale is not None:
        check_float(name, "scale", scale, (torch.float32,))
        check_float(name, "shift", shift, (torch.float32,))
        scale = broadcast_rows(name, "scale", scale, x.shape)
        shift = broadcast_rows(name, "shift", shift, x.shape)
        tensors += [scale, shift]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"{name}: eps must be a number >= 0, got {eps!r}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: out_dtype {out_dtype}; allowed: {[str(d) for d in FLOAT_DTYPES]}")
    check_runtime(name, *tensors)
    return float(eps), weight, bias, scale, shift, out_dtype


def _config(name: str, config: LaunchConfig | None) -> LaunchConfig:
    if config is None:
        return DEFAULT
    if not isinstance(config, LaunchConfig):
        raise ValueError(f"{name}: config must be a LaunchConfig or None, got {type(config).__name__}")
    return config


def _tile(rows: int, c: int, config: LaunchConfig) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps) for `config` (defaults in `LaunchConfig`); BLOCK_R at most the rows there are.
    Under the interpreter (cost per program, not per element) the default is up to INTERPRET_TILE elements."""
    block_c = triton.next_power_of_2(max(c, 1))
    per_program = INTERPRET_TILE if interpreting() else ROW_ELEMENTS
    width = block_c if config.chunk is None else min(config.chunk, block_c)  # what a program holds per row
    block_r = max(1, per_program // width) if config.rows is None else config.rows
    block_r = min(block_r, triton.next_power_of_2(max(rows, 1)))
    warps = config.num_warps or (4 if block_c <= 1024 else 8 if block_c <= 4096 else 16)
    return block_r, block_c, warps


def _launch(x, residual, eps, weight, bias, scale, shift, out_dtype, config):
    b, t, c = x.shape
    out = torch.empty((b, t, c), dtype=out_dtype, device=x.device)
    summed = torch.empty((b, t, c), dtype=x.dtype, device=x.device) if residual is not None else None
    if out.numel() == 0:
        return out, summed
    block_r, block_c, warps = _tile(b * t, c, config)
    r = x if residual is None else residual
    w = x if weight is None else weight
    bb = x if bias is None else bias
    sc = x if scale is None else scale
    sh = x if shift is None else shift
    mod_vec = config.row_vectors and scale is not None and b == 1 and sc.stride(1) == 0 and sh.stride(1) == 0
    idx64 = max(_last_offset(v) for v in (x, r, w, bb, sc, sh, out)) + block_r * c >= 2**31
    if config.chunk is not None:
        chunk = min(config.chunk, block_c)
        _CHUNKED[(triton.cdiv(b * t, block_r),)](
            x, r, w, bb, sc, sh, out, out if summed is None else summed,
            b * t, t, c, eps,
            *x.stride(), *r.stride(), w.stride(-1), bb.stride(-1), *sc.stride(), *sh.stride(),
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            HAS_MOD=scale is not None, SUM_ROUND=ROUNDING[x.dtype], OUT_ROUND=ROUNDING[out_dtype],
            BLOCK_R=block_r, CHUNK=chunk, MOD_VEC=mod_vec, NATIVE_BF16=not interpreting(), IDX64=idx64,
            num_warps=warps, enable_fp_fusion=False,
        )  # fmt: skip
        return out, summed
    tiles = triton.cdiv(b * t, block_r)
    if config.per_sm is not None:
        sms = 2 if interpreting() else torch.cuda.get_device_properties(x.device).multi_processor_count
        tiles = min(tiles, config.per_sm * sms)
    _KERNEL[(tiles,)](
        x, r, w, bb, sc, sh, out, out if summed is None else summed,
        b * t, t, c, eps,
        *x.stride(), *r.stride(), w.stride(-1), bb.stride(-1), *sc.stride(), *sh.stride(),
        HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
        HAS_MOD=scale is not None, SUM_ROUND=ROUNDING[x.dtype], OUT_ROUND=ROUNDING[out_dtype],
        BLOCK_R=block_r, BLOCK_C=block_c, MOD_VEC=mod_vec, NATIVE_BF16=not interpreting(),
        IDX64=idx64, NUM_STAGES=config.num_stages, num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return out, summed


def _last_offset(view: torch.Tensor) -> int:
    """The largest element offset a view reaches from its base (strides here are never negative)."""
    return sum((size - 1) * stride for size, stride in zip(view.shape, view.stride(), strict=True))


def cost(
    shape: tuple[int, int, int],
    dtype: torch.dtype = torch.bfloat16,
    residual: bool = False,
    affine: bool = False,
    modulate: bool = True,
    per_token: bool = False,
) -> tuple[int, int]:
    """(bytes_moved, flops) for x of `shape` (B, T, C) in `dtype`, output in `dtype`.

    Reads x (and, with `residual`, the residual, writing the sum), fp32 weight and bias with `affine`, fp32
    scale/shift of (B, 1, C) (or (B, T, C) with `per_token`) with `modulate`; writes the output once. Flops per
    element: 6 for the norm (sum, subtract, corrected mean, square, add, scale by rstd), +1 for the residual add, +2 for the
    affine, +3 for the modulation."""
    b, t, c = shape
    elements = b * t * c
    size = dtype_size(dtype)
    moved = 2 * elements * size + (2 * elements * size if residual else 0)
    moved += 2 * c * 4 if affine else 0
    moved += 2 * b * (t if per_token else 1) * c * 4 if modulate else 0
    return moved, elements * (6 + (1 if residual else 0) + (2 if affine else 0) + (3 if modulate else 0))
