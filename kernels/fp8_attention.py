"""Low-bit attention with smoothed keys, for Hopper and Ada (contract: approximate): Q.K^T in FP8 (e4m3) or INT8,
P.V in FP8, INT8 or bf16.

Non-causal softmax attention `softmax(q k^T * scale) v` of q (B, H, Tq, D) and k, v (B, H, Tk, D), any strides,
bfloat16 (production) or float32; the output is (B, H, Tq, D) in q's dtype, with q's memory order when q is a
dense permutation (the dispatcher's (B, T, H, D) seen as (B, H, T, D) gets a (B, T, H, D) output, no copy). D is the
kernel's for 32, 64 and 128 (128 is the production case); another D up to 128 is zero-padded to the next of them
(`_runtime.pad_head_dim`: a copy of q, k, v and of the output; the maths below is unchanged, the padded channels are
zero throughout). The 128s below are D = 128.

The maths, in the order it happens:
1-2. `attention_quantize.quantize` (Triton; `quantize_reference` is the same in torch ops, bit for bit): k smoothed by
   its fp32 mean over tokens (softmax-invariant), q and the smoothed k per block of QUANT_BLOCK = 128 tokens to int8
   (qk="int8", SageAttention's choice, scale amax / 127) or e4m3 (qk="e4m3", amax / 448), symmetric, rounded to
   nearest even; pv="fp8" / "int8": v per (batch, head, channel) over all tokens to e4m3 / int8, stored transposed
   (B, H, 128, Tk') so the P.V dot reads it K-major, its keys reordered within groups of 32 (`v_slot`); pv="bf16": v
   in bf16. That module's doc holds the exact recipe.
3. The kernel, FlashAttention-2 style: one program per (BLOCK_M query rows, batch*head), query blocks fastest over
   the grid; key tiles of BLOCK_N tokens through TMA descriptors; each tile is one call of the device function
   `quantized_tile` (block_sparse_attend's low-precision path calls it too, and `quantized_pair`, the same step over
   two tiles at once). Per tile: `s = dot(q8, k8^T)`, an FP8 dot with fp32 accumulation or an INT8 dot with int32
   accumulation (exact), times `scale_q * scale_k * scale * log2(e)` (one scalar per tile: BLOCK_M and BLOCK_N
   divide 128); online softmax in fp32 with exp2 (running max m, row sum l of the fp32 probabilities);
   P = exp2(s - m) <= 1: pv="fp8" rounds `P * 448` to e4m3 (P's row-block scale is 1/448: its amax is at most 1 by
   construction) and runs an FP8 dot of P8 and v8 (`pv_dot`: `tl.dot` with fp32 accumulation) with P's columns
   relabelled as v8's keys were stored (`v_slot`: the keys a thread holds in the logits' accumulator become the ones
   its registers give the dot, no shuffle between lanes); pv="int8" scales P to
   the tile's own row max instead, `127 * P / P_max` with `P_max = exp2(top - m)` (top the tile's row max), rounds it
   to int8 (0..127, all of int8's levels whatever the tile's share of the row), runs an INT8 dot with int32
   accumulation (exact) with the same relabelling, and adds that product times P_max per row; pv="bf16" rounds P to
   bf16 and runs a bf16 dot; all with fp32 accumulation into the running accumulator (rescaled by the max's change
   first). Keys past Tk (q8/k8 padding) get -inf logits; only the last tile holds any, so only it is masked. The
   epilogue divides by l and, for a one-byte pv, multiplies each channel by `scale_v / 448` (`/ 127`). One fused
   multiply-add a logit does the scaling (`tl.fma`, whatever Triton's fp-fusion default): the row max is taken on the
   unscaled dot (the scalar is positive, so the max commutes with it and m is the same number), and pv="fp8" makes
   `P * 448` as `exp2(s - (m - log2 448))` directly, its row sum l carrying the 448 until the epilogue divides it out
   (pv="int8": `exp2(s - (top - log2 127))`, l summing it times P_max, so carrying 127). pv="int8" converts without
   F2I or I2F: adding 1.5 * 2^23 to P leaves the integer in the float's low bits, and the int32 accumulator starts at
   those same bits, so the product comes back as a float less 1.5 * 2^23 (exact: |P . v| <= 127 * 127 * 128 < 2^22).

The quantization of P is per key tile against the running max, so the result depends on BLOCK_N (`reference` takes
it); nothing else depends on the launch but float rounding order inside the dots.

Error contract:
- against `reference` (the same quantized operands and the same tiled online softmax, in fp32 torch maths): equal
  up to fp32 summation order and exp2's last bit, which can move one P across a rounding boundary (rarely; more
  often for bf16's finer grid): under 5e-4 relative L2 on fp32 inputs (the bound tests/kernels/test_fp8_attention.py
  holds; the CuTe kernel that `attend` runs on sm_90, `sm90_kernel`, sums l from P as rounded to e4m3: under 5e-3
  from it, tests/kernels/test_fp8_attention_sm90.py's bound);
- against dense bf16 attention: the quantization error itself. e4m3's 3 mantissa bits on q and k (about 2.5 % RMS
  an element) move every logit; INT8's 127 levels a block lose less wherever a block's values are not dominated by
  a few large ones, which is the case for q/k (tests/kernels/test_fp8_attention.py holds int8 the lower-error
  Q.K^T on iid inputs and on q/k with a shared channel offset and outlier channels). pv="fp8" rounds both P.V operands to e4m3: each of P and v alone
  costs about as much as int8 Q.K^T does, or more (the rounding of each probability and each value, which zero-mean
  v does not average out), so FP8 P.V sets the floor of its pairs' error (the `fp8-attention` scenario's
  `error_parts` separates the steps). A scale cannot change that (e4m3's relative step is the same at every scale);
  int8 P.V can: 127 uniform levels from each tile's row max on P and per channel on v lose less than 3 mantissa
  bits do on the values that carry the output. tests/kernels/test_fp8_attention.py bounds every pair's relative L2
  against bf16 dense on iid normal q, k, v and on RMS-normed q/k with a shared channel offset and outlier channels;
  the benchmark scenario `fp8-attention` reports them at the production shape.

The CPU interpreter (`TRITON_INTERPRET=1`): its FP8 and INT8 dots are right, but its fp32 -> e4m3 and fp32 -> bf16
conversions are not round-to-nearest-even (e.g. 31.9999 -> 16). Under it the kernel rounds P to e4m3 / bf16 with an
integer round-to-nearest-even on the fp32 bits (exact, and what the GPU's `cvt.rn.satfinite` does) before the
conversion, and the bf16 P.V dot runs on the rounded values widened to fp32 (`attention_quantize` does the same for q,
k and v in e4m3).

Needs FP8 tensor cores: compute capability 8.9+ (RuntimeError below, `_runtime.check_fp8`). Launch: `Launch` (tile
sizes, warps, stages); `launch_for(device, pv)` picks ADA below sm_90, and on sm_90+ DEFAULT (also pv="int8"), or
BF16_PV for pv="bf16".
On sm_90 with a one-byte P.V (pv="fp8" or "int8") and D = 128 `attend` (kernel="auto") runs the CuTe DSL kernel
instead when the DSL is installed (`sm90_kernel`; kernels/fp8_attention_sm90.py: the same steps, FlashAttention-3's
warp-specialized schedule, row sums from the P.V dot; evidence: benchmarks/results/fp8-attention.json, the
`...,triton` arms); kernel="triton" runs the Triton kernel everywhere (the only way to pass a `launch`).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from workbench.kernels import attention_quantize
from workbench.kernels._rounding import bf16_round
from workbench.kernels._runtime import (
    LazyKernel,
    capability,
    check_fp8,
    check_qkv,
    check_runtime,
    check_warps,
    dtype_size,
    head_dim_problem,
    interpreting,
    pad_head_dim,
    tma_scratch,
)
from workbench.kernels.attention_quantize import (
    FP8,
    FP8_MAX,
    INT8_MAX,
    P_TOP,
    QUANT_BLOCK,
    Quantized,
    e4m3_round,
    quantize,
    quantize_reference,
)

DTYPES = (torch.bfloat16, torch.float32)
PV_MODES = ("fp8", "bf16", "int8")
QK_MODES = ("e4m3", "int8")
KERNELS = ("auto", "triton")  # the `kernel` argument: "auto" picks (`sm90_kernel`), "triton" runs the Triton kernel
LOG2E = 1.4426950408889634
TILES = (16, 32, 64, 128)  # a tile must divide QUANT_BLOCK
KEY_TILES = (32, 64, 128)  # block_n: whole groups of 32 keys (v_slot's relabelling of P stays inside a tile)


@dataclass(frozen=True)
class Launch:
    """One GPU launch: `block_m` query rows and `block_n` keys per tile (each dividing QUANT_BLOCK, block_n >= 32),
    `num_warps`, `num_stages` software-pipeline stages. `block_n` also sets the tiles P is quantized over (module
    doc)."""

    block_m: int = 64
    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for field, value, allowed in (("block_m", self.block_m, TILES), ("block_n", self.block_n, KEY_TILES)):
            if value not in allowed:
                raise ValueError(f"fp8_attention: Launch.{field}: {value!r}; allowed: {list(allowed)}")
        check_warps("fp8_attention", self.num_warps)
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"fp8_attention: Launch.num_stages: {self.num_stages!r}; allowed: an int in 1..8")


# DEFAULT: the launch for one-byte P.V (evidence: benchmarks/results/fp8-attention.json, m64_n128_w4_s3). BF16_PV:
# the same tiles at 2 stages for pv="bf16" (its bf16 V tiles take twice the shared memory of e4m3 ones; same file,
# m64_n128_w4_s2). Every launch spills no register on its card (ptxas on the JIT's specialization,
# tests/kernels/test_targets.py) and all share block_n, so a call computes the same maths on Ada and Hopper; ADA
# (sm_89: mma.sync, operands in registers) keeps 32 rows over 8 warps, as block_sparse_attend does there (no Ada card
# has measured it).
DEFAULT = Launch()
BF16_PV = Launch(num_stages=2)
ADA = Launch(block_m=32, block_n=128, num_warps=8, num_stages=2)


def launch_for(device: torch.device, pv: str = "fp8") -> Launch:
    """ADA below sm_90; on sm_90 and newer (and off CUDA) DEFAULT, or BF16_PV for `pv` "bf16" (one-byte v, "fp8" or
    "int8", takes DEFAULT)."""
    number = capability(device)
    if number is not None and number < 90:
        return ADA
    return BF16_PV if pv == "bf16" else DEFAULT


def qk_logits(q, k, QK_INT8: tl.constexpr):
    """s = q . k^T in fp32 (a Triton device function): an INT8 dot with int32 accumulation (exact) with QK_INT8, else
    an FP8 dot with fp32 accumulation."""
    if QK_INT8:
        s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
    else:
        s = tl.dot(q, tl.trans(k))
    return s


def pv_dot(p, v, acc, beta, PV: tl.constexpr, EMULATE: tl.constexpr):
    """acc + P . v (a Triton device function), P (M, N) fp32. PV "fp8": P (carrying the factor 448) rounded to e4m3,
    v quantize's transposed e4m3 (D, N), P's columns relabelled as v's keys were stored; "int8": P in [0, 127]
    rounded to int8, v quantize's transposed int8 (D, N), the same relabelling, the exact int32 product scaled by the
    row weights `beta` (M,) (read only here); "bf16": P rounded to bf16, v (N, D) bf16. EMULATE rounds in fp32 bits
    for the CPU interpreter (module doc)."""
    if PV != "bf16":
        # P's columns relabelled as quantize stored v's keys (attention_quantize.v_slot): registers renamed
        p = tl.reshape(
            tl.permute(tl.reshape(p, [p.shape[0], p.shape[1] // 32, 2, 2, 4, 2]), [0, 1, 2, 4, 3, 5]), p.shape
        )
    if PV == "int8":
        # 1.5 * 2^23 + P rounds P to an integer (nearest even) whose low byte is P itself (P <= 127), no F2I; the
        # int32 accumulator starts at that same bias, so its fp32 bits less 1.5 * 2^23 are the exact product
        # (|P . v| <= 127 * 127 * N < 2^22), no I2F
        p8 = (p + 12582912.0).to(tl.int32, bitcast=True).to(tl.int8)
        bias = tl.full((p.shape[0], v.shape[0]), 0x4B400000, tl.int32)
        product = tl.dot(p8, tl.trans(v), bias, out_dtype=tl.int32).to(tl.float32, bitcast=True) - 12582912.0
        acc = tl.fma(product, beta[:, None], acc)
    elif PV == "fp8":
        if EMULATE:  # round to e4m3 in fp32 (the interpreter's conversion does not)
            p = e4m3_round(p)
        acc = tl.dot(p.to(tl.float8e4nv), tl.trans(v), acc)
    elif EMULATE:  # round to bf16 in fp32, then an fp32 dot (the interpreter's bf16 dots are wrong too)
        acc = tl.dot(bf16_round(p), v.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(tl.bfloat16), v, acc)
    return acc


def new_max(m_i, top, PV: tl.constexpr):
    """The online softmax's step from running max m_i to max(m_i, top) (M,) in log2 units, `top` the tile's row max
    (a Triton device function): the new max, alpha = exp2(m_i - m_new) (the rescale of l and acc), the shift P is
    made against, `exp2(s * factor - shift)`, and the tile's row weight beta. PV "bf16": shift m_new (P <= 1), beta 1;
    "fp8": m_new - log2(448), so exp2 gives P * 448 directly, beta 1; "int8": top - log2(127), so exp2 gives P scaled
    to the tile's own row max, 127 * P / P_max in [0, 127], and beta = P_max = exp2(top - m_new) weighs the tile back
    (each row's P uses all of int8's levels whatever its tile's share of the row)."""
    m_new = tl.maximum(m_i, top)
    beta = tl.full(m_new.shape, 1.0, tl.float32)
    if PV == "fp8":
        shift = m_new - 8.807354922057604  # log2(448)
    elif PV == "int8":
        shift = top - 6.988684686772166  # log2(127)
        beta = tl.exp2(top - m_new)
    else:
        shift = m_new
    return m_new, tl.exp2(m_i - m_new), shift, beta


def quantized_tile(
    q, k, v, factor, limit, m_i, l_i, acc,
    MASKED: tl.constexpr, QK_INT8: tl.constexpr, PV: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    """One key tile of the online softmax on quantized operands (a Triton device function; the fp8_attention and
    block_sparse_attend kernels call it). q (M, D) and k (N, D): e4m3, or int8 with QK_INT8 (`qk_logits`);
    `factor`: the scalar `scale_q * scale_k * softmax scale * log2(e)`; with MASKED, keys `limit` and later weigh
    nothing (their logits are -inf: padding past Tk), else `limit` is unread. v: PV "fp8" / "int8" e4m3 / int8
    (D, N) (`quantize`'s transposed layout), "bf16" (N, D) bf16. m_i (M,) running max in log2 units, l_i (M,)
    running sum, acc (M, D) fp32; returns the updated three. P = exp2(s - m) <= 1 is rounded as `pv_dot` says:
    PV "fp8" makes it as `P * 448` (exp2 of the logit less `m - log2 448`), "int8" as `127 * P / P_max` times the
    row weight P_max (`new_max`), and l sums it so: l carries the factor 448 or 127, which the caller removes."""
    s = qk_logits(q, k, QK_INT8)
    if MASKED:
        s = tl.where(tl.arange(0, k.shape[0])[None, :] < limit, s, float("-inf"))
    m_new, alpha, shift, beta = new_max(m_i, tl.reduce(s, 1, tl.standard._elementwise_max) * factor, PV)
    p = tl.exp2(tl.fma(s, factor, -shift[:, None]))  # one FMA a logit, fused whatever the fp-fusion default
    l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine) * beta
    acc = acc * alpha[:, None]  # the P.V dots accumulate into it: no second (M, D) fp32 tile
    return m_new, l_i, pv_dot(p, v, acc, beta, PV, EMULATE)


def quantized_pair(
    q, k, v, factor, k2, v2, factor2, m_i, l_i, acc,
    QK_INT8: tl.constexpr, PV: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    """Two key tiles (k, v, factor) and (k2, v2, factor2) as one step of the online softmax, unmasked: one new max,
    one rescale of acc, the P of both rounded against that max and, with PV "int8", scaled to the row max of both
    (block_sparse_attend's exact blocks two at a time); otherwise `quantized_tile`'s maths. l adds the first tile's
    row sum, then the second's."""
    s = qk_logits(q, k, QK_INT8)
    s2 = qk_logits(q, k2, QK_INT8)
    top = tl.maximum(
        tl.reduce(s, 1, tl.standard._elementwise_max) * factor, tl.reduce(s2, 1, tl.standard._elementwise_max) * factor2
    )
    m_new, alpha, shift, beta = new_max(m_i, top, PV)
    p = tl.exp2(tl.fma(s, factor, -shift[:, None]))
    p2 = tl.exp2(tl.fma(s2, factor2, -shift[:, None]))
    l_i = (
        l_i * alpha
        + tl.reduce(p, 1, tl.standard._sum_combine) * beta
        + tl.reduce(p2, 1, tl.standard._sum_combine) * beta
    )
    acc = pv_dot(p, v, acc * alpha[:, None], beta, PV, EMULATE)
    return m_new, l_i, pv_dot(p2, v2, acc, beta, PV, EMULATE)


def _fp8_attention_fwd(
    q_ptr, qs_ptr, k_ptr, ks_ptr, v_ptr, vs_ptr, out_ptr,
    H, TQ, TK, TQP, TKP, qk_scale,
    v_sb, v_sh, v_st,
    o_sb, o_sh, o_st,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, QUANT: tl.constexpr,
    QK_INT8: tl.constexpr, PV: tl.constexpr, TOP: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    # TOP: P_TOP[PV], the factor a one-byte P and l carry (unread with PV "bf16").
    # tl.reduce with tl.standard's combines and tl.full, not tl.max/tl.sum/tl.zeros: see block_sparse_attend.
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D).to(tl.int64)
    q = tl.load(q_ptr + (bh * TQP + rows.to(tl.int64))[:, None] * D + d[None, :])  # (BLOCK_M, D) e4m3/int8, padded
    q_scale = tl.load(qs_ptr + bh * (TQP // QUANT) + (pid * BLOCK_M) // QUANT) * qk_scale
    k_desc = tl.make_tensor_descriptor(k_ptr + bh * TKP * D, shape=[TKP, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    if PV != "bf16":  # one-byte v, transposed: (D, TKP) per head
        v_desc = tl.make_tensor_descriptor(
            v_ptr + bh * D * TKP, shape=[D, TKP], strides=[TKP, 1], block_shape=[D, BLOCK_N]
        )
    else:
        v_desc = tl.make_tensor_descriptor(
            v_ptr + b * v_sb + h * v_sh, shape=[TK, D], strides=[v_st, 1], block_shape=[BLOCK_N, D]
        )
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.full((BLOCK_M,), 0.0, tl.float32)
    acc = tl.full((BLOCK_M, D), 0.0, tl.float32)
    full = TK // BLOCK_N * BLOCK_N  # tiles of BLOCK_N real keys, then one masked tile for the rest
    for start in tl.range(0, full, BLOCK_N):
        k = k_desc.load([start, 0])  # (BLOCK_N, D) e4m3 / int8
        factor = q_scale * tl.load(ks_ptr + bh * (TKP // QUANT) + start // QUANT)
        v = v_desc.load([0, start]) if PV != "bf16" else v_desc.load([start, 0])  # (D, BLOCK_N) 1 byte / (BLOCK_N, D)
        m_i, l_i, acc = quantized_tile(q, k, v, factor, 0, m_i, l_i, acc, False, QK_INT8, PV, EMULATE)
    if full < TK:  # keys past TK (zero padding) weigh nothing
        k = k_desc.load([full, 0])
        factor = q_scale * tl.load(ks_ptr + bh * (TKP // QUANT) + full // QUANT)
        v = v_desc.load([0, full]) if PV != "bf16" else v_desc.load([full, 0])
        m_i, l_i, acc = quantized_tile(q, k, v, factor, TK - full, m_i, l_i, acc, True, QK_INT8, PV, EMULATE)
    if PV != "bf16":  # P and l carry P_TOP (quantized_tile); v_scale is scale_v / P_TOP
        acc = acc * tl.load(vs_ptr + bh * D + d)[None, :]
        l_i = l_i / TOP
    out = acc / l_i[:, None]
    optr = out_ptr + b * o_sb + h * o_sh + rows.to(tl.int64)[:, None] * o_st + d[None, :]
    tl.store(optr, out.to(out_ptr.dtype.element_ty), mask=(rows < TQ)[:, None])


_KERNEL = LazyKernel(_fp8_attention_fwd, helpers=(quantized_tile, new_max, qk_logits, pv_dot, e4m3_round, bf16_round))


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pv: str, scale: float | None, qk: str) -> float:
    """Every argument of a call; returns the softmax scale (`scale`, or 1/sqrt(D) for None)."""
    name = "fp8_attention"
    check_qkv(name, q, k, v, DTYPES, head_dim_problem)
    if pv not in PV_MODES:
        raise ValueError(f"{name}: pv: {pv!r}; allowed: {list(PV_MODES)}")
    if qk not in QK_MODES:
        raise ValueError(f"{name}: qk: {qk!r}; allowed: {list(QK_MODES)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0):
        raise ValueError(f"{name}: scale: {scale!r}; allowed: a number > 0 or None (1/sqrt(head dim))")
    return q.shape[-1] ** -0.5 if scale is None else scale


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    pv: str = "fp8",
    block_n: int = DEFAULT.block_n,
    qk: str = "e4m3",
) -> torch.Tensor:
    """The kernel's maths in fp32 torch: `quantize_reference`, then the online softmax over key tiles of `block_n`
    with P rounded per tile as the kernel does. (B, H, Tq, D) in q's dtype."""
    scale = _check(q, k, v, pv, scale, qk)
    if block_n not in KEY_TILES:
        raise ValueError(f"fp8_attention: block_n: {block_n!r}; allowed: {list(KEY_TILES)}")
    z = quantize_reference(q, k, v, pv, qk)
    acc, l = online_softmax(*reference_logits(z, q.shape[2], k.shape[2], scale), pv, block_n)  # noqa: E741
    if pv != "bf16":
        acc = acc * z.v_scale[:, :, None, :]
    return (acc / l[..., None]).to(q.dtype)


def online_softmax(
    s: torch.Tensor, values: torch.Tensor, pv: str | None, block_n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The references' online softmax over logits `s` (B, H, Tq, Tk) in log2 units and `values` (B, H, Tk, D), one
    `online_step` per key tile of `block_n` (P rounded as `pv` says): the unnormalised output acc (B, H, Tq, D), which
    carries the factor 448 with pv "fp8" (127 with "int8"), and the row sum l (B, H, Tq)."""
    m = torch.full(s.shape[:3], float("-inf"), device=s.device)
    l = torch.zeros(s.shape[:3], device=s.device)  # noqa: E741
    acc = torch.zeros(s.shape[:3] + (values.shape[-1],), device=s.device)
    for start in range(0, s.shape[-1], block_n):
        tile = slice(start, start + block_n)
        m, l, acc = online_step(s[..., tile], values[:, :, tile], m, l, acc, pv)  # noqa: E741
    return acc, l


def reference_logits(z: Quantized, tq: int, tk: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The references' view of `quantize`'s operands for Tq = `tq` queries and Tk = `tk` keys: the logits in log2
    units `(q8 . k8) * ((scale_q * scale * log2(e)) * scale_k)` (B, H, Tq, Tk) fp32, in the kernel's order of
    products, and v (B, H, Tk, 128) fp32 as the P.V dot reads it (e4m3 / int8 values without their scale, or
    bf16)."""
    qk_scale = torch.tensor(scale * LOG2E, dtype=torch.float32)
    q_scale = z.q_scale.repeat_interleave(QUANT_BLOCK, 2)[:, :, :tq, None] * qk_scale  # (B, H, Tq, 1)
    k_scale = z.k_scale.repeat_interleave(QUANT_BLOCK, 2)[:, :, None, :tk]  # (B, H, 1, Tk)
    values = attention_quantize.v_in_key_order(z.v, tk).transpose(-1, -2).float() if z.pv != "bf16" else z.v.float()
    # int8 products summed over 128 channels stay below 2^24, so these fp32 logits are exact
    logits = z.q8[:, :, :tq].float() @ z.k8[:, :, :tk].float().transpose(-1, -2)
    return logits * (q_scale * k_scale), values


def online_step(
    s: torch.Tensor,
    values: torch.Tensor,
    m: torch.Tensor,
    l: torch.Tensor,  # noqa: E741
    acc: torch.Tensor,
    pv: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One key tile of the references' online softmax, as `quantized_tile` computes it: logits `s` (B, H, Tq, n) in
    log2 units, `values` (B, H, n, D); running max m, sum l (B, H, Tq) and acc (B, H, Tq, D). P is rounded to e4m3
    as `P * 448` (pv "fp8"), to int8 as `127 * P / P_max` weighed back by the tile's row max P_max (pv "int8",
    `new_max`), to bf16 ("bf16") or not at all (None); l sums P unrounded. A row with no finite logit yet keeps zero
    weight. Returns the updated (m, l, acc)."""
    top = s.amax(-1)  # the tile's row max
    m_new = torch.maximum(m, top)
    m_use = torch.where(m_new == float("-inf"), 0.0, m_new)
    alpha = torch.exp2(m - m_use)
    p = torch.exp2(s - m_use[..., None])
    l = l * alpha + p.sum(-1)  # noqa: E741
    if pv == "int8":
        top = torch.where(top == float("-inf"), m_use, top)  # a tile with no finite logit: P = 0
        p = torch.exp2(s - (top - math.log2(INT8_MAX))[..., None]).round()  # (B, H, Tq, n) integers in 0..127
        return m_new, l, acc * alpha[..., None] + torch.exp2(top - m_use)[..., None] * (p @ values)
    if pv == "fp8":
        p = (p * FP8_MAX).to(FP8).float()
    elif pv == "bf16":
        p = p.to(torch.bfloat16).float()
    return m_new, l, acc * alpha[..., None] + p @ values


def fp8_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    pv: str = "fp8",
    launch: Launch | None = None,
    qk: str = "e4m3",
    kernel: str = "auto",
) -> torch.Tensor:
    """`reference(q, k, v, scale, pv, launch.block_n, qk=qk)` up to the contract (module doc): `quantize`, then
    `attend` (`kernel` and `launch` as there), on q, k, v zero-padded to the kernel's head dim when theirs is not one
    (module doc). `scale` defaults to 1/sqrt(D)."""
    scale = _check(q, k, v, pv, scale, qk)
    check_kernel("fp8_attention", kernel, launch, Launch)
    check_runtime("fp8_attention", q, k, v)
    check_fp8("fp8_attention", q.device)
    out = torch.empty_like(q)  # q's memory order when q is a dense permutation, else contiguous
    qp, kp, vp = pad_head_dim(q, k, v)
    wide = out if qp is q else torch.empty_like(qp)  # the kernel's head dim: padded, written back into out after
    attend(quantize(qp, kp, vp, pv, qk=qk), wide, k.shape[2], scale, launch, kernel)
    if wide is not out:
        out.copy_(wide[..., : q.shape[-1]])
    return out


@functools.cache
def _cute_dsl_installed() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def sm90_ready(device: torch.device) -> bool:
    """Whether the CuTe DSL kernel (`fp8_attention_sm90`) can run on `device`: sm_90, outside the interpreter, the DSL
    (nvidia-cutlass-dsl) importable (looked up once a process: `attend` asks on every call)."""
    return (
        device.type == "cuda"  # (a CPU compiling for sm_90 under `targets.built_for` keeps the Triton kernel)
        and capability(device) == 90
        and not interpreting()
        and _cute_dsl_installed()
    )


def sm90_serves(pv: str, device: torch.device) -> bool:
    """Whether the CuTe DSL kernel serves `pv`'s calls on `device` where their shapes allow (`sm90_kernel`): a
    one-byte P.V (pv="fp8" or "int8") and `sm90_ready`."""
    return pv in P_TOP and sm90_ready(device)


def sm90_kernel(z: Quantized, out: torch.Tensor) -> bool:
    """Whether `attend` with kernel="auto" runs the CuTe DSL kernel (FlashAttention-3's schedule, row sums from the
    P.V dot): `sm90_serves` z's pv on out's device, D = 128 and out's channels contiguous; the Triton kernel runs
    everywhere else. Same operands, same maths but for l (that module's doc: under 5e-3 relative L2 between
    the two)."""
    return out.shape[-1] == 128 and out.stride(-1) == 1 and sm90_serves(z.pv, out.device)


def check_kernel(name: str, kernel: str, launch: object, launch_type: type) -> None:
    """ValueError (`name`: the entry's) unless `kernel` is one of KERNELS and `launch` is None or, with
    kernel="triton" only, a `launch_type`: a launch is the Triton kernel's, so it never silently replaces the CuTe
    kernel that "auto" picks where it runs."""
    if kernel not in KERNELS:
        raise ValueError(f"{name}: kernel: {kernel!r}; allowed: {list(KERNELS)}")
    if launch is None:
        return
    if kernel != "triton":
        raise ValueError(
            f"{name}: launch: given with kernel={kernel!r}; allowed: None, or a launch with kernel='triton'"
        )
    if not isinstance(launch, launch_type):
        raise ValueError(f"{name}: launch: {launch!r}; allowed: None or a {launch_type.__qualname__}")


def attend(
    z: Quantized, out: torch.Tensor, tk: int, scale: float, launch: Launch | None = None, kernel: str = "auto"
) -> None:
    """The kernel alone (step 3) on `quantize`'s operands of Tk = `tk` keys, written into `out` (B, H, Tq, D) of
    any strides, D one of `_runtime.KERNEL_HEAD_DIMS`. `kernel` "auto": the CuTe kernel where `sm90_kernel` says so,
    else the Triton kernel at `launch_for`'s launch; "triton": the Triton kernel at `launch` (default `launch_for`;
    a launch needs kernel="triton", `check_kernel`). No checks beyond these two: `fp8_attention` is the checked
    entry."""
    check_kernel("fp8_attention", kernel, launch, Launch)
    if kernel == "auto" and sm90_kernel(z, out):
        from workbench.kernels import fp8_attention_sm90

        fp8_attention_sm90.attend(z, out, tk, scale)
        return
    launch = launch_for(out.device, z.pv) if launch is None else launch
    b, h, tq, d = out.shape
    emulate = interpreting()
    if emulate:
        tuning = {}
    else:
        tuning = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
        triton.set_allocator(tma_scratch)  # device-side descriptors need Triton's global scratch
    v_scale = z.q_scale if z.v_scale is None else z.v_scale  # (unread with pv="bf16")
    _KERNEL[(triton.cdiv(tq, launch.block_m), b * h)](
        z.q8, z.q_scale, z.k8, z.k_scale, z.v, v_scale, out,
        h, tq, tk, z.q8.shape[2], z.k8.shape[2], scale * LOG2E,
        *z.v.stride()[:3], *out.stride()[:3],
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, D=d, QUANT=QUANT_BLOCK,
        QK_INT8=z.qk == "int8", PV=z.pv, TOP=P_TOP.get(z.pv, 1.0), EMULATE=emulate, **tuning,
    )  # fmt: skip


def cost(shape: tuple[int, int, int, int], pv: str = "fp8", dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(bytes_moved, flops) of one call on q, k, v of `shape` (B, H, T, D), self-attention. Flops: 4*T*T*D per head
    (Q.K^T and P.V), as dense attention is counted. Bytes, lower bounds: the quantization's (`attention_quantize.cost`)
    and the kernel's: q8, k8 (one byte an element, e4m3 and int8 alike) and v (one byte, two for pv="bf16") read once
    (re-reads of K/V by other query tiles are assumed to hit L2), the output written in `dtype`. Exponentials are not
    counted."""
    b, h, t, d = shape
    kernel_bytes = b * h * t * d * (2 + (2 if pv == "bf16" else 1) + dtype_size(dtype))
    return int(attention_quantize.cost(shape, pv, dtype) + kernel_bytes), int(b * h * 4 * t * t * d)
