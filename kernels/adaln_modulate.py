"""AdaLN modulation `(n * (1 + scale) + shift).to(out_dtype)` (contract: rounding).

This is the glue diffusers' Wan block runs after its fp32 LayerNorm:
`(self.norm1(x.float()) * (1 + scale) + shift).type_as(x)`. Torch runs it as four kernels, each rounding
to fp32: `1 + scale`, the product, the sum, then the cast (round to nearest even). This kernel keeps
those boundaries: the LayerNorm stays outside (its reduction order is torch's), and the product and the
sum are separate fp32 roundings, never one fused multiply-add.

FMA contraction: the launcher passes `enable_fp_fusion=False`, which makes Triton's NVIDIA/AMD backends
emit no contracted mul+add (and ptxas `--fmad=false`). The CPU interpreter runs numpy, which never
contracts, so the tests there prove the op sequence bit for bit; on a GPU the same claim is
**unverified until measured** (a GPU test compares against torch on the device).

BF16_ROUNDING: the fp32 -> bf16 cast is written out in integers (round to nearest even, as c10::BFloat16; NaN becomes
0x7FC0, NaN bit patterns are outside the contract) because the Triton CPU interpreter's `.to(tl.bfloat16)` truncates; on a GPU the
written-out form equals `cvt.rn.bf16.f32`, costs a few integer ops, and keeps one code path.

Shapes: `n` (B, T, C) float32, any strides; `scale`, `shift` float32 of shape (B, 1, C) (Wan2.1,
broadcast over tokens) or (B, T, C) (Wan2.2 TI2V per-token timesteps), any strides (Wan passes chunks
of its (B, 6, C) table, which are strided views). Output: contiguous (B, T, C) in `out_dtype`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._runtime import (
    FLOAT_DTYPES,
    LazyKernel,
    broadcast_rows,
    check_float,
    check_runtime,
    dtype_size,
)

BLOCK_R = 16
BLOCK_C = 128


def _modulate(
    n_ptr, scale_ptr, shift_ptr, out_ptr,
    R, T, C,
    n_sb, n_st, n_sc,
    sc_sb, sc_st, sc_sc,
    sh_sb, sh_st, sh_sc,
    OUT_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # flattened (b, t)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    b = (rows // T).to(tl.int64)[:, None]
    t = (rows % T).to(tl.int64)[:, None]
    c = cols.to(tl.int64)[None, :]
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    n = tl.load(n_ptr + b * n_sb + t * n_st + c * n_sc, mask=mask, other=0.0)
    scale = tl.load(scale_ptr + b * sc_sb + t * sc_st + c * sc_sc, mask=mask, other=0.0)
    shift = tl.load(shift_ptr + b * sh_sb + t * sh_st + c * sh_sc, mask=mask, other=0.0)
    one_plus = 1.0 + scale  # torch: `1 + scale`, its own fp32 rounding
    product = n * one_plus  # rounded to fp32 (no contraction: enable_fp_fusion=False)
    y = product + shift
    out = out_ptr + rows.to(tl.int64)[:, None] * C + c
    if OUT_BF16:  # round to nearest even in integers, as c10::BFloat16 does (see BF16_ROUNDING)
        bits = y.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        bits = tl.where(y != y, 0x7FC0, bits)
        tl.store(out, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


_KERNEL = LazyKernel(_modulate)


def reference(n: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Exactly diffusers' op sequence (WanTransformerBlock.forward, after `norm(x.float())`)."""
    return (n * (1 + scale) + shift).to(out_dtype)


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
    b, t, c = n.shape
    out = torch.empty((b, t, c), dtype=out_dtype, device=n.device)
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(b * t, BLOCK_R), triton.cdiv(c, BLOCK_C))
    _KERNEL[grid](
        n, scale, shift, out, b * t, t, c, *n.stride(), *scale.stride(), *shift.stride(),
        OUT_BF16=out_dtype == torch.bfloat16, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def cost(shape: tuple[int, int, int], dtype: torch.dtype = torch.bfloat16, per_token: bool = False) -> tuple[int, int]:
    """(bytes_moved, flops) for `n` of `shape` (B, T, C) and output `dtype`; scale/shift (B, 1, C) unless
    `per_token`. Reads n, scale, shift (fp32) and writes the output once; three flops per element."""
    b, t, c = shape
    table = b * (t if per_token else 1) * c
    elements = b * t * c
    return elements * 4 + 2 * table * 4 + elements * dtype_size(dtype), 3 * elements
