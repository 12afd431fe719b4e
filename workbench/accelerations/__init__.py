"""One registry of accelerations, grouped by kind in subpackages.

Each technique is one module under `workbench/accelerations/<kind>/` (attention, caching, fused, quantization,
memory, parallel, compile) that defines `SPECS`, the `Spec`s it registers. `PLUGINS` below is the only list of
plugin modules: adding a technique is one module plus one line here. Its order is the registry's order, which
the panel, the CLI listing and the README table show.

`available()` is what the widgets panel, the CLI and the profiles read; nothing else lists plugins.
"""

from __future__ import annotations

import importlib

from workbench._quiet_imports import defer_torchao

defer_torchao()  # before `base` imports diffusers: see workbench/_quiet_imports.py

from workbench.accelerations.base import CONTRACTS, Handle, Option, Prepared, Receipt, Spec, fingerprint  # noqa: E402
from workbench.accelerations.install import plan  # noqa: E402

PLUGINS = (
    "attention.attention_backend",
    "attention.flash4_attention",
    "attention.block_sparse",
    "attention.fp8_attention",
    "attention.sol_attn",
    "attention.attention_policy",
    "fused.fused_qkv",
    "caching.cross_kv_cache",
    "caching.easycache",
    "caching.diffusers_caches",
    "memory.group_offload",
    "memory.block_ring",
    "compile.regional_compile",
    "caching.teacache",
    "quantization.selective_fp8",
    "caching.mag_cache",
    "caching.cache_dit",
    "fused.fused_block_ops",
    "fused.fused_block_norms",
    "fused.gelu_epilogue",
    "fused.fused_vae_decode",
    "caching.adaln_precompute",
    "parallel.context_parallel",
)


def _load(modules: tuple[str, ...]) -> dict[str, Spec]:
    registry: dict[str, Spec] = {}
    for module in modules:
        for spec in importlib.import_module(f"{__name__}.{module}").SPECS:
            if spec.name in registry:
                raise RuntimeError(f"accelerations: {module} registers {spec.name!r} a second time")
            object.__setattr__(spec, "kind", module.split(".")[0])  # frozen; the module's place is its kind
            registry[spec.name] = spec
    return registry


REGISTRY: dict[str, Spec] = _load(PLUGINS)


def available() -> dict[str, Spec]:
    """Every registered acceleration by name (each `Spec` has `contract`, `options`, `describe()`)."""
    return dict(REGISTRY)


__all__ = [
    "CONTRACTS",
    "REGISTRY",
    "Handle",
    "Option",
    "Prepared",
    "Receipt",
    "Spec",
    "available",
    "fingerprint",
    "plan",
]
