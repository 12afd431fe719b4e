"""fp32 LayerNorm of a bf16/fp32 row, optionally after a residual add and followed by an affine and/or AdaLN
modulation, in one pass (contract: reduction).

diffusers' Wan block (0.42.x) normalises its residual stream three times per block, each time as a chain of
torch kernels around `FP32LayerNorm` (which upcasts input, weight and bias to fp32 and casts back):

    norm1/norm3: (F.layer_norm(x.float(), (C,), None, None, eps) * (1 + scale) + shift).type_as(x)
    norm2:        F.layer_norm(x.float(), (C,), weight.float(), bias.float(), eps).type_as(x)
    before norm3: x = x + attn2_output                  # in x's dtype: fp32 add, then rounded to x's dtype

`layernorm_modulate(x, eps, ...)` is one such chain; `add_layernorm_modulate(x, residual, eps, ...)` first forms
`x + residual` exactly as torch does (fp32 add, round to nearest even to x's dtype), writes that sum (the block's
new residual stream) and normalises it. One program owns ROWS rows (b, t) and the whole row of C channels
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
- Bound (tested on the interpreter): against a float64 ground truth of the chain, the kernel's max-abs and
  relative-L2 errors are each at most 2x those of torch's own op sequence (`reference`) in the working dtype, plus
  2 fp32 ulps (2 * 2^-23) of the output scale (max-abs) or 2 fp32 ulps (relative L2); the floor matters only for
  fp32 rows so short that torch's own error is zero by luck. The residual sum is torch.equal to `x + r`.

Launch: ROWS rows per program and NUM_WARPS warps, one launch for every card. Each row is reduced on its own, so
the rows per program never mix rows. On a GPU the shape of the fp32 reduction tree follows the register layout Triton
picks for the tile (elements per thread, threads and warps along C), so another ROWS or NUM_WARPS can move a row
statistic by an ulp: the kernel is held to the float64 bound above, not to one launch's bits.

bf16 rounding: under the interpreter fp32 -> bf16 is written out in integers (`_rounding`, BF16_ROUNDING). Compiled,
the kernel uses `.to(tl.bfloat16)` (`cvt.rn.bf16.f32`): the same value for every non-NaN input, in one instruction
instead of six (a NaN's payload may differ). Offsets are int32 unless some tensor reaches 2^31 elements (`IDX64`).
Broadcast scale/shift of a one-batch call (stride 0 over tokens) are loaded once per program as (C,) vectors
(`MOD_VEC`), not per element: the same values.

Shapes: x (B, T, C) in float32/bfloat16/float16, any strides; residual the same shape and dtype, any strides;
weight, bias (C,) any float dtype (upcast to fp32, as FP32LayerNorm does); scale, shift float32 (B, 1, C) or
(B, T, C), any strides (Wan passes chunks of its (B, 6, C) table). Output: contiguous (B, T, C) in `out_dtype`
(default x's dtype); the sum: contiguous (B, T, C) in x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from workbench.kernels._rounding import bf16_round, store_bf16
from workbench.kernels._runtime import (
    FLOAT_DTYPES,
    ROUNDING,
    LazyKernel,
    broadcast_rows,
    check_float,
    check_runtime,
    dtype_size,
    interpreting,
)

MAX_C = 16384  # one row of fp32 values per program, in registers
ROWS = 2  # rows (b, t) per program (at most the rows there are)
NUM_WARPS = 2  # warps per program


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
    MOD_VEC: tl.constexpr, NATIVE_BF16: tl.constexpr, IDX64: tl.constexpr,
):  # fmt: skip
    # SUM_ROUND / OUT_ROUND: what the residual sum / the output is rounded to (0: fp32, 1: bf16, 2: fp16).
    # NATIVE_BF16: compiled, `.to(tl.bfloat16)` is cvt.rn (BF16_ROUNDING's result for every non-NaN value).
    # IDX64: some offset needs int64; otherwise the address arithmetic stays int32 (half the integer work).
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) flattened (b, t), int32
    cols = tl.arange(0, BLOCK_C)  # (BLOCK_C,) the whole row
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
    mask = (rows < R)[:, None] & col_ok  # (BLOCK_R, BLOCK_C)
    x = tl.load(x_ptr + b * x_sb + t * x_st + c * x_sc, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_R, BLOCK_C)
    if HAS_RESIDUAL:  # torch's `x + r` in x's dtype: one fp32 add, then rounded to that dtype
        x = x + tl.load(r_ptr + b * r_sb + t * r_st + c * r_sc, mask=mask, other=0.0).to(tl.float32)
        at = sum_ptr + rows[:, None] * C + c
        if SUM_ROUND == 1 and NATIVE_BF16:  # x keeps the rounded value for the norm
            rounded = x.to(tl.bfloat16)
            x = rounded.to(tl.float32)
            tl.store(at, rounded, mask=mask)
        elif SUM_ROUND == 1:
            x = bf16_round(x)
            store_bf16(at, x, mask)
        elif SUM_ROUND == 2:
            x = x.to(tl.float16).to(tl.float32)
            tl.store(at, x.to(tl.float16), mask=mask)
        else:
            tl.store(at, x, mask=mask)
    # row statistics (not torch's order, see the module doc). tl.reduce with tl.standard's combine, not tl.sum:
    # tl.sum is decorated at triton import, which the interpreter cannot call if TRITON_INTERPRET came later
    width = tl.cast(C, tl.float32)
    mean = tl.math.div_rn(tl.reduce(x, 1, tl.standard._sum_combine), width)[:, None]  # (BLOCK_R, 1)
    # the rounding error of the sum above (a few ulps of a large mean) is the mean of d = x - mean, summed over
    # small values; without that correction a row with a large offset would shift every output by the error
    d = tl.where(col_ok, x - mean, 0.0)
    mean = mean + tl.math.div_rn(tl.reduce(d, 1, tl.standard._sum_combine), width)[:, None]
    centred = tl.where(col_ok, x - mean, 0.0)
    var = tl.math.div_rn(tl.reduce(centred * centred, 1, tl.standard._sum_combine), width)
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn((var + eps).to(tl.float32)))[:, None]  # eps is fp64 under compile
    y = centred * rstd  # from here every op is its own fp32 rounding (enable_fp_fusion=False)
    if HAS_WEIGHT:  # weight, bias: (1, BLOCK_C)
        y = y * tl.load(w_ptr + cols * w_s, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + cols * bias_s, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    if HAS_MOD and MOD_VEC:  # one batch, rows broadcast over tokens: the (C,) vectors once, (1, BLOCK_C)
        scale = tl.load(scale_ptr + cols * sc_sc, mask=cols < C, other=0.0).to(tl.float32)[None, :]
        shift = tl.load(shift_ptr + cols * sh_sc, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    elif HAS_MOD:  # (BLOCK_R, BLOCK_C)
        scale = tl.load(scale_ptr + b * sc_sb + t * sc_st + c * sc_sc, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + b * sh_sb + t * sh_st + c * sh_sc, mask=mask, other=0.0).to(tl.float32)
    if HAS_MOD:
        one_plus = 1.0 + scale
        y = y * one_plus
        y = y + shift
    out = out_ptr + rows[:, None] * C + c
    if OUT_ROUND == 1 and NATIVE_BF16:
        tl.store(out, y.to(tl.bfloat16), mask=mask)
    elif OUT_ROUND == 1:
        store_bf16(out, y, mask)
    else:
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


_KERNEL = LazyKernel(_layernorm_modulate, helpers=(bf16_round, store_bf16))


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
) -> torch.Tensor:
    """`reference(x, eps, weight, bias, scale, shift, out_dtype)` in one pass (contract: reduction, module doc)."""
    name = "layernorm_modulate"
    args = _check(name, x, None, eps, weight, bias, scale, shift, out_dtype)
    return _launch(x, None, *args)[0]


def add_layernorm_modulate(
    x: torch.Tensor,
    residual: torch.Tensor,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`add_reference(x, residual, eps, ...)` in one pass: (the sum, bit-equal to `x + residual`; its normed
    output, contract reduction)."""
    name = "add_layernorm_modulate"
    args = _check(name, x, residual, eps, weight, bias, scale, shift, out_dtype)
    out, summed = _launch(x, residual, *args)
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


def _launch(x, residual, eps, weight, bias, scale, shift, out_dtype):
    b, t, c = x.shape
    out = torch.empty((b, t, c), dtype=out_dtype, device=x.device)
    summed = torch.empty((b, t, c), dtype=x.dtype, device=x.device) if residual is not None else None
    if out.numel() == 0:
        return out, summed
    block_c = triton.next_power_of_2(max(c, 1))
    block_r = min(ROWS, triton.next_power_of_2(b * t))
    r = x if residual is None else residual
    w = x if weight is None else weight
    bb = x if bias is None else bias
    sc = x if scale is None else scale
    sh = x if shift is None else shift
    mod_vec = scale is not None and b == 1 and sc.stride(1) == 0 and sh.stride(1) == 0
    idx64 = max(_last_offset(v) for v in (x, r, w, bb, sc, sh, out)) + block_r * c >= 2**31
    _KERNEL[(triton.cdiv(b * t, block_r),)](
        x, r, w, bb, sc, sh, out, out if summed is None else summed,
        b * t, t, c, eps,
        *x.stride(), *r.stride(), w.stride(-1), bb.stride(-1), *sc.stride(), *sh.stride(),
        HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
        HAS_MOD=scale is not None, SUM_ROUND=ROUNDING[x.dtype], OUT_ROUND=ROUNDING[out_dtype],
        BLOCK_R=block_r, BLOCK_C=block_c, MOD_VEC=mod_vec, NATIVE_BF16=not interpreting(),
        IDX64=idx64, num_warps=NUM_WARPS, enable_fp_fusion=False,
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
