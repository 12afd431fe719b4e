"""Which expert runs each step of a request: the one seam expert-aware plugins share.

Wan2.2 has two experts, the pipeline's `transformer` (high noise) and `transformer_2` (low noise); diffusers'
`WanPipeline` runs `transformer` while the timestep is at or above `boundary_ratio * num_train_timesteps` and
`transformer_2` after. A plugin that keeps state across steps (a feature cache, a sparse router with dense steps)
asks this module instead of re-deriving the switch:

- `named_denoisers(model)`: (expert name, module) of every denoiser the model has, in `Family.denoisers` order;
  a plugin installs one hook per entry, so each hook knows its expert and its state is that expert's alone.
- `schedule(model, steps)`: the `Schedule` of a request of `steps` steps (made at `begin_request`), from the
  family's `expert_schedule` (None: the first denoiser runs every step).
- `Schedule.counted(...)`: the (step, steps) a step-indexed option counts (warm-up, final dense steps,
  dense_steps): within the expert's own run of steps when `per_expert` (its first step is 0, its last
  `steps - 1`), else over the whole request (the boundary-unaware count). A single-expert model gives the same
  numbers either way.
- `Schedule.label(expert)`: the expert's name for receipts on a multi-expert model, None on a single-expert one
  (receipts split by expert only where there is more than one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

PER_EXPERT_HELP = (
    "count step options within each expert's run of steps, starting afresh at the expert switch (Wan2.2); "
    "False: over the whole request (boundary-unaware)"
)


def named_denoisers(model: Any) -> list[tuple[str, torch.nn.Module]]:
    """(pipeline attribute, module) of each denoiser `model` (a LoadedModel) holds, in `Family.denoisers` order."""
    found = ((name, getattr(model.pipeline, name, None)) for name in model.family.denoisers)
    return [(name, module) for name, module in found if module is not None]


@dataclass(frozen=True)
class Schedule:
    """`experts[i]`: the denoiser attribute that runs step i of the request; `names`: the model's experts."""

    experts: tuple[str, ...]
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = set(self.experts) - set(self.names)
        if unknown:
            raise RuntimeError(f"expert schedule names {sorted(unknown)}, which the model lacks ({list(self.names)})")

    def span(self, expert: str) -> range:
        """The request steps `expert` runs (contiguous: the boundary is crossed once); empty when it never runs."""
        steps = [i for i, name in enumerate(self.experts) if name == expert]
        if steps and steps != list(range(steps[0], steps[-1] + 1)):
            raise RuntimeError(f"expert {expert!r} runs steps {steps}, not one contiguous run")
        return range(steps[0], steps[-1] + 1) if steps else range(0)

    def counted(self, expert: str, index: int | None, calls: int, total: int | None, per_expert: bool) -> tuple:
        """(step, steps) for a step-indexed option of a call `expert` runs: `index` is the cache context's step
        index (None when the runner gives none), `calls` the plugin's own call count, `total` the step count the
        plugin reads (the cache context's `num_inference_steps`, else the request's). On a single-expert model, or
        with `per_expert` False, that is (`index`, else `calls`; `total`), the request-wide count. Per expert:
        (request step - the expert's first step, the expert's step count); RuntimeError when the runner gives no
        step index or the schedule has another expert at that step (a plugin must never count the wrong one)."""
        if not per_expert or len(self.names) == 1:
            return (calls if index is None else index), total
        if index is None or not 0 <= index < len(self.experts) or self.experts[index] != expert:
            planned = self.experts[index] if index is not None and 0 <= index < len(self.experts) else "no expert"
            raise RuntimeError(
                f"expert {expert!r} ran request step {index}, where the schedule has {planned!r} "
                f"({list(self.experts)}); the runner gives no step index, or the pipeline's boundary or scheduler "
                "changed after begin_request"
            )
        span = self.span(expert)
        return index - span.start, len(span)

    def label(self, expert: str) -> str | None:
        return expert if len(self.names) > 1 else None


def schedule(model: Any, steps: int) -> Schedule:
    """The expert running each of `steps` steps of `model` (a LoadedModel), from its family's `expert_schedule`."""
    names = tuple(name for name, _ in named_denoisers(model))
    per_step = model.family.expert_schedule
    experts = (names[0],) * steps if len(names) == 1 or per_step is None else per_step(model.pipeline, steps)
    return Schedule(tuple(experts), names)
