"""The quantization step of the low-bit attention kernels (`fp8_attention`, `block_sparse_attention`'s `precision=`):
q, the mean-smoothed k and v turned into the int8 / e4m3 operands and scales the attention kernels read.

The maths (`quantize_reference` in torch ops; `quantize` the same in Triton, one read of each tensor):
1. Key smoothing: `k <- k - key_mean(k)` per (batch, head), with `key_mean` the fp32 mean over tokens (torch's
   reduction, shared by both paths) or a vector the caller gives (block_sparse: the mean of its block means). Every
   logit of one query row moves by the same `q . mean(k)`, so the softmax is unchanged in exact maths; what it
   removes is the common offset trained keys carry, which would otherwise set every block's scale and leave the
   per-token part a few quantization steps.
2. q and the smoothed k per block of QUANT_BLOCK = 128 tokens, symmetric, one fp32 scale a block
   `max(amax(|block|), EPS) / top` (IEEE division), value `clamp(x * (1 / scale), -top, top)` (the reciprocal by IEEE
   division once a block, then a multiply a value; evidence:
   benchmarks/results/probes/2026-12-06-attention-quantize-h100.json) rounded to nearest even: qk="int8" top = 127, int8
   values (SageAttention's choice); qk="e4m3" top = 448, e4m3 values. Tokens past T are zeros (padded to a multiple of
   128; padding is added after smoothing, so it stays zero).
3. pv="fp8" / pv="int8": v per (batch, head, channel) over all tokens to one byte, symmetric: e4m3
   (`scale_v = max(amax, EPS) / 448`) or int8 (`scale_v = max(amax, EPS) / 127`), each value times its channel's
   `1 / scale_v` and rounded as q's, stored transposed (B, H, 128, Tk') so the P.V dot reads it K-major, zero-padded
   like k, its keys in `v_slot` order within each group of 32 (below); `v_scale = scale_v / P_TOP[pv]` (the kernels'
   P carries a factor 448, or 127: `P_TOP`). pv="bf16": v rounded to bf16, made contiguous only when TMA cannot
   read it.

Why v's keys are reordered: the P.V dot takes P from registers, where the logits' accumulator left it. On sm_90 an
FP8 wgmma's register A operand gives a thread keys 4t..4t+3 and 4t+16..4t+19 of each 32 (t = lane % 4), while the
accumulator gave it keys 2t, 2t+1 and the same plus 8, 16 and 24. Storing key `16g + 8h + 2t + e` of a group (bits g,
h, e; t in 0..3) at slot `16g + 4t + 2h + e` makes the keys a thread holds the ones its operand slots need: the
kernels relabel P's columns the same way (`fp8_attention.quantized_tile`), a renaming of registers instead of the
cross-lane shuffles a layout conversion would take. Any relabelling gives the same dot; this one is free.

Contract: `quantize` equals `quantize_reference` bit for bit on finite inputs (every step is an exact or IEEE-rounded
fp32 operation in both, the Triton kernel divides with `div_rn`, the scales' reciprocals included; v's per-channel
amax comes from `torch.aminmax`, exact). A NaN or inf makes its block's scale (q, k: every block of the head, through
k's mean) or its channel's scale (v) NaN in both, so the attention output is NaN where dense attention's is (and more:
a whole q block), never a finite number that hides it; the one-byte values of such a block are unspecified. Under
the CPU interpreter the fp32 -> e4m3 conversion is not round-to-nearest-even (fp8_attention's module doc), so the
kernel rounds to the e4m3 grid in fp32 first (EMULATE), as the GPU's `cvt.rn.satfinite` does.

The Triton path: torch's fp32 mean of k (one read) and, for a one-byte pv, `torch.aminmax` of v over tokens (one
read; none where the caller passes v's amax, as block_sparse does from its block-means launch), then one launch per
tensor of `_quantize_fwd` (five launches in all): one program per (128-token block, batch*head) reads the block once
(any strides), smooths, reduces its amax (q, k) or makes the per-channel scales from v's min and max (v: the head's
first program writes v_scale), and writes the one-byte values (transposed and in `v_slot` order for v) and the
block's scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from workbench.kernels._fp8_rows import EPS, FP8, FP8_MAX
from workbench.kernels._runtime import LazyKernel, dtype_size, interpreting, tma_ready

INT8_MAX = 127.0
P_TOP = {"fp8": FP8_MAX, "int8": INT8_MAX}  # the factor the kernels' one-byte P carries, per pv mode
QUANT_BLOCK = 128  # tokens per q / k quantization block (and per program of `_quantize_fwd`)
QUANT_WARPS = 16  # a (128, 128) fp32 tile over 512 threads, 32 values a thread (evidence:
# benchmarks/results/probes/attention-quantize-warps.json); no spills on any target (tests/kernels/test_targets)


@dataclass
class Quantized:
    """The attention kernels' operands. q8 (B, H, Tq', 128) and k8 (B, H, Tk', 128) float8_e4m3fn (qk="e4m3") or
    int8 (qk="int8"), contiguous, tokens padded with zeros to a multiple of QUANT_BLOCK; q_scale (B, H, Tq'/128),
    k_scale (B, H, Tk'/128) fp32; v: pv="fp8" / "int8" the e4m3 / int8 values transposed (B, H, 128, Tk')
    contiguous (keys in `v_slot` order), pv="bf16" bf16 (B, H, Tk, 128) with unit last stride; v_scale (B, H, 128)
    fp32 `scale_v / P_TOP[pv]` (one-byte v) or None (pv="bf16"); k_mean (B, H, 1, 128) fp32: the mean subtracted
    from k."""

    q8: torch.Tensor
    q_scale: torch.Tensor
    k8: torch.Tensor
    k_scale: torch.Tensor
    v: torch.Tensor
    v_scale: torch.Tensor | None
    pv: str
    qk: str
    k_mean: torch.Tensor


def key_mean(k: torch.Tensor) -> torch.Tensor:
    """(B, H, 1, D) fp32 mean of k (B, H, T, D) over tokens, accumulated in fp32 (no fp32 copy of k)."""
    return k.mean(2, keepdim=True, dtype=torch.float32)


def _top(qk: str) -> float:
    return INT8_MAX if qk == "int8" else FP8_MAX


def _bf16_v(v: torch.Tensor) -> torch.Tensor:
    """v in bf16 as the kernels' TMA descriptors read it: unit last stride, 16-byte aligned base and strides."""
    vb = v.to(torch.bfloat16)
    return vb if tma_ready(vb) else vb.contiguous()


def v_slot(key: torch.Tensor) -> torch.Tensor:
    """The slots of v's transposed e4m3 layout that hold keys `key` (an integer tensor of token indices): within each
    group of 32 keys, key `16g + 8h + 2t + e` goes to slot `16g + 4t + 2h + e` (module doc)."""
    return (key & ~15) | ((key & 6) << 1) | ((key >> 2) & 2) | (key & 1)


def v_in_key_order(vt: torch.Tensor, tk: int) -> torch.Tensor:
    """`Quantized.v` (one-byte pv, (B, H, 128, Tk')) as (B, H, 128, tk) with its keys in token order."""
    return vt[..., v_slot(torch.arange(tk, device=vt.device))]


def _ieee_div(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor rounded once (IEEE), on any device: a tensor divisor (torch's scalar path multiplies by the
    reciprocal on CUDA)."""
    return x / torch.full_like(x, divisor)


def _reciprocal(x: torch.Tensor) -> torch.Tensor:
    """1 / x rounded once (IEEE), elementwise, on any device."""
    return torch.ones_like(x) / x


def _v_scale(amax: torch.Tensor, pv: str) -> torch.Tensor:
    """scale_v (B, H, D) fp32 from v's per-channel amax, IEEE division."""
    return _ieee_div(amax.float().clamp(min=EPS), P_TOP[pv])


def _blocks(x: torch.Tensor, qk: str) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (B, H, T, D) -> (e4m3 or int8 (B, H, T', D) zero-padded to T' = QUANT_BLOCK * nb, scales (B, H, nb))."""
    b, h, t, d = x.shape
    nb = -(-t // QUANT_BLOCK)
    x = torch.nn.functional.pad(x, (0, 0, 0, nb * QUANT_BLOCK - t)).view(b, h, nb, QUANT_BLOCK, d)
    top = _top(qk)
    amax = x.abs().amax((3, 4)).clamp(min=EPS)  # (B, H, nb)
    scale = amax / torch.full_like(amax, top)
    x = (x * _reciprocal(scale)[..., None, None]).clamp(-top, top)
    q = x.round().to(torch.int8) if qk == "int8" else x.to(FP8)
    return q.view(b, h, nb * QUANT_BLOCK, d), scale


def quantize_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pv: str = "fp8",
    qk: str = "e4m3",
    k_mean: torch.Tensor | None = None,
) -> Quantized:
    """Steps 1-3 of the module doc in torch ops on q (B, H, Tq, 128), k and v (B, H, Tk, 128); `k_mean`
    (B, H, 1, 128) fp32: the smoothing vector (zeros: no smoothing), else `key_mean(k)`."""
    q8, q_scale = _blocks(q.float(), qk)
    k_mean = key_mean(k) if k_mean is None else k_mean
    k8, k_scale = _blocks(k.float() - k_mean, qk)
    if pv == "bf16":
        return Quantized(q8, q_scale, k8, k_scale, _bf16_v(v), None, pv, qk, k_mean)
    top = P_TOP[pv]
    scale = _v_scale(v.float().abs().amax(2), pv)  # (B, H, D)
    v8 = (v.float() * _reciprocal(scale)[:, :, None]).clamp(-top, top)
    v8 = v8.round().to(torch.int8) if pv == "int8" else v8.to(FP8)
    pad = k8.shape[2] - v.shape[2]
    keys = torch.nn.functional.pad(v8.transpose(-1, -2).view(torch.uint8), (0, pad))  # (B, H, D, Tk'), key order
    vt = torch.empty_like(keys)
    vt[..., v_slot(torch.arange(keys.shape[-1], device=keys.device))] = keys
    return Quantized(q8, q_scale, k8, k_scale, vt.view(v8.dtype), _ieee_div(scale, top), pv, qk, k_mean)


def e4m3_round(x):
    """fp32 `x` rounded to the nearest e4m3 value, ties to even, kept as an fp32 value (a Triton device function; the
    CPU interpreter's fp32 -> e4m3 conversion does not round so, the GPU's `cvt.rn.satfinite` does): 3 mantissa bits,
    or a multiple of 2^-9 below e4m3's smallest normal 2^-6 (adding 2^14 leaves fp32 steps of 2^-9). |x| <= 448."""
    a = tl.abs(x)
    bits = a.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    a = tl.where(a < 0.015625, (a + 16384.0) - 16384.0, bits.to(tl.float32, bitcast=True))
    return tl.where(x < 0, -a, a)


def _quantize_fwd(
    x_ptr, mean_ptr, scale_ptr, out_ptr, low_ptr, high_ptr,
    H, T, TP,
    x_sb, x_sh, x_st, x_sd,
    BLOCK: tl.constexpr, D: tl.constexpr, INT8: tl.constexpr, SMOOTH: tl.constexpr, CHANNEL: tl.constexpr,
    TOP: tl.constexpr, EPS: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    # Step 2 (q, k; SMOOTH subtracts mean_ptr's (D,) per head first) or, with CHANNEL, step 3 (v: the per-channel
    # scales from low_ptr / high_ptr, v's per-channel min and max; the head's first program stores scale / top, the
    # v_scale, into scale_ptr; the output is transposed). TOP: INT8_MAX or FP8_MAX. tl.reduce with tl.standard's
    # combines: see _runtime.LazyKernel.
    blk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, D)
    ok = (rows < T)[:, None]
    ptrs = x_ptr + b * x_sb + h * x_sh + rows.to(tl.int64)[:, None] * x_st + d[None, :] * x_sd
    x = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)  # (BLOCK, D); rows past T are zeros
    if SMOOTH:
        x = tl.where(ok, x - tl.load(mean_ptr + bh * D + d)[None, :], 0.0)
    if CHANNEL:  # max(high, -low) then max(., EPS), NaN kept (tl.maximum's default drops it; torch's keeps it)
        amax = tl.maximum(
            tl.load(high_ptr + bh * D + d).to(tl.float32),
            -tl.load(low_ptr + bh * D + d).to(tl.float32),
            propagate_nan=tl.PropagateNan.ALL,
        )
        channel_scale = tl.div_rn(tl.maximum(amax, EPS, propagate_nan=tl.PropagateNan.ALL), TOP)
        if blk == 0:
            tl.store(scale_ptr + bh * D + d, tl.div_rn(channel_scale, TOP))
        inverse = tl.div_rn(1.0, channel_scale)[None, :]  # (1, D)
    else:
        amax = tl.reduce(tl.reduce(tl.abs(x), 1, tl.standard._elementwise_max), 0, tl.standard._elementwise_max)
        # tl.maximum skips NaN: a NaN or inf in the block poisons its scale through a sum of x * 0 instead (NaN iff
        # one is there), so the block's logits come out NaN as the reference's (torch's amax keeps NaN) do
        poison = tl.reduce(tl.reduce(x * 0.0, 1, tl.standard._sum_combine), 0, tl.standard._sum_combine)
        block_scale = tl.div_rn(tl.maximum(amax, EPS) + poison, TOP)
        tl.store(scale_ptr + bh * (TP // BLOCK) + blk, block_scale)
        inverse = tl.div_rn(1.0, block_scale)
    y = tl.minimum(tl.maximum(x * inverse, -TOP), TOP)
    if INT8:
        y = (y + 12582912.0) - 12582912.0  # round half to even: 1.5 * 2^23 leaves fp32 steps of 1
        values = y.to(tl.int8)
    else:
        if EMULATE:
            y = e4m3_round(y)
        values = y.to(tl.float8e4nv)
    if CHANNEL:  # (D, TP) per head, keys in v_slot order: the tile's rows reordered so, then stored in order
        values = tl.reshape(
            tl.permute(tl.reshape(values, [BLOCK // 32, 2, 2, 4, 2, D]), [0, 1, 3, 2, 4, 5]), [BLOCK, D]
        )
        tl.store(out_ptr + bh * D * TP + d[None, :].to(tl.int64) * TP + rows[:, None], values)
    else:  # (TP, D) per head
        tl.store(out_ptr + (bh * TP + rows.to(tl.int64))[:, None] * D + d[None, :], values)


_KERNEL = LazyKernel(_quantize_fwd, helpers=(e4m3_round,))


def _launch(
    x: torch.Tensor,
    out: torch.Tensor,
    scale: torch.Tensor,
    mean: torch.Tensor | None,
    int8: bool,
    channel: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """`channel`: step 3 with v's per-channel (low, high) (B, H, D), whose max(high, -low) is the amax: v's min and
    max over tokens, or the amax twice (`scale` receives v_scale); else step 2."""
    b, h, t, d = x.shape
    tp = out.shape[-1] if channel else out.shape[2]
    low, high = channel or (scale, scale)
    tuning = {} if interpreting() else {"num_warps": QUANT_WARPS}
    _KERNEL[(tp // QUANT_BLOCK, b * h)](
        x, scale if mean is None else mean, scale, out, low, high, h, t, tp, *x.stride(),
        BLOCK=QUANT_BLOCK, D=d, INT8=int8, SMOOTH=mean is not None, CHANNEL=channel is not None,
        TOP=INT8_MAX if int8 else FP8_MAX, EPS=EPS, EMULATE=interpreting(),
        **tuning,
    )  # fmt: skip


def quantize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pv: str = "fp8",
    qk: str = "e4m3",
    k_mean: torch.Tensor | None = None,
    v_amax: torch.Tensor | None = None,
) -> Quantized:
    """`quantize_reference(q, k, v, pv, qk=qk, k_mean=k_mean)`, bit for bit, in Triton (module doc): q (B, H, Tq,
    128), k and v (B, H, Tk, 128) of one float dtype and any strides, on a CUDA device or the CPU under the
    interpreter. Statistics a caller already has (block_sparse's plan, `block_sparse_routing.block_means`), each
    saving a read of k or v: `k_mean` (B, H, 1, 128) fp32 contiguous, the smoothing vector (else `key_mean(k)`);
    `v_amax` (B, H, 128) fp32 contiguous, v's per-channel max of |v| over tokens (else from `torch.aminmax`; equal
    on finite v). No checks of shapes and dtypes: the attention functions are the checked entries."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    dtype = torch.int8 if qk == "int8" else FP8
    qp, kp = -(-tq // QUANT_BLOCK) * QUANT_BLOCK, -(-tk // QUANT_BLOCK) * QUANT_BLOCK
    q8 = torch.empty((b, h, qp, d), dtype=dtype, device=q.device)
    k8 = torch.empty((b, h, kp, d), dtype=dtype, device=q.device)
    q_scale = torch.empty((b, h, qp // QUANT_BLOCK), dtype=torch.float32, device=q.device)
    k_scale = torch.empty((b, h, kp // QUANT_BLOCK), dtype=torch.float32, device=q.device)
    k_mean = key_mean(k) if k_mean is None else k_mean
    _launch(q, q8, q_scale, None, qk == "int8")
    _launch(k, k8, k_scale, k_mean, qk == "int8")
    if pv == "bf16":
        return Quantized(q8, q_scale, k8, k_scale, _bf16_v(v), None, pv, qk, k_mean)
    # (B, H, D): amax(|v|) = max(high, -low), exact; the kernel takes it from here
    channel = (v_amax, v_amax) if v_amax is not None else torch.aminmax(v, dim=2)
    v_scale = torch.empty((b, h, d), dtype=torch.float32, device=q.device)
    vt = torch.empty((b, h, d, kp), dtype=torch.int8 if pv == "int8" else FP8, device=q.device)
    _launch(v, vt, v_scale, None, pv == "int8", channel)
    return Quantized(q8, q_scale, k8, k_scale, vt, v_scale, pv, qk, k_mean)


def cost(shape: tuple[int, int, int, int], pv: str = "fp8", dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes moved by `quantize` on q, k, v of `shape` (B, H, T, D), a lower bound: q, k, v read once in `dtype` and
    q8, k8 and v written (one byte an element, two for pv="bf16"). The torch reductions' second read of k (and of v
    with a one-byte pv) is not counted."""
    b, h, t, d = shape
    return int(b * h * t * d * (3 * dtype_size(dtype) + 2 + (2 if pv == "bf16" else 1)))
