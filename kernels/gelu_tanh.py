"""GELU with the tanh approximation, `F.gelu(x, approximate="tanh")` (contract: see below).

The FFN activation of diffusers' Wan block (`FeedForward(activation_fn="gelu-approximate")`). Torch computes it in
fp32 ("opmath") for bf16/fp16 input and rounds once to the input dtype: `0.5 * x * (1 + tanh(z))`,
z = kBeta * (x + kKappa * x**3), kBeta = sqrt(2/pi), kKappa = 0.044715. This kernel runs the same sequence in fp32.

Contract: **not claimed bitwise**. `tanh` is a library function whose last-bit behaviour belongs to the
implementation: torch on CPU uses SLEEF's vectorised tanhf (and libm on the scalar tail), on a GPU CUDA's `tanhf`.
Here it is libdevice's `__nv_tanhf` (`LaunchConfig.tanh="libdevice"`, GPU only) or `sign(z) (1 - e) / (1 + e)`,
e = exp2(-2 log2(e) |z|) (`tanh="exp2"`: one MUFU exp2 and one `div.full` instead of libdevice's longer routine;
the CPU interpreter has no libdevice, so it always runs this one). The exp2 form keeps torch's `1 + tanh` on purpose:
`x * sigmoid(2z)` is cheaper still and closer to the exact value, but for x below about -4 torch's own `1 + tanh`
cancels to a few significant bits, and (emulated in torch on the CPU, 4M values of randn * 3) the sigmoid form
differed from torch in 7.3% of bf16 and 57% of fp32 elements, outside the bounds below; this form in 2.1% and 27%.
torch's CUDA kernel is compiled with nvcc's default `--fmad=true`, so `x + kKappa * x_cube` is probably one FMA
there (`kappa_fma=True` reproduces that; otherwise every op is its own fp32 rounding, `enable_fp_fusion=False`).

The tests bound the distance to torch (`excess` <= 1: one output ulp plus 8 fp32 ulps of the input's scale) and
how often it differs (`DIFFER_FRACTION`; measured on the interpreter, 2M values of randn * 3 + 0.05: 27% of fp32
elements differ by a few ulps, 2.1% of bf16 and 3.5% of fp16 elements by one output ulp). Every launch in
`CANDIDATES` is held to those bounds, on the interpreter by tests/kernels/test_gelu_tanh.py and on the GPU against
CUDA's torch by benchmarks/norm_kernels_gpu.py. Measured there (H200, x (1, 32760, 8960) bf16 of randn, 2026-11-30
run 4): libdevice's launches were torch.equal to CUDA torch on every element; exp2's differed in 2.6 % of elements
(excess 0.37, within the bounds). No profile uses this kernel: Wan's GELU runs in the up-projection GEMM's epilogue
(gelu_epilogue).

bf16 stores: on a GPU the native cast (`cvt.rn.bf16.f32`, round to nearest even: the value c10::BFloat16 gives for
every non-NaN input). The interpreter's `.to(tl.bfloat16)` truncates, so there BF16_ROUNDING: the rounding is
written out in integers (NaN becomes 0x7FC0). A NaN's payload and sign may differ from torch's; they are outside
the contract.

Launches (`LaunchConfig`). Contiguous x: one program per `block` consecutive elements of the flattened tensor,
int32 offsets while numel < 2**31. Other strides (or `flat=False`): (block // 128 rows, 128 channels) tiles over x
viewed as (B, T, C), int64 strided addresses: the first version's tiling (`CANDIDATES["tiled"]`: 16 x 128, 4
warps), which ran at 58% of the H200's 4.17 TB/s copy bandwidth at x (1, 32760, 8960) bf16 (with BF16_ROUNDING's
integer rounding then, the native cast now). Each element is computed on its own by the same op sequence, so
`block`, `num_warps`, `flat` and `index64` should not change a bit (tested on the interpreter; the benchmark
records `equal_to_default` on the GPU). Compiled for sm_90 without a GPU (ptxas, bf16, kappa_fma off), the
first version's tiling is 40 SASS instructions per element with one 2-byte load each; the flat launch with 4096
elements per program is 29 with libdevice's tanh and 24 with exp2, each with two 16-byte loads per thread. Their
speed on the H200 at that shape (same run; the copy bandwidth 4.17 TB/s; a device copy of the same bytes under the
same clock took 276 us): the first tiling 407 us (69 %), libdevice flat 343-347 us (81-82 %), exp2 flat 303-309 us
(91-93 %) and 279 us at 8192 elements x 8 warps (101 %): `DEFAULT`. `CANDIDATES["libdevice"]` is the launch to take
where torch's bits matter more than 20 % of this kernel's time.

Shapes: `x` of 1 to 3 dimensions, any strides, fp32/bf16/fp16; the output is contiguous, same shape and dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size, interpreting

K_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5  # M_SQRT2 * M_2_SQRTPI * 0.5, as torch
K_KAPPA = 0.044715
TANHS = ("libdevice", "exp2")
BLOCKS = tuple(2**k for k in range(7, 17))  # 128 .. 65536: each divides 2**31 (see the kernel's int32 offsets)
TILE_C = 128  # channels per tile of the strided launch; its rows are block // TILE_C
INT32_LIMIT = 2**31
# fraction of elements allowed to differ from torch at all (module doc; measured 27% fp32, 2.1% bf16, 3.5% fp16)
DIFFER_FRACTION = {torch.float32: 0.5, torch.bfloat16: 0.05, torch.float16: 0.08}


@dataclass(frozen=True)
class LaunchConfig:
    """How `gelu_tanh` is launched (module doc: what each field may change). block: elements per program (flat
    launch) or per tile (strided launch: block // 128 rows of 128 channels). num_warps: warps per program.
    tanh: "libdevice" or "exp2" (module doc; the interpreter always runs "exp2"). flat: the 1-D launch over the
    elements when x is contiguous; False runs the strided launch for every x. index64: int64 offsets in the flat
    launch always (otherwise only when numel reaches 2**31)."""

    block: int = 4096
    num_warps: int = 8
    tanh: str = "libdevice"
    flat: bool = True
    index64: bool = False

    def __post_init__(self) -> None:
        if type(self.block) is not int or self.block not in BLOCKS:
            raise ValueError(f"LaunchConfig.block: {self.block!r}; expected a power of two from 128 to 65536")
        if type(self.num_warps) is not int or self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"LaunchConfig.num_warps: {self.num_warps!r}; allowed: 1, 2, 4, 8, 16")
        if self.tanh not in TANHS:
            raise ValueError(f"LaunchConfig.tanh: {self.tanh!r}; allowed: {list(TANHS)}")
        for field in ("flat", "index64"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"LaunchConfig.{field}: {getattr(self, field)!r}; allowed: True, False")


# exp2's tanh, 8192 elements, 8 warps: 279 us at (1, 32760, 8960) bf16 on the H200, the same-bytes device copy's
# time under the same clock (libdevice's tanh at 4096 x 8: 345 us, 82 % of copy), within the contract (module doc)
DEFAULT = LaunchConfig(block=8192, num_warps=8, tanh="exp2")
CANDIDATES = {  # what benchmarks/norm_kernels_gpu.py times side by side
    "default": DEFAULT,
    "libdevice": LaunchConfig(),
    "b2048_w4": LaunchConfig(block=2048, num_warps=4),
    "b8192_w8": LaunchConfig(block=8192, num_warps=8),
    "b8192_w16": LaunchConfig(block=8192, num_warps=16),
    "libdevice_i64": LaunchConfig(index64=True),
    "exp2": LaunchConfig(tanh="exp2"),
    "exp2_b2048_w4": LaunchConfig(block=2048, num_warps=4, tanh="exp2"),
    "tiled": LaunchConfig(block=2048, num_warps=4, flat=False),  # the first version's launch, as a baseline
}


def _gelu_tanh(
    x_ptr, out_ptr,
    N, T, C,
    x_sb, x_st, x_sc,
    FLAT: tl.constexpr, WIDE: tl.constexpr, KAPPA_FMA: tl.constexpr, LIBDEVICE_TANH: tl.constexpr,
    BF16_BITS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    if FLAT:  # contiguous x: N elements, BLOCK_C of them per program (T, C, strides and BLOCK_R unused)
        start = tl.program_id(0)
        if WIDE:
            start = start.to(tl.int64)
        # int32: N < 2**31 and BLOCK_C divides 2**31, so even the last program's last offset is below 2**31
        at = start * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = at < N
        src = x_ptr + at
        dst = out_ptr + at
    else:  # any strides: N = B * T rows of C channels in (BLOCK_R, BLOCK_C) tiles, int64 addresses (WIDE unused)
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        b = (rows // T).to(tl.int64)[:, None]
        t = (rows % T).to(tl.int64)[:, None]
        c = cols.to(tl.int64)[None, :]
        mask = (rows < N)[:, None] & (cols < C)[None, :]
        src = x_ptr + b * x_sb + t * x_st + c * x_sc
        dst = out_ptr + rows.to(tl.int64)[:, None] * C + c
    x = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x_cube = x * x * x
    if KAPPA_FMA:
        inner = 0.7978845608028654 * tl.fma(x_cube, 0.044715, x)
    else:
        inner = 0.7978845608028654 * (x + 0.044715 * x_cube)
    if LIBDEVICE_TANH:
        tanh = libdevice.tanh(inner)
    else:  # tanh="exp2" (module doc): -2 log2(e) |inner| <= 0, so e in [0, 1] never overflows
        e = tl.exp2(-2.8853900817779268 * tl.abs(inner))
        # fdiv's default (div.full.f32, about 2 ulp; Triton 3.6 to 3.9 alike): the denominator is in [1, 2], so its
        # range reduction is never needed. Under the interpreter, numpy's divide
        tanh = tl.math.fdiv(1.0 - e, 1.0 + e)
        tanh = tl.where(inner < 0, -tanh, tanh)
    y = 0.5 * x * (1.0 + tanh)
    if BF16_BITS:  # round to nearest even in integers, as c10::BFloat16 does (see BF16_ROUNDING)
        bits = y.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        bits = tl.where(y != y, 0x7FC0, bits)
        tl.store(dst, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=mask)


_KERNEL = LazyKernel(_gelu_tanh)


def reference(x: torch.Tensor) -> torch.Tensor:
    """Exactly what diffusers' GELU module calls (off MPS)."""
    return F.gelu(x, approximate="tanh")


def excess(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> float:
    """The contract's distance bound: the largest |got - want| in units of one output ulp of the value plus 8
    fp32 ulps of the input's scale (the fp32 intermediate's error; near gelu's zero the output cancels, so a
    relative bound would be meaningless). At most 1 within the contract."""
    bound = torch.finfo(want.dtype).eps * want.float().abs() + 8 * 2.0**-24 * x.float().abs() + 1e-30
    return ((got.float() - want.float()).abs() / bound).max().item()


def gelu_tanh(x: torch.Tensor, kappa_fma: bool = False, config: LaunchConfig | None = None) -> torch.Tensor:
    """`reference(x)` computed in fp32 and rounded once to `x.dtype`; close to torch, not claimed bit-equal
    (module doc). `kappa_fma` fuses `x + kKappa * x**3` into one FMA, as nvcc probably does. `config`: the
    launch (None: `DEFAULT`)."""
    name = "gelu_tanh"
    check_float(name, "x", x)
    if not 1 <= x.ndim <= 3:
        raise ValueError(f"{name}: x must have 1 to 3 dimensions, got shape {tuple(x.shape)}")
    if config is None:
        config = DEFAULT
    elif not isinstance(config, LaunchConfig):
        raise ValueError(f"{name}: config must be a LaunchConfig or None, got {type(config).__name__}")
    check_runtime(name, x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    flags = {
        "KAPPA_FMA": kappa_fma,
        "LIBDEVICE_TANH": config.tanh == "libdevice" and not interpreting(),
        "BF16_BITS": x.dtype == torch.bfloat16 and interpreting(),
        "num_warps": config.num_warps,
        "enable_fp_fusion": False,
    }
    if config.flat and x.is_contiguous():
        n = x.numel()
        wide = config.index64 or n >= INT32_LIMIT
        _KERNEL[(triton.cdiv(n, config.block),)](
            x, out, n, 1, 1, 0, 0, 0, FLAT=True, WIDE=wide, BLOCK_R=1, BLOCK_C=config.block, **flags
        )
        return out
    view = x.reshape((1,) * (3 - x.ndim) + tuple(x.shape)) if x.ndim < 3 else x
    b, t, c = view.shape
    block_r = config.block // TILE_C
    grid = (triton.cdiv(b * t, block_r), triton.cdiv(c, TILE_C))
    _KERNEL[grid](
        view, out, b * t, t, c, *view.stride(), FLAT=False, WIDE=False, BLOCK_R=block_r, BLOCK_C=TILE_C, **flags
    )
    return out


def cost(shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(bytes_moved, flops): one read and one write per element; about 9 flops plus one tanh per
    element (tanh counted as one flop: it is special-function throughput, not FMA throughput)."""
    elements = math.prod(shape)
    return 2 * elements * dtype_size(dtype), 10 * elements
