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
from workbench.kernels._runtime import interpreting, pad_head_dim
from workbench.kernels.block_sparse_attention import DTYPES, MAX_HEAD_DIM, block_sparse_attention, reference, routing

KERNEL, REFERENCE = "triton kernel", "torch reference"


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
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    precision, pv = settings.extra.get("precision", "exact"), settings.extra.get("pv", "fp8")
    sink, scale = call.rows(settings.sink_tokens), call.kwargs.get("scale")
    if uses_reference(q.device):
        d = q.shape[-1]
        scale = d**-0.5 if scale is None else scale
        _, density = routing(q, k, settings.tau, sink, scale=scale)
        out = reference(*pad_head_dim(q, k, v), settings.tau, sink, scale, precision, pv)[..., :d]
        return out.transpose(1, 2), torch.tensor(density)
    out, density = block_sparse_attention(
        q, k, v, settings.tau, sink, scale=scale, return_density=True, precision=precision, pv=pv
    )
    return out.transpose(1, 2), density


def uses_reference(device: torch.device) -> bool:
    """Whether the attention plugins' calls on `device` take their kernels' torch references (module doc)."""
    return device.type == "cpu" and not interpreting()


def path(device: torch.device) -> str:
    """The path the attention plugins' calls take on `device`, as their receipts name it."""
    return REFERENCE if uses_reference(device) else KERNEL
