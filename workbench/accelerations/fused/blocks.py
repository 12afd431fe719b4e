"""The prepare-time checks shared by the block-forward plugins (fused_block_ops, fused_block_norms; not a plugin
itself): which of a model's blocks may take a family's fused forward, before anything is mutated. The forwards and
their per-call guards are the families' (`workbench.models.fused`)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch


def fused_blocks(plugin: str, model: Any, device: torch.device) -> list[torch.nn.Module]:
    """The denoisers' transformer blocks (`Family.blocks`), none with its forward already replaced, once the
    kernels can run: diffusers 0.42.x (whose block forwards the families' fused forwards replicate), triton
    installed, and on a CPU only under the interpreter. RuntimeError naming what is missing."""
    import diffusers

    if not diffusers.__version__.startswith("0.42."):
        raise RuntimeError(f"{plugin}: replicates diffusers 0.42.x's block forwards; found {diffusers.__version__}")
    family = model.family
    blocks = []
    for denoiser in model.denoisers():
        for path, module in denoiser.named_modules():
            if type(module).__name__ in family.block_classes:
                if "forward" in module.__dict__:
                    raise RuntimeError(
                        f"{plugin}: {path} already has its forward replaced by another plugin; "
                        "install only one of the block-forward plugins (fused_block_ops, fused_block_norms)"
                    )
                blocks.append(module)
    if not blocks:
        raise RuntimeError(f"{plugin}: found no {list(family.block_classes)} blocks in the denoiser")
    if (why := triton_unusable(device)) is not None:
        raise RuntimeError(f"{plugin}: {why}")
    return blocks


def triton_unusable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on `device` here (`Spec.unusable` of the fused plugins), or None."""
    if importlib.util.find_spec("triton") is None:
        return "needs triton (pip install triton)"
    from workbench.kernels._runtime import cpu_without_interpreter

    if cpu_without_interpreter(device):
        return "Triton kernels on a CPU need TRITON_INTERPRET=1"
    return None
