"""AdaLN modulation `(n * (1 + scale) + shift).to(out_dtype)` (contract: rounding).

This is the glue diffusers' Wan block runs after its fp32 LayerNorm:
`(self.norm1(x.float()) * (1 + scale) + shift).type_as(x)`. Torch runs it as four kernels, each rounding
to fp32: `1 + scale`, the product, the sum, then the cast (round to nearest even). This kernel keeps
those boundaries: the LayerNorm stays outside (its reduction order is torch's), and the product and the
sum are separate fp32 roundings, never one fused multiply-add.

FMA contraction: the launcher passes `enable_fp_fusion=False`, which makes Triton's NVIDIA/AMD backends
emit no contracted mul+add (and ptxas `--fmad=false`). The CPU interpreter runs numpy, which never
contracts, so the tests there prove the op sequence bit for bit; on a GPU the kernel benchmark compares the
output with torch's on the device (`torch.equal`).

bf16 results are rounded as c10::BFloat16 rounds (`_rounding`, BF16_ROUNDING).

Shapes: `n` (B, T, C) float32, any strides; `scale`, `shift` float32 of shape (B, 1, C) (Wan2.1,
broadcast over tokens) or (B, T, C) (Wan2.2 TI2V per-token timesteps), any strides (Wan passes chunks
of its (B, 6, C) table, which are strided views). Output: contiguous (B, T, C) in `out_dtype`.

Second entry point, `adaln_modulate_in_dtype(n, scale, shift, index=None)`: the same expression when all three
operands share one dtype and nothing is upcast first (LTX-2 and MiniMax-H3 write `norm(x) * (1 + scale) + shift`
on bf16 tensors). torch then rounds each of the three ops to that dtype (it computes each in fp32 and casts the
result back), so the kernel does the same: `1 + scale`, the product and the sum are each rounded to bf16/fp16 in
turn (a no-op for fp32, where this is the op sequence above). `index` (T,) integer, optional: the row of a
(R, C) `scale`/`shift` table each token reads, i.e. `scale.index_select(0, index)` without materialising it
(MiniMax-H3 addresses its (timestep, modality) table per row of the packed sequence; the table is shared by the
batch). Index values are not range-checked here (that needs a device sync); the caller must pass indices in
[0, R), as torch's `index_select` would demand.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._rounding import round_to, store_bf16
from workbench.kernels._runtime import (
    FLOAT_DTYPES,
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


def _modulate(
    n_ptr, scale_ptr, shift_ptr, index_ptr, out_ptr,
    R, T, C,
    n_sb, n_st, n_sc,
    sc_sb, sc_st, sc_sc,
    sh_sb, sh_st, sh_sc,
    ROUND: tl.constexpr, HAS_INDEX: tl.constexpr,
    OUT_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # ROUND: 0 = fp32 arithmetic, one cast at the end (Wan); 1 / 2 = every op rounded to bf16 / fp16 (in-dtype)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) flattened (b, t)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # (BLOCK_C,) channels
    b = (rows // T).to(tl.int64)[:, None]
    t = (rows % T).to(tl.int64)[:, None]
    c = cols.to(tl.int64)[None, :]
    mask = (rows < R)[:, None] & (cols < C)[None, :]  # (BLOCK_R, BLOCK_C)
    if HAS_INDEX:  # the table row this token reads, (BLOCK_R, 1) (scale/shift are (B, rows of the table, C) views)
        t_table = tl.load(index_ptr + rows % T, mask=rows < R, other=0).to(tl.int64)[:, None]
    else:
        t_table = t
    # n, scale, shift: each (BLOCK_R, BLOCK_C)
    n = tl.load(n_ptr + b * n_sb + t * n_st + c * n_sc, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + b * sc_sb + t_table * sc_st + c * sc_sc, mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(shift_ptr + b * sh_sb + t_table * sh_st + c * sh_sc, mask=mask, other=0.0).to(tl.float32)
    one_plus = round_to(1.0 + scale, ROUND)  # torch: `1 + scale`, its own rounding
    product = round_to(n * one_plus, ROUND)  # (no contraction: enable_fp_fusion=False)
    y = product + shift
    out = out_ptr + rows.to(tl.int64)[:, None] * C + c
    if OUT_BF16:
        store_bf16(out, y, mask)
    else:
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


_KERNEL = LazyKernel(_modulate, helpers=(round_to, store_bf16))


def reference(n: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Exactly diffusers' op sequence (WanTransformerBlock.forward, after `norm(x.float())`)."""
    return (n * (1 + scale) + shift).to(out_dtype)


def reference_in_dtype(
    n: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, index: torch.Tensor | None = None
) -> torch.Tensor:
    """Exactly diffusers' op sequence on same-dtype tensors (LTX2VideoTransformerBlock, MiniMaxH3TransformerBlock)."""
    if index is not None:
        scale, shift = scale.index_select(0, index), shift.index_select(0, index)
    return n * (1 + scale) + shift


def adaln_modulate(n: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """`reference(n, scale, shift, out_dtype)` in one pass; bit-equal on the interpreter (see module doc)."""
    name = "adaln_modulate"
    for arg, tensor in (("n", n), ("scale", scale), ("shift", shift)):
        check_float(name, arg, tensor, (torch.float32,))
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: out_dtype {out_dtype}; allowed: {[str(d) for d in FLOAT_DTYPES]}")
    if n.ndim != 3:
        raise ValueError(f"{name}: n must be (B, T, C), got shape {tuple(n.shape)}")
    scale = broadcast_rows(name, "scale", scale, n.shape)
    shift = broadcast_rows(name, "shift", shift, n.shape)
    check_runtime(name, n, scale, shift)
    return _launch(n, scale, shift, None, out_dtype, 0)


def adaln_modulate_in_dtype(
    n: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """`reference_in_dtype(n, scale, shift, index)` in one pass; bit-equal on the interpreter (see module doc).

    n (B, T, C); without `index`, scale/shift (B, 1, C) or (B, T, C); with `index` (T,), scale/shift (R, C).
    All three in one of float32/bfloat16/float16. Output: contiguous (B, T, C) in that dtype."""
    name = "adaln_modulate_in_dtype"
    check_float(name, "n", n)
    for arg, tensor in (("scale", scale), ("shift", shift)):
        check_float(name, arg, tensor, (n.dtype,))
    if n.ndim != 3:
        raise ValueError(f"{name}: n must be (B, T, C), got shape {tuple(n.shape)}")
    if index is None:
        scale = broadcast_rows(name, "scale", scale, n.shape)
        shift = broadcast_rows(name, "shift", shift, n.shape)
        check_runtime(name, n, scale, shift)
    else:
        scale = table_rows(name, "scale", scale, n.shape)
        shift = table_rows(name, "shift", shift, n.shape)
        index = check_index(name, index, n.shape[1])
        check_runtime(name, n, scale, shift, index)
    return _launch(n, scale, shift, index, n.dtype, ROUNDING[n.dtype])


def _launch(n, scale, shift, index, out_dtype, rounding):
    b, t, c = n.shape
    out = torch.empty((b, t, c), dtype=out_dtype, device=n.device)
    if out.numel() == 0:
        return out
    block_r, block_c = pointwise_tile(b * t, c, TILE_ROWS, TILE_COLS)
    grid = (triton.cdiv(b * t, block_r), triton.cdiv(c, block_c))
    _KERNEL[grid](
        n, scale, shift, n if index is None else index, out, b * t, t, c,
        *n.stride(), *scale.stride(), *shift.stride(),
        ROUND=rounding, HAS_INDEX=index is not None,
        OUT_BF16=out_dtype == torch.bfloat16, BLOCK_R=block_r, BLOCK_C=block_c, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def cost(
    shape: tuple[int, int, int], dtype: torch.dtype = torch.bfloat16, per_token: bool = False, in_dtype: bool = False
) -> tuple[int, int]:
    """(bytes_moved, flops) for `n` of `shape` (B, T, C) and output `dtype`; scale/shift (B, 1, C) unless
    `per_token`. Reads n, scale, shift (fp32, or `dtype` with `in_dtype`) and writes the output once; three flops
    per element (the in-dtype roundings are a few integer ops, not counted)."""
    b, t, c = shape
    table = b * (t if per_token else 1) * c
    elements = b * t * c
    operand = dtype_size(dtype) if in_dtype else 4
    return elements * operand + 2 * table * operand + elements * dtype_size(dtype), 3 * elements
