"""Per-call guards around the pointwise kernels, shared by the families' fused block forwards.

`block_reason` says why a whole block call cannot take the kernels (then it runs stock). `InDtypeOps` serves the
blocks whose AdaLN glue runs on same-dtype tensors (LTX-2, MiniMax-H3): each call is checked, and one the kernels
cannot take (mixed dtypes, an unexpected broadcast, another device) runs torch's own expression, which is the stock
block's expression, and is counted under `fallbacks[reason]`. `hooked` says when a module's call would run more
than its class forward, so a fused forward must not replace that call.
"""

from __future__ import annotations

from typing import Any

import torch

# The dtypes the kernels take are read from workbench.kernels._runtime at call time: importing it imports triton,
# and a family module (which names these forwards) must import without triton.


def hooked(module: torch.nn.Module) -> bool:
    """True when calling the module would run more than its class forward (torch or diffusers hooks, or an
    instance-level forward): then the fused code must not replace the call."""
    registry = getattr(module, "_diffusers_hook", None)
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or "forward" in module.__dict__
        or (registry and registry.hooks)
    )


def block_reason(block: torch.nn.Module, *tensors: torch.Tensor) -> str | None:
    """Why a whole block call cannot take the kernels (then it runs stock), or None."""
    from workbench.kernels._runtime import FLOAT_DTYPES

    if torch.is_grad_enabled() and (
        any(t.requires_grad for t in tensors) or any(p.requires_grad for p in block.parameters())
    ):
        return "autograd: the kernels have no backward"
    for t in tensors:
        if t.dtype not in FLOAT_DTYPES:
            return f"hidden_states dtype {t.dtype}"
        if t.ndim != 3:
            return f"hidden_states of {t.ndim} dimensions"
        if t.device.type not in ("cpu", "cuda"):
            return f"hidden_states on {t.device.type}"
    return None


def _operand_reason(x: torch.Tensor, operands: tuple[torch.Tensor, ...], index: torch.Tensor | None) -> str | None:
    from workbench.kernels._runtime import INDEX_DTYPES

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
