"""NVIDIA's sol-attn package (`sol_attn`, from NVlabs/Sana `techniques/sparse_backends`) as a sparse route's kernel.

Shared by the `sol_attn` plugin and `attention_policy` (which may serve a qualified sol_attn setting); not a plugin
itself (it registers no Spec). `router_for` makes every check (package and entry points importable, a CUDA device,
the backend the package picks on it) before anything is mutated. The sol_attn plugin's docstring says what was
verified of this adapter.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

from workbench.accelerations.attention.sparse_routing import Call, Router

PACKAGE = "sol_attn"
ENTRY_POINTS = ("sol_attn", "get_sol_attn_backend")
HEAD_DIM = 128
OPTIONS = ("thresh_type",)  # sol_attn's options this package's attend reads from Settings.extra
# the CuTe backend sol-attn 0.5 names for each compute capability it specialises
CUTE_BACKENDS = {(8, 9): "cute_sm89", (9, 0): "cute_sm90", (10, 0): "cute_sm100", (12, 0): "cute_sm120"}
INSTALL_HINT = (
    "install it from its source (README, section 'Accelerations', 'Optional extras': `pip install -e "
    "techniques/sparse_backends` in a checkout of NVlabs/Sana) and its runtime with `pip install "
    "'vflash-workbench[sol]'`"
)


def probe() -> ModuleType:
    """The imported package with its documented entry points, or RuntimeError saying what is missing."""
    try:
        package = importlib.import_module(PACKAGE)
    except ImportError as error:
        raise RuntimeError(f"sol_attn: the `{PACKAGE}` package is not importable ({error}); {INSTALL_HINT}") from error
    missing = [name for name in ENTRY_POINTS if not callable(getattr(package, name, None))]
    if missing:
        raise RuntimeError(
            f"sol_attn: `{PACKAGE}` at {getattr(package, '__file__', '?')} lacks {missing}; this adapter expects the "
            "sol-attn 0.5 interface"
        )
    return package


def expected_backend(device: torch.device, backend: str) -> str:
    """The backend name `get_sol_attn_backend` must return for option `backend` on this CUDA device."""
    if backend == "triton":
        return "triton"
    capability = torch.cuda.get_device_capability(device)
    if capability not in CUTE_BACKENDS:
        raise RuntimeError(
            f"sol_attn: sol-attn 0.5 has no CuTe kernel for sm_{capability[0]}{capability[1]}; it has "
            f"{sorted(CUTE_BACKENDS.values())} (backend='triton' takes its Triton kernel instead)"
        )
    return CUTE_BACKENDS[capability]


def router_for(model: Any, device: torch.device, options: dict[str, Any], settings_for: Any) -> Router:
    """Every check, then a Router that calls the package; nothing is mutated (Router.install does that)."""
    package = probe()
    if device.type != "cuda":
        raise RuntimeError(f"sol_attn: the package runs on CUDA devices; this session runs on {device}")
    want = expected_backend(device, options["backend"])
    got = package.get_sol_attn_backend(device)
    if got != want:
        hint = " (CuTe DSL runtime missing: pip install 'vflash-workbench[sol]')" if got == "triton" else ""
        raise RuntimeError(f"sol_attn: the package picks backend {got!r} on {device}; required {want!r}{hint}")
    try:
        version = metadata.version("sol-attn")
    except metadata.PackageNotFoundError:
        version = None

    def attend(call: Call) -> tuple[torch.Tensor, None]:
        q, k, v = (x.contiguous() for x in call.qkv)
        if q.dtype != torch.bfloat16 or q.shape[-1] != HEAD_DIM:
            raise RuntimeError(f"sol_attn: q {tuple(q.shape)} {q.dtype}; the package takes bfloat16, head dim 128")
        settings = call.settings
        out = package.sol_attn(
            q, k, v, scale=call.kwargs.get("scale"), tau=settings.tau, thresh_type=settings.extra["thresh_type"],
            kv_splits=1, sink_tokens=call.rows(settings.sink_tokens), sink_start=0,
        )  # fmt: skip
        call.router.receipt.notes.update(backend=got, package_version=version)
        return out, None

    router = Router("sol_attn", model, None, attend, settings_for, options["per_expert"])
    router.check_modules(HEAD_DIM, (torch.bfloat16,))
    return router
