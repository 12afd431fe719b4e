"""One registry of accelerations. Each technique lives in its own module and registers one `Spec`.

`available()` is what the widgets panel and the CLI read; nothing else lists plugins.
"""

from __future__ import annotations

from workbench.accelerations import (
    adaln_precompute,
    attention_backend,
    attention_policy,
    block_sparse,
    cache_dit,
    context_parallel,
    cross_kv_cache,
    diffusers_caches,
    easycache,
    flash4_attention,
    fused_block_norms,
    fused_block_ops,
    fused_qkv,
    gelu_epilogue,
    group_offload,
    mag_cache,
    regional_compile,
    selective_fp8,
    sol_attn,
    teacache,
)
from workbench.accelerations.base import CONTRACTS, Handle, Option, Prepared, Receipt, Spec, fingerprint
from workbench.accelerations.install import plan

_MODULES = (
    attention_backend,
    flash4_attention,
    block_sparse,
    sol_attn,
    attention_policy,
    fused_qkv,
    cross_kv_cache,
    easycache,
    diffusers_caches,
    group_offload,
    regional_compile,
    teacache,
    selective_fp8,
    mag_cache,
    cache_dit,
    fused_block_ops,
    fused_block_norms,
    gelu_epilogue,
    adaln_precompute,
    context_parallel,
)
REGISTRY: dict[str, Spec] = {spec.name: spec for module in _MODULES for spec in module.SPECS}


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
