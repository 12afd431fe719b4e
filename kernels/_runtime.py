"""Shared launch plumbing for the kernels in this package (not a kernel itself).

Triton decides at decoration time whether a function runs compiled or under the CPU interpreter
(`TRITON_INTERPRET=1`). The kernels here are decorated lazily, at first launch, so importing
`workbench.kernels.*` never freezes that choice: a test that sets `TRITON_INTERPRET=1` after
something else imported the module still gets the interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreting() -> bool:
    """True when Triton kernels run under the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return bool(triton.knobs.runtime.interpret)


class LazyKernel:
    """`kernel[grid](...)` for a plain Python function written in Triton, decorated at first launch
    (once per interpreter/compiled mode)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self._jitted: dict[bool, Any] = {}

    def __getitem__(self, grid: Any) -> Any:
        mode = interpreting()
        if mode not in self._jitted:
            self._jitted[mode] = triton.jit(self.fn)
        return self._jitted[mode][grid]


def check_runtime(kernel: str, *tensors: torch.Tensor) -> None:
    """All tensors on one device, and a way to run Triton there; RuntimeError naming what is missing."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{kernel}: all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cpu" and not interpreting():
        raise RuntimeError(
            f"{kernel}: CPU tensors need the Triton interpreter; set TRITON_INTERPRET=1 before launching, "
            "or move the tensors to a CUDA device"
        )
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"{kernel}: Triton kernels run on cuda (or cpu under TRITON_INTERPRET=1), not {device}")


def check_float(kernel: str, name: str, tensor: torch.Tensor, allowed: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{kernel}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in allowed:
        raise ValueError(f"{kernel}: {name} has dtype {tensor.dtype}; allowed: {[str(d) for d in allowed]}")


def broadcast_rows(kernel: str, name: str, tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A (B, 1, C) or (B, T, C) operand as a (B, T, C) view (stride 0 over tokens when broadcast)."""
    b, t, c = shape
    if tensor.ndim != 3 or tensor.shape[0] != b or tensor.shape[2] != c or tensor.shape[1] not in (1, t):
        raise ValueError(f"{kernel}: {name} has shape {tuple(tensor.shape)}; expected ({b}, 1, {c}) or ({b}, {t}, {c})")
    return tensor.expand(b, t, c)


def dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
