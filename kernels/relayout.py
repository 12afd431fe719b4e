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
exactly once. Pure element movement: the output is `torch.equal` to the reference for every dtype
(bf16, fp16, fp32), odd sequence lengths and non-contiguous inputs. The pack no longer allocates the
stacked intermediate, which halves its transient peak.

`direct_relayout_enabled()` reads `WORKBENCH_DIRECT_RELAYOUT` for diagnosis: unset or "1" -> direct
kernels, "0" -> references; any other value raises (fail closed).

One copy kernel serves all three: rows are a flattened 4-D index in destination order, columns the
head dimension, with source and destination strides passed per dimension.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from workbench.kernels._runtime import LazyKernel, check_float, check_runtime, dtype_size

ENV_VAR = "WORKBENCH_DIRECT_RELAYOUT"
BLOCK_R = 32
MAX_BLOCK_C = 128


def _strided_copy(
    src_ptr, dst_ptr,
    R, N1, N2, N3, C,
    s0, s1, s2, s3, s4,
    d0, d1, d2, d3, d4,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # flattened (i0, i1, i2, i3)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    r = rows.to(tl.int64)
    i3 = r % N3
    r = r // N3
    i2 = r % N2
    r = r // N2
    i1 = r % N1
    i0 = r // N1
    c = cols.to(tl.int64)[None, :]
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    src = (i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3)[:, None] + c * s4
    dst = (i0 * d0 + i1 * d1 + i2 * d2 + i3 * d3)[:, None] + c * d4
    tl.store(dst_ptr + dst, tl.load(src_ptr + src, mask=mask), mask=mask)


_KERNEL = LazyKernel(_strided_copy)


def _copy(
    src: torch.Tensor,
    dst: torch.Tensor,
    sizes: tuple[int, int, int, int, int],
    src_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
) -> None:
    """dst[i0..i4] = src[i0..i4] over `sizes`, both addressed through the given element strides."""
    n0, n1, n2, n3, c = sizes
    rows = n0 * n1 * n2 * n3
    if rows == 0 or c == 0:
        return
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(c))
    grid = (triton.cdiv(rows, BLOCK_R), triton.cdiv(c, block_c))
    _KERNEL[grid](
        src, dst, rows, n1, n2, n3, c, *src_strides, *dst_strides, BLOCK_R=BLOCK_R, BLOCK_C=block_c,
    )  # fmt: skip


def _check_world(name: str, world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"{name}: world_size must be a positive int, got {world_size!r}")


def _divisible(name: str, what: str, value: int, world_size: int) -> int:
    if value % world_size:
        raise ValueError(f"{name}: {what}={value} is not divisible by world_size={world_size}")
    return value // world_size


def direct_relayout_enabled() -> bool:
    """`WORKBENCH_DIRECT_RELAYOUT`: unset or "1" -> True, "0" -> False; anything else raises (fail closed)."""
    value = os.environ.get(ENV_VAR)
    if value is None or value == "1":
        return True
    if value == "0":
        return False
    raise ValueError(f'{ENV_VAR}={value!r} is not allowed; set "0" (reference relayout) or "1" (direct), or unset it')


# ---------------------------------------------------------------------------------------------- QKV pack


def pack_qkv_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int) -> torch.Tensor:
    """The materialised chain: stack beside the heads, split heads per rank, move the rank axis first, copy."""
    b, t, h, d = q.shape
    stacked = torch.stack((q, k, v), dim=2).view(b, t, 3, world_size, h // world_size, d)
    return stacked.permute(3, 0, 1, 2, 4, 5).contiguous()


def pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int) -> torch.Tensor:
    """`pack_qkv_reference(q, k, v, world_size)` in one strided pass per operand, no stacked intermediate."""
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
    out = torch.empty((world_size, b, t, 3, hw, d), dtype=q.dtype, device=q.device)
    dst_strides = out.stride()[:3] + out.stride()[4:]
    for slot, src in enumerate((q, k, v)):
        sb, st, sh, sd = src.stride()
        # destination order (rank, b, t, head-in-rank, d); head = rank * hw + head-in-rank
        _copy(src, out[:, :, :, slot], (world_size, b, t, hw, d), (hw * sh, sb, st, sh, sd), dst_strides)
    return out


# ------------------------------------------------------------------------------- attention-result split


def split_result_reference(out: torch.Tensor, world_size: int) -> torch.Tensor:
    """The materialised chain: split the sequence per rank, move the rank axis first, copy."""
    b, t, hw, d = out.shape
    return out.reshape(b, world_size, t // world_size, hw, d).permute(1, 0, 2, 3, 4).contiguous()


def split_result(out: torch.Tensor, world_size: int) -> torch.Tensor:
    """`split_result_reference(out, world_size)` in one strided pass."""
    name = "split_result"
    _check_world(name, world_size)
    check_float(name, "out", out)
    if out.ndim != 4:
        raise ValueError(f"{name}: out must be (B, T_full, H/W, D), got shape {tuple(out.shape)}")
    check_runtime(name, out)
    b, t, hw, d = out.shape
    tc = _divisible(name, "T_full (out.shape[1])", t, world_size)
    result = torch.empty((world_size, b, tc, hw, d), dtype=out.dtype, device=out.device)
    sb, st, sh, sd = out.stride()
    _copy(out, result, (world_size, b, tc, hw, d), (tc * st, sb, st, sh, sd), result.stride())
    return result


# ---------------------------------------------------------------------------------- returned-head merge


def merge_heads_reference(received: torch.Tensor, world_size: int) -> torch.Tensor:
    """The materialised chain: move the rank axis next to the heads, fold it into them, copy."""
    w, b, t, hw, d = received.shape
    return received.permute(1, 2, 0, 3, 4).reshape(b, t, w * hw, d).contiguous()


def merge_heads(received: torch.Tensor, world_size: int) -> torch.Tensor:
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
    rw, rb, rt, rh, rd = received.stride()
    # destination order (b, t, rank, head-in-rank, d)
    _copy(received, result, (b, t, w, hw, d), (rb, rt, rw, rh, rd), (t * w * hw * d, w * hw * d, hw * d, d, 1))
    return result


def cost(op: str, shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(bytes_moved, flops) for `op` given its input shape: one read and one write per element, no flops.

    `pack_qkv`: shape of one of q/k/v (B, T_local, H, D), three operands; `split_result`: (B, T_full, H/W, D);
    `merge_heads`: (W, B, T_local, H/W, D)."""
    operands = {"pack_qkv": 3, "split_result": 1, "merge_heads": 1}
    if op not in operands:
        raise ValueError(f"cost: op must be one of {sorted(operands)}, got {op!r}")
    return 2 * operands[op] * math.prod(shape) * dtype_size(dtype), 0
