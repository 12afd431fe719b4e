"""What the families' fast VAE decode paths share (`workbench.models.fused.<family>_vae`, installed by
fused_vae_decode through `Family.vae_decode`): the checks that the decoder runs only its class forwards, the
replacement of `vae._decode` and its removal, the channels-last relayout of the decoder's convolution weights, the
fallback to diffusers' own decode, and the write of a norm + SiLU into a convolution buffer's interior.

A family's path subclasses `ReplacedDecode`, defines `_decode` with its VAE's signature (calling `runs_stock` first)
and `_norm_kernel` (its norm + SiLU as one `workbench.kernels.rms_norm_silu` launch); options are the plugin's:
`conv_cache` ("buffer" / "stock"), `channels_last` (bool), `norm` ("torch" / "triton").
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from workbench.models.fused.guards import hooked


def decoder_reason(vae: Any) -> str | None:
    """Why `vae`'s decode cannot be replaced now (a replaced `_decode`, a decoder module with hooks), or None."""
    if "_decode" in vae.__dict__:
        return "its _decode is already replaced (context_parallel's parallel_decode?)"
    for name, module in vae.decoder.named_modules():
        if hooked(module):
            return f"decoder module {name or '<decoder>'} has hooks or a replaced forward (offloading?)"
    return None


class ReplacedDecode:
    """Replaces `vae._decode` with the subclass's `_decode` until `remove()`; with `channels_last` the decoder's
    Conv3d weights are relaid as channels_last_3d (Conv2d: channels_last) and `format` is the activations' layout."""

    def __init__(self, vae: Any, options: dict[str, Any], receipt: Any):
        self.vae, self.decoder, self.receipt = vae, vae.decoder, receipt
        self.buffered = options["conv_cache"] == "buffer"
        self.kernel = options["norm"] == "triton"
        self.channels_last = options["channels_last"]
        self.format = torch.channels_last_3d if self.channels_last else torch.contiguous_format
        self.relaid: list[torch.nn.Parameter] = []
        if self.channels_last:
            for module in self.decoder.modules():
                if isinstance(module, torch.nn.Conv3d | torch.nn.Conv2d):
                    form = torch.channels_last_3d if isinstance(module, torch.nn.Conv3d) else torch.channels_last
                    module.weight.data = module.weight.data.contiguous(memory_format=form)
                    self.relaid.append(module.weight)
        vae._decode = self._decode  # an instance attribute (Module.__setattr__ keeps non-tensors in __dict__)

    def _norm_kernel(self, norm: torch.nn.Module, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """`silu(norm(x))` as one kernel launch, into `out` when given; returns the result."""
        raise NotImplementedError

    def remove(self) -> None:
        """Put `_decode` and the weights' layout back (the same values, contiguous as loaded)."""
        if self.vae.__dict__.get("_decode") == self._decode:
            del self.vae._decode
        for weight in self.relaid:
            weight.data = weight.data.contiguous()
        self.relaid.clear()

    def runs_stock(self, tiling: str | None) -> bool:
        """True when this call must run diffusers' own `_decode`: `tiling` names the tiled decode the VAE would run
        (None: none), and grad mode with trainable decoder weights (the kernels have no backward). Counted under the
        receipt's fallbacks."""
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.decoder.parameters())
        reason = tiling or ("grad mode" if grad else None)
        if reason is None:
            return False
        self.receipt.fallbacks[f"{reason}: diffusers' own"] += 1
        return True

    def activation(self, x: torch.Tensor, norm: torch.nn.Module | None) -> torch.Tensor:
        """`silu(norm(x))` (the norm + SiLU a convolution reads) as a new tensor: the kernel or torch's modules."""
        if norm is None:
            return x
        if self.kernel:
            self.receipt.counters["norm_silu_kernel_calls"] += 1
            return self._norm_kernel(norm, x)
        return F.silu(norm(x))

    def write_activation(self, inside: torch.Tensor, x: torch.Tensor, norm: torch.nn.Module | None) -> None:
        """`silu(norm(x))` (`x` when `norm` is None) written into `inside`, a view of a convolution buffer, with
        torch's values (or the kernel's)."""
        if norm is None:
            inside.copy_(x)
        elif self.kernel:
            self._norm_kernel(norm, x, out=inside)
            self.receipt.counters["norm_silu_kernel_calls"] += 1
        elif inside.is_cuda:  # one elementwise kernel per element, whatever the strides: torch's values
            torch.ops.aten.silu.out(norm(x), out=inside)
        else:  # the CPU's vectorised and scalar SiLU loops round differently, and the strides pick the loop
            inside.copy_(F.silu(norm(x)))
