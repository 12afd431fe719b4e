"""Merged Q/K/V projection: one wide GEMM instead of three (contract: reduction).

diffusers' attention modules know how to fuse themselves (`fuse_projections`); the merged GEMM may
reduce in a different order than three separate ones, so the contract is `reduction`. The receipt
counts calls of the fused projection modules, which only run when the fused path was taken.
LTX-2 is not listed: in diffusers 0.42.1 its attention processor never reads the fused weights, so
fusing would install a plugin that cannot execute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.base import Handle, Spec

FUSED_NAMES = ("to_qkv", "to_kv", "to_added_qkv")


def _fusable(model: Any) -> list[torch.nn.Module]:
    """Attention modules diffusers can fuse: self-attention with one input width for Q, K and V, or
    cross-attention whose K and V read the same context (fused to one K/V GEMM)."""
    found = []
    for denoiser in model.denoisers():
        for m in denoiser.modules():
            if not (hasattr(m, "fuse_projections") and getattr(m, "_supports_qkv_fusion", True)):
                continue
            q, k, v = (getattr(m, name, None) for name in ("to_q", "to_k", "to_v"))
            if not all(isinstance(p, torch.nn.Linear) for p in (q, k, v)):
                continue
            widths = {k.in_features, v.in_features}
            if getattr(m, "is_cross_attention", False) and len(widths) == 1 or widths == {q.in_features}:
                found.append(m)
    return found


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], attentions: list[torch.nn.Module], device: torch.device):
        super().__init__(spec, options, proof=("fused_projection_calls",))
        self.receipt.traceable(device, counters=("fused_projection_calls",))  # counted inside the blocks
        self.attentions: list[torch.nn.Module] = []
        self.hooks = []
        # modules without their own `fused_projections` flag (the class's) get it back removed, not set to False
        self.inherited = {id(a) for a in attentions if "fused_projections" not in vars(a)}
        try:
            for attention in attentions:
                attention.fuse_projections()
                self.attentions.append(attention)
                for name in FUSED_NAMES:
                    if isinstance(fused := getattr(attention, name, None), torch.nn.Module):
                        self.hooks.append(fused.register_forward_pre_hook(self._count))
        except BaseException:
            self._remove()  # a half-fused model must not survive a failed activation
            raise

    def _count(self, *_: Any) -> None:
        self.receipt.count("fused_projection_calls")

    def _remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        for attention in self.attentions:
            attention.unfuse_projections()
            if id(attention) in self.inherited:
                vars(attention).pop("fused_projections", None)


@dataclass(frozen=True)
class FusedQKVConfig:
    """fused_qkv takes no options: every fusable attention module is fused."""


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    attentions = _fusable(model)
    if not attentions:
        raise RuntimeError(f"fused_qkv: no fusable attention modules in {model.family.name}'s denoiser")
    return lambda: _Installed(SPEC, options, attentions, device)


SPEC = Spec(
    name="fused_qkv",
    contract="reduction",
    summary="merged Q/K/V (and cross K/V) projections via diffusers fuse_projections",
    prepare_fn=_prepare,
    config=FusedQKVConfig,
    touches=("attention.projections",),
    order=10,
)
SPECS = (SPEC,)
