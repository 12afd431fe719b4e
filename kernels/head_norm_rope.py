"""MiniMax-H3's q/k step in one pass: RMSNorm over each head's channels, then the rotate-half rotary on the
leading channels (contract: reduction).

diffusers' `MiniMaxH3AttnProcessor` (0.42.x) runs, for the query and the key:

    x = attn.norm_q(x.unflatten(-1, (heads, -1)))   # torch.nn.RMSNorm(head_dim), weight (head_dim,) in x's dtype
    r = cos.shape[-1]                                # rotated channels per head (96 at the default config)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)      # (T, r) float32 tables from the model's `rope`
    x1, x2 = x[..., :r].chunk(2, -1)
    out = cat(x[..., :r] * cos + cat(-x2, x1) * sin, x[..., r:]).contiguous()

Torch runs that as two RMSNorm launches, the concatenation copies and a handful of pointwise passes over q
and k; the kernel reads q (or k) once and writes it once.

Rounding, kept from torch: RMSNorm computes in fp32, `x * rsqrt(mean(x**2) + eps) * weight`, and rounds once to
x's dtype; the rotary runs in x's dtype, each product and the sum rounded on its own (no fused multiply-add:
`enable_fp_fusion=False`; a product of two bf16 values is exact in fp32, so one rounding of it is torch's bf16
product). The tables are rounded to x's dtype in the kernel, as torch rounds them before the products.
Why `reduction`, not `rounding`: the sum of squares is a Triton tree reduction and `rsqrt` is `1 / sqrt_rn`, so a
row's scale can differ from torch's by an ulp; the rest of the chain is torch's op for op. Bound (tested): against a
float64 run of the chain, max-abs and relative-L2 errors at most 2x torch's own (+1e-7 of the output scale).

The rotation needs, for channel c < r, its partner c + r/2 (negated) or c - r/2. r/2 is 48 at the default config,
not a power of two, so the partner is loaded again (a second read of the same head row, from L1/L2) and normed with
the row's scale, instead of being shuffled in registers.

BF16 rounding is c10::BFloat16's (`_rounding`, BF16_ROUNDING).

Launch: ROWS head rows per program and NUM_WARPS warps on a GPU (INTERPRET_ROWS rows under the interpreter), one
launch for every card; the rows per program never mix rows, and the warps can change only the order of a row's sum
of squares (held to the float64 bound above).

Shapes: x (B, T, H, D) in bfloat16 or float32, any strides; weight (D,) in x's dtype; cos, sin (T, r) float32
with r even and <= D. Output: contiguous (B, T, H, D) in x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._rounding import bf16_round, store_bf16
from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size, interpreting

DTYPES = (torch.bfloat16, torch.float32)
ROWS = 16  # head rows (b, t, h) per program on a GPU
NUM_WARPS = 4  # warps per program on a GPU
INTERPRET_ROWS = 64  # head rows per program under the interpreter (its cost is per program)


def _head_norm_rope(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    N, T, H, ROT, eps,
    x_sb, x_st, x_sh, x_sd, c_st, c_sd, s_st, s_sd,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, X_BF16: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_R head rows (b, t, h) x all D channels."""
    n = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) flattened (b, t, h)
    bt = n // H
    h = (n - bt * H).to(tl.int64)
    b = bt // T
    t = (bt - b * T).to(tl.int64)
    b = b.to(tl.int64)
    c = tl.arange(0, BLOCK_D)  # (BLOCK_D,) channels of the head
    half = ROT // 2
    rotated = c < ROT
    partner = tl.where(c < half, c + half, c - half)  # the channel rotate-half pairs c with (inside [0, ROT))
    row_ok = (n < N)[:, None]
    mask = row_ok & (c < D)[None, :]
    rot_mask = row_ok & rotated[None, :]
    row = x_ptr + (b * x_sb + t * x_st + h * x_sh)[:, None]
    x = tl.load(row + (c * x_sd)[None, :], mask=mask, other=0.0).to(tl.float32)  # (BLOCK_R, BLOCK_D)
    squares = tl.reduce(x * x, 1, tl.standard._sum_combine)  # not tl.sum: see kernels/_runtime.py's LazyKernel
    ms = tl.math.div_rn(squares, tl.cast(D, tl.float32))
    r = tl.math.div_rn(1.0, tl.math.sqrt_rn((ms + eps).to(tl.float32)))[:, None]  # eps is fp64 under compile
    w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)[None, :]  # (1, BLOCK_D)
    xp = tl.load(row + (partner * x_sd)[None, :], mask=rot_mask, other=0.0).to(tl.float32)  # (BLOCK_R, BLOCK_D)
    wp = tl.load(w_ptr + partner, mask=rotated, other=0.0).to(tl.float32)[None, :]  # (1, BLOCK_D)
    y = tl.join((x * r) * w, (xp * r) * wp)  # RMSNorm's output for c and for its partner: (BLOCK_R, BLOCK_D, 2)
    if X_BF16:  # torch rounds RMSNorm's output to x's dtype
        y = bf16_round(y)
    y, yp = tl.split(y)
    yp = tl.where((c < half)[None, :], -yp, yp)  # cat(-x2, x1): exact in any dtype
    # cos, sin: each (BLOCK_R, BLOCK_D), zero past ROT
    cos = tl.load(cos_ptr + (t * c_st)[:, None] + (c * c_sd)[None, :], mask=rot_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + (t * s_st)[:, None] + (c * s_sd)[None, :], mask=rot_mask, other=0.0).to(tl.float32)
    if X_BF16:  # torch's `cos.to(x.dtype)`, `sin.to(x.dtype)`
        cos, sin = tl.split(bf16_round(tl.join(cos, sin)))
    products = tl.join(y * cos, yp * sin)  # each rounded to x's dtype on its own
    if X_BF16:
        products = bf16_round(products)
    a, bb = tl.split(products)
    out = tl.where(rotated[None, :], a + bb, y)  # channels past ROT pass through
    at = out_ptr + (n.to(tl.int64) * D)[:, None] + c[None, :]
    if X_BF16:
        store_bf16(at, out, mask)
    else:
        tl.store(at, out, mask=mask)


_KERNEL = LazyKernel(_head_norm_rope, helpers=(bf16_round, store_bf16))


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' op sequence (module doc) on x (B, T, H, D): torch's RMSNorm, then the rotate-half rotary."""
    x = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    rot = cos.shape[-1]
    cos = cos.to(x.dtype)[None, :, None, :]
    sin = sin.to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., :rot].chunk(2, dim=-1)
    turned = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x[..., :rot] * cos + turned * sin, x[..., rot:]), dim=-1).contiguous()


def _check(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    name = "head_norm_rope"
    check_float(name, "x", x, DTYPES)
    if x.ndim != 4:
        raise ValueError(f"{name}: x must be (B, T, H, D), got shape {tuple(x.shape)}")
    b, t, h, d = x.shape
    if weight.dtype != x.dtype or tuple(weight.shape) != (d,):
        raise ValueError(f"{name}: weight must be ({d},) in {x.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    for arg, table in (("cos", cos), ("sin", sin)):
        if table.dtype != torch.float32 or table.ndim != 2 or table.shape[0] != t:
            raise ValueError(f"{name}: {arg} must be ({t}, r) float32, got {tuple(table.shape)} {table.dtype}")
    rot = cos.shape[1]
    if sin.shape != cos.shape or rot % 2 or rot > d:
        raise ValueError(
            f"{name}: cos/sin must share a shape (T, r) with r even and <= {d}; got {cos.shape}, {sin.shape}"
        )


def head_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """`reference(x, weight, eps, cos, sin)` in one kernel (contract: reduction; module doc)."""
    _check(x, weight, cos, sin)
    check_runtime("head_norm_rope", x, weight, cos, sin)
    b, t, h, d = x.shape
    out = torch.empty((b, t, h, d), dtype=x.dtype, device=x.device)
    rows = b * t * h
    block_r = min(INTERPRET_ROWS if interpreting() else ROWS, triton.next_power_of_2(max(rows, 1)))
    tuning = {} if interpreting() else {"num_warps": NUM_WARPS, "enable_fp_fusion": False}
    _KERNEL[(triton.cdiv(rows, block_r),)](
        x, weight, cos, sin, out,
        rows, t, h, cos.shape[1], float(eps),
        *x.stride(), *cos.stride(), *sin.stride(),
        D=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_R=block_r, X_BF16=x.dtype == torch.bfloat16, **tuning,
    )  # fmt: skip
    return out


def cost(
    shape: tuple[int, int, int, int], dtype: torch.dtype = torch.bfloat16, rotated: int | None = None
) -> tuple[int, int]:
    """(bytes_moved, flops) for x of `shape` (B, T, H, D) in `dtype` with `rotated` rotary channels per head
    (default D). Bytes: x read once and the output written once (the tables and weight are small and shared across
    heads). Flops per element: RMSNorm 4 (square, add, two products); rotary 3 more per rotated channel (two
    products, one sum)."""
    b, t, h, d = shape
    elements = b * t * h * d
    rotated = d if rotated is None else rotated
    return 2 * elements * dtype_size(dtype), 4 * elements + 3 * b * t * h * rotated
