"""Gated residual `(x.float() + y * gate).to(x.dtype)` (contract: rounding).

diffusers' Wan block closes its self-attention and FFN branches with
`(hidden_states.float() + attn_output * gate).type_as(hidden_states)` (the FFN writes
`ff_output.float() * gate`, the same value: bf16/fp16 -> fp32 is exact). `gate` is a float32 chunk of
`scale_shift_table + temb.float()`, so torch promotes `y * gate` to fp32 whatever `y`'s dtype. Torch's
rounding boundaries, kept here: the product rounded to fp32, the sum rounded to fp32, then the cast to
`x.dtype` (round to nearest even).

FMA contraction: `x + y * gate` is the textbook contraction; the launcher passes
`enable_fp_fusion=False` so Triton's GPU backends emit a separate mul and add. The CPU interpreter
(numpy) never contracts: the tests there prove the op sequence bit for bit; on a GPU the kernel benchmark
compares the output with torch's on the device (`torch.equal`).

bf16 results are rounded as c10::BFloat16 rounds (`_rounding`, BF16_ROUNDING).

Shapes: `x` (B, T, C) in fp32/bf16/fp16; `y` (B, T, C) in any of those; `gate` float32 (B, 1, C) or
(B, T, C). Any strides. Output: contiguous (B, T, C) in `x.dtype`.

Second entry point, `gated_residual_in_dtype(x, y, gate, index=None)`: `x + y * gate` when all three share one
dtype and nothing is upcast (LTX-2: `h + attn * gate`, MiniMax-H3: `residual + gate * attn_output`; IEEE
products commute bit for bit). torch rounds the product to that dtype, then the sum, so the kernel rounds the
product to bf16/fp16 before adding (a no-op for fp32). `index` (T,) integer, optional: each token reads row
`index[t]` of an (R, C) `gate` table, i.e. `gate.index_select(0, index)` unmaterialised (MiniMax-H3); values are
not range-checked here (the caller keeps them in [0, R)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._rounding import round_to, store_bf16
from workbench.kernels._runtime import (
    ROUNDING,
    LazyKernel,
    broadcast_rows,
    check_float,
    check_index,
    check_runtime,
    dtype_size,
    pointwise_tile,
    table_rows,
)

# One program's tile on a GPU: TILE_ROWS flattened (b, t) rows x TILE_COLS channels. Each element is computed on its
# own, so the result never depends on the tile; the interpreter widens it (`pointwise_tile`).
TILE_ROWS, TILE_COLS = 16, 128


def _gated_residual(
    x_ptr, y_ptr, gate_ptr, index_ptr, out_ptr,
    R, T, C,
    x_sb, x_st, x_sc,
    y_sb, y_st, y_sc,
    g_sb, g_st, g_sc,
    ROUND: tl.constexpr, HAS_INDEX: tl.constexpr,
    OUT_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # ROUND: 0 = fp32 product (Wan); 1 / 2 = the product rounded to bf16 / fp16 first (in-dtype)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) flattened (b, t)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # (BLOCK_C,) channels
    b = (rows // T).to(tl.int64)[:, None]
    t = (rows % T).to(tl.int64)[:, None]
    c = cols.to(tl.int64)[None, :]
    mask = (rows < R)[:, None] & (cols < C)[None, :]  # (BLOCK_R, BLOCK_C)
    if HAS_INDEX:  # the gate-table row this token reads: (BLOCK_R, 1)
        t_table = tl.load(index_ptr + rows % T, mask=rows < R, other=0).to(tl.int64)[:, None]
    else:
        t_table = t
    # x, y, gate: each (BLOCK_R, BLOCK_C)
    x = tl.load(x_ptr + b * x_sb + t * x_st + c * x_sc, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + b * y_sb + t * y_st + c * y_sc, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + b * g_sb + t_table * g_st + c * g_sc, mask=mask, other=0.0).to(tl.float32)
    product = round_to(y * gate, ROUND)  # (no contraction: enable_fp_fusion=False)
    s = x + product
    out = out_ptr + rows.to(tl.int64)[:, None] * C + c
    if OUT_BF16:
        store_bf16(out, s, mask)
    else:
        tl.store(out, s.to(out_ptr.dtype.element_ty), mask=mask)


_KERNEL = LazyKernel(_gated_residual, helpers=(round_to, store_bf16))


def reference(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Exactly diffusers' op sequence (WanTransformerBlock.forward, both gated residuals)."""
    return (x.float() + y * gate).type_as(x)


def reference_in_dtype(
    x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, index: torch.Tensor | None = None
) -> torch.Tensor:
    """Exactly diffusers' op sequence on same-dtype tensors (LTX2VideoTransformerBlock, MiniMaxH3TransformerBlock)."""
    if index is not None:
        gate = gate.index_select(0, index)
    return x + y * gate


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`reference(x, y, gate)` in one pass; bit-equal on the interpreter (see module doc)."""
    name = "gated_residual"
    check_float(name, "x", x)
    check_float(name, "y", y)
    check_float(name, "gate", gate, (torch.float32,))
    _check_xy(name, x, y)
    gate = broadcast_rows(name, "gate", gate, x.shape)
    check_runtime(name, x, y, gate)
    return _launch(x, y, gate, None, 0)


def gated_residual_in_dtype(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """`reference_in_dtype(x, y, gate, index)` in one pass; bit-equal on the interpreter (see module doc).

    x, y (B, T, C); without `index`, gate (B, 1, C) or (B, T, C); with `index` (T,), gate (R, C). All three in one
    of float32/bfloat16/float16. Output: contiguous (B, T, C) in that dtype."""
    name = "gated_residual_in_dtype"
    check_float(name, "x", x)
    check_float(name, "y", y, (x.dtype,))
    check_float(name, "gate", gate, (x.dtype,))
    _check_xy(name, x, y)
    if index is None:
        gate = broadcast_rows(name, "gate", gate, x.shape)
        check_runtime(name, x, y, gate)
    else:
        gate = table_rows(name, "gate", gate, x.shape)
        index = check_index(name, index, x.shape[1])
        check_runtime(name, x, y, gate, index)
    return _launch(x, y, gate, index, ROUNDING[x.dtype])


def _check_xy(name: str, x: torch.Tensor, y: torch.Tensor) -> None:
    if x.ndim != 3:
        raise ValueError(f"{name}: x must be (B, T, C), got shape {tuple(x.shape)}")
    if y.shape != x.shape:
        raise ValueError(f"{name}: y has shape {tuple(y.shape)}; expected x's shape {tuple(x.shape)}")


def _launch(x, y, gate, index, rounding):
    b, t, c = x.shape
    out = torch.empty((b, t, c), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    block_r, block_c = pointwise_tile(b * t, c, TILE_ROWS, TILE_COLS)
    grid = (triton.cdiv(b * t, block_r), triton.cdiv(c, block_c))
    _KERNEL[grid](
        x, y, gate, x if index is None else index, out, b * t, t, c, *x.stride(), *y.stride(), *gate.stride(),
        ROUND=rounding, HAS_INDEX=index is not None,
        OUT_BF16=x.dtype == torch.bfloat16, BLOCK_R=block_r, BLOCK_C=block_c, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def cost(
    shape: tuple[int, int, int],
    dtype: torch.dtype = torch.bfloat16,
    y_dtype: torch.dtype | None = None,
    gate_dtype: torch.dtype = torch.float32,
) -> tuple[int, int]:
    """(bytes_moved, flops) for x of `shape` (B, T, C) in `dtype`, y in `y_dtype` (default `dtype`) and a
    (B, 1, C) gate in `gate_dtype` (fp32 for Wan; `dtype` for the in-dtype form): reads x, y, gate, writes the
    output; two flops per element."""
    b, t, c = shape
    elements = b * t * c
    y_size = dtype_size(y_dtype or dtype)
    return elements * (2 * dtype_size(dtype) + y_size) + b * c * dtype_size(gate_dtype), 2 * elements
