"""Choose the dense attention kernel through diffusers' dispatcher (contract: reduction).

Another kernel computes the same softmax attention with a different reduction order. The receipt
counts calls that reached the chosen backend's function, so a configured-but-bypassed backend shows.
The count runs inside each transformer block, so it goes through `Receipt.count`: under
regional_compile a Python counter would be guarded on its value and every call would recompile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from diffusers.models.attention_dispatch import (
    AttentionBackendName,
    _AttentionBackendRegistry,
    _check_attention_backend_requirements,
)

from workbench.accelerations.base import Handle, Option, Spec

ALIASES = {"cudnn": "_native_cudnn", "math": "_native_math", "efficient": "_native_efficient"}
# Hub backends download kernels at first use; this workbench never reaches the network.
BACKENDS = tuple(
    sorted(
        b.value
        for b in AttentionBackendName
        if not b.value.endswith("_hub") and b.value in _AttentionBackendRegistry._backends
    )
)
CUDA_ONLY = ("cudnn", "flash", "efficient", "sage", "xformers", "aiter", "npu", "xla")


class BackendSwap(Handle):
    """Pins `modules`' processors to `backend` and replaces that backend's registry entry with `_function()` for
    the handle's lifetime; `_remove` puts both back. Here the function is the backend's own, counted; other
    plugins (flash4_attention) supply another."""

    COUNTER = "attention_calls"

    def __init__(
        self, spec: Spec, options: dict[str, Any], modules: list[torch.nn.Module], backend: str, device: torch.device
    ):
        super().__init__(spec, options, proof=(self.COUNTER,))
        self.receipt.traceable(device, counters=(self.COUNTER,))
        self.modules = modules
        self.backend = AttentionBackendName(backend)
        self.previous_active = _AttentionBackendRegistry._active_backend
        self.original_fn = _AttentionBackendRegistry._backends[self.backend]
        function = self._function()
        for module in modules:
            module.set_attention_backend(backend)
        _AttentionBackendRegistry._backends[self.backend] = function

    def _function(self) -> Callable[..., Any]:
        receipt, original = self.receipt, self.original_fn

        def counted(**kwargs: Any) -> Any:
            receipt.count(self.COUNTER)
            return original(**kwargs)

        return counted

    def _remove(self) -> None:
        _AttentionBackendRegistry._backends[self.backend] = self.original_fn
        for module in self.modules:
            module.reset_attention_backend()
        _AttentionBackendRegistry.set_active_backend(self.previous_active)


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    backend = ALIASES.get(options["backend"], options["backend"])
    if device.type != "cuda" and any(tag in backend for tag in CUDA_ONLY):
        raise RuntimeError(
            f"attention_backend.backend={options['backend']!r} needs CUDA; this session runs on {device}"
        )
    try:
        _check_attention_backend_requirements(AttentionBackendName(backend))
    except RuntimeError as error:
        raise RuntimeError(f"attention_backend.backend={options['backend']!r} cannot run here: {error}") from error
    modules = model.denoisers()
    return lambda: BackendSwap(SPEC, options, modules, backend, device)


SPEC = Spec(
    name="attention_backend",
    contract="reduction",
    summary="dense attention through a chosen diffusers backend (cuDNN, flash, flex, math, ...)",
    prepare_fn=_prepare,
    options=(
        Option("backend", str, "native", allowed=tuple(ALIASES) + BACKENDS, help="diffusers backend name or alias"),
    ),
    touches=("attention_processor.backend",),
    order=20,
)
SPECS = (SPEC,)
