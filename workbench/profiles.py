"""Named acceleration profiles: data, turned into a `Session.accelerate` config by `profile()`.

`stock`: nothing installed ({}).

`exact-fast`: the best measured combination of plugins whose contract is `bitwise`, `rounding` or
`reduction` (never `approximate`; checked against `workbench.accelerations.available()` at every call, so a
plugin whose contract became approximate makes this raise instead of silently joining the profile).

Attention stays on diffusers' default (`native`, torch SDPA, which picks cuDNN itself on the H200): forcing the
`_native_cudnn` backend measured slower than that default in the same process, 0.970x on the Wan2.1-1.3B
forward (benchmarks/results/2026-11-29-exact-fast-forward.json) and 0.985x on the full-size H3 forward
(2026-11-29-h3-full-forward.json), with bit-equal outputs, so no profile forces it.

- Wan: `fused_block_ops` (rope="auto": attn1's rotary step as the `rope_only` kernel) + `adaln_precompute` +
  `cross_kv_cache`. On the H200 (2026-11-29-exact-fast-forward.json, A/B/A, 3 rounds) this set with cuDNN
  forced ran one 32,760-token forward at 1.075x stock with output `torch.equal` to stock, and a 16-step request
  at 1.067x; the Wan block with rope="auto" is `torch.equal` to the stock block on the H200 (float32 and float64
  rotary tables, 2026-11-29-fused-blocks-gpu.json). `regional_compile` moved the random-weight output by relative
  L2 0.032, outside the 0.03 budget (2026-11-29-qualify-stock-vs-regional-compile.json), so it is NOT here;
  it also refuses blocks whose forward `fused_block_ops` replaced.
- H3: `fused_block_ops` (bit-equal to the cuDNN arm on the full-size forward, 1.013x over it).
- LTX-2: `adaln_precompute` and `cross_kv_cache` where their `Spec.families` accept the family (its fused
  block measured 0.87x per block, so it is left out).
- On a CPU `fused_block_ops` needs the Triton interpreter, so it is dropped unless `TRITON_INTERPRET=1` is set.
"""

from __future__ import annotations

import os
from typing import Any

import torch

PROFILES = ("stock", "exact-fast")
FAMILIES = ("wan", "ltx2", "h3")
EXACT_CONTRACTS = ("bitwise", "rounding", "reduction")

# family -> (plugin, options, CPU only under TRITON_INTERPRET=1), in the order they are listed
_EXACT_FAST = {
    "wan": (
        ("fused_block_ops", {"rope": "auto"}, True),
        ("adaln_precompute", {}, False),
        ("cross_kv_cache", {}, False),
    ),
    "ltx2": (("adaln_precompute", {}, False), ("cross_kv_cache", {}, False)),
    "h3": (("fused_block_ops", {}, True), ("adaln_precompute", {}, False), ("cross_kv_cache", {}, False)),
}


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
    for plugin, options, cpu_needs_interpreter in _EXACT_FAST[family]:
        spec = specs.get(plugin)
        if spec is None:
            raise RuntimeError(f"profile {name!r}: plugin {plugin!r} is not registered")
        if spec.contract not in EXACT_CONTRACTS:
            raise RuntimeError(
                f"profile {name!r}: plugin {plugin!r} has contract {spec.contract!r}; exact-fast allows {EXACT_CONTRACTS}"
            )
        if spec.families is not None and family not in spec.families:
            continue
        if cpu_needs_interpreter and not on_cuda and not interpreting:
            continue
        config[plugin] = dict(options)
    return config
