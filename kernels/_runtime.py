"""Shared launch plumbing for the kernels in this package (not a kernel itself).

Triton decides at decoration time whether a function runs compiled or under the CPU interpreter
(`TRITON_INTERPRET=1`). The kernels here are decorated lazily, at first launch, so importing
`workbench.kernels.*` never freezes that choice: a test that sets `TRITON_INTERPRET=1` after
something else imported the module still gets the interpreter.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from typing import Any

import torch
import triton

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The `ROUND` constexpr of the in-dtype pointwise kernels: what each intermediate result is rounded to
# (0: nothing, fp32 arithmetic; 1: bfloat16; 2: float16), as torch does for ops on tensors of that dtype.
ROUNDING = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
INDEX_DTYPES = (torch.int64, torch.int32)


# How Triton reads a boolean switch such as TRITON_INTERPRET (triton.knobs, case-insensitive): these are on, these
# off; unset or empty is off. Any other value Triton also takes as off, silently; `interpreting` refuses it.
SWITCH_ON = ("1", "true", "on", "yes", "y")
SWITCH_OFF = ("0", "false", "off", "no", "n")


def interpreting() -> bool:
    """True when Triton kernels run under the CPU interpreter: `triton.knobs.runtime.interpret`, which reads
    TRITON_INTERPRET as SWITCH_ON / SWITCH_OFF (so "true" and "1" both turn it on) unless a program set the knob.

    ValueError for a TRITON_INTERPRET Triton does not recognise ("2", " 1", "interpret"), which it would take as off
    while the person who set it meant on."""
    value = os.environ.get("TRITON_INTERPRET")
    if value and value.lower() not in SWITCH_ON + SWITCH_OFF:
        raise ValueError(
            f"TRITON_INTERPRET: {value[:40]!r} is not a switch value Triton recognises (it would read it as off); "
            f"allowed: one of {list(SWITCH_ON)} (on) or {list(SWITCH_OFF)} (off), any case, or unset"
        )
    return bool(triton.knobs.runtime.interpret)


class LazyKernel:
    """`kernel[grid](...)` for a plain Python function written in Triton, decorated at first launch
    (once per interpreter/compiled mode).

    `helpers`: plain Python functions written in Triton that the kernel calls by their global name (device functions
    shared between kernels), and that may call each other so. Each mode gets its own copies of the kernel and the
    helpers whose globals name the helpers decorated for that mode (`function`), so a helper is never frozen in the
    mode that was current at import.

    A build for another card (Triton's `override_arch` knob, set by `targets.built_for`) is decorated apart too:
    Triton's in-process cache key leaves the architecture out, so one JIT function would hand back the build it made
    first for a launch.

    Why the kernels reduce with `tl.reduce(x, axis, tl.standard._sum_combine)` (or `_elementwise_max`) and make zeros
    with `tl.full`: `tl.sum`, `tl.max` and `tl.zeros` are JIT functions decorated when triton was imported, which the
    interpreter cannot call when TRITON_INTERPRET was set after that import, as it is when a kernel is decorated
    here at its first launch."""

    def __init__(self, fn: Callable[..., Any], helpers: tuple[Callable[..., Any], ...] = ()):
        self.fn = fn
        self.helpers = helpers
        self._jitted: dict[tuple[bool, str | None], Any] = {}  # (interpreted, override_arch) -> JIT function

    def function(self, interpret: bool) -> Callable[..., Any]:
        """The kernel's function with its helpers decorated for the interpreter (`interpret`) or the compiler."""
        if not self.helpers:
            return self.fn
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        wrap = InterpretedFunction if interpret else JITFunction
        scopes = [dict(helper.__globals__) for helper in self.helpers]
        decorated = {h.__name__: wrap(_with_globals(h, scope)) for h, scope in zip(self.helpers, scopes, strict=True)}
        for scope in scopes:  # a helper calls the others decorated too
            scope.update(decorated)
        return _with_globals(self.fn, {**self.fn.__globals__, **decorated})

    def __getitem__(self, grid: Any) -> Any:
        mode = interpreting()
        key = (mode, None if mode else getattr(triton.knobs.runtime, "override_arch", None))
        if key not in self._jitted:
            self._jitted[key] = triton.jit(self.function(mode))
        return self._jitted[key][grid]


def _with_globals(fn: Callable[..., Any], scope: dict[str, Any]) -> Callable[..., Any]:
    """A copy of `fn` that reads its globals from `scope` (Triton reads the source, constexpr annotations and module
    from the copy as from `fn`)."""
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__doc__ = fn.__qualname__, fn.__doc__
    copy.__annotations__, copy.__module__ = fn.__annotations__, fn.__module__
    return copy


def tma_ready(x: torch.Tensor) -> bool:
    """Whether a TMA descriptor can read x: unit last stride, 16-byte aligned base and strides."""
    return (
        x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(st * x.element_size() % 16 == 0 for st in x.stride()[:-1])
    )


def tma_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator for the tensor descriptors `tl.make_tensor_descriptor` builds on the device
    (`triton.set_allocator(tma_scratch)` before such a launch)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def capability(device: torch.device) -> int | None:
    """The CUDA device's compute capability as one number (8.9 -> 89), or None off CUDA (a CPU, the interpreter):
    what a kernel picks its launch by (`workbench.kernels.targets`)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def fp8_problem(device: torch.device) -> str | None:
    """Why FP8 (e4m3) cannot run on `device`, or None: a CUDA device below sm_89 (e4m3 tensor cores, and Triton's
    e4m3 conversions, start with Ada). Off CUDA it says nothing: whether a CPU may run is the caller's rule."""
    number = capability(device)
    if number is not None and number < 89:
        return f"FP8 (e4m3) needs compute capability 8.9 or newer (Ada, Hopper); this GPU is sm_{number}"
    return None


def check_fp8(kernel: str, device: torch.device) -> None:
    """RuntimeError naming `kernel` where `fp8_problem` gives a reason."""
    if (problem := fp8_problem(device)) is not None:
        raise RuntimeError(f"{kernel}: {problem}")


def cpu_without_interpreter(device: torch.device | str) -> bool:
    """Whether Triton kernels cannot run on `device` (a torch.device or its type) for want of the interpreter: a CPU
    while TRITON_INTERPRET is off (`interpreting`). Each caller's error says what to do instead."""
    return torch.device(device).type == "cpu" and not interpreting()


INTERPRET_TILE = 16384  # elements per program under the interpreter


def pointwise_tile(rows: int, cols: int, block_r: int, block_c: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_C) for a row-by-column pointwise kernel: the given tile when compiled; under the
    interpreter, whose cost is per program and per op rather than per element, one tile as wide as the row
    (up to `block_c`) and up to INTERPRET_TILE elements. Results do not depend on the tile (each element is
    computed on its own), so this changes only how long a CPU test takes."""
    if not interpreting():
        return block_r, block_c
    block_c = min(block_c, triton.next_power_of_2(max(cols, 1)))
    block_r = min(max(block_r, INTERPRET_TILE // block_c), triton.next_power_of_2(max(rows, 1)))
    return block_r, block_c


def check_runtime(kernel: str, *tensors: torch.Tensor) -> None:
    """All tensors on one device, and a way to run Triton there; RuntimeError naming what is missing."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{kernel}: all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if cpu_without_interpreter(device):
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


def check_qkv(
    kernel: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dtypes: tuple[torch.dtype, ...],
    layout: Callable[[str, torch.Tensor], str | None],
) -> None:
    """An attention kernel's q (B, H, Tq, D), k and v (B, H, Tk, D): each a tensor of one of `dtypes` whose shape
    `layout(name, tensor)` accepts (it returns the kernel's message for one it cannot take, else None), one dtype for
    the three, k and v of one shape, batch and heads shared with q, no empty sequence; ValueError otherwise."""
    for arg, tensor in (("q", q), ("k", k), ("v", v)):
        check_float(kernel, arg, tensor, dtypes)
        message = layout(arg, tensor)
        if message is not None:
            raise ValueError(f"{kernel}: {message}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"{kernel}: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2]:
        raise ValueError(f"{kernel}: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"{kernel}: empty sequence: q {tuple(q.shape)}, k {tuple(k.shape)}")


# The attention kernels' head dims: D is a tl.arange extent (a power of two) and the K of the FP8 dots (>= 32).
KERNEL_HEAD_DIMS = (32, 64, 128)
MAX_HEAD_DIM = KERNEL_HEAD_DIMS[-1]


def kernel_head_dim(d: int) -> int:
    """The head dim an attention kernel runs for inputs of head dim `d` (1..MAX_HEAD_DIM): the smallest of
    KERNEL_HEAD_DIMS >= d. Inputs of another `d` are zero-padded to it (`pad_head_dim`): q.k, the softmax and the
    first `d` output columns are unchanged, the padded columns come out zero and are dropped."""
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {d}; the attention kernels take 1..{MAX_HEAD_DIM}")
    return next(size for size in KERNEL_HEAD_DIMS if size >= d)


def head_dim_problem(arg: str, tensor: torch.Tensor) -> str | None:
    """The attention kernels' layout check (`check_qkv`'s `layout`): (B, H, T, D) with 1 <= D <= MAX_HEAD_DIM."""
    if tensor.ndim != 4:
        return f"{arg} must be (B, H, T, D), got shape {tuple(tensor.shape)}"
    if not 1 <= tensor.shape[-1] <= MAX_HEAD_DIM:
        return f"{arg} has head dim {tensor.shape[-1]}; supported: 1..{MAX_HEAD_DIM} (run as {list(KERNEL_HEAD_DIMS)})"
    return None


def pad_head_dim(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(B, H, T, D) tensors zero-padded on D to `kernel_head_dim(D)` (each returned as given when D is one)."""
    out = []
    for tensor in tensors:
        extra = kernel_head_dim(tensor.shape[-1]) - tensor.shape[-1]
        out.append(torch.nn.functional.pad(tensor, (0, extra)) if extra else tensor)
    return tuple(out)


def broadcast_rows(kernel: str, name: str, tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A (B, 1, C) or (B, T, C) operand as a (B, T, C) view (stride 0 over tokens when broadcast)."""
    b, t, c = shape
    if tensor.ndim != 3 or tensor.shape[0] != b or tensor.shape[2] != c or tensor.shape[1] not in (1, t):
        raise ValueError(f"{kernel}: {name} has shape {tuple(tensor.shape)}; expected ({b}, 1, {c}) or ({b}, {t}, {c})")
    return tensor.expand(b, t, c)


def table_rows(kernel: str, name: str, tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """An (R, C) table read through a per-token index, as a (B, R, C) view (stride 0 over the batch)."""
    b, _, c = shape
    if tensor.ndim != 2 or tensor.shape[1] != c:
        raise ValueError(f"{kernel}: {name} has shape {tuple(tensor.shape)}; with an index expected (R, {c})")
    return tensor.unsqueeze(0).expand(b, tensor.shape[0], c)


def check_index(kernel: str, index: torch.Tensor, tokens: int) -> torch.Tensor:
    """A (T,) int32/int64 per-token table index, contiguous. Values are the caller's to keep in range."""
    if not isinstance(index, torch.Tensor) or index.dtype not in INDEX_DTYPES:
        got = index.dtype if isinstance(index, torch.Tensor) else type(index).__name__
        raise ValueError(f"{kernel}: index has dtype {got}; allowed: {[str(d) for d in INDEX_DTYPES]}")
    if index.shape != (tokens,):
        raise ValueError(f"{kernel}: index has shape {tuple(index.shape)}; expected ({tokens},)")
    return index.contiguous()


def check_power_of_two(kernel: str, field: str, value: int, minimum: int = 1) -> None:
    """A `Launch` field that must be a power of two >= `minimum`; ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value & (value - 1):
        raise ValueError(f"{kernel}: Launch.{field}: {value!r}; expected a power of two >= {minimum}")


def check_warps(kernel: str, value: int) -> None:
    """A `Launch.num_warps`: one of 1, 2, 4, 8, 16; ValueError naming it otherwise."""
    if value not in (1, 2, 4, 8, 16):
        raise ValueError(f"{kernel}: Launch.num_warps: {value!r}; allowed: 1, 2, 4, 8, 16")


def dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
