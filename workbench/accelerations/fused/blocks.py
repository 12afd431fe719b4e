"""Per-call guards around the pointwise kernels, and the prepare-time checks, shared by the block-forward plugins
(fused_block_ops, fused_block_norms; not a plugin itself).

`InDtypeOps` serves the blocks whose AdaLN glue runs on same-dtype tensors (LTX-2, MiniMax-H3): each call is
checked, and one the kernels cannot take (mixed dtypes, an unexpected broadcast, another device) runs torch's
own expression, which is the stock block's expression, and is counted under `fallbacks[reason]`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

import torch

from workbench.kernels._runtime import FLOAT_DTYPES, INDEX_DTYPES

SUPPORTED_DTYPES = FLOAT_DTYPES


def block_classes(plugin: str, model: Any, supported: Iterable[str]) -> set[str]:
    """The model's block class names, each one `supported`; RuntimeError for another diffusers or block class."""
    import diffusers

    if not diffusers.__version__.startswith("0.42."):
        raise RuntimeError(f"{plugin}: replicates diffusers 0.42.x's block forwards; found {diffusers.__version__}")
    names = set(model.family.block_classes)
    unknown = sorted(names - set(supported))
    if unknown:
        raise RuntimeError(f"{plugin}: block class {unknown[0]} is not implemented (only {sorted(supported)})")
    return names


def replaceable_blocks(plugin: str, model: Any, names: set[str], device: torch.device) -> list[torch.nn.Module]:
    """The denoisers' blocks of classes `names`, none with its forward already replaced, once the kernels can run
    on `device` (triton installed; on a CPU only under the interpreter)."""
    blocks = []
    for denoiser in model.denoisers():
        for path, module in denoiser.named_modules():
            if type(module).__name__ in names:
                if "forward" in module.__dict__:
                    raise RuntimeError(
                        f"{plugin}: {path} already has its forward replaced by another plugin; "
                        "install only one of the block-forward plugins (fused_block_ops, fused_block_norms)"
                    )
                blocks.append(module)
    if not blocks:
        raise RuntimeError(f"{plugin}: found no {sorted(names)} blocks in the denoiser")
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError(f"{plugin}: needs triton (pip install triton)")
    from workbench.kernels._runtime import interpreting

    if device.type == "cpu" and not interpreting():
        raise RuntimeError(
            f"{plugin}: on CPU the Triton kernels run only under the interpreter; "
            "set TRITON_INTERPRET=1 in the environment, or open the session on a CUDA device"
        )
    return blocks


def block_reason(block: torch.nn.Module, *tensors: torch.Tensor) -> str | None:
    """Why a whole block call cannot take the kernels (then it runs stock), or None."""
    if torch.is_grad_enabled() and (
        any(t.requires_grad for t in tensors) or any(p.requires_grad for p in block.parameters())
    ):
        return "autograd: the kernels have no backward"
    for t in tensors:
        if t.dtype not in SUPPORTED_DTYPES:
            return f"hidden_states dtype {t.dtype}"
        if t.ndim != 3:
            return f"hidden_states of {t.ndim} dimensions"
        if t.device.type not in ("cpu", "cuda"):
            return f"hidden_states on {t.device.type}"
    return None


def _operand_reason(x: torch.Tensor, operands: tuple[torch.Tensor, ...], index: torch.Tensor | None) -> str | None:
    b, t, c = x.shape
    for op in operands:
        if op.dtype != x.dtype:
            return f"mixed dtypes {x.dtype} and {op.dtype}"
        if op.device != x.device:
            return "operands on different devices"
        if index is None:
            if op.ndim != 3 or op.shape[0] not in (1, b) or op.shape[1] not in (1, t) or op.shape[2] != c:
                return f"modulation of shape {tuple(op.shape)} for hidden states {tuple(x.shape)}"
        elif op.ndim != 2 or op.shape[1] != c:
            return f"modulation table of shape {tuple(op.shape)} for hidden states {tuple(x.shape)}"
    if index is not None and (index.dtype not in INDEX_DTYPES or index.shape != (t,) or index.device != x.device):
        return f"index of shape {tuple(index.shape)} and dtype {index.dtype}"
    return None


def _over_batch(op: torch.Tensor, batch: int) -> torch.Tensor:
    return op.expand(batch, -1, -1) if op.ndim == 3 and op.shape[0] != batch else op


class InDtypeOps:
    """`n * (1 + scale) + shift` and `x + y * gate` through the in-dtype kernels, per-call checked."""

    def __init__(self, receipt: Any):
        from workbench.kernels.adaln_modulate import adaln_modulate_in_dtype
        from workbench.kernels.adaln_modulate import reference_in_dtype as modulate_reference
        from workbench.kernels.gated_residual import gated_residual_in_dtype
        from workbench.kernels.gated_residual import reference_in_dtype as residual_reference

        self.receipt = receipt
        self._modulate, self._modulate_torch = adaln_modulate_in_dtype, modulate_reference
        self._residual, self._residual_torch = gated_residual_in_dtype, residual_reference

    def modulate(
        self, n: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, index: torch.Tensor | None = None
    ) -> torch.Tensor:
        reason = _operand_reason(n, (scale, shift), index)
        if reason is not None:
            self.receipt.count_fallback(f"adaln_modulate: {reason}")
            return self._modulate_torch(n, scale, shift, index)
        self.receipt.count("adaln_modulate_calls")
        b = n.shape[0]
        return self._modulate(n, _over_batch(scale, b), _over_batch(shift, b), index)

    def residual(
        self, x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`x + y * gate` (also the value of `x + gate * y`: IEEE products commute)."""
        reason = _operand_reason(x, (gate,), index) or (
            f"branch output of shape {tuple(y.shape)} and dtype {y.dtype}"
            if y.shape != x.shape or y.dtype != x.dtype or y.device != x.device
            else None
        )
        if reason is not None:
            self.receipt.count_fallback(f"gated_residual: {reason}")
            return self._residual_torch(x, y, gate, index)
        self.receipt.count("gated_residual_calls")
        return self._residual(x, y, _over_batch(gate, x.shape[0]), index)
