"""Named acceleration profiles: data, turned into a `Session.accelerate` config by `profile()`.

`stock`: nothing installed ({}).

`within-budget`: what a calibration found (`workbench calibrate`, `workbench.evidence.calibrate`): the config of a
calibration or stack record, given as `record=`. It holds only where it was measured: the same model, device (type,
and name on a GPU) and request geometry; `within_budget` refuses anything else, and a record whose setting was not
confirmed (status other than "calibrated" or "quality_confirmed").

`exact-fast`: the best measured combination of plugins whose contract is `bitwise`, `rounding` or
`reduction` (never `approximate`; checked against `workbench.accelerations.available()` at every call, so a
plugin whose contract became approximate makes this raise instead of silently joining the profile). Each family
names its set (`Family.exact_fast` in workbench/models/), chosen by A/B/A measurement against stock; `python -m
benchmarks run forward-wan request-wan forward-h3` re-measures them (docs/measurements.md):
- Wan: `fused_block_norms` + `adaln_precompute` + `cross_kv_cache` + `gelu_epilogue` + `flash4_attention` +
  `fused_vae_decode` in its bitwise default (padded conv buffers). The bit-equal set (`fused_block_ops` + precompute
  + cross-KV) is what a user who needs `torch.equal` to stock installs by hand.
- H3: `fused_block_norms` + `flash4_attention`.
- LTX-2: `cross_kv_cache` (its fused block was slower per block, and FlashAttention-4 is unmeasured on it).
Attention is never forced to `_native_cudnn`: it was slower than diffusers' default on both Wan and H3.

What a machine cannot run is left out, and `profile_plan` says why: a plugin whose `Spec.devices` excludes the
device (gelu_epilogue, flash4_attention on a CPU), and a plugin whose `Spec.unusable` gives a reason (a Triton
plugin on a CPU without `TRITON_INTERPRET` on, read as Triton reads it: `workbench.kernels._runtime.interpreting`, which
refuses a value Triton would silently take as off; flash4_attention: `flash_attn.cute` not installed, or a GPU other
than sm_90/sm_100; the README's section "Accelerations", "Optional extras": `flash4`), and, given the loaded model, a
plugin whose `Spec.model_problem` gives a reason (fused_vae_decode on Wan2.2-TI2V's VAE). The receipts of a request
say which plugins ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workbench.models import families

PROFILES = ("stock", "exact-fast")  # computed from (family, device); `within-budget` is read from a record
CONFIRMED = ("calibrated", "quality_confirmed")
EXACT_CONTRACTS = ("bitwise", "rounding", "reduction")
# Each family names its exact-fast set (`Family.exact_fast`: plugin, options, in install order); a new family
# brings its own, and the registry says what each plugin is and where it runs.
FAMILIES = tuple(families())


def profile(name: str, family: str, device: str | torch.device, model: Any = None) -> dict[str, dict[str, Any]]:
    """The `Session.accelerate` config of profile `name` for model `family` on `device` (and, given the loaded
    `model`, without the plugins it cannot take: `profile_plan`).

    ValueError naming the allowed values for an unknown profile or family; RuntimeError if a plugin the
    profile lists is no longer registered or its contract became `approximate`.
    """
    return profile_plan(name, family, device, model)[0]


def calibration_record(record: str | Path | dict[str, Any], field: str = "record") -> dict[str, Any]:
    """The calibration or stack record at `record` (a path, or the loaded dict), checked for what `within_budget`
    reads: a confirmed status, the setting (config for a stack) as plugin -> options, and the scope's model, device
    and request. ValueError naming `field` and what is wrong or missing; nothing else is checked here."""
    if isinstance(record, dict):
        data: Any = record
    else:
        try:
            data = json.loads(Path(record).read_text())
        except (OSError, ValueError, RecursionError) as error:  # RecursionError: nested too deeply
            raise ValueError(f"{field}: {str(record)!r} is not a readable JSON file ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{field}: expected a JSON object (a calibrate record), got {type(data).__name__}")
    kind = data.get("kind")
    if kind not in ("calibration", "stack"):
        raise ValueError(f"{field}: kind {kind!r}; allowed: a 'calibration' or 'stack' record (workbench calibrate)")
    if data.get("status") not in CONFIRMED:
        raise ValueError(f"{field}: status {data.get('status')!r} ({data.get('reason')}); allowed: {list(CONFIRMED)}")
    name = "setting" if kind == "calibration" else "config"
    config = data.get(name)
    if not isinstance(config, dict) or not all(isinstance(o, dict) for o in config.values()):
        raise ValueError(f"{field}: {name!r} must be an object of plugin -> options, got {config!r}")
    scope = data.get("scope")
    device = scope.get("device") if isinstance(scope, dict) else None
    if not (
        isinstance(scope, dict)
        and isinstance(scope.get("model"), str)
        and isinstance(device, dict)
        and {"name", "type"} <= set(device)
        and isinstance(scope.get("request"), dict)
    ):
        raise ValueError(f"{field}: 'scope' must hold 'model', 'device' (name, type) and 'request', got {scope!r}")
    return data


def within_budget(
    record: str | Path | dict[str, Any],
    model: str,
    device: str | torch.device,
    request: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    dtype: str | None = None,
) -> dict[str, dict[str, Any]]:
    """The config of a calibration or stack record (a path or the loaded dict), after checking that it holds here:
    its status is confirmed, its model is `model`, its device matches `device` and, given them, the geometry matches
    the `request` (resolved, as `Request.to_dict`), the denoisers' shapes the model `key`
    (`attention_policy.model_key`: a local folder of another size under the same name differs) and the `dtype`
    ("bfloat16", ...). ValueError naming what differs otherwise."""
    from workbench import environment

    data = calibration_record(record)
    config = data["setting"] if data["kind"] == "calibration" else data["config"]
    scope = data["scope"]
    measured = {"model": scope["model"], "device": scope["device"]["name"], "type": scope["device"]["type"]}
    here = environment.device_info(environment.device(device))
    if measured["model"] != model:
        raise ValueError(f"record: calibrated for model {measured['model']!r}, not {model!r}")
    if measured["type"] != here["type"] or (here["type"] == "cuda" and measured["device"] != here["name"]):
        raise ValueError(f"record: calibrated on {measured['device']} ({measured['type']}), not {here['name']}")
    for name, here_value in (("model_key", key), ("dtype", dtype)):
        if here_value is not None and scope.get(name) != here_value:
            raise ValueError(f"record: calibrated with {name} {scope.get(name)!r}, not {here_value!r}")
    if request is not None:
        held = scope["request"]
        differ = {k: (v, request.get(k)) for k, v in held.items() if v != request.get(k)}
        if differ:
            shown = ", ".join(f"{k} {a!r} (calibrated) vs {b!r}" for k, (a, b) in differ.items())
            raise ValueError(f"record: holds for another request geometry: {shown}")
    return config


def card_plan(name: str, family: str, card: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """What profile `name` installs for `family` on a GPU of `card` (a capability "sm_86", "sm_89", ... of
    `workbench.kernels.targets.TARGETS`, or a card's name of `workbench.cards.CARDS` such as "rtx4090-48gb"),
    without that GPU: (config, {plugin left out: why}), from each plugin's
    declared `Spec.capabilities`. Packages this machine lacks are not asked about: that is `profile_plan`'s answer
    on the card itself. Where FlashAttention-4 is left out, attention stays PyTorch's SDPA (its flash / memory-
    efficient kernels on Ampere and Ada), the best exact attention those cards have."""
    from workbench import cards
    from workbench.kernels.targets import TARGETS

    if cards.is_card(card):
        card = cards.card(card).target
    if card not in TARGETS:
        raise ValueError(f"card: unknown {card!r}; allowed: {list(TARGETS)} or one of {list(cards.CARDS)}")
    number = TARGETS[card].capability

    def why_not(spec: Any) -> str | None:
        if "cuda" not in spec.devices:
            return f"runs on {list(spec.devices)}"
        if spec.capabilities is not None and number not in spec.capabilities:
            return f"runs on {'/'.join(f'sm_{c}' for c in spec.capabilities)}, not {card}"
        return None

    return _plan(name, family, why_not)


def profile_plan(
    name: str, family: str, device: str | torch.device, model: Any = None
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(`profile(name, family, device, model)`, {plugin the profile lists but leaves out here: why}). Given the loaded
    `model`, a plugin whose `Spec.model_problem` names a reason is left out too (fused_vae_decode on a VAE it does not
    cover)."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"device: {device!r}; allowed: 'cpu', 'cuda' or 'cuda:N' (or a torch.device)") from None

    def why_not(spec: Any) -> str | None:
        if kind not in spec.devices:
            return f"runs on {list(spec.devices)}, not {kind}"
        if spec.unusable is not None and (reason := spec.unusable(torch.device(device))) is not None:
            return reason
        return None if model is None or spec.model_problem is None else spec.model_problem(model)

    return _plan(name, family, why_not)


def _plan(
    name: str, family: str, why_not: Callable[[Any], str | None]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The profile's plugins for `family`, each kept or left out with `why_not(spec)`'s reason."""
    if name == "within-budget":
        raise ValueError("profile: 'within-budget' is read from a calibration record: profiles.within_budget(record)")
    if name not in PROFILES:
        raise ValueError(f"profile: unknown profile {name!r}; allowed: {list(PROFILES)}")
    if family not in FAMILIES:
        raise ValueError(f"profile: unknown family {family!r}; allowed: {list(FAMILIES)}")
    if name == "stock":
        return {}, {}
    from workbench.accelerations import available

    specs = available()
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
            raise RuntimeError(f"profile {name!r}: plugin {plugin!r} serves {spec.families}, not {family!r}")
        reason = why_not(spec)
        if reason is None:
            config[plugin] = dict(options)
        else:
            left_out[plugin] = reason
    return config, left_out
