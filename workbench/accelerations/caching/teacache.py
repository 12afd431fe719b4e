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

Families: Wan (`blocks`), LTX-2 (`transformer_blocks`, video and audio streams) and MiniMax-H3
(`transformer_blocks`). H3's indicator is its first block's `norm1(x) * (1 + scale[idx]) + shift[idx]` over the
whole packed sequence (text, conditioning, audio and video rows), with the per-row (timestep, modality)
modulation rows taken from that block's `adaln_proj(temb)`, as the block computes them; the skip adds one
residual for the packed sequence. H3 is guidance-distilled: one branch ("cond"), N - 1 transformer calls for N
steps (its runner tells the cache context that count).

Rescale polynomial, per family: `rescale="wan2.1-t2v-1.3b"` uses the Wan2.1 T2V 1.3B coefficients published
in the TeaCache repository, ali-vilab/TeaCache, TeaCache4Wan2.1/teacache_generate.py (the `use_ret_steps`
set, also listed as `wan2.1_t2v_1.3B_ret_mode` by ports). They were fitted against upstream's Wan
indicator, the timestep projection `e0`, not against this modulated input, so with this indicator they
are a borrowed calibration; the default is `rescale="none"` (identity). Coefficients apply only to the family
they were fitted on (`RESCALE_FAMILY`). This module carries no coefficients fitted on LTX-2 or MiniMax-H3
(TeaCache's LTX-Video set was fitted on an earlier, different model and is not reused), so those families run
with `rescale="none"`, the raw relative L1 change: a `rel_l1_thresh` for them is a threshold on that raw change,
to be calibrated on the family itself. Asking for another family's polynomial is a ValueError.
Negative polynomial values are clamped to 0 so the sum never decreases.

`rel_l1_thresh=0` never reuses, so its output is the dense output bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

from workbench.accelerations.base import Handle, Option, Spec, drop_restored_forwards

LEADER_HOOK = "workbench_teacache_leader"
FOLLOWER_HOOK = "workbench_teacache_follower"
# Highest power first (numpy.poly1d order). Source: see the module docstring.
RESCALE = {
    "none": None,
    "wan2.1-t2v-1.3b": (-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02),
}
RESCALE_FAMILY = {"wan2.1-t2v-1.3b": "wan"}  # the family each polynomial was fitted on
# Per family: the block list attribute, the streams a block carries (name, positional index) in output order.
LAYOUT = {
    "wan": ("blocks", (("hidden_states", 0),)),
    "ltx2": ("transformer_blocks", (("hidden_states", 0), ("audio_hidden_states", 1))),
    "h3": ("transformer_blocks", (("hidden_states", 0),)),
}


def _arg(args: tuple, kwargs: dict, name: str, index: int) -> Any:
    return kwargs[name] if name in kwargs else args[index]


def _modulated_input(family: str, block: torch.nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """The first block's self-attention input, computed as the block computes it."""
    x = _arg(args, kwargs, "hidden_states", 0)
    if family == "wan":
        temb = _arg(args, kwargs, "temb", 2)
        if temb.ndim == 4:  # batch, seq, 6, dim (Wan2.2 TI2V)
            shift, scale = (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)[:2]
            shift, scale = shift.squeeze(2), scale.squeeze(2)
        else:  # batch, 6, dim
            shift, scale = (block.scale_shift_table + temb.float()).chunk(6, dim=1)[:2]
        return (block.norm1(x.float()) * (1 + scale) + shift).type_as(x)
    if family == "h3":  # per-row rows of the (timestep, modality) table
        temb = _arg(args, kwargs, "temb", 1)
        indices = _arg(args, kwargs, "adaln_indices", 2)
        shift, scale = block.adaln_proj(temb)[:2]
        return block.norm1(x) * (1.0 + scale.index_select(0, indices)) + shift.index_select(0, indices)
    temb = _arg(args, kwargs, "temb", 4)
    shift, scale = block.get_mod_params(block.scale_shift_table, temb, x.size(0))[:2]
    return block.norm1(x) * (1 + scale) + shift


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

    def __init__(self, handle: _Installed, family: str, is_last: bool):
        super().__init__()
        self.handle, self.family, self.is_last = handle, family, is_last
        self.streams = LAYOUT[family][1]
        self.state_manager = StateManager(_BranchState)

    def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        handle, options = self.handle, self.handle.options
        state, context = self.state_manager.get_state(), self.state_manager.context
        step = context.step_index if context.step_index is not None else state.calls
        steps = context.num_inference_steps or handle.steps
        state.calls += 1
        inputs = [_arg(args, kwargs, name, index) for name, index in self.streams]
        modulated = _modulated_input(self.family, module, args, kwargs)
        must_run = (
            options["rel_l1_thresh"] == 0.0
            or step < options["warmup"]
            or (steps is not None and step >= steps - options["final_dense"])
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
        handle.receipt.record_decision(context.name, "R" if reuse else "C")
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
            passed = [_arg(args, kwargs, name, index) for name, index in self.leader.streams]
            return passed[0] if len(passed) == 1 else tuple(passed)
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.is_last:
            _store_residuals(state, output)
        return output


def _store_residuals(state: _BranchState, output: Any) -> None:
    outputs = [output] if isinstance(output, torch.Tensor) else list(output)
    state.residuals = [v - x for v, x in zip(outputs, state.stack_inputs, strict=True)]
    state.stack_inputs = None


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], family: str, stacks: list[tuple[Any, list]]):
        super().__init__(spec, options, proof=("reused",))
        self.steps: int | None = None
        self.coefficients = RESCALE[options["rescale"]]
        self.blocks: list[torch.nn.Module] = []
        self.leaders: list[_LeaderHook] = []
        for _, blocks in stacks:
            leader = _LeaderHook(self, family, is_last=len(blocks) == 1)
            HookRegistry.check_if_exists_or_initialize(blocks[0]).register_hook(leader, LEADER_HOOK)
            self.leaders.append(leader)
            self.blocks.append(blocks[0])
            for index, block in enumerate(blocks[1:], start=2):
                follower = _FollowerHook(leader, is_last=index == len(blocks))
                HookRegistry.check_if_exists_or_initialize(block).register_hook(follower, FOLLOWER_HOOK)
                self.blocks.append(block)
        self.denoisers = [denoiser for denoiser, _ in stacks]
        for denoiser in self.denoisers:  # the denoiser's cache_context must reach the new block registries
            HookRegistry.check_if_exists_or_initialize(denoiser).invalidate_child_registries_cache()

    def rescale(self, change: float) -> float:
        if self.coefficients is None:
            return change
        value = 0.0
        for coefficient in self.coefficients:  # Horner, highest power first
            value = value * change + coefficient
        return max(value, 0.0)

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.steps = steps
        self._reset()

    def end_request(self, request_id: int) -> None:
        self._reset()

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


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    family = model.family.name
    fitted_on = RESCALE_FAMILY.get(options["rescale"], family)
    if fitted_on != family:
        raise ValueError(
            f"teacache.rescale: {options['rescale']!r} was fitted on {fitted_on}, not {family}; {family} has no "
            "published coefficients here, use rescale='none'"
        )
    attribute = LAYOUT[family][0]
    stacks = []
    for denoiser in model.denoisers():
        blocks = getattr(denoiser, attribute, None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            raise RuntimeError(f"teacache: {type(denoiser).__name__} has no block list {attribute!r}")
        stacks.append((denoiser, list(blocks)))
    return lambda: _Installed(SPEC, options, family, stacks)


SPEC = Spec(
    name="teacache",
    contract="approximate",
    summary="skip the block stack while the first block's timestep-modulated input barely changes (TeaCache)",
    prepare_fn=_prepare,
    options=(
        Option("rel_l1_thresh", float, None, minimum=0.0, required=True, help="accumulated relative L1 change allowed"),
        Option("warmup", int, 1, minimum=0, help="first steps always computed"),
        Option("final_dense", int, 1, minimum=0, help="last steps always computed"),
        Option("rescale", str, "none", allowed=tuple(RESCALE), help="polynomial applied to each step's change"),
    ),
    families=tuple(LAYOUT),
    group="feature_cache",
    touches=("denoiser.forward",),
    order=80,
)
SPECS = (SPEC,)
