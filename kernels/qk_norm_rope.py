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
  `enable_fp_fusion=False` and the equality is **unverified until measured**.
- `qk_norm_rope` (contract: reduction): RMSNorm then the rotary step. torch 2.13's RMSNorm computes
  `(x.float() * rsqrt(mean(x.float() ** 2) + eps) * weight.float()).to(x.dtype)` (one rounding at the end;
  checked on CPU for bf16 and fp32). The kernel keeps every op after the mean, but its sum of squares is a
  Triton tree reduction (evens and odds summed separately) and `rsqrt` is `1 / sqrt_rn`, so the per-row
  scale can differ from torch's by an ulp or so. Bound (tested, vs a float64 ground truth of the whole
  chain): the kernel's max abs and relative L2 error are each at most 2x torch's own error plus 1e-7 of
  the output scale. See tests/kernels/test_qk_norm_rope.py.

BF16_ROUNDING: fp32 -> bf16 is written out in integers (round to nearest even, as c10::BFloat16; NaN becomes
0x7FC0) because the CPU interpreter's `.to(tl.bfloat16)` truncates.

Shapes: `qk_norm_rope(x, weight, eps, freqs_cos, freqs_sin, heads)`: x (B, T, C) with C = heads * D, any
strides; weight (C,) in x's dtype. `rope_only(x, freqs_cos, freqs_sin)`: x (B, T, H, D), any strides.
freqs (1 or B, T, 1 or H, D), float32 or float64, any strides. x in bfloat16 or float32; D even.
Output: contiguous (B, T, H, D) in x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size, pointwise_tile

X_DTYPES = (torch.bfloat16, torch.float32)
FREQ_DTYPES = (torch.float32, torch.float64)
BLOCK_R = 16  # rope_only: rows (b, t) per program
BLOCK_P = 64  # rope_only: (even, odd) pairs per program
MAX_FUSED_PAIRS = 8192  # qk_norm_rope holds one whole row (C / 2 pairs) per program


def _qk_norm_rope(
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
        r = tl.math.div_rn(1.0, tl.math.sqrt_rn(ms + eps))[:, None]
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


_KERNEL = LazyKernel(_qk_norm_rope)


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


def _launch(x4, weight, eps, cos, sin, norm):
    b, t, h, d = x4.shape
    c = h * d
    out = torch.empty((b, t, h, d), dtype=x4.dtype, device=x4.device)
    if out.numel() == 0:
        return out
    if norm:
        block_p = triton.next_power_of_2(c // 2)
        block_r = max(1, min(16, 1024 // block_p))
        grid = (triton.cdiv(b * t, block_r), 1)
    else:
        block_r, block_p = pointwise_tile(b * t, c // 2, BLOCK_R, BLOCK_P)
        grid = (triton.cdiv(b * t, block_r), triton.cdiv(c // 2, block_p))
    _KERNEL[grid](
        x4, weight if norm else x4, cos, sin, out, b * t, t, c, d // 2, float(eps),
        *x4.stride(), *cos.stride(), *sin.stride(),
        NORM=norm, X_BF16=x4.dtype == torch.bfloat16, F64=cos.dtype == torch.float64,
        BLOCK_R=block_r, BLOCK_P=block_p, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def rope_only(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """`rope_reference(x, freqs_cos, freqs_sin)` in one pass; bit-equal on the interpreter (module doc)."""
    name = "rope_only"
    check_float(name, "x", x, X_DTYPES)
    if x.ndim != 4:
        raise ValueError(f"{name}: x must be (B, T, H, D), got shape {tuple(x.shape)}")
    b, t, h, d = x.shape
    if d % 2:
        raise ValueError(f"{name}: head dim D must be even, got {d}")
    cos, sin = _check_freqs(name, tuple(x.shape), freqs_cos, freqs_sin)
    check_runtime(name, x, cos, sin)
    return _launch(x, None, 0.0, cos, sin, norm=False)


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    freqs_cos: torch.Tensor,
    freqs_sin: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """`reference(...)` in one pass (contract: reduction; the RMS sum's order differs, see module doc)."""
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
    if c // 2 > MAX_FUSED_PAIRS:
        raise ValueError(f"{name}: C={c} is wider than this kernel holds in one program ({2 * MAX_FUSED_PAIRS})")
    d = c // heads
    cos, sin = _check_freqs(name, (b, t, heads, d), freqs_cos, freqs_sin)
    check_runtime(name, x, weight, cos, sin)
    return _launch(x.unflatten(2, (heads, d)), weight.contiguous(), eps, cos, sin, norm=True)


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
