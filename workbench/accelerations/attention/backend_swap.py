"""Swapping the function behind one of diffusers' attention-dispatcher backends, for a handle's lifetime.

Shared by `attention_backend` (the backend's own function, counted) and `flash4_attention` (FA4's kernel behind
the `native` entry); not a plugin itself (it registers no Spec). `unsupported_call` says what in a dispatcher call
a plain dense attention kernel does not take (flash4_attention and the sparse routing's kernels refuse it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

from workbench.accelerations.base import Handle, Spec


def unsupported_call(kwargs: dict[str, Any]) -> list[str]:
    """What in a call of diffusers' attention dispatcher (its backend function's keyword arguments) a plain dense
    attention kernel does not take: a mask, dropout, causal attention, a context-parallel config; empty when none."""
    problems = []
    if kwargs.get("attn_mask") is not None:
        problems.append("an attention mask")
    if kwargs.get("dropout_p"):
        problems.append(f"dropout_p={kwargs['dropout_p']}")
    if kwargs.get("is_causal"):
        problems.append("is_causal=True")
    if kwargs.get("_parallel_config") is not None:
        problems.append("a context-parallel config")
    return problems


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
        # processors without their own `_attention_backend` (the class's None) get it back removed, not set to None
        self.inherited = [p for p in _processors(modules) if "_attention_backend" not in vars(p)]
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
        for processor in self.inherited:
            vars(processor).pop("_attention_backend", None)
        _AttentionBackendRegistry.set_active_backend(self.previous_active)


def _processors(modules: list[torch.nn.Module]) -> list[Any]:
    """The attention processors (with an instance dict) of `modules` and their submodules, each once."""
    found = {}
    for module in modules:
        for sub in module.modules():
            processor = vars(sub).get("processor")
            if processor is not None and hasattr(processor, "__dict__"):
                found.setdefault(id(processor), processor)
    return list(found.values())
