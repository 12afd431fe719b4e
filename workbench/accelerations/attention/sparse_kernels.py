"""The workbench's own attention kernels as a route's kernel: `kernel_attend`, and through it the block-sparse Triton
kernel (`workbench.kernels.block_sparse_attention`).

Shared by the `block_sparse` and `fp8_attention` plugins and `attention_policy` (which may serve a qualified
block_sparse setting); not a plugin itself (it registers no Spec). `kernel_attend` runs a kernel on a routed `Call`
(the dispatcher's (B, T, H, D) q/k/v and the setting) and returns the attention output in the same layout;
`block_sparse_attend` is it for the block-sparse kernel, with the kernel's density.

On a CPU outside the Triton interpreter (`uses_reference`) the kernel's torch reference serves the call: the same
routing and the same maths in fp32 (`block_sparse_attention.reference`, which the kernel tests hold the kernel to),
so the shipped CPU demo can toggle the sparse and low-bit attention plugins at a request's speed. Their receipts name
the path (`notes["path"]`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from workbench.accelerations.attention.sparse_routing import Call
from workbench.kernels._runtime import cpu_without_interpreter
from workbench.kernels.block_sparse_attention import DTYPES, MAX_HEAD_DIM, block_sparse_attention, reference

KERNEL, REFERENCE = "triton kernel", "torch reference"
# the path's name where the low-precision calls on sm_90 take the CuTe kernel (`fp8_attention_sm90`) when their
# shapes allow it, and the Triton kernel otherwise (each plugin says which shapes)
CUTE = "cute kernel (sm_90a)"
LOW_PRECISION = ("precision", "pv")  # block_sparse's options `block_sparse_attend` reads from Settings.extra


def kernel_attend(
    call: Call,
    plugin: str,
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    limits: tuple[int, tuple[torch.dtype, ...]],
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`kernel`, or its torch `reference` where the call's device `uses_reference`, on the call's (B, T, H, D) q, k, v
    read as (B, H, T, D) views without a copy and then `args` / `kwargs`. Returns its (B, H, T, D) output as a
    (B, T, H, D) view, and its density when it returns (output, density), else None. `limits`: the kernel's largest
    head dim and its dtypes; a call outside them is a RuntimeError naming `plugin` (the routed modules were checked
    at prepare, `Router.check_modules`: this one reached the kernel anyway)."""
    q, k, v = call.qkv
    max_head_dim, dtypes = limits
    if q.shape[-1] > max_head_dim or q.dtype not in dtypes:
        raise RuntimeError(
            f"{plugin}: attention of head dim {q.shape[-1]} in {q.dtype} reached the kernel; "
            f"it supports head dims up to {max_head_dim} in {[str(d) for d in dtypes]}"
        )
    attend = reference if uses_reference(q.device) else kernel
    out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), *args, **kwargs)
    out, density = out if isinstance(out, tuple) else (out, None)
    return out.transpose(1, 2), density


def block_sparse_attend(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """`kernel_attend` with the block-sparse kernel at the call's setting: its `tau` and sink rows, and its `extra`'s
    block_sparse `precision` and `pv` (a setting without them is exact)."""
    settings = call.settings
    return kernel_attend(
        call, "block_sparse", block_sparse_attention, reference, (MAX_HEAD_DIM, DTYPES),
        settings.tau, call.rows(settings.sink_tokens), scale=call.kwargs.get("scale"), return_density=True,
        precision=settings.extra.get("precision", "exact"), pv=settings.extra.get("pv", "fp8"),
    )  # fmt: skip


def uses_reference(device: torch.device) -> bool:
    """Whether the attention plugins' calls on `device` take their kernels' torch references (module doc)."""
    return cpu_without_interpreter(device)


def path(device: torch.device) -> str:
    """The path the attention plugins' calls take on `device`, as their receipts name it."""
    return REFERENCE if uses_reference(device) else KERNEL
