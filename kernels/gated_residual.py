"""Gated residual `(x.float() + y * gate).to(x.dtype)` (contract: rounding).

diffusers' Wan block closes its self-attention and FFN branches with
`(hidden_states.float() + attn_output * gate).type_as(hidden_states)` (the FFN writes
`ff_output.float() * gate`, the same value: bf16/fp16 -> fp32 is exact). `gate` is a float32 chunk of
`scale_shift_table + temb.float()`, so torch promotes `y * gate` to fp32 whatever `y`'s dtype. Torch's
rounding boundaries, kept here: the product rounded to fp32, the sum rounded to fp32, then the cast to
`x.dtype` (round to nearest even).

FMA contraction: `x + y * gate` is the textbook contraction; the launcher passes
`enable_fp_fusion=False` so Triton's GPU backends emit a separate mul and add. The CPU interpreter
(numpy) never contracts: the tests there prove the op sequence bit for bit; on a GPU the claim is
**unverified until measured**.

BF16_ROUNDING: fp32 -> bf16 is written out in integers (round to nearest even, as c10::BFloat16; NaN becomes
0x7FC0, NaN bit patterns are outside the contract) because the CPU interpreter's `.to(tl.bfloat16)` truncates.

Shapes: `x` (B, T, C) in fp32/bf16/fp16; `y` (B, T, C) in any of those; `gate` float32 (B, 1, C) or
(B, T, C). Any strides. Output: contiguous (B, T, C) in `x.dtype`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._runtime import LazyKernel, broadcast_rows, check_float, check_runtime, dtype_size

BLOCK_R = 16
BLOCK_C = 128


def _gated_residual(
    x_ptr, y_ptr, gate_ptr, out_ptr,
    R, T, C,
    x_sb, x_st, x_sc,
    y_sb, y_st, y_sc,
    g_sb, g_st, g_sc,
    OUT_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # flattened (b, t)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    b = (rows // T).to(tl.int64)[:, None]
    t = (rows % T).to(tl.int64)[:, None]
    c = cols.to(tl.int64)[None, :]
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    x = tl.load(x_ptr + b * x_sb + t * x_st + c * x_sc, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + b * y_sb + t * y_st + c * y_sc, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + b * g_sb + t * g_st + c * g_sc, mask=mask, other=0.0)
    product = y * gate  # rounded to fp32 (no contraction: enable_fp_fusion=False)
    s = x + product
    out = out_ptr + rows.to(tl.int64)[:, None] * C + c
    if OUT_BF16:  # round to nearest even in integers, as c10::BFloat16 does (see BF16_ROUNDING)
        bits = s.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        bits = tl.where(s != s, 0x7FC0, bits)
        tl.store(out, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(out, s.to(out_ptr.dtype.element_ty), mask=mask)


_KERNEL = LazyKernel(_gated_residual)


def reference(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Exactly diffusers' op sequence (WanTransformerBlock.forward, both gated residuals)."""
    return (x.float() + y * gate).type_as(x)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`reference(x, y, gate)` in one pass; bit-equal on the interpreter (see module doc)."""
    name = "gated_residual"
    check_float(name, "x", x)
    check_float(name, "y", y)
    check_float(name, "gate", gate, (torch.float32,))
    if x.ndim != 3:
        raise ValueError(f"{name}: x must be (B, T, C), got shape {tuple(x.shape)}")
    if y.shape != x.shape:
        raise ValueError(f"{name}: y has shape {tuple(y.shape)}; expected x's shape {tuple(x.shape)}")
    gate = broadcast_rows(name, "gate", gate, x.shape)
    check_runtime(name, x, y, gate)
    b, t, c = x.shape
    out = torch.empty((b, t, c), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(b * t, BLOCK_R), triton.cdiv(c, BLOCK_C))
    _KERNEL[grid](
        x, y, gate, out, b * t, t, c, *x.stride(), *y.stride(), *gate.stride(),
        OUT_BF16=x.dtype == torch.bfloat16, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def cost(
    shape: tuple[int, int, int], dtype: torch.dtype = torch.bfloat16, y_dtype: torch.dtype | None = None
) -> tuple[int, int]:
    """(bytes_moved, flops) for x of `shape` (B, T, C) in `dtype`, y in `y_dtype` (default `dtype`) and a
    (B, 1, C) fp32 gate: reads x, y, gate, writes the output; two flops per element."""
    b, t, c = shape
    elements = b * t * c
    y_size = dtype_size(y_dtype or dtype)
    return elements * (2 * dtype_size(dtype) + y_size) + b * c * 4, 2 * elements
