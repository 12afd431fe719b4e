"""A loaded model: its family, the resident diffusers pipeline, and the request defaults for it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.io import json_bytes, write_atomic
from workbench.models.family import check_call_overrides


@dataclass
class LoadedModel:
    """`defaults` fill request fields left out; `call_overrides` are extra pipeline kwargs (tiny text lengths).

    `call_overrides` may not replace a kwarg the request sets (steps, guidance, sizes, ...): what runs is what the
    Result's request says, and the overrides themselves are recorded in `Result.metadata["call_overrides"]`.
    """

    name: str
    family: Any  # workbench.models.family.Family
    pipeline: Any
    defaults: dict[str, Any]
    call_overrides: dict[str, Any]

    def __post_init__(self) -> None:
        check_call_overrides(self.family, self.call_overrides, f"model {self.name!r}")

    def resolve(self, request: Any, defaults: dict[str, Any] | None = None) -> Any:
        """`request` with this model's defaults (and over them `defaults`, a session's adapters' own) filled in,
        checked against its family (ValueError if not)."""
        from workbench.request import Request  # workbench.request imports workbench.models

        if not isinstance(request, Request):
            raise ValueError(f"request: expected a workbench.Request, got {type(request).__name__}")
        return request.resolved(self.family, {**self.defaults, **(defaults or {})})

    def denoisers(self) -> list[torch.nn.Module]:
        """The transformer(s) that run the denoising loop (two for Wan2.2)."""
        return [m for name in self.family.denoisers if (m := getattr(self.pipeline, name, None)) is not None]

    def save(self, path: str | Path) -> Path:
        """Save in diffusers format (safetensors) plus `workbench.json` with this model's request defaults."""
        path = Path(path)
        self.pipeline.save_pretrained(str(path), safe_serialization=True)  # modular pipelines need a str
        stored = {"defaults": self.defaults, "call_overrides": self.call_overrides}
        write_atomic(path / "workbench.json", json_bytes(stored))
        return path


def cast_components(pipeline: Any, dtype: torch.dtype) -> None:
    """Cast every module component to `dtype` the way `from_pretrained(torch_dtype=...)` would.

    diffusers keeps parameters named in a model's `_keep_in_fp32_modules` (norms, time embedders,
    modulation tables) in float32 when it loads in low precision; a plain `.to(dtype)` would not, and
    the tiny models would then run different arithmetic from a real checkpoint.
    """
    for component in pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            cast_module(component, dtype)


def cast_module(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast one component as `cast_components` does (its `_keep_in_fp32_modules` stay float32), tensor by tensor:
    the float32 copy of a large model is freed while the cast goes, not after it."""
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or [])
    for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers()):
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(torch.float32 if keep & set(name.split(".")) else dtype)


ALIGNMENT = 64  # bytes: where torch's CPU allocator starts every tensor it allocates


def own_aligned_storage(pipeline: Any) -> int:
    """Give each CPU parameter and buffer of `pipeline`'s module components that does not start on an `ALIGNMENT`
    boundary storage of its own, allocated by torch; returns how many moved. diffusers' `from_pretrained` leaves a
    safetensors checkpoint's tensors as views into the memory-mapped file, at the file's 8-byte alignment, and CPU
    BLAS rounds a product of such a weight differently from the same weight in torch's own storage (a copy, a ring
    slot): a loaded model computed on the CPU would not be bit for bit itself once re-homed. Values are unchanged,
    and a tensor two modules share stays shared (its one object takes the new storage)."""
    modules = pipeline.components.values() if not isinstance(pipeline, torch.nn.Module) else [pipeline]
    moved = 0
    with torch.no_grad():
        for component in modules:
            if not isinstance(component, torch.nn.Module):
                continue
            for tensor in itertools.chain(component.parameters(), component.buffers()):
                if tensor.device.type == "cpu" and tensor.data_ptr() % ALIGNMENT:
                    tensor.data = tensor.data.clone()
                    moved += 1
    return moved
