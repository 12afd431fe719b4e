"""Activation peaks per stage for the memory planner (`workbench.memory_plan`), estimated from a model's layers.

Activation estimates (bytes; `b` is the element size of the module's weights). Rough on purpose and documented so a
measured value can replace them (`MemoryBudget.activation`; `memory_plan.measured_activation(result, plan)` reads
them back from a Result):
- denoise: `rows * b * max(8 * D, 2 * D + 3 * F)` with `rows` from `Family.denoise_shape` (tokens of one denoiser
  forward, CFG batch included), `D` a block's width (the most common `in_features` of its Linears) and `F` its
  feed-forward width (the widest input of a Linear back to `D`): inside a block, the residual, the norm output, q, k,
  v, the attention output and rotary temporaries (~8 D per row), or the residual, the norm output and the
  feed-forward's up / gate / product (2 D + 3 F per row).
- text_encode: the same per-row formula on the text encoder's Linears, for `TEXT_ROWS` rows.
- video_decode / image_encode: `b * frames * height * width * C * 3`, `C` the input channels of the decoder's last
  convolution (the widest map at full resolution), 3 live maps (input, output, norm). Tiled: `height` and `width`
  capped at the VAE's tile size (and `frames` at its temporal tile where it has one). An upper bound: a VAE that
  decodes a few frames at a time (Wan's causal decoder) peaks lower.
- audio_decode: `b * samples * C * 3` with `samples` = the clip's seconds x the output sample rate, `C` as above over
  the audio VAE's and vocoder's last convolutions.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch

TEXT_ROWS = 1024  # text-encoder rows planned for: a 512-token prompt and its negative


def _linear_widths(module: torch.nn.Module) -> tuple[int, int, int]:
    """(D, F, element bytes) of a module's Linears: D the most common input width; F the feed-forward width, the
    widest input of a Linear back to D (the down projection; a conditioning projection such as an adaLN one that
    widens D many times but runs on one row per sample does not count), D when there is none."""
    linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        return 0, 0, 0
    width = Counter(m.in_features for m in linears).most_common(1)[0][0]
    ffn = max((m.in_features for m in linears if m.out_features == width), default=width)
    return width, max(ffn, width), linears[0].weight.element_size()


def _per_row(module: torch.nn.Module) -> int:
    d, f, b = _linear_widths(module)
    return b * max(8 * d, 2 * d + 3 * f)


def _last_conv_channels(modules: list[torch.nn.Module]) -> tuple[int, int]:
    """(input channels, element bytes) of the last convolution among `modules` (a VAE's decoder, a vocoder)."""
    channels, size = 0, 0
    for module in modules:
        root = getattr(module, "decoder", module)
        convs = [m for m in root.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
        if convs:
            channels = max(channels, convs[-1].in_channels)
            size = max(size, convs[-1].weight.element_size())
    return channels, size


def estimate_activation(model: Any, request: Any) -> tuple[dict[str, int], int | None]:
    """(stage -> estimated activation peak, the video decode's peak when tiled or None) for a resolved `request`
    (module docstring: the formulas). The tiled figure is None when the VAE has no tiling or tiles by default."""
    pipeline, family = model.pipeline, model.family
    rows, _ = family.denoise_shape(request)
    denoisers = model.denoisers()
    estimate = {"denoise": max(rows * _per_row(family.blocks(d)[0]) for d in denoisers if family.blocks(d))}
    text = getattr(pipeline, "text_encoder", None)
    if text is not None:
        estimate["text_encode"] = TEXT_ROWS * _per_row(text)
    tiled = None
    vae = getattr(pipeline, "vae", None)
    if vae is not None:
        channels, size = _last_conv_channels([vae])
        per_pixel = size * channels * 3
        estimate["video_decode"] = per_pixel * request.frames * request.height * request.width
        if request.image is not None or request.last_image is not None:
            estimate["image_encode"] = per_pixel * request.height * request.width
        if hasattr(vae, "use_tiling") and hasattr(vae, "tile_sample_min_height"):
            frames = min(request.frames, getattr(vae, "tile_sample_min_num_frames", request.frames))
            height = min(request.height, vae.tile_sample_min_height)
            width = min(request.width, vae.tile_sample_min_width)
            tiled_peak = per_pixel * frames * height * width
            if vae.use_tiling:  # tiled is this model's own decode (MiniMax-H3): the only mode
                estimate["video_decode"] = tiled_peak
            else:
                tiled = tiled_peak
    audio = [m for name in ("audio_vae", "vocoder") if (m := getattr(pipeline, name, None)) is not None]
    if family.has_audio and audio:
        channels, size = _last_conv_channels(audio)
        rate = getattr(pipeline, "audio_sampling_rate", None) or _vocoder_rate(pipeline)
        estimate["audio_decode"] = size * channels * 3 * math.ceil(request.frames / request.fps * rate)
    return estimate, tiled


def _vocoder_rate(pipeline: Any) -> int:
    vocoder = getattr(pipeline, "vocoder", None)
    return int(vocoder.config.output_sampling_rate) if vocoder is not None else 48_000
