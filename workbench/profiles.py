"""Named acceleration profiles: data, turned into a `Session.accelerate` config by `profile()`.

`stock`: nothing installed ({}).

`exact-fast`: the best measured combination of plugins whose contract is `bitwise`, `rounding` or
`reduction` (never `approximate`; checked against `workbench.accelerations.available()` at every call, so a
plugin whose contract became approximate makes this raise instead of silently joining the profile).

- Wan on CUDA: cuDNN attention + `fused_block_ops` (rope="auto": attn1's rotary step as the `rope_only` kernel)
  + `adaln_precompute` + `cross_kv_cache`. Measured on the H200 in this project: `fused_block_ops` +
  `adaln_precompute` + `cross_kv_cache` qualified at 1.046x with bit-equal output, before the rotary kernel existed
  (benchmarks/results/2026-11-29-exact-fast-exact-plugins.json); the Wan block with rope="auto" is `torch.equal`
  to the stock block on the H200 at the 1.3B shape, float32 and float64 rotary tables, 1.13x per block
  (benchmarks/results/2026-11-29-fused-blocks-gpu.json). `regional_compile` was
  measured at 1.125x but moved the random-weight output by relative L2 0.032, outside the 0.03 budget
  (benchmarks/results/2026-11-29-qualify-stock-vs-regional-compile.json), so it is NOT in exact-fast; it also
  refuses blocks whose forward `fused_block_ops` replaced. Whether torch.compile over the fused blocks composes
  is measured by benchmarks/exact_fast_forward.py (its `exact-fast+compile` arm), not assumed here.
- Wan on CPU: cuDNN attention is CUDA-only and `fused_block_ops` needs the Triton interpreter there, so
  both are dropped unless `TRITON_INTERPRET=1` is set (then `fused_block_ops` stays; cuDNN never does).
- LTX-2 and H3: only those of `cross_kv_cache`, `adaln_precompute` and `attention_backend` (cuDNN, CUDA only)
  whose `Spec.families` accept the family.
"""

from __future__ import annotations

import os
from typing import Any

import torch

PROFILES = ("stock", "exact-fast")
FAMILIES = ("wan", "ltx2", "h3")
EXACT_CONTRACTS = ("bitwise", "rounding", "reduction")

# (plugin, options, needs CUDA, CPU only under TRITON_INTERPRET=1), in the order they are listed
_WAN_EXACT_FAST = (
    ("attention_backend", {"backend": "cudnn"}, True, False),
    ("fused_block_ops", {"rope": "auto"}, False, True),
    ("adaln_precompute", {}, False, False),
    ("cross_kv_cache", {}, False, False),
)
_OTHER_EXACT_FAST = (
    ("attention_backend", {"backend": "cudnn"}, True, False),
    ("adaln_precompute", {}, False, False),
    ("cross_kv_cache", {}, False, False),
)


def profile(name: str, family: str, device: str | torch.device) -> dict[str, dict[str, Any]]:
    """The `Session.accelerate` config of profile `name` for model `family` on `device`.

    ValueError naming the allowed values for an unknown profile or family; RuntimeError if a plugin the
    profile lists is no longer registered or its contract became `approximate`.
    """
    if name not in PROFILES:
        raise ValueError(f"profile: unknown profile {name!r}; allowed: {list(PROFILES)}")
    if family not in FAMILIES:
        raise ValueError(f"profile: unknown family {family!r}; allowed: {list(FAMILIES)}")
    if name == "stock":
        return {}
    from workbench.accelerations import available

    specs = available()
    on_cuda = torch.device(device).type == "cuda"
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    config: dict[str, dict[str, Any]] = {}
    for plugin, options, cuda_only, cpu_needs_interpreter in _WAN_EXACT_FAST if family == "wan" else _OTHER_EXACT_FAST:
        spec = specs.get(plugin)
        if spec is None:
            raise RuntimeError(f"profile {name!r}: plugin {plugin!r} is not registered")
        if spec.contract not in EXACT_CONTRACTS:
            raise RuntimeError(
                f"profile {name!r}: plugin {plugin!r} has contract {spec.contract!r}; exact-fast allows {EXACT_CONTRACTS}"
            )
        if spec.families is not None and family not in spec.families:
            continue
        if cuda_only and not on_cuda:
            continue
        if cpu_needs_interpreter and not on_cuda and not interpreting:
            continue
        config[plugin] = dict(options)
    return config
