"""Handles shared by the caching plugins built on diffusers' hooks; not a plugin itself (it registers no Spec).

`CacheHandle`: diffusers' own caches (`denoiser.enable_cache(config)`) installed with fail-closed checks and receipts,
for `diffusers_caches` (first-block cache, TaylorSeer, PAB) and `mag_cache`. Receipts count work that really ran: a
skipped block or predicted module still passes through its `__call__` (the cache hook answers for it), so executions
are counted one level down, a block at the first layer of its feed-forward, an attention at its output projection.

`ScheduledCacheHandle`: the request lifecycle of the caches that register hooks of their own (`easycache`,
`teacache`): the request's step count and expert schedule, and per-request state emptied around each request.

Experts (Wan2.2): diffusers keeps each cache's state in hooks on each denoiser, so the low-noise expert's state is its
own and its step counts (TaylorSeer's `disable_cache_before_step`, MagCache's step index) start at 0 when it first
runs. The receipt's counts are split by expert (`experts` in the receipt, `workbench.models.experts`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from diffusers.hooks._helpers import TransformerBlockRegistry

from workbench.accelerations.base import Handle, Spec, drop_restored_forwards
from workbench.models import experts

FEED_FORWARD_NAMES = ("ffn", "ff")
# Counted by hooks inside the blocks, so through Receipt.count (compile-safe).
COUNTERS = ("block_calls", "blocks_executed", "attention_calls", "attention_executed")


class CacheHandle(Handle):
    """diffusers' cache installed on every denoiser by `config_fn(expert)` (the denoiser's pipeline attribute), with
    execution counted one level down (see the module docstring); `blocks_skipped` / `attention_skipped` are filled
    in at the end of each request."""

    def __init__(self, spec: Spec, options: dict[str, Any], model: Any, config_fn: Callable[[str], Any]):
        super().__init__(spec, options, proof=("blocks_skipped", "attention_skipped"))
        named = experts.named_denoisers(model)
        self.denoisers = [denoiser for _, denoiser in named]
        self.experts = [name for name, _ in named] if len(named) > 1 else []  # receipt shares: Wan2.2's two
        self.receipt.traceable(self.denoisers[0].device, counters=COUNTERS, experts=self.experts)
        self.hooks = []
        self_attention = model.family.self_attention  # the attention PAB broadcasts, as the family names it
        for name, denoiser in named:
            expert = name if self.experts else None
            for block in model.family.blocks(denoiser):
                self._count(block, "block_calls", expert)
                self._count(_first_module(_feed_forward(block)), "blocks_executed", expert)
            for attention in [] if self_attention is None else self_attention.modules(denoiser):
                self._count(attention, "attention_calls", expert)
                self._count(_first_module(attention.to_out), "attention_executed", expert)
        self.names = [name for name, _ in named]
        try:
            for name, denoiser in named:
                denoiser.enable_cache(config_fn(name))
        except Exception:
            self._remove()
            raise

    def _count(self, module: torch.nn.Module, counter: str, expert: str | None) -> None:
        def bump(*_: Any) -> None:
            self.receipt.count(counter, expert=expert)

        self.hooks.append(module.register_forward_pre_hook(bump))

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        for denoiser in self.denoisers:
            denoiser._reset_stateful_cache()

    def end_request(self, request_id: int) -> None:
        self.receipt.fold()
        for prefix, c in (
            ("", self.receipt.counters),
            *((f"{e}/", self.receipt.expert_counters) for e in self.experts),
        ):
            for kind in ("blocks", "attention"):
                calls = "block_calls" if kind == "blocks" else "attention_calls"
                c[f"{prefix}{kind}_skipped"] = c[f"{prefix}{calls}"] - c[f"{prefix}{kind}_executed"]
        for denoiser in self.denoisers:
            denoiser._reset_stateful_cache()

    def _remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        for denoiser in self.denoisers:
            if getattr(denoiser, "is_cache_enabled", False):
                denoiser.disable_cache()
            drop_restored_forwards(denoiser)


class ScheduledCacheHandle(Handle):
    """A cache whose hooks read the request's step count (`steps`) and expert schedule (`schedule`), both set at
    `begin_request`, and keep per-request state that the subclass's `_reset` empties at the start and end of every
    request. Its options include `warmup`, `final_dense`, `per_expert` and the reuse threshold that `THRESHOLD` names
    (0: never reuse)."""

    THRESHOLD: str

    def __init__(self, spec: Spec, options: dict[str, Any], proof: tuple[str, ...]):
        super().__init__(spec, options, proof)
        self.steps: int | None = None
        self.schedule: experts.Schedule | None = None

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.steps = steps
        self.schedule = experts.schedule(self.model, steps)
        self._reset()

    def end_request(self, request_id: int) -> None:
        self._reset()

    def must_compute(self, expert: str, context: Any, calls: int) -> bool:
        """Whether a call of `expert`'s hook must compute whatever the cache holds: reuse is off (the `THRESHOLD`
        option is 0), or the call's step is a warm-up step (`warmup`) or one of the last `final_dense`. The step and
        the step count are `Schedule.counted`'s (per expert with `per_expert`) from the cache context's step index and
        `num_inference_steps` (else `calls`, the branch's calls so far, and the request's `steps`); RuntimeError where
        it refuses the count."""
        options = self.options
        step, steps = self.schedule.counted(
            expert, context.step_index, calls, context.num_inference_steps or self.steps, options["per_expert"]
        )
        return (
            options[self.THRESHOLD] == 0.0
            or step < options["warmup"]
            or (steps is not None and step >= steps - options["final_dense"])
        )

    def _reset(self) -> None:
        raise NotImplementedError


def _first_module(module: torch.nn.Module) -> torch.nn.Module:
    """The first layer that really runs: a ModuleList is never called itself; a FeedForward's is its `net`."""
    if isinstance(getattr(module, "net", None), torch.nn.ModuleList | torch.nn.Sequential):
        module = module.net
    return module[0] if isinstance(module, torch.nn.ModuleList | torch.nn.Sequential) else module


def _feed_forward(block: torch.nn.Module) -> torch.nn.Module:
    for name in FEED_FORWARD_NAMES:
        if isinstance(child := getattr(block, name, None), torch.nn.Module):
            return child
    raise RuntimeError(f"{type(block).__name__}: no feed-forward child {FEED_FORWARD_NAMES} to count executions")


def needs_registered_blocks(name: str, model: Any) -> None:
    TransformerBlockRegistry._register()  # diffusers fills its registry lazily
    for denoiser in model.denoisers():
        for block in model.family.blocks(denoiser):
            if type(block) not in TransformerBlockRegistry._registry:
                raise RuntimeError(
                    f"{name}: diffusers does not support block class {type(block).__name__} "
                    f"(not in its TransformerBlockRegistry); {model.family.name} cannot use this cache"
                )
            return
