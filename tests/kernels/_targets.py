"""Ahead-of-time compiles of the kernels for each card of `workbench.kernels.targets.TARGETS`, without a GPU (the CI's
tooling, not the product's).

`record(call)` runs a kernel's public function on CPU tensors with every Triton launch intercepted instead of run: it
returns what the compiled path would launch (the kernel, its argument types, its constexprs, warps and stages: the
launch that ships, chosen by the same code a GPU call takes) and writes nothing the caller can use. `compile_for`
compiles one such launch for a target with Triton's own compiler (the PTX assembler ships with Triton) and reports
the shared memory the launch needs and ptxas' registers and spills (tests/kernels/test_targets.py compiles every
kernel for every target with it).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import triton

from workbench.kernels import _runtime
from workbench.kernels.targets import TARGETS, Target, kernel_modules


@dataclass(frozen=True)
class Launched:
    """One intercepted launch: the kernel's Python function, its signature, constexprs and argument attributes as
    Triton's JIT would specialize them (an int argument equal to 1 becomes a constexpr; pointers 16-byte aligned and
    ints divisible by 16 are marked so, which lets the compiler vectorize), and the launch options (warps, stages,
    fp fusion, ...) the compiled path passed."""

    name: str
    fn: Callable[..., Any]
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    attrs: dict[tuple[int, ...], Any]


@dataclass(frozen=True)
class Report:
    """What one launch needs on one target: shared memory (bytes), registers per thread, spilled bytes."""

    kernel: str
    target: str
    shared_bytes: int
    registers: int
    spill_bytes: int


def record(call: Callable[[], Any], target: Target | None = None) -> list[Launched]:
    """The launches `call()` makes on the compiled path for a GPU of `target` (default sm_90), intercepted: the
    kernels pick their launch by that capability as on the card, and no kernel runs (outputs are garbage)."""
    number = (target or TARGETS["sm_90"]).capability
    launches: list[Launched] = []

    def launcher(self: _runtime.LazyKernel, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            launches.append(_launched(self.function(False), args, kwargs))

        return launch

    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(_runtime.LazyKernel, "__getitem__", launcher))
        for module in [_runtime, *kernel_modules()]:  # the compiled path: no interpreter, a device to run it
            if hasattr(module, "interpreting"):
                patches.enter_context(mock.patch.object(module, "interpreting", lambda: False))
            if hasattr(module, "check_runtime"):
                patches.enter_context(mock.patch.object(module, "check_runtime", lambda *a, **k: None))
            if hasattr(module, "capability"):
                patches.enter_context(mock.patch.object(module, "capability", lambda device: number))
            if hasattr(module, "check_fp8"):  # the refusal below sm_89 is checked on its own; here: what would launch
                patches.enter_context(mock.patch.object(module, "check_fp8", lambda *a: None))
        patches.enter_context(mock.patch.object(triton, "set_allocator", lambda *a, **k: None))
        call()
    if not launches:
        raise RuntimeError("record: the call launched no kernel")
    return launches


def compiled_for(launched: Launched, target: Target) -> Any:
    """`launched` compiled by Triton for `target` (no GPU needed): the compiled kernel (`.asm["ptx"]`, `.metadata`);
    raises whatever the compiler raises."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    # JITFunction directly: triton.jit would hand back the interpreter's wrapper while TRITON_INTERPRET is on
    source = ASTSource(
        fn=JITFunction(launched.fn), signature=launched.signature, constexprs=launched.constexprs, attrs=launched.attrs
    )
    return triton.compile(source, target=GPUTarget("cuda", target.capability, 32), options=launched.options)


def compile_for(launched: Launched, target: Target) -> Report:
    """Compile `launched` for `target` (`compiled_for`) and report its shared memory, registers and spills."""
    kernel = compiled_for(launched, target)
    registers, spills = _ptxas_usage(kernel.asm["ptx"], target)
    return Report(launched.name, target.name, int(kernel.metadata.shared), registers, spills)


def _launched(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Launched:
    import inspect

    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    names = list(inspect.signature(fn).parameters)
    options = {k: v for k, v in kwargs.items() if k not in names}  # launch options: warps, stages, fp fusion, ...
    constexprs = {k: v for k, v in kwargs.items() if k in names}
    signature, attrs = {}, {}
    for i, (name, value) in enumerate(zip(names, args, strict=False)):
        # the JIT's own specialization: ("*bf16" | "i32" | "fp32" | "constexpr", "D" for 16-divisible or aligned)
        kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            constexprs[name] = value
        elif isinstance(spec, str):
            attrs[(i,)] = BaseBackend.parse_attr(spec)
    for name in constexprs:
        signature[name] = "constexpr"
    missing = [n for n in names if n not in signature]
    if missing:
        raise RuntimeError(f"record: {fn.__name__} launched without {missing}")
    return Launched(fn.__name__, fn, signature, constexprs, options, attrs)


def _ptxas_usage(ptx: str, target: Target) -> tuple[int, int]:
    """(registers, spilled bytes) from ptxas -v on the kernel's PTX (the ptxas Triton itself uses for the target)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(target.capability).path
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.ptx"
        path.write_text(ptx)
        arch = f"sm_{target.capability}a" if target.capability == 90 else target.name
        run = subprocess.run(
            [ptxas, "-v", f"-arch={arch}", str(path), "-o", str(Path(folder) / "kernel.cubin")],
            capture_output=True,
            text=True,
        )
    report = run.stderr + run.stdout
    if run.returncode:
        raise RuntimeError(f"ptxas for {target.name} failed: {report.strip()[-500:]}")
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report))
    return registers, spills
