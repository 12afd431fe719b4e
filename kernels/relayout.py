"""Direct Ulysses (sequence-head) relayouts for the all-to-all (contract: bitwise).

The two-device sequence-head path exchanges attention inputs and outputs with one all-to-all each way:

- `pack_qkv(q, k, v, W)`: q, k, v (B, T_local, H, D) with any strides (typically views of one fused
  projection) -> destination-major (W, B, T_local, 3, H/W, D) contiguous; slot r holds heads
  [r*H/W, (r+1)*H/W) for rank r. The q/k/v axis sits next to the heads on purpose: what a rank receives
  from the one all-to-all is (W, B, T_local, 3, H/W, D) in source order, which for B == 1 *is* the
  (B, T_full, 3, H/W, D) layout of a fused projection, so q, k and v are strided views of it and no
  unpack copy follows the exchange.
- `split_result(out, W)`: this rank's attention output (B, T_full, H/W, D) -> destination-major
  (W, B, T_full/W, H/W, D) contiguous; slot r holds the sequence chunk that rank r owns.
- `merge_heads(received, W)`: the received chunks (W, B, T_local, H/W, D) -> (B, T_local, H, D)
  contiguous with rank r's heads at [r*H/W, (r+1)*H/W).

Each replaces a materialised stack/permute/contiguous (or reshape/permute/contiguous) chain, kept beside it
as `*_reference`, with one Triton pass that reads the source strides and writes every destination element
exactly once, with no stacked intermediate (the pack's transient peak is its output alone).

Contract: bitwise. Pure element movement: the output is `torch.equal` to the reference for every dtype (bf16,
fp16, fp32), odd sequence lengths and non-contiguous inputs, whatever the launch.

Kernel: one copy kernel serves all three. Each op is written as a 5-D index (i0, i1, i2, i3, c) = (small, small,
the sequence, head-in-rank, head dim) with source and destination strides per dimension. A program owns one
(i0, i1) pair, found once per program, and a tile of `Launch.tile // BLOCK_C` rows of the flattened (i2, i3)
index by BLOCK_C (<= 128) head-dim columns: i2 and i3 come from a division by N3 (the heads per rank, a
compile-time constant, so a multiply-shift), the head dim is the contiguous, vectorised axis, and offsets are
int32 unless some offset of the launch (masked padding included) reaches 2**31. `pack_qkv` moves q, k and v in
the same program when their strides agree (one launch; the three operands' rows of one token are neighbours in
the destination), else one launch per operand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from workbench.kernels._runtime import (
    LazyKernel,
    capability,
    check_float,
    check_power_of_two,
    check_runtime,
    check_warps,
    dtype_size,
)

MAX_BLOCK_C = 128
_INT32_LIMIT = 2**31


@dataclass(frozen=True)
class Launch:
    """How the copy is tiled on the GPU (it never changes the result). tile: elements per operand per program (a
    power of two; rows = tile // BLOCK_C). num_warps: warps per program."""

    tile: int = 8192
    num_warps: int = 4

    def __post_init__(self) -> None:
        check_power_of_two("relayout", "tile", self.tile)
        check_warps("relayout", self.num_warps)


DEFAULT = Launch()  # sm_90's: measured on the H200
# sm_80/86/89: the H200's tile with twice the warps, which halves the registers a thread holds. Chosen from compile
# reports (tests/kernels/test_targets.py checks it spills no more than DEFAULT on sm_90); not timed on such a card.
AMPERE_ADA = Launch(num_warps=8)


def launch_for(device: torch.device) -> Launch:
    """The launch the copy uses on `device` when none is given: DEFAULT on sm_90 and newer (and off CUDA),
    AMPERE_ADA below."""
    number = capability(device)
    return AMPERE_ADA if number is not None and number < 90 else DEFAULT


def _tiled_copy(
    src0_ptr, src1_ptr, src2_ptr, dst_ptr,
    N1, R, C, BLOCKS,
    s0, s1, s2, s3, s4,
    d0, d1, d2, d3, d4, d_slot,
    N3: tl.constexpr, NSRC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    EVEN_C: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """dst[i0, i1, i2, i3, c] (+ slot * d_slot) = src_slot[i0, i1, i2, i3, c]; program (pid0, pid1) owns
    (i0, i1) = divmod(pid0 // BLOCKS, N1), rows [(pid0 % BLOCKS) * BLOCK_R, ...) of the flattened
    (i2, i3) < R = N2 * N3, and columns [pid1 * BLOCK_C, ...) < C."""
    pid = tl.program_id(0)
    outer = pid // BLOCKS
    block = pid - outer * BLOCKS
    i0 = outer // N1
    i1 = outer - i0 * N1
    rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    if WIDE:
        i0 = i0.to(tl.int64)
        i1 = i1.to(tl.int64)
        rows = rows.to(tl.int64)
        cols = cols.to(tl.int64)
    i2 = rows // N3
    i3 = rows - i2 * N3
    src = (i0 * s0 + i1 * s1) + (i2 * s2 + i3 * s3)[:, None] + (cols * s4)[None, :]
    dst = (i0 * d0 + i1 * d1) + (i2 * d2 + i3 * d3)[:, None] + (cols * d4)[None, :]
    if EVEN_C:
        mask = tl.broadcast_to((rows < R)[:, None], (BLOCK_R, BLOCK_C))
    else:
        mask = (rows < R)[:, None] & (cols < C)[None, :]
    tl.store(dst_ptr + dst, tl.load(src0_ptr + src, mask=mask), mask=mask)
    if NSRC == 3:
        tl.store(dst_ptr + d_slot + dst, tl.load(src1_ptr + src, mask=mask), mask=mask)
        tl.store(dst_ptr + 2 * d_slot + dst, tl.load(src2_ptr + src, mask=mask), mask=mask)


_TILED = LazyKernel(_tiled_copy)


def _max_offset(sizes: tuple[int, ...], strides: tuple[int, ...]) -> int:
    return sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))


def _copy(
    srcs: tuple[torch.Tensor, ...],
    dst: torch.Tensor,
    sizes: tuple[int, int, int, int, int],
    src_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    launch: Launch,
    d_slot: int = 0,
) -> None:
    """dst[i0..i4] (+ slot * d_slot) = srcs[slot][i0..i4] over `sizes` (1 or 3 sources), addressed through the
    given element strides (every source has `src_strides`)."""
    n0, n1, n2, n3, c = sizes
    rows = n0 * n1 * n2 * n3
    if rows == 0 or c == 0:
        return
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(c))
    if len(srcs) not in (1, 3):
        raise ValueError(f"relayout: the copy kernel takes 1 or 3 sources per launch, got {len(srcs)}")
    block_r = max(1, launch.tile // block_c)
    per_outer = n2 * n3
    blocks = triton.cdiv(per_outer, block_r)
    col_blocks = triton.cdiv(c, block_c)
    # the largest offset any lane forms, masked lanes (padded rows and columns) included
    padded = (n0, n1, (blocks * block_r - 1) // n3 + 1, n3, col_blocks * block_c)
    reach = max(_max_offset(padded, src_strides), _max_offset(padded, dst_strides) + (len(srcs) - 1) * d_slot)
    wide = reach >= _INT32_LIMIT
    grid = (n0 * n1 * blocks, col_blocks)
    src0, src1, src2 = srcs if len(srcs) == 3 else (srcs[0],) * 3
    _TILED[grid](
        src0, src1, src2, dst, n1, per_outer, c, blocks, *src_strides, *dst_strides, d_slot,
        N3=n3, NSRC=len(srcs), BLOCK_R=block_r, BLOCK_C=block_c, EVEN_C=c % block_c == 0, WIDE=wide,
        num_warps=launch.num_warps,
    )  # fmt: skip


def _check_launch(launch: Launch | None, device: torch.device) -> Launch:
    if launch is None:
        return launch_for(device)
    if not isinstance(launch, Launch):
        raise ValueError(f"relayout: launch must be a relayout.Launch, got {type(launch).__name__}")
    return launch


def _check_world(name: str, world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"{name}: world_size must be a positive int, got {world_size!r}")


def _divisible(name: str, what: str, value: int, world_size: int) -> int:
    if value % world_size:
        raise ValueError(f"{name}: {what}={value} is not divisible by world_size={world_size}")
    return value // world_size


# ---------------------------------------------------------------------------------------------- QKV pack


def pack_qkv_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int) -> torch.Tensor:
    """The materialised chain: stack beside the heads, split heads per rank, move the rank axis first, copy."""
    b, t, h, d = q.shape
    stacked = torch.stack((q, k, v), dim=2).view(b, t, 3, world_size, h // world_size, d)
    return stacked.permute(3, 0, 1, 2, 4, 5).contiguous()


def pack_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int, launch: Launch | None = None
) -> torch.Tensor:
    """`pack_qkv_reference(q, k, v, world_size)` in one strided pass (one launch when q, k and v share their
    strides, else one per operand), no stacked intermediate."""
    name = "pack_qkv"
    _check_world(name, world_size)
    for arg, tensor in (("q", q), ("k", k), ("v", v)):
        check_float(name, arg, tensor)
    if q.ndim != 4:
        raise ValueError(f"{name}: q must be (B, T_local, H, D), got shape {tuple(q.shape)}")
    for arg, tensor in (("k", k), ("v", v)):
        if tensor.shape != q.shape:
            raise ValueError(f"{name}: {arg} has shape {tuple(tensor.shape)}; expected q's shape {tuple(q.shape)}")
        if tensor.dtype != q.dtype:
            raise ValueError(f"{name}: {arg} has dtype {tensor.dtype}; expected q's dtype {q.dtype}")
    check_runtime(name, q, k, v)
    b, t, h, d = q.shape
    hw = _divisible(name, "H (q.shape[2])", h, world_size)
    launch = _check_launch(launch, q.device)
    out = torch.empty((world_size, b, t, 3, hw, d), dtype=q.dtype, device=q.device)
    dst_strides = out.stride()[:3] + out.stride()[4:]
    sizes = (world_size, b, t, hw, d)  # (rank, b, t, head-in-rank, d); head = rank * hw + head-in-rank

    def strides(src: torch.Tensor) -> tuple[int, ...]:
        sb, st, sh, sd = src.stride()
        return (hw * sh, sb, st, sh, sd)

    if q.stride() == k.stride() == v.stride():
        _copy((q, k, v), out, sizes, strides(q), dst_strides, launch, d_slot=out.stride(3))
        return out
    for slot, src in enumerate((q, k, v)):
        _copy((src,), out[:, :, :, slot], sizes, strides(src), dst_strides, launch)
    return out


# ------------------------------------------------------------------------------- attention-result split


def split_result_reference(out: torch.Tensor, world_size: int) -> torch.Tensor:
    """The materialised chain: split the sequence per rank, move the rank axis first, copy."""
    b, t, hw, d = out.shape
    return out.reshape(b, world_size, t // world_size, hw, d).permute(1, 0, 2, 3, 4).contiguous()


def split_result(out: torch.Tensor, world_size: int, launch: Launch | None = None) -> torch.Tensor:
    """`split_result_reference(out, world_size)` in one strided pass; a contiguous batch-1 `out` is already rank-major,
    so it is returned as a view (what the reference's `.contiguous()` also does: no copy at all)."""
    name = "split_result"
    _check_world(name, world_size)
    check_float(name, "out", out)
    if out.ndim != 4:
        raise ValueError(f"{name}: out must be (B, T_full, H/W, D), got shape {tuple(out.shape)}")
    check_runtime(name, out)
    b, t, hw, d = out.shape
    tc = _divisible(name, "T_full (out.shape[1])", t, world_size)
    if b == 1 and out.is_contiguous():
        return out.view(world_size, b, tc, hw, d)
    result = torch.empty((world_size, b, tc, hw, d), dtype=out.dtype, device=out.device)
    sb, st, sh, sd = out.stride()
    _copy(
        (out,),
        result,
        (world_size, b, tc, hw, d),
        (tc * st, sb, st, sh, sd),
        result.stride(),
        _check_launch(launch, out.device),
    )
    return result


# ---------------------------------------------------------------------------------- returned-head merge


def merge_heads_reference(received: torch.Tensor, world_size: int) -> torch.Tensor:
    """The materialised chain: move the rank axis next to the heads, fold it into them, copy."""
    w, b, t, hw, d = received.shape
    return received.permute(1, 2, 0, 3, 4).reshape(b, t, w * hw, d).contiguous()


def merge_heads(received: torch.Tensor, world_size: int, launch: Launch | None = None) -> torch.Tensor:
    """`merge_heads_reference(received, world_size)` in one strided pass."""
    name = "merge_heads"
    _check_world(name, world_size)
    check_float(name, "received", received)
    if received.ndim != 5:
        raise ValueError(f"{name}: received must be (W, B, T_local, H/W, D), got shape {tuple(received.shape)}")
    if received.shape[0] != world_size:
        raise ValueError(
            f"{name}: received.shape[0]={received.shape[0]} must equal world_size={world_size} "
            f"(shape {tuple(received.shape)})"
        )
    check_runtime(name, received)
    w, b, t, hw, d = received.shape
    result = torch.empty((b, t, w * hw, d), dtype=received.dtype, device=received.device)
    launch = _check_launch(launch, received.device)
    # source order (rank, b, t, head-in-rank, d): the sequence is the long axis of every tile, as in the others
    _copy((received,), result, (w, b, t, hw, d), received.stride(), (hw * d, t * w * hw * d, w * hw * d, d, 1), launch)
    return result


def cost(op: str, shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(bytes_moved, flops) for `op` given its input shape: one read and one write per element, no flops.

    `pack_qkv`: shape of one of q/k/v (B, T_local, H, D), three operands; `split_result`: (B, T_full, H/W, D);
    `merge_heads`: (W, B, T_local, H/W, D)."""
    operands = {"pack_qkv": 3, "split_result": 1, "merge_heads": 1}
    if op not in operands:
        raise ValueError(f"cost: op must be one of {sorted(operands)}, got {op!r}")
    return 2 * operands[op] * math.prod(shape) * dtype_size(dtype), 0
