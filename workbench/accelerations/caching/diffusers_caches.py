"""diffusers' own feature caches as plugins (contract: approximate): first-block cache, TaylorSeer,
pyramid attention broadcast. One file for the three because they share everything but their config:
diffusers does the caching; this file adds fail-closed checks and receipts.

Receipts count work that really ran. A skipped block or predicted module still passes through its
`__call__` (the cache hook answers for it), so executions are counted one level down: a block at the
first layer of its feed-forward, an attention at its output projection.

TaylorSeer: diffusers' default module patterns (`^blocks.*attn` and the like, full match) name no module
of Wan (`attn1`, `attn2`) or LTX-2, so left alone it would hook nothing and run dense. This plugin gives it
the names of every block's attention and feed-forward children instead (their outputs are what the paper
forecasts), and refuses a model where it finds none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from diffusers import FirstBlockCacheConfig, PyramidAttentionBroadcastConfig, TaylorSeerCacheConfig
from diffusers.hooks._helpers import TransformerBlockRegistry

from workbench.accelerations.base import Handle, Option, Spec, drop_restored_forwards

FEED_FORWARD_NAMES = ("ffn", "ff")
# Counted by hooks inside the blocks, so through Receipt.count (compile-safe).
COUNTERS = ("block_calls", "blocks_executed", "attention_calls", "attention_executed")


def _blocks(model: Any, denoiser: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in denoiser.modules() if type(m).__name__ in model.family.block_classes]


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], model: Any, config_fn: Callable[[], Any]):
        super().__init__(spec, options, proof=("blocks_skipped", "attention_skipped"))
        self.denoisers = model.denoisers()
        self.receipt.traceable(self.denoisers[0].device, counters=COUNTERS)
        self.hooks = []
        for denoiser in self.denoisers:
            for block in _blocks(model, denoiser):
                self._count(block, "block_calls")
                self._count(_first_module(_feed_forward(block)), "blocks_executed")
                attention = getattr(block, "attn1", None)
                if attention is not None:
                    self._count(attention, "attention_calls")
                    self._count(_first_module(attention.to_out), "attention_executed")
        try:
            for denoiser in self.denoisers:
                denoiser.enable_cache(config_fn())
        except Exception:
            self._remove()
            raise

    def _count(self, module: torch.nn.Module, counter: str) -> None:
        def bump(*_: Any) -> None:
            self.receipt.count(counter)

        self.hooks.append(module.register_forward_pre_hook(bump))

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        for denoiser in self.denoisers:
            denoiser._reset_stateful_cache()

    def end_request(self, request_id: int) -> None:
        self.receipt.fold()
        c = self.receipt.counters
        c["blocks_skipped"] = c["block_calls"] - c["blocks_executed"]
        c["attention_skipped"] = c["attention_calls"] - c["attention_executed"]
        for denoiser in self.denoisers:
            denoiser._reset_stateful_cache()

    def _remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        for denoiser in self.denoisers:
            if getattr(denoiser, "is_cache_enabled", False):
                denoiser.disable_cache()
            drop_restored_forwards(denoiser)


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


def _needs_registered_blocks(name: str, model: Any) -> None:
    TransformerBlockRegistry._register()  # diffusers fills its registry lazily
    for denoiser in model.denoisers():
        for block in _blocks(model, denoiser):
            if type(block) not in TransformerBlockRegistry._registry:
                raise RuntimeError(
                    f"{name}: diffusers does not support block class {type(block).__name__} "
                    f"(not in its TransformerBlockRegistry); {model.family.name} cannot use this cache"
                )
            return


def _prepare_first_block(model: Any, options: dict[str, Any], device: torch.device):
    _needs_registered_blocks("first_block_cache", model)
    return lambda: _Installed(
        FIRST_BLOCK, options, model, lambda: FirstBlockCacheConfig(threshold=options["threshold"])
    )


def _taylorseer_targets(model: Any, denoiser: torch.nn.Module) -> list[str]:
    """Full names of each block's attention and feed-forward children, as regexes for diffusers' patterns."""
    blocks = {id(b) for b in _blocks(model, denoiser)}
    targets = []
    for block_name, block in denoiser.named_modules():
        if id(block) not in blocks:
            continue
        for child_name, _ in block.named_children():
            if re.fullmatch(r"(audio_)?(attn\d*|ffn?|ff)", child_name):
                targets.append(re.escape(f"{block_name}.{child_name}"))
    return targets


def _prepare_taylorseer(model: Any, options: dict[str, Any], device: torch.device):
    per_denoiser = [_taylorseer_targets(model, denoiser) for denoiser in model.denoisers()]
    if not all(per_denoiser):
        raise RuntimeError(
            f"taylorseer: found no attention/feed-forward children in the {model.family.name} blocks "
            f"{model.family.block_classes} to forecast"
        )
    targets = sorted(set().union(*per_denoiser))  # names relative to each denoiser (Wan2.2's two are alike)

    def config() -> TaylorSeerCacheConfig:
        return TaylorSeerCacheConfig(
            cache_interval=options["cache_interval"],
            disable_cache_before_step=options["disable_cache_before_step"],
            max_order=options["max_order"],
            cache_identifiers=targets,
        )

    return lambda: _Installed(TAYLORSEER, options, model, config)


def _prepare_pab(model: Any, options: dict[str, Any], device: torch.device):
    pipe = model.pipeline
    if not hasattr(type(pipe), "current_timestep"):
        raise RuntimeError(
            f"pyramid_attention_broadcast: {type(pipe).__name__} exposes no current_timestep, which PAB needs "
            "to decide when to broadcast"
        )
    if options["timestep_low"] >= options["timestep_high"]:
        raise ValueError("pyramid_attention_broadcast.timestep_low: must be below timestep_high")

    def config() -> PyramidAttentionBroadcastConfig:
        return PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=options["skip_range"],
            spatial_attention_timestep_skip_range=(options["timestep_low"], options["timestep_high"]),
            current_timestep_callback=lambda: pipe.current_timestep,
        )

    return lambda: _Installed(PAB, options, model, config)


COMMON = {"contract": "approximate", "group": "feature_cache", "touches": ("denoiser.forward",), "order": 80}
FIRST_BLOCK = Spec(
    name="first_block_cache",
    summary="diffusers FirstBlockCache: skip the remaining blocks while the first block's residual barely moves",
    prepare_fn=_prepare_first_block,
    options=(Option("threshold", float, 0.05, minimum=0.0, help="relative change of the first block's residual"),),
    **COMMON,
)
TAYLORSEER = Spec(
    name="taylorseer",
    summary="diffusers TaylorSeer: predict block outputs by Taylor extrapolation between full steps",
    prepare_fn=_prepare_taylorseer,
    options=(
        Option("cache_interval", int, 5, minimum=1, help="full computation every N steps"),
        Option("disable_cache_before_step", int, 3, minimum=0, help="steps always computed at the start"),
        Option("max_order", int, 1, minimum=0, maximum=4, help="Taylor order"),
    ),
    **COMMON,
)
PAB = Spec(
    name="pyramid_attention_broadcast",
    summary="diffusers PAB: reuse self-attention outputs for a range of blocks inside a timestep window",
    prepare_fn=_prepare_pab,
    options=(
        Option("skip_range", int, 2, minimum=2, help="recompute attention every N calls"),
        Option("timestep_low", int, 100, minimum=0, maximum=1000),
        Option("timestep_high", int, 800, minimum=0, maximum=1000),
    ),
    **COMMON,
)
SPECS = (FIRST_BLOCK, TAYLORSEER, PAB)
