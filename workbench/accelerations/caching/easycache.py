"""EasyCache: reuse the denoiser's transformation when its output is predicted to barely change
(contract: approximate). Our own implementation of the published algorithm (Zhou et al., 2025).

At a computed step the hook stores the transformation `delta = v - x` (output minus input) and the
transformation rate `k = |v - v_prev| / |x - x_prev|` (mean absolute values). At the following steps
it predicts the relative output change `k * |x - x_prev| / |v_prev|` and accumulates it; while the sum
stays below `threshold` it returns `x + delta` instead of running the transformer. Warm-up steps and
the final steps always run. The streams are the family's (`Family.streams`: the denoiser inputs one step
transforms, in output order; LTX-2 and H3: video, then audio). State lives per CFG branch (diffusers' cache
context), per expert (one hook on each denoiser: Wan2.2's low-noise expert starts with no cached transformation)
and per request; `threshold=0` never reuses, so its output is the dense output bit for bit.

Experts (`workbench.models.experts`): with `per_expert=True` (the default) `warmup` and `final_dense` count within
each expert's run of steps, so each expert starts and ends dense; `per_expert=False` counts them over the whole
request (the boundary-unaware count). On Wan2.2 the decisions are kept per expert and branch
(`notes["decisions"]["transformer_2/cond"]`) and the counts split under `experts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

from workbench.accelerations.base import Knob, Spec, drop_restored_forwards, option
from workbench.accelerations.caching.diffusers_hooks import ScheduledCacheHandle
from workbench.models import experts

HOOK_NAME = "workbench_easycache"


@dataclass
class _BranchState(BaseState):
    calls: int = 0
    inputs: list[torch.Tensor] | None = None
    outputs: list[torch.Tensor] | None = None
    deltas: list[torch.Tensor] | None = None
    rate: list[float] | None = None
    accumulated: float = 0.0
    template: Any = None

    def reset(self) -> None:
        self.__init__()


def _l1(t: torch.Tensor) -> float:
    return float(t.float().abs().mean())


class _EasyCacheHook(ModelHook):
    _is_stateful = True

    def __init__(self, handle: _Installed, streams: tuple[str, ...], expert: str):
        super().__init__()
        self.handle, self.expert = handle, expert
        self.streams = streams
        self.state_manager = StateManager(_BranchState)

    def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        handle, state, options = self.handle, self.state_manager.get_state(), self.handle.options
        context = self.state_manager.context
        must_run = handle.must_compute(self.expert, context, state.calls) or state.deltas is None or state.rate is None
        label = handle.schedule.label(self.expert)
        state.calls += 1
        inputs = [kwargs[name] for name in self.streams]
        if not must_run:
            predicted = max(
                rate * _l1(x - x_prev) / max(_l1(v_prev), 1e-12)
                for rate, x, x_prev, v_prev in zip(state.rate, inputs, state.inputs, state.outputs, strict=True)
            )
            if state.accumulated + predicted < options["threshold"]:
                state.accumulated += predicted
                handle.receipt.record_decision(context.name, "R", label)
                return _rebuild(state.template, [x + d for x, d in zip(inputs, state.deltas, strict=True)])

        output = self.fn_ref.original_forward(*args, **kwargs)
        handle.receipt.record_decision(context.name, "C", label)
        outputs = _tensors(output)[: len(inputs)]
        if state.inputs is not None:
            state.rate = [
                _l1(v - v_prev) / max(_l1(x - x_prev), 1e-12)
                for v, v_prev, x, x_prev in zip(outputs, state.outputs, inputs, state.inputs, strict=True)
            ]
        state.inputs, state.outputs = inputs, outputs
        state.deltas = [v - x for v, x in zip(outputs, inputs, strict=True)]
        state.accumulated = 0.0
        state.template = output
        return output

    def reset_state(self, module: torch.nn.Module) -> torch.nn.Module:
        self.state_manager.reset()
        return module


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, tuple | list):
        return [t for t in output if isinstance(t, torch.Tensor)]
    return [v for v in output.values() if isinstance(v, torch.Tensor)]  # diffusers BaseOutput


def _rebuild(template: Any, tensors: list[torch.Tensor]) -> Any:
    """An output of the same structure as `template` with its leading tensors replaced."""
    if isinstance(template, torch.Tensor):
        return tensors[0]
    items = iter(tensors)
    if isinstance(template, tuple | list):
        return type(template)(next(items, t) if isinstance(t, torch.Tensor) else t for t in template)
    return type(template)(**{k: next(items, v) if isinstance(v, torch.Tensor) else v for k, v in template.items()})


class _Installed(ScheduledCacheHandle):
    THRESHOLD = "threshold"

    def __init__(self, spec: Spec, options: dict[str, Any], model: Any, streams: tuple):
        super().__init__(spec, options, proof=("reused",))
        named = experts.named_denoisers(model)
        self.denoisers = [denoiser for _, denoiser in named]
        self.hooks = []
        for expert, denoiser in named:
            hook = _EasyCacheHook(self, streams, expert)
            HookRegistry.check_if_exists_or_initialize(denoiser).register_hook(hook, HOOK_NAME)
            self.hooks.append(hook)

    def _reset(self) -> None:
        for hook, denoiser in zip(self.hooks, self.denoisers, strict=True):
            hook.reset_state(denoiser)

    def _remove(self) -> None:
        self._reset()
        for denoiser in self.denoisers:
            HookRegistry.check_if_exists_or_initialize(denoiser).remove_hook(HOOK_NAME, recurse=False)
            drop_restored_forwards(denoiser)


@dataclass(frozen=True)
class EasyCacheConfig:
    """EasyCache's options; `threshold` has no default (it is the quality/speed trade)."""

    threshold: float | None = option(None, minimum=0.0, required=True, help="accumulated relative change allowed")
    warmup: int = option(2, minimum=0, help="first steps always computed")
    final_dense: int = option(1, minimum=0, help="last steps always computed")
    per_expert: bool = option(True, help=experts.PER_EXPERT_HELP)


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    streams = model.family.streams
    return lambda: _Installed(SPEC, options, model, streams)


SPEC = Spec(
    name="easycache",
    contract="approximate",
    summary="reuse the denoiser's input->output transformation while its predicted change stays small",
    prepare_fn=_prepare,
    config=EasyCacheConfig,
    knob=Knob("threshold", 0.0, 0.5),
    requires=lambda family: None if family.streams else "it names no denoiser streams",
    group="feature_cache",
    touches=("denoiser.forward",),
    order=80,
)
SPECS = (SPEC,)
