"""Block-sparse attention, stage 2: the attention kernel over a routing plan's per-query-block key lists.

For query block i (64 rows) of one (batch, head), the kernel computes one softmax over
- the keys of the exact key blocks of i (the first count[b, h, i] entries of idx[b, h, i], ascending), and
- one pseudo-key per folded key block j (every block not exact for i): key `mean_k(j)`, value `mean_v(j)`, and
  `log(length_j)` added to its logit, so it weighs as `length_j` identical keys.

One program per (query block, batch*head); query blocks vary fastest over the grid, so the programs resident at
once read one head's K/V (L2 reuse). The program first walks its exact list (FlashAttention-2 style online
softmax over 64 x 64 tiles, exp2 with log2(e) folded into the scale; K/V tiles by per-head TMA tensor descriptors,
rows past Tk read as zeros and masked to -inf by a (64,) bias), then the folded blocks' mean keys 64 at a time
(one dot per chunk, exact blocks masked out, chunks with no folded block skipped), in the same running max / sum /
accumulator.

Dtypes: bf16 on a GPU runs bf16 Q K^T and P @ V dots with fp32 accumulation (P and the mean keys/values rounded to
bf16, as flash attention does); fp32 inputs run IEEE-precision fp32 dots. INTERPRETER_BF16: the Triton CPU
interpreter computes `tl.dot` on bfloat16 operands wrongly (numpy has no bfloat16), so under
`TRITON_INTERPRET=1` q, k, v are widened to fp32 (exact) and the dots run in fp32.

Low precision (`attend(..., quantized=z)`, `block_sparse_attention(..., precision=...)`): the exact blocks go
through `fp8_attention.quantized_tile` / `quantized_pair` on z's int8/e4m3 q and k rows (the q8 tile and the
per-128-token scales are loaded once per program; a 64-key block indexes its k scale) and z's e4m3 / int8
(transposed) or bf16 v, in the order below; after the exact
list the accumulator takes v's per-channel one-byte scale, so the folded pass adds real-valued mean values to it. The
folded pass runs as in the exact path, on q in its dtype. k and v are quantized once per call, before the kernel
(`attention_quantize.quantize`, the dense kernel's operands); a visit only loads its one-byte tiles and one k scale.
The list is ascending, so only its last entry can be the key block that ends past Tk: that one visit masks those
logits (a select per logit), the others take none. The unmasked ones go two at a time (`fp8_attention.quantized_pair`:
one max and one rescale of the accumulator per pair, P of both rounded against that max), an odd one out alone, then
the masked one alone; `block_sparse_attention.reference` visits them so.

Contract against the dense torch maths of the same routing (`block_sparse_attention.reference`): equal up to
rounding (fp32: ~1e-6; bf16: ~1e-2 absolute on unit-scale values, the output itself rounded to bf16).

Launch (`Launch`): warps and software-pipeline stages of the kernel on a GPU (the interpreter takes neither). The
maths does not depend on it; float rounding inside the dots may. TMA needs K and V with unit last stride and
16-byte aligned base and strides (ValueError otherwise); on a GPU a Triton global-scratch allocator is installed
for the device-side descriptors (128 bytes a program).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from workbench.kernels._rounding import bf16_round
from workbench.kernels._runtime import LazyKernel, capability, interpreting, tma_ready, tma_scratch
from workbench.kernels.attention_quantize import P_TOP, QUANT_BLOCK, Quantized, e4m3_round
from workbench.kernels.block_sparse_routing import BLOCK
from workbench.kernels.fp8_attention import (
    LOG2E,
    check_kernel,
    new_max,
    pv_dot,
    qk_logits,
    quantized_pair,
    quantized_tile,
    sm90_kernel,
)
from workbench.kernels.fp8_attention import sm90_serves as fp8_sm90_serves


@dataclass(frozen=True)
class Launch:
    """The attention kernel's GPU launch: `num_warps` warps per program, `num_stages` software-pipeline stages, and
    `rows` query rows per program (a 64-row query block is split over 64 // rows programs that share its key list)."""

    num_warps: int = 4
    num_stages: int = 3
    rows: int = BLOCK

    def __post_init__(self) -> None:
        if self.num_warps not in (1, 2, 4, 8, 16) or not 1 <= self.num_stages <= 8 or self.rows not in (16, 32, 64):
            raise ValueError(
                f"block_sparse_attention: Launch num_warps must be a power of two <= 16, num_stages 1..8 and rows "
                f"16, 32 or 64, got {self.num_warps!r}, {self.num_stages!r}, {self.rows!r}"
            )


DEFAULT = Launch()
# Below sm_90 the dots are mma.sync with operands in registers: a program keeps its fp32 accumulator, query tile and
# scores there, and 32 rows over 8 warps hold a quarter of a 64-row program's share a thread. Chosen from compile
# reports (tests/kernels/test_targets.py checks it spills no more than DEFAULT on sm_90); not timed on such a card.
AMPERE_ADA = Launch(num_warps=8, num_stages=2, rows=32)


def launch_for(device: torch.device) -> Launch:
    """The launch used on `device` when none is given: DEFAULT on sm_90 and newer (and off CUDA), AMPERE_ADA below."""
    number = capability(device)
    return AMPERE_ADA if number is not None and number < 90 else DEFAULT


@dataclass
class Plan:
    """Everything the kernel reads besides q, k, v (the routing and its compacted lists), for one call.

    k_mean/v_mean (B, H, Kb, D) in the dot dtype; log_len (Kb,) fp32; mask bool (B, H, Qb, Kb);
    idx int32 (B, H, Qb, Kb) whose first count[b, h, i] entries are query block i's exact key blocks, ascending;
    count int32 (B, H, Qb); density: fraction of exact pairs (0-dim tensor, no host sync); scale: the softmax scale;
    key_mean (B, H, 1, D) and v_amax (B, H, D) fp32: the low-precision path's quantizer statistics
    (`block_sparse_routing.Means`), None unless asked for."""

    k_mean: torch.Tensor
    v_mean: torch.Tensor
    log_len: torch.Tensor
    mask: torch.Tensor
    idx: torch.Tensor
    count: torch.Tensor
    density: torch.Tensor
    scale: float
    key_mean: torch.Tensor | None = None
    v_amax: torch.Tensor | None = None


def _lowbit_block(k_desc, v_desc, ks_base, q_scale, j, BLOCK: tl.constexpr, QUANT: tl.constexpr, PV: tl.constexpr):
    """Key block j's tiles, k (BLOCK, D) one byte and v (D, BLOCK) one byte (PV "fp8", "int8") or (BLOCK, D) bf16, and
    the factor of its logits (q's scale times the block's k scale; the low-precision path, a Triton device
    function)."""
    k = k_desc.load([j * BLOCK, 0])
    v = v_desc.load([0, j * BLOCK]) if PV != "bf16" else v_desc.load([j * BLOCK, 0])
    return k, v, q_scale * tl.load(ks_base + (j * BLOCK) // QUANT)


def _block_sparse_fwd(
    q_ptr, k_ptr, v_ptr, km_ptr, vm_ptr, loglen_ptr, mask_ptr, idx_ptr, count_ptr, out_ptr,
    q8_ptr, qs_ptr, ks_ptr, vs_ptr,
    H, TQ, TK, KB, QB, qk_scale, TQP, TKP,
    q_sb, q_sh, q_st, q_sd,
    k_sb, k_sh, k_st,
    v_sb, v_sh, v_st,
    F32: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
    LOWBIT: tl.constexpr, QK_INT8: tl.constexpr, PV: tl.constexpr, QUANT: tl.constexpr, TOP: tl.constexpr,
    LOG2E: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    # TOP: P_TOP[PV], the factor a one-byte P and l carry (read with LOWBIT and a one-byte PV only).
    # Reductions are tl.reduce with tl.standard's combines, and zeros are tl.full: tl.sum/tl.max/tl.zeros are
    # JITFunctions decorated when triton was imported, which the interpreter cannot call when
    # TRITON_INTERPRET was set later (LazyKernel's case).
    part = tl.program_id(0)  # ROWS query rows: part `part % (BLOCK // ROWS)` of query block g
    g = part // (BLOCK // ROWS)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = part * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    d = tl.arange(0, D).to(tl.int64)
    row_ok = rows < TQ
    q = tl.load(
        q_ptr + b * q_sb + h * q_sh + rows.to(tl.int64)[:, None] * q_st + d[None, :] * q_sd,
        mask=row_ok[:, None],
        other=0.0,
    )  # (ROWS, D)
    if F32:
        q = q.to(tl.float32)
    m_i = tl.full((ROWS,), float("-inf"), tl.float32)
    l_i = tl.full((ROWS,), 0.0, tl.float32)
    acc = tl.full((ROWS, D), 0.0, tl.float32)
    row = bh.to(tl.int64) * QB + g  # this query block's row of mask, idx and count
    # 1. Exact key blocks, from the compacted list; K/V tiles through per-head 2-D TMA descriptors
    n_exact = tl.load(count_ptr + row)
    k_desc = tl.make_tensor_descriptor(
        k_ptr + b * k_sb + h * k_sh, shape=[TK, D], strides=[k_st, 1], block_shape=[BLOCK, D]
    )
    if LOWBIT and PV != "bf16":  # quantize's one-byte v, transposed: (D, TKP) per head
        v_desc = tl.make_tensor_descriptor(
            v_ptr + b * v_sb + h * v_sh, shape=[D, TKP], strides=[v_st, 1], block_shape=[D, BLOCK]
        )
    else:
        v_desc = tl.make_tensor_descriptor(
            v_ptr + b * v_sb + h * v_sh, shape=[TK, D], strides=[v_st, 1], block_shape=[BLOCK, D]
        )
    if LOWBIT:  # quantize's padded q8 rows and the per-128-token scales (module doc: low precision)
        q8 = tl.load(q8_ptr + (bh.to(tl.int64) * TQP + rows.to(tl.int64))[:, None] * D + d[None, :])
        q_scale = tl.load(qs_ptr + bh.to(tl.int64) * (TQP // QUANT) + (part * ROWS) // QUANT) * qk_scale
        ks_base = ks_ptr + bh.to(tl.int64) * (TKP // QUANT)
        # the list is ascending, so only its last entry can be the key block that ends past TK: the rest unmasked
        n_full = n_exact
        if TK % BLOCK != 0 and n_exact > 0:
            n_full -= (tl.load(idx_ptr + row * KB + n_exact - 1) == KB - 1).to(tl.int32)
        for n in tl.range(0, n_full - 1, 2):  # two blocks a softmax step: one max and one rescale of acc per pair
            j, j2 = tl.load(idx_ptr + row * KB + n), tl.load(idx_ptr + row * KB + n + 1)
            k, v, factor = _lowbit_block(k_desc, v_desc, ks_base, q_scale, j, BLOCK, QUANT, PV)
            k2, v2, factor2 = _lowbit_block(k_desc, v_desc, ks_base, q_scale, j2, BLOCK, QUANT, PV)
            m_i, l_i, acc = quantized_pair(q8, k, v, factor, k2, v2, factor2, m_i, l_i, acc, QK_INT8, PV, EMULATE)
        if n_full % 2 == 1:  # an odd one out, alone
            j = tl.load(idx_ptr + row * KB + n_full - 1)
            k, v, factor = _lowbit_block(k_desc, v_desc, ks_base, q_scale, j, BLOCK, QUANT, PV)
            m_i, l_i, acc = quantized_tile(q8, k, v, factor, 0, m_i, l_i, acc, False, QK_INT8, PV, EMULATE)
        if n_full < n_exact:  # the last key block, keys past TK masked
            k, v, factor = _lowbit_block(k_desc, v_desc, ks_base, q_scale, KB - 1, BLOCK, QUANT, PV)
            m_i, l_i, acc = quantized_tile(
                q8, k, v, factor, TK - (KB - 1) * BLOCK, m_i, l_i, acc, True, QK_INT8, PV, EMULATE
            )
    else:
        for n in tl.range(0, n_exact):
            j = tl.load(idx_ptr + row * KB + n)
            key_ok = j * BLOCK + cols < TK
            k = k_desc.load([j * BLOCK, 0])
            v = v_desc.load([j * BLOCK, 0])
            if F32:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            # keys past TK get -inf through one fused multiply-add (a (BLOCK,) bias, not a select per element)
            s = s * qk_scale + tl.where(key_ok, 0.0, float("-inf"))[None, :]  # (ROWS, BLOCK), log2 units
            m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no finite logit yet stays at zero weight
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            if F32:
                pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    if LOWBIT and PV != "bf16":  # P.V ran on one-byte v without its per-channel scale; the folded pass adds real values
        acc = acc * tl.load(vs_ptr + bh.to(tl.int64) * D + d)[None, :]
        l_i = l_i / TOP  # P and l carried P_TOP (quantized_tile); folded weights are real
    # 2. Folded key blocks: their mean keys, BLOCK at a time, as pseudo-keys with log(length) on the logit.
    # km/vm arrive in the dot's dtype (bf16 rounded once when the means are made, or fp32); .to() is then a no-op.
    means = bh.to(tl.int64) * KB * D
    for c in range(0, KB, BLOCK):
        blocks = c + cols
        block_ok = blocks < KB
        folded = tl.load(mask_ptr + row * KB + blocks, mask=block_ok, other=1) == 0  # (BLOCK,)
        n_folded = tl.reduce(folded.to(tl.int32), 0, tl.standard._sum_combine)
        if n_folded > 0:  # skip chunks that are all exact
            moff = means + blocks.to(tl.int64)[:, None] * D + d[None, :]
            km = tl.load(km_ptr + moff, mask=block_ok[:, None], other=0.0)  # (BLOCK, D)
            vm = tl.load(vm_ptr + moff, mask=block_ok[:, None], other=0.0)
            if F32:
                s = tl.dot(q, tl.trans(km), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(km.to(q.dtype)))
            bias = tl.load(loglen_ptr + blocks, mask=block_ok, other=0.0) * LOG2E
            s = tl.where(folded[None, :], s * qk_scale + bias[None, :], float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            if F32:
                pv = tl.dot(p, vm, input_precision="ieee")
            else:
                pv = tl.dot(p.to(q.dtype), vm.to(q.dtype))
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    out = acc / l_i[:, None]
    optr = out_ptr + (bh.to(tl.int64) * TQ + rows.to(tl.int64))[:, None] * D + d[None, :]
    tl.store(optr, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


_KERNEL = LazyKernel(
    _block_sparse_fwd,
    helpers=(_lowbit_block, quantized_tile, quantized_pair, new_max, qk_logits, pv_dot, e4m3_round, bf16_round),
)


def _check_tma(k: torch.Tensor, v: torch.Tensor) -> None:
    for arg, x in (("k", k), ("v", v)):
        if not tma_ready(x):
            raise ValueError(
                f"block_sparse_attention: the kernel reads {arg} through TMA descriptors and needs unit last stride "
                f"and 16-byte aligned base and strides (tma), got strides {tuple(x.stride())} ({x.dtype}) at "
                f"address {x.data_ptr():#x}"
            )


# (qk, pv) pairs `attend` runs on the CuTe kernel by default: each checked against the Triton kernel and the fp32
# reference on lists of one step as well as long ones (benchmarks/results/probes/2026-12-06-block-sparse-cute-h100.json)
SM90_PAIRS = (("e4m3", "fp8"), ("int8", "fp8"), ("int8", "int8"))


def sm90_serves(qk: str, pv: str, device: torch.device) -> bool:
    """Whether the CuTe kernel serves (qk, pv)'s low-precision calls on `device` where their tensors allow
    (`sm90_sparse`): a pair of SM90_PAIRS that `fp8_attention.sm90_serves`."""
    return (qk, pv) in SM90_PAIRS and fp8_sm90_serves(pv, device)


def sm90_sparse(z: Quantized, q: torch.Tensor) -> bool:
    """Whether `attend` with kernel="auto" runs the CuTe kernel on `quantize`'s operands `z` of q: a pair of
    SM90_PAIRS, bf16 q that TMA can read and `fp8_attention.sm90_kernel` (sm_90, the CuTe DSL, D = 128)."""
    return (z.qk, z.pv) in SM90_PAIRS and q.dtype == torch.bfloat16 and tma_ready(q) and sm90_kernel(z, q)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    route: Plan,
    launch: Launch | None = None,
    quantized: Quantized | None = None,
    kernel: str = "auto",
) -> torch.Tensor:
    """The attention kernel alone on a `plan(...)` of the same q, k, v: (B, H, Tq, D) contiguous in q's dtype.
    `quantized`: `attention_quantize.quantize` of the same q, k, v; the exact blocks then run on it (module doc: low
    precision) and `route.k_mean` must be smoothed by its k_mean. `kernel` "auto": where `sm90_sparse` holds, the
    CuTe kernel (`fp8_attention_sm90.attend_sparse`: the same visits and maths up to fp32 order and l, which sums P
    as rounded there), else the Triton kernel at `launch_for`'s launch; "triton": the Triton kernel at `launch`
    (default `launch_for(q.device)`; a launch needs kernel="triton", `fp8_attention.check_kernel`)."""
    check_kernel("block_sparse_attention", kernel, launch, Launch)
    z = quantized
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if z is not None and kernel == "auto" and sm90_sparse(z, q):
        from workbench.kernels import fp8_attention_sm90

        fp8_attention_sm90.attend_sparse(z, q, route, k.shape[2], out)
        return out
    launch = launch_for(q.device) if launch is None else launch
    if z is None:
        _check_tma(k, v)
    b, h, tq, d = q.shape
    qb, kb = route.mask.shape[-2:]
    emulate = interpreting()
    if emulate:
        tuning = {}
    else:
        tuning = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
        triton.set_allocator(tma_scratch)  # device-side descriptors need Triton's global scratch
    if z is None:  # the exact path: the low-precision operands are not read
        kv, lowbit, scales = (k, v), {"QK_INT8": False, "PV": "bf16", "TOP": 1.0}, (q, q, q, q, 1, 1)
    else:
        kv = (z.k8, z.v)
        lowbit = {"QK_INT8": z.qk == "int8", "PV": z.pv, "TOP": P_TOP.get(z.pv, 1.0)}
        v_scale = z.q_scale if z.v_scale is None else z.v_scale  # (unread with pv="bf16")
        scales = (z.q8, z.q_scale, z.k_scale, v_scale, z.q8.shape[2], z.k8.shape[2])
    _KERNEL[(qb * (BLOCK // launch.rows), b * h)](
        q, *kv, route.k_mean, route.v_mean, route.log_len, route.mask.view(torch.uint8), route.idx, route.count, out,
        *scales[:4], h, tq, k.shape[2], kb, qb, route.scale * LOG2E, *scales[4:],
        *q.stride(), *kv[0].stride()[:3], *kv[1].stride()[:3],
        F32=q.dtype == torch.float32 or emulate, BLOCK=BLOCK, ROWS=launch.rows, D=d,
        LOWBIT=z is not None, QUANT=QUANT_BLOCK, LOG2E=LOG2E, EMULATE=emulate, **lowbit, **tuning,
    )  # fmt: skip
    return out
