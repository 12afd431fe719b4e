"""GELU with the tanh approximation, `F.gelu(x, approximate="tanh")` (contract: see below).

The FFN activation of diffusers' Wan block (`FeedForward(activation_fn="gelu-approximate")`). Torch
computes it in fp32 ("opmath") for bf16/fp16 input and rounds once to the input dtype:
`0.5 * x * (1 + tanh(kBeta * (x + kKappa * x**3)))`, kBeta = sqrt(2/pi), kKappa = 0.044715. This kernel
runs the same sequence in fp32.

Contract: **not claimed bitwise**. `tanh` is a library function whose last-bit behaviour belongs to the
implementation: torch on CPU uses SLEEF's vectorised tanhf (and libm on the scalar tail), the Triton
interpreter has no libdevice, so there tanh is `sign(z) (1 - e) / (1 + e)`, e = exp(-2|z|), and on a GPU torch uses CUDA's `tanhf` while Triton uses libdevice's
`__nv_tanhf`. Also torch's CUDA kernel is compiled with nvcc's default `--fmad=true`, so
`x + kKappa * x_cube` is probably one FMA there (`KAPPA_FMA=True` reproduces that). The tests bound
the distance to torch (measured on the interpreter: ~30% of fp32 elements differ by a few ulps, ~2% of
bf16 and ~4% of fp16 elements by one output ulp) and how often it differs; a GPU measurement decides
whether a `rounding` claim can be made there. Until then the fused-block plugin leaves GELU to torch by
default.

BF16_ROUNDING: fp32 -> bf16 is written out in integers (round to nearest even, as c10::BFloat16; NaN becomes
0x7FC0, NaN bit patterns are outside the contract) because the CPU interpreter's `.to(tl.bfloat16)` truncates.

Shapes: `x` of 1 to 3 dimensions, any strides, fp32/bf16/fp16; the output is contiguous, same dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size, interpreting

BLOCK_R = 16
BLOCK_C = 128
K_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5  # M_SQRT2 * M_2_SQRTPI * 0.5, as torch
K_KAPPA = 0.044715


def _gelu_tanh(
    x_ptr, out_ptr,
    R, T, C,
    x_sb, x_st, x_sc,
    KAPPA_FMA: tl.constexpr, LIBDEVICE_TANH: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    b = (rows // T).to(tl.int64)[:, None]
    t = (rows % T).to(tl.int64)[:, None]
    c = cols.to(tl.int64)[None, :]
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    x = tl.load(x_ptr + b * x_sb + t * x_st + c * x_sc, mask=mask, other=0.0).to(tl.float32)
    x_cube = x * x * x
    if KAPPA_FMA:
        inner = 0.7978845608028654 * tl.fma(x_cube, 0.044715, x)
    else:
        inner = 0.7978845608028654 * (x + 0.044715 * x_cube)
    if LIBDEVICE_TANH:
        tanh = libdevice.tanh(inner)
    else:  # the CPU interpreter has no libdevice: tanh from exp (not torch's last bits either)
        e = tl.exp(-2.0 * tl.abs(inner))  # in (0, 1]: no overflow
        tanh = (1.0 - e) / (1.0 + e)
        tanh = tl.where(inner < 0, -tanh, tanh)
    y = 0.5 * x * (1.0 + tanh)
    out = out_ptr + rows.to(tl.int64)[:, None] * C + c
    if OUT_BF16:  # round to nearest even in integers, as c10::BFloat16 does (see BF16_ROUNDING)
        bits = y.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        bits = tl.where(y != y, 0x7FC0, bits)
        tl.store(out, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


_KERNEL = LazyKernel(_gelu_tanh)


def reference(x: torch.Tensor) -> torch.Tensor:
    """Exactly what diffusers' GELU module calls (off MPS)."""
    return F.gelu(x, approximate="tanh")


def gelu_tanh(x: torch.Tensor, kappa_fma: bool = False) -> torch.Tensor:
    """`reference(x)` computed in fp32 and rounded once to `x.dtype`; close to torch, not claimed
    bit-equal (see module doc). `kappa_fma` fuses `x + kKappa * x**3` into one FMA, as nvcc probably does."""
    name = "gelu_tanh"
    check_float(name, "x", x)
    if not 1 <= x.ndim <= 3:
        raise ValueError(f"{name}: x must have 1 to 3 dimensions, got shape {tuple(x.shape)}")
    check_runtime(name, x)
    view = x.reshape((1,) * (3 - x.ndim) + tuple(x.shape)) if x.ndim < 3 else x
    b, t, c = view.shape
    out = torch.empty((b, t, c), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out.reshape(x.shape)
    grid = (triton.cdiv(b * t, BLOCK_R), triton.cdiv(c, BLOCK_C))
    _KERNEL[grid](
        view, out, b * t, t, c, *view.stride(),
        KAPPA_FMA=kappa_fma, LIBDEVICE_TANH=not interpreting(), OUT_BF16=x.dtype == torch.bfloat16, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out.reshape(x.shape)


def cost(shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(bytes_moved, flops): one read and one write per element; about 9 flops plus one tanh per
    element (tanh counted as one flop: it is special-function throughput, not FMA throughput)."""
    elements = math.prod(shape)
    return 2 * elements * dtype_size(dtype), 10 * elements
