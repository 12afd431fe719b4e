"""Channel RMS norm + SiLU over 5-D video activations in one pass, written into any strided view (contract: reduction).

Two norms, one kernel (the `PIXEL` switch), as the video VAEs' residual blocks and decoder heads run them on
(B, C, T, H, W) activations:

`rms_norm_silu`: diffusers' `WanRMS_norm` (channel-first, no images) followed by `F.silu` (the Wan VAE):

    n = F.normalize(x.float(), dim=1).to(x.dtype)      # x / max(||x||_2 over C, eps), in fp32, rounded once
    v = n * scale * gamma + bias                         # each product and the sum rounded to x's dtype, as torch
    y = silu(v) = v / (1 + exp(-v))                      # in fp32, rounded once to x's dtype

`pixel_norm_silu`: diffusers' `PerChannelRMSNorm` followed by `F.silu` (LTX-2's video VAE): no gain nor bias, eps
inside the root, every op in x's dtype:

    r = sqrt(mean(x ** 2 over C) + eps)                  # x ** 2, the mean, + eps, sqrt: each rounded to x's dtype,
                                                         # eps too (torch casts a Python scalar to the tensor's dtype)
    v = x / r                                            # rounded to x's dtype
    y = silu(v)                                          # in fp32, rounded once to x's dtype

The mean is an fp32 sum of the rounded squares times 1/C, rounded once (torch's CUDA mean; its CPU mean divides the
fp32 sum by C, the same value but for the last bit of the fp32 quotient).

Rounding boundaries kept from torch (Wan's form; the pixel form rounds after every op as written above): the fp32 normalisation is rounded to the dtype, then `* scale` (a Python float,
applied in fp32), `* gamma` and `+ bias` are each rounded to the dtype (torch's in-dtype ops compute in fp32 and round
per op; a float `bias` of 0.0 only turns -0 into +0), then SiLU in fp32 rounded once. BF16 rounding is c10::BFloat16's
(`_rounding`, BF16_ROUNDING).

Why `reduction`, not `rounding`: the sum of squares over C is a Triton tree reduction (numpy's pairwise sum under the
interpreter), not torch's order, and `exp` is Triton's (ex2-based on NVIDIA GPUs) rather than CUDA's `expf`; the
norm and the division use `sqrt_rn` / `div_rn` (IEEE). So a normed value can differ from torch's by about an ulp of
fp32 before it is rounded to the dtype: in bf16/fp16 an output element is torch's or, rarely, an ulp or two away (one
ulp off in the normed value can round to two after `* scale`); in fp32 (nothing rounded in between; SiLU's slope
amplifies a relative error of a negative input several times) within 16 eps of torch's value, relative. Tested in
tests/kernels/test_rms_norm_silu.py: 4 eps relative for bf16/fp16, 16 eps for fp32. The pixel form, whose every op
is IEEE-rounded as torch's: the rounded mean is torch's unless the other summation order crosses a rounding boundary,
so an element is torch's (bf16 under the interpreter: all of them, measured) or the SiLU of a normed value an ulp or
two away; tested within 4 eps * (|torch| + |x / rms|) for every dtype.

Layout: `x` (B, C, T, H, W) with any strides (contiguous NCDHW or channels_last_3d are the fast ones); `out`, when
given, any (B, C, T, H, W) view of x's dtype (the interior of a padded convolution buffer: the caller saves the copy),
else a new tensor in x's memory format. gamma (C,) or (C, 1, 1, 1); bias a float or a (C,)-shaped tensor.
One program normalises BLOCK_P positions with all of their channels in registers (C <= 2048).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.kernels._rounding import round_to, store_bf16
from workbench.kernels._runtime import ROUNDING, LazyKernel, check_float, check_runtime, dtype_size, interpreting

MAX_CHANNELS = 2048
TILE = 4096  # channels x positions per program (compiled); under the interpreter one program takes INTERPRET_TILE
POSITIONS_OUTER = 32  # positions per program at least when channels are strided (NCDHW): 64-byte runs along W
INTERPRET_TILE = 32768


def _rms_norm_silu(
    x_ptr, gamma_ptr, bias_ptr, out_ptr,
    P, C, T, H, W,
    x_sb, x_sc, x_st, x_sh, x_sw,
    o_sb, o_sc, o_st, o_sh, o_sw,
    scale, bias_value, eps, inv_c,
    HAS_BIAS: tl.constexpr, ROUND: tl.constexpr, OUT_BF16: tl.constexpr, CHANNELS_INNER: tl.constexpr,
    PIXEL: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # CHANNELS_INNER: tile (positions, channels), threads run along channels (channels_last_3d, C stride 1);
    # else tile (channels, positions), threads run along positions (NCDHW, W stride 1): coalesced either way
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    w = (p % W).to(tl.int64)
    rest = p // W
    h = (rest % H).to(tl.int64)
    rest = rest // H
    t = (rest % T).to(tl.int64)
    b = (rest // T).to(tl.int64)
    c = tl.arange(0, BLOCK_C).to(tl.int64)
    if CHANNELS_INNER:
        pos_x = (b * x_sb + t * x_st + h * x_sh + w * x_sw)[:, None]
        pos_o = (b * o_sb + t * o_st + h * o_sh + w * o_sw)[:, None]
        ch = c[None, :]
        mask = (p < P)[:, None] & (c < C)[None, :]
    else:
        pos_x = (b * x_sb + t * x_st + h * x_sh + w * x_sw)[None, :]
        pos_o = (b * o_sb + t * o_st + h * o_sh + w * o_sw)[None, :]
        ch = c[:, None]
        mask = (c < C)[:, None] & (p < P)[None, :]
    x = tl.load(x_ptr + pos_x + ch * x_sc, mask=mask, other=0.0).to(tl.float32)
    squares = x * x
    if PIXEL:  # x ** 2 is an op of its own, rounded to the dtype
        squares = round_to(squares, ROUND)
    # tl.reduce with tl.standard's combine, not tl.sum: tl.sum is decorated at triton import, which the interpreter
    # cannot call when TRITON_INTERPRET was set later (the benchmark harness's --smoke)
    if CHANNELS_INNER:
        total = tl.reduce(squares, 1, tl.standard._sum_combine)[:, None]
    else:
        total = tl.reduce(squares, 0, tl.standard._sum_combine)[None, :]
    if PIXEL:
        # mean (fp32 sum times 1/C, as torch's CUDA mean), + eps, sqrt, x / rms: each rounded to the dtype
        rms = round_to(tl.math.sqrt_rn(round_to(round_to(total * inv_c, ROUND) + eps, ROUND)), ROUND)
        v = round_to(tl.math.div_rn(x, rms), ROUND)
    else:  # WanRMS_norm: `normalize(x) * scale * gamma + bias` (fp32 normalisation), each op rounded to the dtype
        gamma = tl.load(gamma_ptr + ch, mask=(ch < C), other=0.0).to(tl.float32)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + ch, mask=(ch < C), other=0.0).to(tl.float32)
        else:
            bias = bias_value
        v = round_to(tl.math.div_rn(x, tl.maximum(tl.math.sqrt_rn(total), eps)), ROUND)
        v = round_to(round_to(v * scale, ROUND) * gamma, ROUND)
        v = round_to(v + bias, ROUND)
    y = tl.math.div_rn(v, 1.0 + tl.exp(-v))
    out = out_ptr + pos_o + ch * o_sc
    if OUT_BF16:
        store_bf16(out, y, mask)
    else:
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


# enable_fp_fusion=False at launch: torch multiplies and adds apart.
_KERNEL = LazyKernel(_rms_norm_silu, helpers=(round_to, store_bf16))


def reference(
    x: torch.Tensor, gamma: torch.Tensor, bias: float | torch.Tensor = 0.0, scale: float | None = None
) -> torch.Tensor:
    """diffusers' `WanRMS_norm(channel_first=True, images=False)` then `F.silu`, op for op. `scale` defaults to
    sqrt(C), as the module sets it; gamma and bias in the module's (C, 1, 1, 1) form or (C,)."""
    c = x.shape[1]
    scale = c**0.5 if scale is None else scale
    low = x.dtype in (torch.float16, torch.bfloat16)
    normalized = torch.nn.functional.normalize(x.float() if low else x, dim=1).to(x.dtype)
    gamma = gamma.reshape(c, 1, 1, 1)
    bias = bias.reshape(c, 1, 1, 1) if isinstance(bias, torch.Tensor) else bias
    return torch.nn.functional.silu(normalized * scale * gamma + bias)


def pixel_norm_reference(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """diffusers' `PerChannelRMSNorm` (LTX-2's video VAE: no gain, eps inside the root, every op in x's dtype) then
    `F.silu`, op for op."""
    return torch.nn.functional.silu(x / torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + eps))


def rms_norm_silu(
    x: torch.Tensor,
    gamma: torch.Tensor,
    bias: float | torch.Tensor = 0.0,
    scale: float | None = None,
    eps: float = 1e-12,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`reference(x, gamma, bias, scale)` in one pass, written into `out` (see module doc); returns `out`."""
    name = "rms_norm_silu"
    c = _check_x(name, x)
    check_float(name, "gamma", gamma)
    if gamma.numel() != c or gamma.shape not in ((c,), (c, 1, 1, 1)):
        raise ValueError(f"{name}: gamma has shape {tuple(gamma.shape)}; expected ({c},) or ({c}, 1, 1, 1)")
    has_bias = isinstance(bias, torch.Tensor)
    if has_bias:
        check_float(name, "bias", bias)
        if bias.shape not in ((c,), (c, 1, 1, 1)):
            raise ValueError(f"{name}: bias has shape {tuple(bias.shape)}; expected ({c},) or ({c}, 1, 1, 1)")
    elif isinstance(bias, bool) or not isinstance(bias, int | float):
        raise ValueError(f"{name}: bias must be a number or a tensor, got {type(bias).__name__}")
    out = _check_out(name, x, out)
    gamma = gamma.reshape(c).contiguous()
    bias_tensor = bias.reshape(c).contiguous() if has_bias else gamma
    check_runtime(name, x, gamma, bias_tensor, out)
    scale = float(c**0.5 if scale is None else scale)
    _launch(x, out, gamma, bias_tensor, scale, 0.0 if has_bias else float(bias), eps, has_bias=has_bias, pixel=False)
    return out


def pixel_norm_silu(x: torch.Tensor, eps: float = 1e-8, out: torch.Tensor | None = None) -> torch.Tensor:
    """`pixel_norm_reference(x, eps)` in one pass, written into `out` (see module doc); returns `out`."""
    name = "pixel_norm_silu"
    _check_x(name, x)
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0:
        raise ValueError(f"{name}: eps is {eps!r}; allowed: a number >= 0")
    out = _check_out(name, x, out)
    check_runtime(name, x, out)
    eps = torch.tensor(eps, dtype=x.dtype).item()  # torch rounds the Python scalar to x's dtype before the add
    _launch(x, out, x, x, 1.0, 0.0, eps, has_bias=False, pixel=True)  # no gamma nor bias: x stands in as the pointer
    return out


def _check_x(name: str, x: torch.Tensor) -> int:
    check_float(name, "x", x)
    if x.ndim != 5:
        raise ValueError(f"{name}: x must be (B, C, T, H, W), got shape {tuple(x.shape)}")
    if not 1 <= x.shape[1] <= MAX_CHANNELS:
        raise ValueError(f"{name}: x has {x.shape[1]} channels; allowed: 1 to {MAX_CHANNELS}")
    return x.shape[1]


def _check_out(name: str, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty_like(x)
    if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype:
        got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{name}: out {got}; expected shape {tuple(x.shape)} and dtype {x.dtype}")
    return out


def _launch(
    x: torch.Tensor,
    out: torch.Tensor,
    gamma: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    bias_value: float,
    eps: float,
    *,
    has_bias: bool,
    pixel: bool,
) -> None:
    b, c, t, h, w = x.shape
    positions = b * t * h * w
    if positions == 0:
        return
    block_c = triton.next_power_of_2(c)
    channels_inner = x.stride(1) == 1 and c > 1
    block_p = max(1 if channels_inner else POSITIONS_OUTER, TILE // block_c)  # channels outer: runs along W
    if interpreting():
        block_p = max(1, INTERPRET_TILE // block_c)
    block_p = min(block_p, triton.next_power_of_2(positions))
    grid = (triton.cdiv(positions, block_p),)
    _KERNEL[grid](
        x, gamma, bias, out, positions, c, t, h, w, *x.stride(), *out.stride(),
        scale, bias_value, float(eps), 1.0 / c,
        HAS_BIAS=has_bias, ROUND=ROUNDING[x.dtype], OUT_BF16=x.dtype == torch.bfloat16,
        CHANNELS_INNER=channels_inner, PIXEL=pixel, BLOCK_P=block_p, BLOCK_C=block_c,
        num_warps=8 if block_p * block_c > TILE else 4, enable_fp_fusion=False,
    )  # fmt: skip


def cost(shape: tuple[int, int, int, int, int], dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(bytes_moved, flops) for x of `shape` (B, C, T, H, W): reads x once, writes the output once; about 12
    flops per element (square-add, divide, three multiplies, add, exp, add, divide)."""
    elements = 1
    for size in shape:
        elements *= size
    return 2 * elements * dtype_size(dtype), 12 * elements
