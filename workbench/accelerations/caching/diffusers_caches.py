"""diffusers' own feature caches as plugins (contract: approximate): first-block cache, TaylorSeer,
pyramid attention broadcast. One file for the three because they share everything but their config:
diffusers does the caching; this file adds fail-closed checks and receipts.

Receipts count work that really ran (`diffusers_hooks.CacheHandle`, shared with mag_cache).

TaylorSeer: diffusers' default module patterns (`^blocks.*attn` and the like, full match) name no module
of Wan (`attn1`, `attn2`) or LTX-2, so left alone it would hook nothing and run dense. This plugin gives it
the names of every block's attention and feed-forward children instead (their outputs are what the paper
forecasts), and refuses a model where it finds none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import diffusers
import torch

from workbench.accelerations.base import Knob, Spec, option
from workbench.accelerations.caching.diffusers_hooks import CacheHandle, needs_registered_blocks


@dataclass(frozen=True)
class FirstBlockCacheConfig:
    """first_block_cache's options (turned into diffusers' `FirstBlockCacheConfig` at install)."""

    threshold: float = option(0.05, minimum=0.0, help="relative change of the first block's residual")


def _prepare_first_block(model: Any, options: dict[str, Any], device: torch.device):
    needs_registered_blocks("first_block_cache", model)
    return lambda: CacheHandle(
        FIRST_BLOCK, options, model, lambda expert: diffusers.FirstBlockCacheConfig(threshold=options["threshold"])
    )


def _taylorseer_targets(model: Any, denoiser: torch.nn.Module) -> list[str]:
    """Full names of each block's attention and feed-forward children, as regexes for diffusers' patterns."""
    blocks = {id(b) for b in model.family.blocks(denoiser)}
    targets = []
    for block_name, block in denoiser.named_modules():
        if id(block) not in blocks:
            continue
        for child_name, _ in block.named_children():
            if re.fullmatch(r"(audio_)?(attn\d*|ffn?|ff)", child_name):
                targets.append(re.escape(f"{block_name}.{child_name}"))
    return targets


@dataclass(frozen=True)
class TaylorSeerConfig:
    """taylorseer's options (turned into diffusers' `TaylorSeerCacheConfig` at install, with the block targets)."""

    cache_interval: int = option(5, minimum=1, help="full computation every N steps")
    disable_cache_before_step: int = option(3, minimum=0, help="steps always computed at the start")
    max_order: int = option(1, minimum=0, maximum=4, help="Taylor order")


def _prepare_taylorseer(model: Any, options: dict[str, Any], device: torch.device):
    per_denoiser = [_taylorseer_targets(model, denoiser) for denoiser in model.denoisers()]
    if not all(per_denoiser):
        raise RuntimeError(
            f"taylorseer: found no attention/feed-forward children in the {model.family.name} blocks "
            f"{model.family.block_classes} to forecast"
        )
    targets = sorted(set().union(*per_denoiser))  # names relative to each denoiser (Wan2.2's two are alike)

    def config(expert: str) -> diffusers.TaylorSeerCacheConfig:
        return diffusers.TaylorSeerCacheConfig(
            cache_interval=options["cache_interval"],
            disable_cache_before_step=options["disable_cache_before_step"],
            max_order=options["max_order"],
            cache_identifiers=targets,
        )

    return lambda: CacheHandle(TAYLORSEER, options, model, config)


@dataclass(frozen=True)
class PyramidAttentionBroadcastConfig:
    """pyramid_attention_broadcast's options (turned into diffusers' `PyramidAttentionBroadcastConfig`)."""

    skip_range: int = option(2, minimum=2, help="recompute attention every N calls")
    timestep_low: int = option(100, minimum=0, maximum=1000)
    timestep_high: int = option(800, minimum=0, maximum=1000)


def _pab_window(options: dict[str, Any]) -> None:
    if options["timestep_low"] >= options["timestep_high"]:
        raise ValueError(
            f"pyramid_attention_broadcast.timestep_low: {options['timestep_low']} is not below timestep_high "
            f"{options['timestep_high']}; allowed: timestep_low < timestep_high"
        )


def _prepare_pab(model: Any, options: dict[str, Any], device: torch.device):
    pipe = model.pipeline
    if not hasattr(type(pipe), "current_timestep"):
        raise RuntimeError(
            f"pyramid_attention_broadcast: {type(pipe).__name__} exposes no current_timestep, which PAB needs "
            "to decide when to broadcast"
        )

    def config(expert: str) -> diffusers.PyramidAttentionBroadcastConfig:
        return diffusers.PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=options["skip_range"],
            spatial_attention_timestep_skip_range=(options["timestep_low"], options["timestep_high"]),
            current_timestep_callback=lambda: pipe.current_timestep,
        )

    return lambda: CacheHandle(PAB, options, model, config)


COMMON = {"contract": "approximate", "group": "feature_cache", "touches": ("denoiser.forward",), "order": 80}
FIRST_BLOCK = Spec(
    name="first_block_cache",
    summary="diffusers FirstBlockCache: skip the remaining blocks while the first block's residual barely moves",
    prepare_fn=_prepare_first_block,
    config=FirstBlockCacheConfig,
    knob=Knob("threshold", 0.0, 0.5),
    **COMMON,
)
TAYLORSEER = Spec(
    name="taylorseer",
    summary="diffusers TaylorSeer: predict block outputs by Taylor extrapolation between full steps",
    prepare_fn=_prepare_taylorseer,
    config=TaylorSeerConfig,
    **COMMON,
)
PAB = Spec(
    name="pyramid_attention_broadcast",
    summary="diffusers PAB: reuse self-attention outputs for a range of blocks inside a timestep window",
    prepare_fn=_prepare_pab,
    config=PyramidAttentionBroadcastConfig,
    joint=_pab_window,
    **COMMON,
)
SPECS = (FIRST_BLOCK, TAYLORSEER, PAB)
