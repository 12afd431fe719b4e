"""The workbench's block-sparse Triton kernel (`workbench.kernels.block_sparse_attention`) as a sparse route's kernel.

Shared by the `block_sparse` plugin and `attention_policy` (which may serve a qualified block_sparse setting); not a
plugin itself (it registers no Spec). `block_sparse_attend` takes a routed `Call` (the dispatcher's (B, T, H, D)
q/k/v and the setting) and returns the attention output in the same layout with the kernel's density.

On a CPU outside the Triton interpreter (`uses_reference`) the kernel's torch reference serves the call: the same
routing and the same maths in fp32 (`block_sparse_attention.reference`, which the kernel tests hold the kernel to),
so the shipped CPU demo can toggle the sparse and low-bit attention plugins at a request's speed. Their receipts name
the path (`notes["path"]`).
"""

from __future__ import annotations

import torch

from workbench.accelerations.attention.sparse_routing import Call
from workbench.kernels._runtime import cpu_without_interpreter
from workbench.kernels.block_sparse_attention import DTYPES, MAX_HEAD_DIM, block_sparse_attention, reference

KERNEL, REFERENCE = "triton kernel", "torch reference"
# the path's name where the low-precision calls on sm_90 take the CuTe kernel (`fp8_attention_sm90`) when their
# shapes allow it, and the Triton kernel otherwise (each plugin says which shapes)
CUTE = "cute kernel (sm_90a)"


def block_sparse_attend(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel on the dispatcher's (B, T, H, D) tensors, read as (B, H, T, D) views without a copy; the
    setting's `extra` carries block_sparse's `precision` and `pv` (a setting without them is exact)."""
    q, k, v = call.qkv
    if q.shape[-1] > MAX_HEAD_DIM or q.dtype not in DTYPES:
        raise RuntimeError(
            f"block_sparse: attention of head dim {q.shape[-1]} in {q.dtype} reached the kernel; "
            f"it supports head dims up to {MAX_HEAD_DIM} in {[str(d) for d in DTYPES]}"
        )
    settings = call.settings
    attend = reference if uses_reference(q.device) else block_sparse_attention
    out, density = attend(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), settings.tau, call.rows(settings.sink_tokens),
        scale=call.kwargs.get("scale"), return_density=True,
        precision=settings.extra.get("precision", "exact"), pv=settings.extra.get("pv", "fp8"),
    )  # fmt: skip
    return out.transpose(1, 2), density


def uses_reference(device: torch.device) -> bool:
    """Whether the attention plugins' calls on `device` take their kernels' torch references (module doc)."""
    return cpu_without_interpreter(device)


def path(device: torch.device) -> str:
    """The path the attention plugins' calls take on `device`, as their receipts name it."""
    return REFERENCE if uses_reference(device) else KERNEL
