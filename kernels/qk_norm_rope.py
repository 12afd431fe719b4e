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
sum is its own rounding in that dtype (no fused multiply-add: `enable_fp_fusion=False`), then the store into `out`
casts to x's dtype. torch casts float64 -> bfloat16 through float32 (two roundings: `static_cast<float>`, then
c10::BFloat16's round to nearest even); the kernels do the same.

Two entry points, two contracts:

- `rope_only` (contract: rounding): the rotary step alone on a (B, T, H, D) view. Same op sequence as torch, so
  it is bit-equal to `rope_reference` on the CPU interpreter (numpy never contracts) and, with FP fusion off, on a
  GPU.
- `qk_norm_rope` (contract: reduction): RMSNorm then the rotary step. torch 2.13's RMSNorm computes
  `(x.float() * rsqrt(mean(x.float() ** 2) + eps) * weight.float()).to(x.dtype)` (one rounding at the end). The
  kernel keeps every op after the mean, but its sum of squares is a Triton tree reduction (one over each row's
  heads x channels tile) and `rsqrt` is `1 / sqrt_rn`, so the per-row scale can differ from torch's by an ulp or
  so. Bound (tested against a float64 ground truth of the whole chain): the kernel's max abs and relative L2
  error are each at most 2x torch's own error plus 1e-7 of the output scale.

bf16 rounding: c10::BFloat16's, written out in integers (`_rounding`, BF16_ROUNDING). NATIVE_BF16 (qk_norm_rope's row kernel when
compiled): `.to(tl.bfloat16, fp_downcast_rounding="rtne")`, PTX `cvt.rn.bf16(x2).f32`, also round to nearest even,
so the same bits for every non-NaN value (infinities, overflow and subnormals included); a NaN stays NaN with the
hardware's canonical payload.

Kernels, one launch each for every card (the result never depends on the launch, bit for bit, except through the
order of qk_norm_rope's RMS sum; the interpreter widens the row tile, `_runtime.pointwise_tile`):
- `_tiled_rope` (rope_only): a program owns ROPE_ROWS rows (b, t) and a group of ROPE_HEADS heads (ROPE_WARPS
  warps); row -> (b, t) is one int32 division per row, the head comes from the program and the loop.
  Each head's D channels are one contiguous [rows, D] tile (16-byte loads and stores), split into even and odd
  channels in registers (`tl.reshape` + `tl.split`) and joined back before the store; shared (.., 1, D) tables are
  loaded once per program for all its heads, and head groups vary fastest over the grid, so the programs of one
  row tile share those table rows in L2. int64 offsets.
- `_row_qk_norm_rope` (qk_norm_rope): a program holds NORM_ROWS rows whole as one [rows, H, D] tile (H and D
  padded to powers of two and masked; NORM_WARPS warps), reads x once, loads its (.., 1, D) table rows once for
  every head and reduces each row once; NATIVE_BF16 when compiled; int32 offsets when the farthest element the
  launch addresses (masked padding included) is below 2**31, else int64. A row of more than MAX_ROW_TILE padded
  elements is refused (ValueError): Wan's widest, 40 heads x 128, pads to 64 x 128 = 8192.

Shapes: `qk_norm_rope(x, weight, eps, freqs_cos, freqs_sin, heads)`: x (B, T, C) with C = heads * D, any
strides; weight (C,) in x's dtype. `rope_only(x, freqs_cos, freqs_sin)`: x (B, T, H, D), any strides.
freqs (1 or B, T, 1 or H, D), float32 or float64, any strides. x in bfloat16 or float32; D even.
Output: contiguous (B, T, H, D) in x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._rounding import bf16_round, store_bf16
from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size, interpreting, pointwise_tile

X_DTYPES = (torch.bfloat16, torch.float32)
FREQ_DTYPES = (torch.float32, torch.float64)
MAX_ROW_TILE = 16384  # the row kernel's padded heads x padded head dim per row (its registers hold the row)
ROPE_ROWS, ROPE_HEADS, ROPE_WARPS = 16, 4, 4  # rope_only: rows (b, t) x heads per program (compiled), warps
NORM_ROWS, NORM_WARPS = 1, 2  # qk_norm_rope: rows (b, t) per program (compiled), warps


def _tiled_rope(
    x_ptr, cos_ptr, sin_ptr, out_ptr,
    R, T, H, GROUPS,
    x_sb, x_st, x_sh, x_sd,
    c_sb, c_st, c_sh, c_sd,
    s_sb, s_st, s_sh, s_sd,
    D: tl.constexpr, BLOCK_D: tl.constexpr, HEADS: tl.constexpr, BLOCK_R: tl.constexpr,
    X_BF16: tl.constexpr, F64: tl.constexpr, HEAD_TABLES: tl.constexpr,
):  # fmt: skip
    """rope_only: program `pid` = row tile pid // GROUPS (BLOCK_R rows (b, t)) x heads [h0, h0 + HEADS) of group
    pid % GROUPS. One head of the tile is a [BLOCK_R, BLOCK_D] block of channels, read and written contiguously;
    the rotation works on its even/odd halves [BLOCK_R, BLOCK_D / 2]."""
    pid = tl.program_id(0)
    tile = pid // GROUPS  # head groups vary fastest: one row tile's programs share its table rows in L2
    h0 = (pid - tile * GROUPS) * HEADS
    rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) flattened (b, t), int32 (R < 2**31)
    b = rows // T  # one int32 division per row
    t = (rows - b * T).to(tl.int64)
    b = b.to(tl.int64)
    cols = tl.arange(0, BLOCK_D).to(tl.int64)  # (BLOCK_D,) channel in the head
    if BLOCK_D == D:
        mask = tl.broadcast_to((rows < R)[:, None], (BLOCK_R, BLOCK_D))
    else:
        mask = (rows < R)[:, None] & (cols < D)[None, :]
    x_at = x_ptr + (b * x_sb + t * x_st)[:, None] + (cols * x_sd)[None, :]  # [BLOCK_R, BLOCK_D], head 0
    cos_at = cos_ptr + (b * c_sb + t * c_st)[:, None] + (cols * c_sd)[None, :]
    sin_at = sin_ptr + (b * s_sb + t * s_st)[:, None] + (cols * s_sd)[None, :]
    out_at = out_ptr + (rows.to(tl.int64) * (H * D))[:, None] + cols[None, :]
    # per-head steps in int64 (tl.cast: a stride of 1 arrives as a constexpr when compiled)
    x_sh = tl.cast(x_sh, tl.int64)
    c_sh = tl.cast(c_sh, tl.int64)
    s_sh = tl.cast(s_sh, tl.int64)
    if not HEAD_TABLES:  # (.., 1, D) tables: one load for every head of the program; cos at 2j, sin at 2j + 1
        # cos, sin: each [BLOCK_R, BLOCK_D / 2]
        cos, _ = tl.split(tl.reshape(tl.load(cos_at, mask=mask, other=0.0), [BLOCK_R, BLOCK_D // 2, 2]))
        _, sin = tl.split(tl.reshape(tl.load(sin_at, mask=mask, other=0.0), [BLOCK_R, BLOCK_D // 2, 2]))
    for h in range(h0, tl.minimum(h0 + HEADS, H)):
        x = tl.load(x_at + h * x_sh, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_D]
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
        if X_BF16:
            store_bf16(out_at + h * D, y, mask)
        else:
            tl.store(out_at + h * D, y, mask=mask)


_TILED = LazyKernel(_tiled_rope, helpers=(store_bf16,))


def _row_qk_norm_rope(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    R, T, H, eps,
    x_sb, x_st, x_sh, x_sd,
    c_sb, c_st, c_sh, c_sd,
    s_sb, s_st, s_sh, s_sd,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
    X_BF16: tl.constexpr, F64: tl.constexpr, HEAD_TABLES: tl.constexpr, NATIVE_BF16: tl.constexpr,
    INDEX: tl.constexpr,
):  # fmt: skip
    """qk_norm_rope: program `pid` owns rows (b, t) [pid * BLOCK_R, + BLOCK_R), each held whole as
    [BLOCK_H, BLOCK_D] (heads x channels, both padded to powers of two and masked), so x is read from memory once
    and the row's sum of squares is one reduction; the rotary arithmetic per element is `_tiled_rope`'s."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) flattened (b, t), int32 (R < 2**31)
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
    # tl.reduce with tl.standard's own combine, not tl.sum: tl.sum is a JITFunction decorated when triton was
    # imported, which the interpreter cannot call if TRITON_INTERPRET was set later (LazyKernel)
    squares = tl.reduce(tl.reduce(x * x, 2, tl.standard._sum_combine), 1, tl.standard._sum_combine)
    ms = tl.math.div_rn(squares, tl.cast(H * D, tl.float32))
    r = tl.math.div_rn(1.0, tl.math.sqrt_rn((ms + eps).to(tl.float32)))[:, None, None]  # eps is fp64 under compile
    w_at = w_ptr + (heads * D)[:, None] + cols[None, :]
    w = tl.load(w_at, mask=channels, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_D]
    x = (x * r) * w[None, :, :]
    if X_BF16 and NATIVE_BF16:  # torch rounds RMSNorm's output to x's dtype
        x = x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    elif X_BF16:
        x = bf16_round(x)
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
    out_at = out_ptr + (rows.to(INDEX) * (H * D))[:, None, None] + ((heads * D)[:, None] + cols[None, :])[None, :, :]
    if X_BF16 and NATIVE_BF16:
        tl.store(out_at, y.to(tl.bfloat16, fp_downcast_rounding="rtne"), mask=mask)
    elif X_BF16:
        store_bf16(out_at, y, mask)
    else:
        tl.store(out_at, y, mask=mask)


_ROW = LazyKernel(_row_qk_norm_rope, helpers=(bf16_round, store_bf16))


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


def _launch_tiled(x4, cos, sin):
    b, t, h, d = x4.shape
    out = torch.empty((b, t, h, d), dtype=x4.dtype, device=x4.device)
    if out.numel() == 0:
        return out
    block_d = triton.next_power_of_2(d)
    block_r, _ = pointwise_tile(b * t, block_d, ROPE_ROWS, block_d)
    heads = min(ROPE_HEADS, h)
    groups = triton.cdiv(h, heads)
    _TILED[(triton.cdiv(b * t, block_r) * groups,)](
        x4, cos, sin, out, b * t, t, h, groups,
        *x4.stride(), *cos.stride(), *sin.stride(),
        D=d, BLOCK_D=block_d, HEADS=heads, BLOCK_R=block_r, X_BF16=x4.dtype == torch.bfloat16,
        F64=cos.dtype == torch.float64, HEAD_TABLES=cos.stride(2) != 0 or sin.stride(2) != 0,
        num_warps=ROPE_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def _launch_row(x4, weight, eps, cos, sin):
    b, t, h, d = x4.shape
    out = torch.empty((b, t, h, d), dtype=x4.dtype, device=x4.device)
    if out.numel() == 0:
        return out
    block_d = triton.next_power_of_2(d)
    block_h = triton.next_power_of_2(h)
    block_r, _ = pointwise_tile(b * t, block_h * block_d, NORM_ROWS, block_h * block_d)
    _ROW[(triton.cdiv(b * t, block_r),)](
        x4, weight, cos, sin, out, b * t, t, h, float(eps),
        *x4.stride(), *cos.stride(), *sin.stride(),
        D=d, BLOCK_D=block_d, BLOCK_H=block_h, BLOCK_R=block_r, X_BF16=x4.dtype == torch.bfloat16,
        F64=cos.dtype == torch.float64, HEAD_TABLES=cos.stride(2) != 0 or sin.stride(2) != 0,
        NATIVE_BF16=not interpreting(), INDEX=_index((x4, cos, sin, out), block_r, block_h, block_d),
        num_warps=NORM_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def _index(tensors, block_r: int, heads: int, block_d: int) -> tl.dtype:
    """The row kernel's offset dtype: int32 only where the farthest element of every (B, T, H, D) operand the
    launch addresses, masked padding included (rows up to a whole last tile, so b one past the batch; `heads` and
    `block_d` as the kernel pads them), stays below 2**31."""
    rows = triton.cdiv(tensors[0].shape[0] * tensors[0].shape[1], block_r) * block_r
    for tensor in tensors:
        t = tensor.shape[1]
        extents = (triton.cdiv(rows, t), t, heads, block_d)
        if sum((n - 1) * s for n, s in zip(extents, tensor.stride(), strict=True)) >= 2**31:  # strides are >= 0
            return tl.int64
    return tl.int32


def rope_only(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """`rope_reference(x, freqs_cos, freqs_sin)` in one pass; bit-equal (contract: rounding, module doc)."""
    name = "rope_only"
    check_float(name, "x", x, X_DTYPES)
    if x.ndim != 4:
        raise ValueError(f"{name}: x must be (B, T, H, D), got shape {tuple(x.shape)}")
    b, t, h, d = x.shape
    if d % 2:
        raise ValueError(f"{name}: head dim D must be even, got {d}")
    cos, sin = _check_freqs(name, tuple(x.shape), freqs_cos, freqs_sin)
    check_runtime(name, x, cos, sin)
    return _launch_tiled(x, cos, sin)


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    freqs_cos: torch.Tensor,
    freqs_sin: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """`reference(...)` in one pass (contract: reduction; the RMS sum's order differs, see module doc). x (B, T, C)
    with heads and head dim C / heads, each padded to a power of two, spanning at most MAX_ROW_TILE elements;
    ValueError otherwise."""
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
    if (problem := row_tile_problem(heads, d)) is not None:
        raise ValueError(f"{name}: x has {problem}")
    cos, sin = _check_freqs(name, (b, t, heads, d), freqs_cos, freqs_sin)
    check_runtime(name, x, weight, cos, sin)
    return _launch_row(x.unflatten(2, (heads, d)), weight.contiguous(), eps, cos, sin)


def row_tile_problem(heads: int, d: int) -> str | None:
    """Why a row of `heads` heads of `d` channels does not fit the row kernel (heads and head dim each padded to a
    power of two, at most MAX_ROW_TILE elements), or None."""
    padded_h, padded_d = triton.next_power_of_2(heads), triton.next_power_of_2(d)
    if padded_h * padded_d <= MAX_ROW_TILE:
        return None
    return (
        f"{heads} heads of {d} channels, padded to powers of two {padded_h} x {padded_d} = {padded_h * padded_d} "
        f"elements per row; allowed: at most {MAX_ROW_TILE} (MAX_ROW_TILE)"
    )


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
