"""Named acceleration profiles: data, turned into a `Session.accelerate` config by `profile()`.

`stock`: nothing installed ({}).

`exact-fast`: the best measured combination of plugins whose contract is `bitwise`, `rounding` or
`reduction` (never `approximate`; checked against `workbench.accelerations.available()` at every call, so a
plugin whose contract became approximate makes this raise instead of silently joining the profile). Each family
names its set (`Family.exact_fast` in workbench/models/); the measurements behind them:

The sets were chosen from A/B/A measurements on an H200 (random weights); `python -m benchmarks run forward-wan
request-wan forward-h3` re-measures them against stock (docs/measurements.md):
- Wan: `fused_block_norms` + `adaln_precompute` + `cross_kv_cache` + `gelu_epilogue` + `flash4_attention` (output
  relative L2 about 5e-3 against stock). The bit-equal set (`fused_block_ops` + precompute + cross-KV) is what a
  user who needs `torch.equal` to stock installs by hand.
- H3: `fused_block_norms` + `flash4_attention` (relative L2 about 2.5e-3).
- LTX-2: `adaln_precompute` and `cross_kv_cache` where their `Spec.families` accept the family (its fused block
  measured slower per block, and FlashAttention-4 was not measured on it).
Attention is never forced to `_native_cudnn`: that measured slower than diffusers' default (0.970x Wan, 0.985x H3).

What a machine cannot run is left out, and `profile_plan` says why: a plugin whose `Spec.devices` excludes the
device (gelu_epilogue, flash4_attention on a CPU), and a plugin whose `Spec.unusable` gives a reason (a Triton
plugin on a CPU without `TRITON_INTERPRET` on, read as Triton reads it: `workbench.kernels._runtime.interpreting`, which
refuses a value Triton would silently take as off; flash4_attention: `flash_attn.cute` not installed, or a GPU other
than sm_90/sm_100; README: FlashAttention-4). The receipts of a request
say which plugins ran.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.models import families

PROFILES = ("stock", "exact-fast")
EXACT_CONTRACTS = ("bitwise", "rounding", "reduction")
# Each family names its exact-fast set (`Family.exact_fast`: plugin, options, in install order); a new family
# brings its own, and the registry says what each plugin is and where it runs.
FAMILIES = tuple(families())


def profile(name: str, family: str, device: str | torch.device) -> dict[str, dict[str, Any]]:
    """The `Session.accelerate` config of profile `name` for model `family` on `device`.

    ValueError naming the allowed values for an unknown profile or family; RuntimeError if a plugin the
    profile lists is no longer registered or its contract became `approximate`.
    """
    return profile_plan(name, family, device)[0]


def profile_plan(
    name: str, family: str, device: str | torch.device
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(`profile(name, family, device)`, {plugin the profile lists but leaves out here: why})."""
    if name not in PROFILES:
        raise ValueError(f"profile: unknown profile {name!r}; allowed: {list(PROFILES)}")
    if family not in FAMILIES:
        raise ValueError(f"profile: unknown family {family!r}; allowed: {list(FAMILIES)}")
    if name == "stock":
        return {}, {}
    from workbench.accelerations import available

    specs = available()
    kind = torch.device(device).type
    config: dict[str, dict[str, Any]] = {}
    left_out: dict[str, str] = {}
    for plugin, options in families()[family].exact_fast:
        spec = specs.get(plugin)
        if spec is None:
            raise RuntimeError(f"profile {name!r}: plugin {plugin!r} is not registered")
        if spec.contract not in EXACT_CONTRACTS:
            raise RuntimeError(
                f"profile {name!r}: plugin {plugin!r} has contract {spec.contract!r}; exact-fast allows {EXACT_CONTRACTS}"
            )
        if spec.families is not None and family not in spec.families:
            continue  # listed for other families
        if kind not in spec.devices:
            left_out[plugin] = f"runs on {list(spec.devices)}, not {kind}"
        elif spec.unusable is not None and (reason := spec.unusable(torch.device(device))) is not None:
            left_out[plugin] = reason
        else:
            config[plugin] = dict(options)
    return config, left_out
