"""The GPUs the kernels are built for, and running them on the GPU at hand as another card's build.

`TARGETS`: the compute capabilities the project supports, with what the kernels must respect there: shared memory a
block may use (the opt-in maximum), and whether the tensor cores take FP8 (e4m3). The seeds' cards are sm_86
(RTX 3090) and sm_89 (RTX 4090); sm_80 is the A100, sm_90 the H100/H200 everything was measured on. The CI compiles
every kernel for every target without a GPU (tests/kernels/test_targets.py), so a kernel that stops compiling for a
card, or outgrows its shared memory, fails there and not on a user's GPU.

`built_for(target)` runs kernels on the GPU at hand as the card's build: Triton generates their code for `target` and
assembles it for this GPU (PTX is forward compatible), so the H200 can check and time what a 3090 or 4090 would run
(benchmarks scenario `portability`). `kernel_modules()`: every Triton kernel module, imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import triton


@dataclass(frozen=True)
class Target:
    """A compute capability the kernels support: `shared_bytes` a block may use, `fp8` e4m3 tensor cores."""

    name: str
    capability: int
    shared_bytes: int
    fp8: bool


TARGETS = {
    t.name: t
    for t in (
        Target("sm_80", 80, 166_912, False),  # A100: 163 KB per block
        Target("sm_86", 86, 101_376, False),  # RTX 3090 / A-series workstation: 99 KB
        Target("sm_89", 89, 101_376, True),  # RTX 4090 / L40: 99 KB, FP8 tensor cores
        Target("sm_90", 90, 232_448, True),  # H100 / H200: 227 KB
    )
}


@contextlib.contextmanager
def built_for(target: Target) -> Iterator[None]:
    """Inside, kernels launched on a GPU are compiled as Triton compiles them for `target` (its code generation: below
    sm_90 no wgmma, no TMA, no warp specialization; FP8 conversions from sm_89) and assembled for the GPU they run on.
    Only the build changes: the launch is still the caller's (pass the card's, e.g. `launch_for`'s choice below
    sm_90), and the GPU's own limits apply (the CI checks shared memory per card). Triton's
    `override_arch` knob (TRITON_OVERRIDE_ARCH) for the duration, restored after; `_runtime.LazyKernel` keeps these
    builds apart from the GPU's own. RuntimeError when this Triton has no such knob."""
    runtime = triton.knobs.runtime
    if not hasattr(runtime, "override_arch") or not hasattr(runtime, "scope"):
        raise RuntimeError(
            f"built_for({target.name}): this Triton ({triton.__version__}) has no knobs.runtime.override_arch "
            "(TRITON_OVERRIDE_ARCH) to compile for another card; install a Triton that has it"
        )
    with runtime.scope():  # restores the knob and TRITON_OVERRIDE_ARCH, which setting the knob exports
        runtime.override_arch = f"sm{target.capability}"
        yield


NOT_TRITON = ("targets", "fp8_attention_sm90")  # this module; the CuTe DSL kernel (its own tests compile it)


def kernel_modules() -> list[Any]:
    """Every Triton kernel module of `workbench.kernels` (not the shared plumbing, not `NOT_TRITON`), imported, in
    name order."""
    import importlib
    import pkgutil

    import workbench.kernels as package

    names = [
        m.name
        for m in pkgutil.iter_modules(package.__path__)
        if not m.name.startswith("_") and m.name not in NOT_TRITON
    ]
    return [importlib.import_module(f"workbench.kernels.{name}") for name in names]
