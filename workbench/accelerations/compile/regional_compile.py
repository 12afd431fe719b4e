"""Regional compilation: `torch.compile` of each repeated transformer block (contract: reduction).

diffusers' `compile_repeated_blocks(fullgraph=..., mode=...)` calls `block.compile(...)` on every
instance of the class names in the denoiser's `_repeated_blocks`; that sets the block's
`_compiled_call_impl`. Uninstall sets it back to None on each compiled block; the dynamo caches
are left alone (a global `torch._dynamo.reset()` would touch other sessions' compiled code).
Compiled kernels fuse and reorder reductions, so the output is close to dense, not equal.

What the receipt proves: `compiled_calls` counts calls that entered each block's compiled callable
(counted in a thin wrapper around it, outside the traced frame, so the counter does not change
what dynamo traces). It does not prove dynamo ran a compiled graph rather than falling back to
eager (e.g. after hitting its recompile limit); with `fullgraph=True` a graph break is an error
instead of a silent fallback. `graphs_compiled` is the change of dynamo's global
`counters["stats"]["unique_graphs"]` during the request (process-wide, so another thread compiling
at the same time would be counted too). Compile time is paid inside the first request after
install: that request's receipt has `notes["includes_compile"] = True` so timing evidence can
exclude it; later requests have it False (a new input shape can still recompile: see
`graphs_compiled`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.utils import counters as dynamo_counters

from workbench.accelerations.base import Handle, Spec, option

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def _repeated_blocks(denoiser: torch.nn.Module) -> list[torch.nn.Module]:
    names = getattr(denoiser, "_repeated_blocks", None) or ()
    return [m for m in denoiser.modules() if type(m).__name__ in names]


def _modified(block: torch.nn.Module) -> list[str]:
    """Parts of a block another plugin has changed; compiling over those is not verified."""
    found = []
    for name, sub in block.named_modules():
        registry = getattr(sub, "_diffusers_hook", None)
        if sub._forward_hooks or sub._forward_pre_hooks or "forward" in sub.__dict__:
            found.append(name or "<block>")
        elif registry is not None and registry.hooks:
            found.append(f"{name or '<block>'} (diffusers hooks {list(registry.hooks)})")
        elif getattr(sub, "_compiled_call_impl", None) is not None:
            found.append(f"{name or '<block>'} (already compiled)")
    return found


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], denoisers: list[torch.nn.Module]):
        super().__init__(spec, options, proof=("compiled_calls",))
        self.blocks = [block for denoiser in denoisers for block in _repeated_blocks(denoiser)]
        for block in self.blocks:
            changed = _modified(block)
            if changed:
                raise RuntimeError(
                    f"regional_compile: {type(block).__name__} was already modified by another acceleration "
                    f"({', '.join(changed[:3])}); compiling over it is not supported"
                )
        self.first_request = True
        self.graphs_before = 0
        try:
            for denoiser in denoisers:
                denoiser.compile_repeated_blocks(fullgraph=options["fullgraph"], mode=options["mode"])
            for block in self.blocks:
                block._compiled_call_impl = self._counted(block._compiled_call_impl)
        except Exception:
            self._remove()
            raise

    def _counted(self, compiled: Any) -> Any:
        receipt = self.receipt

        def call(*args: Any, **kwargs: Any) -> Any:
            receipt.counters["compiled_calls"] += 1
            return compiled(*args, **kwargs)

        return call

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.receipt.counters["compiled_blocks"] = len(self.blocks)
        self.receipt.notes["includes_compile"] = self.first_request
        self.first_request = False
        self.graphs_before = dynamo_counters["stats"]["unique_graphs"]

    def end_request(self, request_id: int) -> None:
        self.receipt.counters["graphs_compiled"] = dynamo_counters["stats"]["unique_graphs"] - self.graphs_before

    def _remove(self) -> None:
        for block in self.blocks:
            block._compiled_call_impl = None


@dataclass(frozen=True)
class RegionalCompileConfig:
    """regional_compile's options."""

    mode: str = option("default", allowed=MODES, help="torch.compile mode")
    fullgraph: bool = option(True, help="a graph break is an error instead of a silent eager fallback")


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    denoisers = model.denoisers()
    for denoiser in denoisers:
        names = getattr(denoiser, "_repeated_blocks", None)
        if not names:
            raise RuntimeError(f"regional_compile: {type(denoiser).__name__} declares no `_repeated_blocks`")
        if not _repeated_blocks(denoiser):
            raise RuntimeError(f"regional_compile: no {list(names)} modules found in {type(denoiser).__name__}")
    if device.type == "cpu":
        if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
            raise RuntimeError("regional_compile: torch.compile on CPU needs a C++ compiler (g++/c++/clang++)")
    else:
        from torch.utils._triton import has_triton

        if not has_triton():
            raise RuntimeError(f"regional_compile: torch.compile on {device.type} needs triton, which is missing")
    return lambda: _Installed(SPEC, options, denoisers)


SPEC = Spec(
    name="regional_compile",
    contract="reduction",
    summary="torch.compile of each repeated transformer block (diffusers compile_repeated_blocks)",
    prepare_fn=_prepare,
    config=RegionalCompileConfig,
    touches=("blocks.compiled_call",),
    order=90,  # after every plugin that changes what a block computes; refuses blocks already modified
)
SPECS = (SPEC,)
