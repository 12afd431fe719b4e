"""Wan's QK RMSNorm (across heads) followed by its rotary embedding, in one pass.

diffusers' `WanAttnProcessor` (0.42.x) runs, for the query and the key of self-attention:

    x = attn.norm_q(x)                    # torch.nn.RMSNorm(heads * head_dim, eps), weight per channel
    x = x.unflatten(2, (heads, -1))       # (B, T, H, D)
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cos[..., 0::2], freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos

Dtype path, kept here: the rotary arithmetic runs in `promote(x.dtype, freqs.dtype)`. `WanRotaryPosEmbed`
builds its tables in float64, and diffusers keeps `rope` in `_keep_in_fp32_modules`, so a low-precision
checkpoint carries float32 tables (float64 when nothing cast them); both are accepted. Each product and each
sum is its own rounding in that dtype (no fused multiply-add), then the store into `out` casts to x's dtype.
torch casts float64 -> bfloat16 through float32 (two roundings: `static_cast<float>`, then c10::BFloat16's
round to nearest even); the kernel does the same.

Two entry points, two contracts:

- `rope_only` (contract: rounding): the rotary step alone on a (B, T, H, D) view. Same op sequence as torch,
  so it is bit-equal on the CPU interpreter (numpy never contracts); on a GPU the launcher passes
  `enable_fp_fusion=False`, and every launch was measured torch.equal on an H200 at Wan's q/k shape (bf16 x,
  float32 and float64 tables) and on small odd, strided and per-head-table cases (2026-11-29).
- `qk_norm_rope` (contract: reduction): RMSNorm then the rotary step. torch 2.13's RMSNorm computes
  `(x.float() * rsqrt(mean(x.float() ** 2) + eps) * weight.float()).to(x.dtype)` (one rounding at the end;
  checked on CPU for bf16 and fp32). The kernel keeps every op after the mean, but its sum of squares is a
  Triton tree reduction in an order set by the launch (head tile: one per head, the heads' sums added
  in order; tile "row": one reduction over the row's channels, then over its heads; legacy: evens and odds
  summed separately over the row) and `rsqrt` is `1 / sqrt_rn`, so the per-row scale can differ from torch's by
  an ulp or so. Bound (tested for every launch in CANDIDATES, vs a float64 ground truth of the whole chain): the
  kernel's max abs and relative L2 error are each at most 2x torch's own error plus 1e-7 of the output scale.
  See tests/kernels/test_qk_norm_rope.py.

BF16_ROUNDING: fp32 -> bf16 is written out in integers (round to nearest even, as c10::BFloat16; NaN becomes
0x7FC0) because the CPU interpreter's `.to(tl.bfloat16)` truncates. NATIVE_BF16 (qk_norm_rope with
`bf16_cast="native"`, compiled launches only; the interpreter keeps the integer path): `.to(tl.bfloat16,
fp_downcast_rounding="rtne")`, PTX `cvt.rn.bf16(x2).f32`, also round to nearest even, so the same bits for every
non-NaN value (infinities, overflow to infinity and subnormals included); a NaN keeps being NaN, but its payload
is the hardware's canonical one instead of 0x7FC0. It replaces about 7 integer ops per element and rounding
(two roundings per element on the norm path: RMSNorm's output, then the rotary output) by one conversion. The
CPU tests cannot run this path (its bits are checked on the GPU by benchmarks/norm_kernels_gpu.py's bound).

Shapes: `qk_norm_rope(x, weight, eps, freqs_cos, freqs_sin, heads, config=None)`: x (B, T, C) with
C = heads * D, any strides; weight (C,) in x's dtype. `rope_only(x, freqs_cos, freqs_sin, config=None)`:
x (B, T, H, D), any strides.
freqs (1 or B, T, 1 or H, D), float32 or float64, any strides. x in bfloat16 or float32; D even.
Output: contiguous (B, T, H, D) in x's dtype.

Launches (`LaunchConfig`; the result never depends on it, bit for bit, except qk_norm_rope's RMS sum order and,
with `bf16_cast="native"`, NaN payloads): `DEFAULT` runs the tiled kernel (tile "head"). A program owns BLOCK_R
rows (b, t) and a group of heads (`heads`, all of them with the norm); row -> (b, t) is one int32 division per
row, the head comes from the program and the loop, so no element index is divided. Each head's D channels are
one contiguous [BLOCK_R, D] tile (16-byte loads and stores), split into its even and odd channels in registers
(`tl.reshape` to [BLOCK_R, D/2, 2] + `tl.split`) and joined back before the store (`tl.join`); the (.., 1, D)
tables are loaded the same way, once per program for all its heads, and head groups vary fastest over the grid,
so the programs of one row tile run together and share those table rows in L2. `LEGACY` runs the first version
(one tile = rows x channel pairs; each element's head and channel from an int64 division and modulo; stride-2
bf16 loads and stores), kept so benchmarks/rope_kernel_gpu.py can time both in one process.

qk_norm_rope's launch options (LaunchConfig; rope_only ignores them: its kernel and contract are unchanged).
On the "head" tile the norm path reads each head tile twice: once for the row's sum of squares, once
for the output (the second read from L1/L2 when the row tile's data is still there), and the integer rounding
(BF16_ROUNDING) is about a third of its instructions per element (static count of the loops compiled for sm_90).
`bf16_cast="native"`: NATIVE_BF16.
`index="auto"`: element offsets in int32 instead of int64 when the farthest element the launch addresses
(masked padding included) is below 2**31, else int64 as before; only the offset arithmetic changes.
(A head-tile option adding the heads' squares per channel before one reduction was 5-20 % slower on the H200 in
every run and was removed.) `tile="row"` (`_row_qk_norm_rope`): a program holds its rows whole
as one [BLOCK_R, H, D] tile (H and D padded to powers of two and masked: Wan's 12 heads are 16, so a quarter of
the lanes idle), reads x once, loads its (.., 1, D) table rows once for every head, and reduces each row once;
every thread that holds part of a row repeats the row's division and square root, so few rows per thread (small
`rows`, few warps) keep that overhead low. Rows wider than MAX_ROW_TILE padded elements are refused (ValueError).
None of these is measured on a GPU yet: CANDIDATES' "norm_*" entries after the measured ones are for that.

Measured (H200, Wan2.1-1.3B's q/k: x (1, 32760, 12, 128) bf16, (1, T, 1, 128) tables, 2026-11-29, triton 3.6):
legacy 482 us (float32 tables, 12 % of the 4.17 TB/s copy bandwidth) and 679 us (float64); tiled with 4 heads
per program 67 us (84 %) and 125 us (52 %; all heads per program: 117 us); torch's reference 973 / 1436 us.
Every launch was torch.equal to `rope_reference` there.
qk_norm_rope (same shape, bf16, float32 tables; 2026-11-30 runs 3-4 of norm-kernels-gpu, two machines; a device copy
of the same 235 MB took 62 us under the same clock): the head tile 98-100 us (57 %; with the native cast 91-93 us);
the row tile (x read once) 73-106 us, fastest 2 rows x 2 warps 73 us (77 %) on the first machine and persistent 8 per
SM, 3 stages 83 us (68 %) on the second; `NORM_DEFAULT` (1 row, 2 warps) 76 / 85 us (74 / 66 %), within 4 % of the
fastest on both. None reaches 80 %. Every launch met the float64 bound on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size, interpreting, pointwise_tile

X_DTYPES = (torch.bfloat16, torch.float32)
FREQ_DTYPES = (torch.float32, torch.float64)
BLOCK_R = 16  # legacy rope_only: rows (b, t) per program
BLOCK_P = 64  # legacy rope_only: (even, odd) pairs per program
MAX_FUSED_PAIRS = 8192  # legacy qk_norm_rope holds one whole row (C / 2 pairs) per program
MAX_ROW_TILE = 16384  # tile="row": padded heads x padded head dim one program holds per row
KERNELS = ("tiled", "legacy")
TILES = ("head", "row")
BF16_CASTS = ("integer", "native")
INDEXES = ("int64", "auto")


@dataclass(frozen=True)
class LaunchConfig:
    """How the kernels are launched on the GPU. Every config gives the same (bit-equal) rope_only result.

    kernel: "tiled" (current) or "legacy" (the first version; its tiles are fixed and the other fields are
    ignored). rows: rows (b, t) per program (a power of two). heads: heads per program in rope_only (more than
    H means all; qk_norm_rope always takes all, its RMS spans them). num_warps: warps per program.
    Used by qk_norm_rope only (rope_only ignores them; module doc):
    tile: "head" (one [rows, D] tile per head, x read twice) or "row" (all heads as one [rows, H, D] tile, x read
    once). bf16_cast: "integer"
    (BF16_ROUNDING everywhere) or "native" (NATIVE_BF16 when compiled). index: "int64" offsets, or "auto" (int32
    when every offset the launch forms fits, else int64). per_sm (tile "row"): None, one program per row tile; k,
    k programs per streaming multiprocessor (2 under the interpreter) looping over the tiles with `num_stages`-deep
    load pipelining (1: none)."""

    kernel: str = "tiled"
    rows: int = 16
    heads: int = 4
    num_warps: int = 4
    tile: str = "head"
    bf16_cast: str = "integer"
    index: str = "int64"
    per_sm: int | None = None
    num_stages: int = 1

    def __post_init__(self) -> None:
        if self.per_sm is not None and (
            isinstance(self.per_sm, bool) or not isinstance(self.per_sm, int) or self.per_sm < 1
        ):
            raise ValueError(f"LaunchConfig.per_sm: {self.per_sm!r}; expected None or an int >= 1")
        if self.num_stages not in (1, 2, 3, 4):
            raise ValueError(f"LaunchConfig.num_stages: {self.num_stages!r}; allowed: 1, 2, 3, 4")
        choices = {"kernel": KERNELS, "tile": TILES, "bf16_cast": BF16_CASTS, "index": INDEXES}
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"LaunchConfig.{field}: {getattr(self, field)!r}; allowed: {list(allowed)}")
        if not isinstance(self.rows, int) or self.rows < 1 or self.rows & (self.rows - 1):
            raise ValueError(f"LaunchConfig.rows: {self.rows!r}; expected a power of two >= 1")
        if not isinstance(self.heads, int) or self.heads < 1:
            raise ValueError(f"LaunchConfig.heads: {self.heads!r}; expected an int >= 1")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"LaunchConfig.num_warps: {self.num_warps!r}; allowed: 1, 2, 4, 8, 16")


LEGACY = LaunchConfig(kernel="legacy")
_FAST = {"bf16_cast": "native", "index": "auto"}  # the options that change no output bit (NaN payloads aside)
DEFAULT = LaunchConfig()  # rope_only's: fastest with float32 tables on the H200 (module doc; rope_kernel_gpu.py)
# qk_norm_rope's: the row tile, one row per program, 2 warps (H200, 2026-11-30 runs 3-4: module doc)
NORM_DEFAULT = LaunchConfig(rows=1, num_warps=2, tile="row", bf16_cast="native", index="auto")
CANDIDATES = {  # what the benchmark times side by side
    "legacy": LEGACY,
    "tiled": DEFAULT,
    "tiled_h4_r32": LaunchConfig(rows=32),
    "tiled_h1": LaunchConfig(heads=1),
    "tiled_h1_r32": LaunchConfig(heads=1, rows=32),
    "tiled_h1_r8_w2": LaunchConfig(heads=1, rows=8, num_warps=2),
    "tiled_all_heads": LaunchConfig(heads=64),
    # for qk_norm_rope (its norm path takes every head, `heads` unused there); on the H200 (2026-11-30-norm-kernels-
    # gpu-run2.json) all within 95-102 us of the tiled DEFAULT's 99 us (55-59 % of copy bandwidth), torch.equal to it
    "norm_r8": LaunchConfig(rows=8),
    "norm_r4_w2": LaunchConfig(rows=4, num_warps=2),
    "norm_r8_w2": LaunchConfig(rows=8, num_warps=2),
    "norm_r16_w8": LaunchConfig(rows=16, num_warps=8),
    "norm_r32_w8": LaunchConfig(rows=32, num_warps=8),
    # qk_norm_rope's faster paths (module doc; measured there). Head tile: the native cast alone, then with int32
    # offsets. Row tile (x read once) over rows x warps (few rows per thread: every thread holding a row repeats its
    # scale's division and square root), and once with the integer cast.
    "norm_native": LaunchConfig(bf16_cast="native"),
    "norm_native_i32": LaunchConfig(**_FAST),
    "norm_row_r1_w1": LaunchConfig(rows=1, num_warps=1, tile="row", **_FAST),
    "norm_row_r1_w2": LaunchConfig(rows=1, num_warps=2, tile="row", **_FAST),
    "norm_row_r2_w2": LaunchConfig(rows=2, num_warps=2, tile="row", **_FAST),
    "norm_row_r2_w4": LaunchConfig(rows=2, num_warps=4, tile="row", **_FAST),
    "norm_row_r4_w4": LaunchConfig(rows=4, num_warps=4, tile="row", **_FAST),
    "norm_row_r2_w2_integer": LaunchConfig(rows=2, num_warps=2, tile="row", index="auto"),
    # the row tile, persistent (grid-stride loop, pipelined loads)
    "norm_row_p4_s2_r2_w2": LaunchConfig(rows=2, num_warps=2, tile="row", per_sm=4, num_stages=2, **_FAST),
    "norm_row_p8_s2_r2_w2": LaunchConfig(rows=2, num_warps=2, tile="row", per_sm=8, num_stages=2, **_FAST),
    "norm_row_p8_s3_r2_w2": LaunchConfig(rows=2, num_warps=2, tile="row", per_sm=8, num_stages=3, **_FAST),
    "norm_row_p4_s2_r4_w4": LaunchConfig(rows=4, num_warps=4, tile="row", per_sm=4, num_stages=2, **_FAST),
    "norm_row_p8_s2_r1_w1": LaunchConfig(rows=1, num_warps=1, tile="row", per_sm=8, num_stages=2, **_FAST),
}


def _legacy_qk_norm_rope(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    R, T, C, HALF_D, eps,
    x_sb, x_st, x_sh, x_sd,
    c_sb, c_st, c_sh, c_sd,
    s_sb, s_st, s_sh, s_sd,
    NORM: tl.constexpr, X_BF16: tl.constexpr, F64: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    # One tile = BLOCK_R rows (b, t) x BLOCK_P (even, odd) channel pairs. With NORM, one program holds the
    # whole row (BLOCK_P >= C / 2) so the RMS is computed in-register.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    pairs = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    b = (rows // T).to(tl.int64)[:, None]
    t = (rows % T).to(tl.int64)[:, None]
    p = pairs.to(tl.int64)[None, :]
    h = p // HALF_D
    j = p % HALF_D
    mask = (rows < R)[:, None] & (pairs < C // 2)[None, :]
    even = 2 * p  # channel in the flat hidden dim (h * D + 2j)
    x_at = x_ptr + b * x_sb + t * x_st + h * x_sh + (2 * j) * x_sd
    x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_at + x_sd, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        # tl.reduce with tl.standard's own combine, not tl.sum: tl.sum is a JITFunction decorated when triton
        # was imported, which the interpreter cannot call if TRITON_INTERPRET was set later (LazyKernel's case);
        # the interpreter maps this combine to np.sum, a GPU to Triton's tree reduction
        ms = tl.reduce(x1 * x1, 1, tl.standard._sum_combine) + tl.reduce(x2 * x2, 1, tl.standard._sum_combine)
        ms = tl.math.div_rn(ms, C.to(tl.float32))
        r = tl.math.div_rn(1.0, tl.math.sqrt_rn((ms + eps).to(tl.float32)))[:, None]  # eps is fp64 under compile
        w1 = tl.load(w_ptr + even, mask=(pairs < C // 2)[None, :], other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + even + 1, mask=(pairs < C // 2)[None, :], other=0.0).to(tl.float32)
        x1 = (x1 * r) * w1
        x2 = (x2 * r) * w2
        if X_BF16:  # torch rounds RMSNorm's output to x's dtype (BF16_ROUNDING)
            bits = x1.to(tl.uint32, bitcast=True)
            bits = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16) << 16
            x1 = tl.where(x1 != x1, x1, bits.to(tl.float32, bitcast=True))
            bits = x2.to(tl.uint32, bitcast=True)
            bits = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16) << 16
            x2 = tl.where(x2 != x2, x2, bits.to(tl.float32, bitcast=True))
    cos = tl.load(cos_ptr + b * c_sb + t * c_st + h * c_sh + (2 * j) * c_sd, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + b * s_sb + t * s_st + h * s_sh + (2 * j + 1) * s_sd, mask=mask, other=0.0)
    if F64:  # promote(x, float64): the arithmetic runs in float64 (the upcast is exact)
        x1 = x1.to(tl.float64)
        x2 = x2.to(tl.float64)
    a = x1 * cos  # each product and sum rounded on its own (enable_fp_fusion=False)
    bb = x2 * sin
    y1 = a - bb
    c = x1 * sin
    d = x2 * cos
    y2 = c + d
    if F64:  # torch casts float64 -> float32 first, then (for bf16) float32 -> bf16
        y1 = y1.to(tl.float32)
        y2 = y2.to(tl.float32)
    out = out_ptr + rows.to(tl.int64)[:, None] * C + even
    if X_BF16:  # BF16_ROUNDING
        bits = y1.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        bits = tl.where(y1 != y1, 0x7FC0, bits)
        tl.store(out, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        bits = y2.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        bits = tl.where(y2 != y2, 0x7FC0, bits)
        tl.store(out + 1, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(out, y1, mask=mask)
        tl.store(out + 1, y2, mask=mask)


_LEGACY = LazyKernel(_legacy_qk_norm_rope)


def _tiled_qk_norm_rope(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    R, T, H, GROUPS, eps,
    x_sb, x_st, x_sh, x_sd,
    c_sb, c_st, c_sh, c_sd,
    s_sb, s_st, s_sh, s_sd,
    D: tl.constexpr, BLOCK_D: tl.constexpr, HEADS: tl.constexpr, BLOCK_R: tl.constexpr,
    NORM: tl.constexpr, X_BF16: tl.constexpr, F64: tl.constexpr, HEAD_TABLES: tl.constexpr,
    NATIVE_BF16: tl.constexpr, INDEX: tl.constexpr,
):  # fmt: skip
    """Program `pid` = row tile pid // GROUPS (BLOCK_R rows (b, t)) x heads [h0, h0 + HEADS) of group
    pid % GROUPS; with NORM one group holds every head. One head of the tile is a [BLOCK_R, BLOCK_D] block of
    channels, read and written contiguously; the rotation works on its even/odd halves [BLOCK_R, BLOCK_D / 2]."""
    pid = tl.program_id(0)
    tile = pid // GROUPS  # head groups vary fastest: one row tile's programs share its table rows in L2
    h0 = (pid - tile * GROUPS) * HEADS
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)  # flattened (b, t), int32 (R < 2**31)
    b = rows // T  # one int32 division per row
    t = (rows - b * T).to(INDEX)
    b = b.to(INDEX)
    cols = tl.arange(0, BLOCK_D).to(INDEX)  # channel in the head
    if BLOCK_D == D:
        mask = tl.broadcast_to((rows < R)[:, None], (BLOCK_R, BLOCK_D))
    else:
        mask = (rows < R)[:, None] & (cols < D)[None, :]
    x_at = x_ptr + (b * x_sb + t * x_st)[:, None] + (cols * x_sd)[None, :]  # [BLOCK_R, BLOCK_D], head 0
    cos_at = cos_ptr + (b * c_sb + t * c_st)[:, None] + (cols * c_sd)[None, :]
    sin_at = sin_ptr + (b * s_sb + t * s_st)[:, None] + (cols * s_sd)[None, :]
    out_at = out_ptr + (rows.to(INDEX) * (H * D))[:, None] + cols[None, :]
    # per-head steps in INDEX (tl.cast: a stride of 1 arrives as a constexpr when compiled)
    x_sh = tl.cast(x_sh, INDEX)
    c_sh = tl.cast(c_sh, INDEX)
    s_sh = tl.cast(s_sh, INDEX)
    if not HEAD_TABLES:  # (.., 1, D) tables: one load for every head of the program; cos at 2j, sin at 2j + 1
        cos, _ = tl.split(tl.reshape(tl.load(cos_at, mask=mask, other=0.0), [BLOCK_R, BLOCK_D // 2, 2]))
        _, sin = tl.split(tl.reshape(tl.load(sin_at, mask=mask, other=0.0), [BLOCK_R, BLOCK_D // 2, 2]))
    if NORM:  # RMS over the whole row (every head), in fp32; see the module doc for the order of the sum
        squares = tl.full([BLOCK_R], 0.0, tl.float32)  # not tl.zeros: a JITFunction, as tl.sum (legacy kernel)
        for h in range(0, H):
            x = tl.load(x_at + h * x_sh, mask=mask, other=0.0).to(tl.float32)
            squares += tl.reduce(x * x, 1, tl.standard._sum_combine)  # tl.sum: see the legacy kernel
    if NORM:
        ms = tl.math.div_rn(squares, tl.cast(H * D, tl.float32))
        r = tl.math.div_rn(1.0, tl.math.sqrt_rn((ms + eps).to(tl.float32)))[:, None]  # eps is fp64 under compile
    for h in range(h0, tl.minimum(h0 + HEADS, H)):
        x = tl.load(x_at + h * x_sh, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_D]
        if NORM:
            w = tl.load(w_ptr + h * D + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
            x = (x * r) * w
            if X_BF16 and NATIVE_BF16:  # torch rounds RMSNorm's output to x's dtype
                x = x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
            elif X_BF16:  # BF16_ROUNDING
                bits = x.to(tl.uint32, bitcast=True)
                bits = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16) << 16
                x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        if HEAD_TABLES:
            cos, _ = tl.split(tl.reshape(tl.load(cos_at + h * c_sh, mask=mask, other=0.0), [BLOCK_R, BLOCK_D // 2, 2]))
            _, sin = tl.split(tl.reshape(tl.load(sin_at + h * s_sh, mask=mask, other=0.0), [BLOCK_R, BLOCK_D // 2, 2]))
        x1, x2 = tl.split(tl.reshape(x, [BLOCK_R, BLOCK_D // 2, 2]))  # channels 2j, 2j + 1: [BLOCK_R, BLOCK_D / 2]
        if F64:  # promote(x, float64): the arithmetic runs in float64 (the upcast is exact)
            x1 = x1.to(tl.float64)
            x2 = x2.to(tl.float64)
        a = x1 * cos  # each product and sum rounded on its own (enable_fp_fusion=False)
        bb = x2 * sin
        y1 = a - bb
        c = x1 * sin
        d = x2 * cos
        y2 = c + d
        y = tl.reshape(tl.join(y1, y2), [BLOCK_R, BLOCK_D])  # channel order again: 2j <- y1, 2j + 1 <- y2
        if F64:  # torch casts float64 -> float32 first, then (for bf16) float32 -> bf16
            y = y.to(tl.float32)
        if X_BF16 and NATIVE_BF16:
            tl.store(out_at + h * D, y.to(tl.bfloat16, fp_downcast_rounding="rtne"), mask=mask)
        elif X_BF16:  # BF16_ROUNDING
            bits = y.to(tl.uint32, bitcast=True)
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
            bits = tl.where(y != y, 0x7FC0, bits)
            tl.store(out_at + h * D, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        else:
            tl.store(out_at + h * D, y, mask=mask)


_TILED = LazyKernel(_tiled_qk_norm_rope)


def _row_qk_norm_rope(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    R, T, H, eps,
    x_sb, x_st, x_sh, x_sd,
    c_sb, c_st, c_sh, c_sd,
    s_sb, s_st, s_sh, s_sd,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
    X_BF16: tl.constexpr, F64: tl.constexpr, HEAD_TABLES: tl.constexpr, NATIVE_BF16: tl.constexpr,
    INDEX: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """qk_norm_rope's tile="row": program `pid` owns rows (b, t) [pid * BLOCK_R, + BLOCK_R), each held whole as
    [BLOCK_H, BLOCK_D] (heads x channels, both padded to powers of two and masked), so x is read from memory once
    and the row's sum of squares is one reduction; the arithmetic per element is the tiled kernel's."""
    # one row tile per program, or (LaunchConfig.per_sm) a grid-stride loop whose loads are pipelined NUM_STAGES - 1
    # tiles ahead (layernorm_modulate's persistent launch)
    for tile in tl.range(tl.program_id(0), (R + BLOCK_R - 1) // BLOCK_R, tl.num_programs(0), num_stages=NUM_STAGES):
        rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)  # flattened (b, t), int32 (R < 2**31)
        b = rows // T  # one int32 division per row
        t = (rows - b * T).to(INDEX)
        b = b.to(INDEX)
        heads = tl.arange(0, BLOCK_H).to(INDEX)
        cols = tl.arange(0, BLOCK_D).to(INDEX)
        live = (rows < R)[:, None, None]
        channels = (heads < H)[:, None] & (cols < D)[None, :]  # [BLOCK_H, BLOCK_D]
        mask = live & channels[None, :, :]  # [BLOCK_R, BLOCK_H, BLOCK_D]
        cos_at = cos_ptr + (b * c_sb + t * c_st)[:, None, None] + (cols * c_sd)[None, None, :]
        sin_at = sin_ptr + (b * s_sb + t * s_st)[:, None, None] + (cols * s_sd)[None, None, :]
        if HEAD_TABLES:  # [BLOCK_R, BLOCK_H, BLOCK_D / 2]; cos at 2j, sin at 2j + 1
            cos_at += (heads * tl.cast(c_sh, INDEX))[None, :, None]
            sin_at += (heads * tl.cast(s_sh, INDEX))[None, :, None]
            cos, _ = tl.split(tl.reshape(tl.load(cos_at, mask=mask, other=0.0), [BLOCK_R, BLOCK_H, BLOCK_D // 2, 2]))
            _, sin = tl.split(tl.reshape(tl.load(sin_at, mask=mask, other=0.0), [BLOCK_R, BLOCK_H, BLOCK_D // 2, 2]))
        else:  # (.., 1, D) tables: [BLOCK_R, 1, BLOCK_D / 2], one load per row, broadcast over the heads
            shared = live & (cols < D)[None, None, :]
            cos, _ = tl.split(tl.reshape(tl.load(cos_at, mask=shared, other=0.0), [BLOCK_R, 1, BLOCK_D // 2, 2]))
            _, sin = tl.split(tl.reshape(tl.load(sin_at, mask=shared, other=0.0), [BLOCK_R, 1, BLOCK_D // 2, 2]))
        x_row = (b * x_sb + t * x_st)[:, None, None]
        x_at = x_ptr + x_row + (heads * tl.cast(x_sh, INDEX))[None, :, None] + (cols * x_sd)[None, None, :]
        x = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_H, BLOCK_D]
        # tl.reduce with tl.standard's combine, as the other kernels (tl.sum: see the legacy kernel)
        squares = tl.reduce(tl.reduce(x * x, 2, tl.standard._sum_combine), 1, tl.standard._sum_combine)
        ms = tl.math.div_rn(squares, tl.cast(H * D, tl.float32))
        r = tl.math.div_rn(1.0, tl.math.sqrt_rn((ms + eps).to(tl.float32)))[:, None, None]  # eps is fp64 under compile
        w = tl.load(w_ptr + (heads * D)[:, None] + cols[None, :], mask=channels, other=0.0).to(tl.float32)
        x = (x * r) * w[None, :, :]
        if X_BF16 and NATIVE_BF16:  # torch rounds RMSNorm's output to x's dtype
            x = x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        elif X_BF16:  # BF16_ROUNDING
            bits = x.to(tl.uint32, bitcast=True)
            bits = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16) << 16
            x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        x1, x2 = tl.split(tl.reshape(x, [BLOCK_R, BLOCK_H, BLOCK_D // 2, 2]))  # channels 2j, 2j + 1
        if F64:  # promote(x, float64): the arithmetic runs in float64 (the upcast is exact)
            x1 = x1.to(tl.float64)
            x2 = x2.to(tl.float64)
        a = x1 * cos  # each product and sum rounded on its own (enable_fp_fusion=False)
        bb = x2 * sin
        y1 = a - bb
        c = x1 * sin
        d = x2 * cos
        y2 = c + d
        y = tl.reshape(tl.join(y1, y2), [BLOCK_R, BLOCK_H, BLOCK_D])  # channel order again
        if F64:  # torch casts float64 -> float32 first, then (for bf16) float32 -> bf16
            y = y.to(tl.float32)
        out_at = (
            out_ptr + (rows.to(INDEX) * (H * D))[:, None, None] + ((heads * D)[:, None] + cols[None, :])[None, :, :]
        )
        if X_BF16 and NATIVE_BF16:
            tl.store(out_at, y.to(tl.bfloat16, fp_downcast_rounding="rtne"), mask=mask)
        elif X_BF16:  # BF16_ROUNDING
            bits = y.to(tl.uint32, bitcast=True)
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
            bits = tl.where(y != y, 0x7FC0, bits)
            tl.store(out_at, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        else:
            tl.store(out_at, y, mask=mask)


_ROW = LazyKernel(_row_qk_norm_rope)


def rope_reference(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary step, as the arithmetic diffusers 0.42 runs: channel pair (2i, 2i+1) is rotated with the
    cosine from the table's even columns and the sine from its odd columns, in the promoted dtype, then
    rounded once to x's dtype."""
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = freqs_cos[..., 0::2], freqs_sin[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return rotated.to(x.dtype)


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    freqs_cos: torch.Tensor,
    freqs_sin: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """`norm_q`/`norm_k` (torch.nn.RMSNorm over the full hidden dim), unflatten to heads, then the rotary step."""
    normed = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    return rope_reference(normed.unflatten(2, (heads, -1)), freqs_cos, freqs_sin)


def _check_freqs(name: str, x_shape: tuple[int, ...], freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    b, t, h, d = x_shape
    for arg, f in (("freqs_cos", freqs_cos), ("freqs_sin", freqs_sin)):
        check_float(name, arg, f, FREQ_DTYPES)
        if f.ndim != 4 or f.shape[0] not in (1, b) or f.shape[1] != t or f.shape[2] not in (1, h) or f.shape[3] != d:
            raise ValueError(f"{name}: {arg} has shape {tuple(f.shape)}; expected (1 or {b}, {t}, 1 or {h}, {d})")
    if freqs_cos.dtype != freqs_sin.dtype:
        raise ValueError(f"{name}: freqs_cos is {freqs_cos.dtype} but freqs_sin is {freqs_sin.dtype}")
    return freqs_cos.expand(b, t, h, d), freqs_sin.expand(b, t, h, d)


def _config(config: LaunchConfig | None) -> LaunchConfig:
    if config is None:
        return DEFAULT
    if not isinstance(config, LaunchConfig):
        raise ValueError(f"qk_norm_rope: config must be a LaunchConfig or None, got {type(config).__name__}")
    return config


def _launch(x4, weight, eps, cos, sin, norm, config):
    b, t, h, d = x4.shape
    c = h * d
    out = torch.empty((b, t, h, d), dtype=x4.dtype, device=x4.device)
    if out.numel() == 0:
        return out
    flags = {"X_BF16": x4.dtype == torch.bfloat16, "F64": cos.dtype == torch.float64}
    if config.kernel == "legacy":
        if norm:
            block_p = triton.next_power_of_2(c // 2)
            block_r = max(1, min(16, 1024 // block_p))
            grid = (triton.cdiv(b * t, block_r), 1)
        else:
            block_r, block_p = pointwise_tile(b * t, c // 2, BLOCK_R, BLOCK_P)
            grid = (triton.cdiv(b * t, block_r), triton.cdiv(c // 2, block_p))
        _LEGACY[grid](
            x4, weight if norm else x4, cos, sin, out, b * t, t, c, d // 2, float(eps),
            *x4.stride(), *cos.stride(), *sin.stride(),
            NORM=norm, **flags, BLOCK_R=block_r, BLOCK_P=block_p, enable_fp_fusion=False,
        )  # fmt: skip
        return out
    block_d = triton.next_power_of_2(d)
    flags["HEAD_TABLES"] = cos.stride(2) != 0 or sin.stride(2) != 0
    # the norm path's options (LaunchConfig); rope_only keeps the launch it was measured with
    flags["NATIVE_BF16"] = norm and config.bf16_cast == "native" and not interpreting()
    if norm and config.tile == "row":
        block_h = triton.next_power_of_2(h)
        block_r, _ = pointwise_tile(b * t, block_h * block_d, config.rows, block_h * block_d)
        tiles = triton.cdiv(b * t, block_r)
        if config.per_sm is not None:
            sms = 2 if interpreting() else torch.cuda.get_device_properties(x4.device).multi_processor_count
            tiles = min(tiles, config.per_sm * sms)
        _ROW[(tiles,)](
            x4, weight, cos, sin, out, b * t, t, h, float(eps),
            *x4.stride(), *cos.stride(), *sin.stride(),
            D=d, BLOCK_D=block_d, BLOCK_H=block_h, BLOCK_R=block_r, **flags,
            INDEX=_index(config, (x4, cos, sin, out), block_r, block_h, block_d), NUM_STAGES=config.num_stages,
            num_warps=config.num_warps, enable_fp_fusion=False,
        )  # fmt: skip
        return out
    block_r, _ = pointwise_tile(b * t, block_d, config.rows, block_d)
    heads = h if norm else min(config.heads, h)
    groups = triton.cdiv(h, heads)
    _TILED[(triton.cdiv(b * t, block_r) * groups,)](
        x4, weight if norm else x4, cos, sin, out, b * t, t, h, groups, float(eps),
        *x4.stride(), *cos.stride(), *sin.stride(),
        D=d, BLOCK_D=block_d, HEADS=heads, BLOCK_R=block_r, NORM=norm, **flags,
        INDEX=_index(config, (x4, cos, sin, out), block_r, h, block_d) if norm else tl.int64,

        num_warps=config.num_warps, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def _index(config: LaunchConfig, tensors, block_r: int, heads: int, block_d: int) -> tl.dtype:
    """The offsets' dtype: int32 only where `config.index` allows it and the farthest element of every
    (B, T, H, D) operand the launch addresses, masked padding included (rows up to a whole last tile, so b one
    past the batch; `heads` and `block_d` as the kernel pads them), stays below 2**31."""
    if config.index == "int64":
        return tl.int64
    rows = triton.cdiv(tensors[0].shape[0] * tensors[0].shape[1], block_r) * block_r
    for tensor in tensors:
        t = tensor.shape[1]
        extents = (triton.cdiv(rows, t), t, heads, block_d)
        if sum((n - 1) * s for n, s in zip(extents, tensor.stride(), strict=True)) >= 2**31:  # strides are >= 0
            return tl.int64
    return tl.int32


def rope_only(
    x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, config: LaunchConfig | None = None
) -> torch.Tensor:
    """`rope_reference(x, freqs_cos, freqs_sin)` in one pass; bit-equal on the interpreter (module doc).
    `config`: the launch (None: `DEFAULT`)."""
    name = "rope_only"
    check_float(name, "x", x, X_DTYPES)
    if x.ndim != 4:
        raise ValueError(f"{name}: x must be (B, T, H, D), got shape {tuple(x.shape)}")
    b, t, h, d = x.shape
    if d % 2:
        raise ValueError(f"{name}: head dim D must be even, got {d}")
    cos, sin = _check_freqs(name, tuple(x.shape), freqs_cos, freqs_sin)
    check_runtime(name, x, cos, sin)
    return _launch(x, None, 0.0, cos, sin, False, _config(config))


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    freqs_cos: torch.Tensor,
    freqs_sin: torch.Tensor,
    heads: int,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """`reference(...)` in one pass (contract: reduction; the RMS sum's order differs, see module doc).
    `config`: the launch (None: `NORM_DEFAULT`, or `DEFAULT`'s head tile for rows too wide for the row tile)."""
    name = "qk_norm_rope"
    check_float(name, "x", x, X_DTYPES)
    check_float(name, "weight", weight, (x.dtype,))
    if x.ndim != 3:
        raise ValueError(f"{name}: x must be (B, T, C), got shape {tuple(x.shape)}")
    b, t, c = x.shape
    if not isinstance(heads, int) or heads < 1 or c % heads or (c // heads) % 2:
        raise ValueError(f"{name}: heads={heads!r} must be a positive int dividing C={c} into an even head dim")
    if weight.shape != (c,):
        raise ValueError(f"{name}: weight has shape {tuple(weight.shape)}; expected ({c},)")
    if not eps >= 0:
        raise ValueError(f"{name}: eps must be >= 0, got {eps}")
    d = c // heads
    padded = triton.next_power_of_2(heads) * triton.next_power_of_2(d)
    config = _config(config) if config is not None else NORM_DEFAULT if padded <= MAX_ROW_TILE else DEFAULT
    if config.kernel == "legacy" and c // 2 > MAX_FUSED_PAIRS:
        raise ValueError(f"{name}: C={c} is wider than this kernel holds in one program ({2 * MAX_FUSED_PAIRS})")
    if config.kernel == "tiled" and config.tile == "row" and padded > MAX_ROW_TILE:
        raise ValueError(
            f"{name}: tile='row' holds {heads} heads x {d} padded to {padded} elements per row, over {MAX_ROW_TILE}; "
            "use tile='head'"
        )
    cos, sin = _check_freqs(name, (b, t, heads, d), freqs_cos, freqs_sin)
    check_runtime(name, x, weight, cos, sin)
    return _launch(x.unflatten(2, (heads, d)), weight.contiguous(), eps, cos, sin, True, config)


def cost(
    shape: tuple[int, int, int, int],
    dtype: torch.dtype = torch.bfloat16,
    freqs_dtype: torch.dtype = torch.float32,
    norm: bool = True,
) -> tuple[int, int]:
    """(bytes_moved, flops) for x of `shape` (B, T, H, D) in `dtype`, (1, T, 1, D) tables in `freqs_dtype`.

    Reads x, both tables (half of each: cos at even, sin at odd index; counted whole, a DRAM sector holds
    both) and, with `norm`, the weight; writes the output once. Flops per element: rotary 3 (two products,
    one sum); RMSNorm 4 more (square, add, two products)."""
    b, t, h, d = shape
    elements = b * t * h * d
    tables = 2 * t * d * dtype_size(freqs_dtype)
    weight = h * d * dtype_size(dtype) if norm else 0
    return 2 * elements * dtype_size(dtype) + tables + weight, elements * (7 if norm else 3)
