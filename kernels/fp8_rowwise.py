"""Row-wise dynamic FP8 (e4m3) quantization in one kernel, for `selective_fp8`'s fused path (contract: approximate).

Each row of a (M, K) matrix gets its own scale `max(amax(|row|), EPS) / 448` (448: e4m3's largest finite value)
and is stored as `clamp(row / scale, -448, 448)` rounded to nearest-even e4m3. torchao's
`Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())` uses the same recipe, eagerly as about six torch
passes per activation (abs, amax, divide, clamp, cast, copies). Here one program per row reads the row twice (the
amax, then the scaled cast; the second read mostly from L2) and writes one byte per element.

Contract: approximate (FP8). Against `reference` (the same recipe in torch, fp32 maths): the scales are equal
(one IEEE division of the same amax), the quantized values equal on a GPU (`cvt.rn.satfinite.e4m3x2.f32` after the
clamp is torch's round-to-nearest-even cast).

`fp8_linear(x, weight_q, weight_scale, bias)`: the Linear on quantized operands, `torch._scaled_mm` with the row
scales of x and the per-output-row scales of the weight (both float32), bf16 out, bias added in bf16 after.

The CPU interpreter's fp32 -> e4m3 conversion is wrong at binade edges (e.g. 31.9999 -> 16); under it the kernel
stores the scaled fp32 values and torch casts them (round to nearest even, saturated by the clamp first), which is
the rounding the GPU's `cvt.rn.satfinite.e4m3x2.f32` does in the kernel.

Shapes: x (M, K) bf16 or fp32 with unit last stride; K a multiple of 16 (torch._scaled_mm's rule). Returns
(q (M, K) float8_e4m3fn contiguous, scale (M, 1) float32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._fp8_rows import EPS, FP8, FP8_MAX
from workbench.kernels._fp8_rows import reference as reference  # the kernel's recipe in torch, kept beside it
from workbench.kernels._runtime import LazyKernel, check_float, check_fp8, check_runtime, interpreting

# One launch for every card: BLOCK_K columns per step of a row's two loops (capped at the row's padded width) and
# NUM_WARPS warps per program. The scale is a max (order-free) and each element its own division, so the result
# never depends on them.
BLOCK_K = 1024
NUM_WARPS = 4


def _quantize_rows(
    x_ptr, q_ptr, s_ptr, K, x_sm,
    BLOCK_K: tl.constexpr, FP8_MAX: tl.constexpr, EPS: tl.constexpr, CAST: tl.constexpr,
):  # fmt: skip
    """One program per row: its amax, its scale, then the row scaled, clamped and cast (CAST) or stored in fp32."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_sm
    peak = tl.full((BLOCK_K,), 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
        x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)  # (BLOCK_K,)
        peak = tl.maximum(peak, tl.abs(x))
    amax = tl.reduce(peak, 0, tl.standard._elementwise_max)  # not tl.max: see kernels/_runtime.py's LazyKernel
    scale = tl.math.div_rn(tl.maximum(amax, EPS), FP8_MAX)
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
        x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)  # (BLOCK_K,)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
        if CAST:
            tl.store(q_ptr + row * K + cols, y.to(tl.float8e4nv), mask=cols < K)
        else:
            tl.store(q_ptr + row * K + cols, y, mask=cols < K)


_KERNEL = LazyKernel(_quantize_rows)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference(x)` in one kernel launch (module doc)."""
    check_float("quantize_rows", "x", x, (torch.bfloat16, torch.float32))
    if x.ndim != 2 or x.stride(1) != 1 or x.shape[1] % 16:
        raise ValueError(
            f"quantize_rows: x must be (M, K) with unit last stride and K a multiple of 16, got shape "
            f"{tuple(x.shape)} strides {tuple(x.stride())}"
        )
    check_runtime("quantize_rows", x)
    check_fp8("quantize_rows", x.device)
    m, k = x.shape
    cast = not interpreting()
    q = torch.empty((m, k), dtype=FP8 if cast else torch.float32, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        tuning = {"num_warps": NUM_WARPS} if cast else {}
        _KERNEL[(m,)](
            x, q, scale, k, x.stride(0),
            BLOCK_K=min(BLOCK_K, triton.next_power_of_2(k)), FP8_MAX=FP8_MAX, EPS=EPS, CAST=cast, **tuning,
        )  # fmt: skip
    return (q if cast else q.to(FP8)), scale


def fp8_linear(
    x: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x (..., K) bf16 through weights quantized by `quantize_rows(weight)` (weight_q (N, K), weight_scale (N, 1)):
    (..., N) bf16. Needs a GPU with FP8 tensor cores (torch._scaled_mm)."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    q, scale = quantize_rows(rows)
    out = torch._scaled_mm(q, weight_q.t(), scale_a=scale, scale_b=weight_scale.t(), out_dtype=torch.bfloat16)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight_q.shape[0])
