"""diffusers' MagCache as a plugin (contract: approximate): skip the block stack while the accumulated
error predicted from per-step residual magnitude ratios stays below `threshold` (Ma et al. 2025,
github.com/Zehong-Ma/MagCache; implementation `diffusers.hooks.mag_cache`).

`mag_ratios` are checkpoint- and schedule-dependent: one ratio per inference step, `mean(|r_t| / |r_t-1|)`
of the block-stack residual norms per token. `calibrate=True` obtains them: diffusers then never skips
and records the ratios; this plugin copies them into `receipt.notes["mag_ratios"]` per CFG branch (and
per denoiser for Wan2.2), ready to pass back as `mag_ratios` for the same step count. Without
calibration `mag_ratios` is required and its length must equal the request's steps (diffusers would
silently interpolate; this plugin refuses at `begin_request` instead).

diffusers' config fixes `num_inference_steps`, so the cache is (re)enabled at `begin_request` whenever
the step count changes. Receipts as the other diffusers caches: executed blocks counted at their
feed-forward, `blocks_skipped` is proof. `max_skip_steps=0` or `calibrate=True` never skip (dense bit
for bit); `threshold=0` alone still skips when the ratios are exactly 1.

Experts (Wan2.2, `workbench.models.experts`): diffusers' state, and so its step index, lives in hooks on each
denoiser, so the low-noise expert counts its steps from 0. With `per_expert=True` (the default) each expert's cache
is configured for its own run of steps: `num_inference_steps` its step count, `mag_ratios` its slice of the
request's ratios (one per request step, as before), `retention_ratio` of its own steps never skipped; calibration
records the ratios per expert (`"cond/transformer_2"`), which concatenate in request order to the request's list.
`per_expert=False` is the boundary-unaware configuration: every expert gets the whole list and step count, so the
low-noise expert reads the ratios of the first steps of the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import diffusers
import torch
from diffusers.hooks import HookRegistry

from workbench.accelerations.base import Knob, Spec, option
from workbench.accelerations.caching.diffusers_hooks import CacheHandle, needs_registered_blocks
from workbench.models import experts

NAME = "mag_cache"
TAIL_HOOK = "mag_cache_block_hook"


class _Installed(CacheHandle):
    def __init__(self, spec: Spec, options: dict[str, Any], model: Any, steps: int):
        self.schedule = experts.schedule(model, steps)
        super().__init__(spec, options, model, self._config)
        self._watch_calibration()

    def _config(self, expert: str) -> diffusers.MagCacheConfig:
        """The expert's config for the current schedule: its own span per expert, else the whole request."""
        options, steps = self.options, len(self.schedule.experts)
        ratios = None if options["calibrate"] else list(options["mag_ratios"])
        span = self.schedule.span(expert)
        if options["per_expert"] and len(span):  # an expert that never runs keeps the whole-request config
            steps, ratios = len(span), None if ratios is None else ratios[span.start : span.stop]
        return diffusers.MagCacheConfig(
            threshold=options["threshold"],
            max_skip_steps=options["max_skip_steps"],
            retention_ratio=options["retention_ratio"],
            num_inference_steps=steps,
            mag_ratios=ratios,
            calibrate=options["calibrate"],
        )

    def begin_request(self, request_id: int, steps: int) -> None:
        ratios = self.options["mag_ratios"]
        if not self.options["calibrate"] and len(ratios) != steps:
            raise ValueError(
                f"{NAME}.mag_ratios: {len(ratios)} ratios given but the request has {steps} steps; "
                "give one per step (calibrate=True with this step count records them)"
            )
        schedule = experts.schedule(self.model, steps)
        if schedule != self.schedule:
            self.schedule = schedule
            for name, denoiser in zip(self.names, self.denoisers, strict=True):
                denoiser.disable_cache()
                denoiser.enable_cache(self._config(name))
            self._watch_calibration()
        super().begin_request(request_id, steps)

    def _watch_calibration(self) -> None:
        """Copy each ratio diffusers' tail hook records into the receipt (diffusers only prints them)."""
        if not self.options["calibrate"]:
            return
        for name, denoiser in zip(self.names, self.denoisers, strict=True):
            for module in denoiser.modules():
                registry = getattr(module, "_diffusers_hook", None)
                hook = registry.get_hook(TAIL_HOOK) if registry is not None else None
                if hook is not None and hook.is_tail:
                    hook._perform_calibration_step = self._recorder(hook, name)

    def _recorder(self, hook: Any, expert: str):
        record = type(hook)._perform_calibration_step.__get__(hook)

        def perform(state: Any, residual: torch.Tensor) -> None:
            record(state, residual)
            branch = hook.state_manager.context.name
            key = branch if len(self.denoisers) == 1 else f"{branch}/{expert}"
            self.receipt.notes.setdefault("mag_ratios", {}).setdefault(key, []).append(state.calibration_ratios[-1])

        return perform

    def _remove(self) -> None:
        super()._remove()
        for denoiser in self.denoisers:
            HookRegistry.check_if_exists_or_initialize(denoiser).invalidate_child_registries_cache()


@dataclass(frozen=True)
class MagCacheConfig:
    """mag_cache's options (turned into diffusers' `MagCacheConfig` at install, with the request's step count)."""

    mag_ratios: list[float] | None = option(None, help="one residual magnitude ratio per step (from calibrate=True)")
    calibrate: bool = option(False, help="never skip; record mag_ratios in the receipt notes")
    threshold: float = option(0.06, minimum=0.0, help="accumulated error allowed while skipping")
    max_skip_steps: int = option(3, minimum=0, help="most consecutive skipped steps")
    retention_ratio: float = option(0.2, minimum=0.0, maximum=1.0, help="fraction of first steps never skipped")
    per_expert: bool = option(True, help=experts.PER_EXPERT_HELP)


def _ratios(options: dict[str, Any]) -> None:
    ratios = options["mag_ratios"]
    if ratios is None and not options["calibrate"]:
        raise ValueError(
            f"{NAME}.mag_ratios: required unless calibrate=True (run once with calibrate=True to get them)"
        )
    if ratios is not None and (not ratios or min(ratios) <= 0):
        raise ValueError(f"{NAME}.mag_ratios: expected a non-empty list of positive numbers, got {ratios!r}")


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    needs_registered_blocks(NAME, model)
    ratios = options["mag_ratios"]
    steps = len(ratios) if ratios else int(model.defaults.get("steps", 1))
    return lambda: _Installed(SPEC, options, model, steps)


SPEC = Spec(
    name=NAME,
    summary="diffusers MagCache: skip the block stack while residual-magnitude ratios predict little change",
    prepare_fn=_prepare,
    config=MagCacheConfig,
    joint=_ratios,
    knob=Knob("threshold", 0.0, 0.5),  # with mag_ratios from a calibrate=True run
    contract="approximate",
    group="feature_cache",
    touches=("denoiser.forward",),
    order=80,
)
SPECS = (SPEC,)
