"""The workbench's block-sparse Triton kernel (`workbench.kernels.block_sparse_attention`) as a sparse route's kernel.

Shared by the `block_sparse` plugin and `attention_policy` (which may serve a qualified block_sparse setting); not a
plugin itself (it registers no Spec). `block_sparse_attend` takes a routed `Call` (the dispatcher's (B, T, H, D)
q/k/v and the setting) and returns the attention output in the same layout with the kernel's density.
"""

from __future__ import annotations

import torch

from workbench.accelerations.attention.sparse_routing import Call
from workbench.kernels._runtime import interpreting
from workbench.kernels.block_sparse_attention import DTYPES, MAX_HEAD_DIM, block_sparse_attention


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
    out, density = block_sparse_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), settings.tau, call.rows(settings.sink_tokens),
        scale=call.kwargs.get("scale"), return_density=True,
        precision=settings.extra.get("precision", "exact"), pv=settings.extra.get("pv", "fp8"),
    )  # fmt: skip
    return out.transpose(1, 2), density


def triton_unusable(device: torch.device) -> str | None:
    """Why a Triton attention kernel (block_sparse's, fp8_attention's) cannot run on `device` here, or None."""
    if device.type == "cpu" and not interpreting():
        return "the Triton kernel on CPU needs TRITON_INTERPRET=1 (or a CUDA device)"
    return None


def check_block_sparse_device(name: str, device: torch.device) -> None:
    if (reason := triton_unusable(device)) is not None:
        raise RuntimeError(f"{name}: {reason}")
