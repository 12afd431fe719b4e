"""TeaCache: skip the whole transformer block stack while the timestep-modulated input of the first
block barely changes, adding the stack's last residual instead (contract: approximate). Our own
implementation of Liu et al. 2024, "Timestep Embedding Tells: It's Time to Cache for Video Diffusion
Model" (github.com/ali-vilab/TeaCache).

Indicator: the first block's self-attention input, `norm1(x) * (1 + scale_msa) + shift_msa`, with shift
and scale taken from that block's modulation table plus the timestep projection, recomputed cheaply
(one norm) in a hook on the first block exactly as the block does it. Per step the relative L1 change
`mean|m - m_prev| / mean|m_prev|` is (optionally) rescaled by a polynomial and accumulated; while the sum
stays below `rel_l1_thresh` the stack is skipped and `x + residual` is returned, where `residual` is
output minus input of the whole stack at the last computed step (LTX-2: one residual per stream, video
and audio; the indicator is the video stream's). Computing resets the sum. Warm-up and final steps
always compute. State lives per CFG branch (diffusers' cache context) and per request.

What a family contributes (`Family.teacache`, `Family.block_streams`): the indicator, computed from the first
block's arguments as that block computes it (Wan: fp32 norm and `scale_shift_table + temb`; LTX-2: the video
stream's `get_mod_params`; MiniMax-H3: the whole packed sequence with the per-row (timestep, modality) rows of
`adaln_proj(temb)`), the streams a block carries (LTX-2: video and audio, one residual each; H3: one packed
sequence) and the rescale polynomials fitted on it. H3 is guidance-distilled: one branch ("cond"), N - 1
transformer calls for N steps (its runner tells the cache context that count).

Rescale polynomial: `rescale="none"` (the default) is the identity, the raw relative L1 change; any other name is
a polynomial a family publishes in `Family.teacache.coefficients` (Wan: `"wan2.1-t2v-1.3b"`, TeaCache's published
Wan2.1 T2V 1.3B set; its source and why it is a borrowed calibration here are stated beside it in
`workbench/models/wan.py`). A polynomial applies only to the family it was fitted on; asking for another family's
is a ValueError. A family without coefficients runs with `rescale="none"`: its `rel_l1_thresh` is a threshold on
the raw change, to be calibrated on the family itself. Negative polynomial values are clamped to 0 so the sum
never decreases.

`rel_l1_thresh=0` never reuses, so its output is the dense output bit for bit.

Experts (`workbench.models.experts`): each denoiser's stack has its own leader, so Wan2.2's low-noise expert starts
with no residual and no previous indicator of its own. With `per_expert=True` (the default) `warmup` and
`final_dense` count within each expert's run of steps; `per_expert=False` counts them over the whole request (the
boundary-unaware count). On Wan2.2 decisions are kept per expert and branch (`"transformer_2/cond"`) and the counts
split under `experts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

from workbench.accelerations.base import Knob, Spec, drop_restored_forwards, option
from workbench.accelerations.caching.diffusers_hooks import ScheduledCacheHandle
from workbench.models import experts, families
from workbench.models.family import block_arg

LEADER_HOOK = "workbench_teacache_leader"
FOLLOWER_HOOK = "workbench_teacache_follower"
# rescale name -> the family whose `teacache.coefficients` hold it ("none": the identity, for every family)
FITTED_ON = {
    name: family.name
    for family in families().values()
    if family.teacache is not None
    for name in family.teacache.coefficients
}
RESCALES = ("none", *FITTED_ON)


@dataclass
class _BranchState(BaseState):
    calls: int = 0
    previous: torch.Tensor | None = None  # modulated input at the previous step
    accumulated: float = 0.0
    residuals: list[torch.Tensor] | None = None  # stack output - stack input, per stream
    stack_inputs: list[torch.Tensor] | None = None
    skipping: bool = False

    def reset(self) -> None:
        self.__init__()


class _LeaderHook(ModelHook):
    """On the first block: decide compute or reuse for the whole stack."""

    _is_stateful = True

    def __init__(self, handle: _Installed, family: Any, is_last: bool, expert: str):
        super().__init__()
        self.handle, self.indicator, self.is_last = handle, family.teacache.indicator, is_last
        self.expert = expert
        self.streams = family.block_streams
        self.state_manager = StateManager(_BranchState)

    def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        handle, options = self.handle, self.handle.options
        state, context = self.state_manager.get_state(), self.state_manager.context
        scheduled = handle.must_compute(self.expert, context, state.calls)
        state.calls += 1
        inputs = [block_arg(args, kwargs, name, index) for name, index in self.streams]
        modulated = self.indicator(module, args, kwargs)
        must_run = (
            scheduled
            or state.residuals is None
            or state.previous is None
            or state.previous.shape != modulated.shape
            or any(r.shape != x.shape for r, x in zip(state.residuals, inputs, strict=True))
        )
        reuse = False
        if not must_run:
            previous = state.previous.float()
            change = float((modulated.float() - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12))
            state.accumulated += handle.rescale(change)
            reuse = state.accumulated < options["rel_l1_thresh"]
        if not reuse:
            state.accumulated = 0.0
        state.previous = modulated
        state.skipping = reuse
        handle.receipt.record_decision(context.name, "R" if reuse else "C", handle.schedule.label(self.expert))
        if reuse:
            outputs = [x + r for x, r in zip(inputs, state.residuals, strict=True)]
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        state.stack_inputs = inputs
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.is_last:
            _store_residuals(state, output)
        return output

    def reset_state(self, module: torch.nn.Module) -> torch.nn.Module:
        self.state_manager.reset()
        return module


class _FollowerHook(ModelHook):
    """On every later block: pass the hidden states through while the leader reuses."""

    def __init__(self, leader: _LeaderHook, is_last: bool):
        super().__init__()
        self.leader, self.is_last = leader, is_last

    def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        state = self.leader.state_manager.get_state()
        if state.skipping:
            passed = [block_arg(args, kwargs, name, index) for name, index in self.leader.streams]
            return passed[0] if len(passed) == 1 else tuple(passed)
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.is_last:
            _store_residuals(state, output)
        return output


def _store_residuals(state: _BranchState, output: Any) -> None:
    outputs = [output] if isinstance(output, torch.Tensor) else list(output)
    state.residuals = [v - x for v, x in zip(outputs, state.stack_inputs, strict=True)]
    state.stack_inputs = None


class _Installed(ScheduledCacheHandle):
    THRESHOLD = "rel_l1_thresh"

    def __init__(self, spec: Spec, options: dict[str, Any], family: Any, stacks: list[tuple[str, Any, list]]):
        super().__init__(spec, options, proof=("reused",))
        rescale = options["rescale"]
        self.coefficients = None if rescale == "none" else family.teacache.coefficients[rescale]
        self.blocks: list[torch.nn.Module] = []
        self.leaders: list[_LeaderHook] = []
        for expert, _, blocks in stacks:
            leader = _LeaderHook(self, family, is_last=len(blocks) == 1, expert=expert)
            HookRegistry.check_if_exists_or_initialize(blocks[0]).register_hook(leader, LEADER_HOOK)
            self.leaders.append(leader)
            self.blocks.append(blocks[0])
            for index, block in enumerate(blocks[1:], start=2):
                follower = _FollowerHook(leader, is_last=index == len(blocks))
                HookRegistry.check_if_exists_or_initialize(block).register_hook(follower, FOLLOWER_HOOK)
                self.blocks.append(block)
        self.denoisers = [denoiser for _, denoiser, _ in stacks]
        for denoiser in self.denoisers:  # the denoiser's cache_context must reach the new block registries
            HookRegistry.check_if_exists_or_initialize(denoiser).invalidate_child_registries_cache()

    def rescale(self, change: float) -> float:
        if self.coefficients is None:
            return change
        return max(float(np.polyval(self.coefficients, change)), 0.0)  # highest power first

    def _reset(self) -> None:
        for leader in self.leaders:
            leader.state_manager.reset()

    def _remove(self) -> None:
        self._reset()
        for block in self.blocks:
            registry = HookRegistry.check_if_exists_or_initialize(block)
            for name in (LEADER_HOOK, FOLLOWER_HOOK):
                if registry.get_hook(name) is not None:
                    registry.remove_hook(name, recurse=False)
        for denoiser in self.denoisers:
            HookRegistry.check_if_exists_or_initialize(denoiser).invalidate_child_registries_cache()
            drop_restored_forwards(denoiser)


@dataclass(frozen=True)
class TeaCacheConfig:
    """TeaCache's options; `rel_l1_thresh` has no default (it is the quality/speed trade)."""

    rel_l1_thresh: float | None = option(
        None, minimum=0.0, required=True, help="accumulated relative L1 change allowed"
    )
    warmup: int = option(1, minimum=0, help="first steps always computed")
    final_dense: int = option(1, minimum=0, help="last steps always computed")
    rescale: str = option("none", allowed=RESCALES, help="polynomial applied to each step's change")
    per_expert: bool = option(True, help=experts.PER_EXPERT_HELP)


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    family = model.family
    fitted_on = FITTED_ON.get(options["rescale"], family.name)
    if fitted_on != family.name:
        raise ValueError(
            f"teacache.rescale: {options['rescale']!r} was fitted on {fitted_on}, not {family.name}; {family.name} "
            "has no published coefficients here, use rescale='none'"
        )
    stacks = []
    for expert, denoiser in experts.named_denoisers(model):
        blocks = family.blocks(denoiser)
        if not blocks:
            raise RuntimeError(f"teacache: {type(denoiser).__name__} has no {list(family.block_classes)} blocks")
        stacks.append((expert, denoiser, blocks))
    return lambda: _Installed(SPEC, options, family, stacks)


SPEC = Spec(
    name="teacache",
    contract="approximate",
    summary="skip the block stack while the first block's timestep-modulated input barely changes (TeaCache)",
    prepare_fn=_prepare,
    config=TeaCacheConfig,
    knob=Knob("rel_l1_thresh", 0.0, 0.6),
    requires=lambda family: None if family.teacache is not None else "it names no TeaCache indicator",
    group="feature_cache",
    touches=("denoiser.forward",),
    order=80,
)
SPECS = (SPEC,)
