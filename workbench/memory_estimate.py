"""Activation peaks per stage for the memory planner (`workbench.memory_plan`), estimated from a model's layers.

Activation estimates (bytes). Rough on purpose and documented so a measured value can replace them
(`MemoryBudget.activation`). Every stage's estimate adds `WORKSPACE` (128 MiB) for what no formula here sees and a
measured peak holds: cuBLAS's workspace and the request's own tensors (latents, prompt embeddings, the other CFG
branch's prediction); `tests/test_memory_estimate.py` holds the estimates to the GPU measurements in
`benchmarks/results`.

A transformer block's bytes per row, `row_bytes(block)`, from what a pre-norm block forward keeps alive (diffusers
0.42.1's MiniMax-H3, Wan and their kind) at each point that can be its widest:
`b * max(4 D + FFN, 2 D + 7 A, 11 D) + 8 h`, with the widths read off its Linears: `D` a residual width (the output
of a narrowing Linear, such as the feed-forward's down projection; the widest result of a block with several
streams, LTX-2's video and audio; their most common `in_features` when none narrows), `F` the feed-forward width
(the widest input of a Linear back to D), `A` the attention width (the other inputs of Linears back to D, i.e.
`to_out`; D when there is none), `b` the weights' element size and `h` the attention's head width (`head_dim`, or
A / `heads`; no tables counted when neither is stated).
- the feed-forward, `4 D + FFN`: the block's input (its caller's loop still holds it), the attention output, the
  residual after attention and the FFN's normed input (4 D), then the up projection's output and its activation
  (GELU: FFN = 2 F), or gated (SwiGLU: an up projection 2 F wide, or two F wide ones per down projection) the
  projection whose halves stay views, the activated gate and their product (FFN = 4 F);
- the attention, `2 D + 7 A`: the block's input and normed input, q, k and v, and the rotary embedding of q (or k):
  its output and three half-width float32 temporaries (the two products and their sum, as Wan computes them;
  MiniMax-H3's bf16 rotation holds less);
- the residual update after the feed-forward in float32 as Wan writes it (`(h.float() + ff.float() * gate)`),
  `11 D`: the block's input, the attention output, the residual, the FFN's input and output, and three D-wide
  float32 tensors at once (the upcast residual, the gated output and their sum);
- `8 h`: the rotary tables (cosine and sine, float32, a head wide), alive for the whole forward.

- denoise: `rows * (row_bytes(block) + held)` with `rows` from `Family.denoise_shape` (tokens of one denoiser
  forward, CFG batch included) and `held` the output its forward keeps of `Family.denoise_held` per row (MiniMax-H3:
  its float32 video embedding, 4 D; counted on every row, the text and audio rows too).
- text_encode: `TEXT_ROWS * row_bytes(text encoder)` (its Linears, all layers).
- video_decode / image_encode, a convolutional VAE: `b * frames * height * width * C * 3`, `C` the input channels of
  the decoder's last convolution (the widest map at full resolution), 3 live maps (input, output, norm). Tiled:
  `height` and `width` capped at the VAE's tile size (and `frames` at its temporal tile where it has one). An upper
  bound: a VAE that decodes a few frames at a time (Wan's causal decoder) peaks lower.
- video_decode, a decoder without a final convolution (MiniMax-H3's ViT decoder): `tokens * row_bytes(decoder) +
  2 * frames * height * width * channels * b_out`. `tokens`: what one decoder call attends over, the latent grid of
  the decoder's clip (`clip_length` pixel frames make ceil(clip_length / temporal factor) latent frames, plus the
  overlap `token_drop` leaves; all the video's latent frames without `clip_length`) at the latent size of a tile
  (or of the frame, untiled), the downsample factors from the VAE config, plus its register tokens. The output at
  the decoder's output projection's element size `b_out`, twice: the decoded clips are held until they are
  concatenated into the video.
  image_encode then takes `C` from the encoder's first convolution (its full-resolution width, at its element size).
- audio_decode: `b * samples * C * 3` with `samples` = the clip's seconds x the output sample rate, `C` as above over
  the audio VAE's and vocoder's last convolutions.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch

TEXT_ROWS = 1024  # text-encoder rows planned for: a 512-token prompt and its negative
WORKSPACE = 128 * 2**20  # added to every stage's estimate (module docstring)
ROPE_TABLES = 2 * 4  # cosine and sine, float32, per row and head channel


def _linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def _head_width(module: torch.nn.Module, attention: int) -> int:
    """The head width of the first attention module that states it (`head_dim`, or `heads` of `attention`); 0 when
    none does (no rotary tables counted)."""
    for m in module.modules():
        if isinstance(getattr(m, "head_dim", None), int):
            return m.head_dim
        if isinstance(getattr(m, "heads", None), int) and m.heads > 0:
            return attention // m.heads
    return 0


def _stream(linears: list[torch.nn.Linear], d: int) -> tuple[int, int]:
    """(elements per row at the widest point, attention width A) of a block whose residual stream is `d` wide
    (module docstring: F, A, gated and the three candidate points)."""
    back = {m.in_features for m in linears if m.out_features == d}
    f = max(back | {d})
    a = max(back - {f}, default=d)
    ups = sum(m.in_features == d and m.out_features == f for m in linears)
    downs = sum(m.in_features == f and m.out_features == d for m in linears)
    gated = any(m.in_features == d and m.out_features == 2 * f for m in linears) or ups >= 2 * max(downs, 1)
    return max(4 * d + (4 * f if gated else 2 * f), 2 * d + 7 * a, 11 * d), a


def row_bytes(module: torch.nn.Module) -> int:
    """Activation bytes per row of a transformer block (or a stack of them) from its Linears' widths: the module
    docstring's `b * max(4 D + FFN, 2 D + 7 A, 11 D) + 8 h` for the widest of its residual streams (the outputs of
    its narrowing Linears: LTX-2's blocks carry a video and an audio stream); 0 for a module without Linears."""
    linears = _linears(module)
    if not linears:
        return 0
    streams = {m.out_features for m in linears if m.in_features > m.out_features}
    streams = streams or {Counter(m.in_features for m in linears).most_common(1)[0][0]}
    elements, a = max(_stream(linears, d) for d in streams)
    return linears[0].weight.element_size() * elements + ROPE_TABLES * _head_width(module, a)


def denoise_activation(family: Any, denoiser: torch.nn.Module, rows: int) -> int:
    """Estimated activation peak of one forward of `denoiser` (a `family` denoiser) over `rows` rows: its first
    block's `row_bytes`, the outputs of `family.denoise_held` per row, and `WORKSPACE`."""
    blocks = family.blocks(denoiser)
    if not blocks:
        raise ValueError(f"denoiser: {type(denoiser).__name__} has no blocks of {family.name}'s {family.block_classes}")
    held = 0
    for name in family.denoise_held:
        module = denoiser.get_submodule(name)
        held += module.out_features * module.weight.element_size()
    return rows * (row_bytes(blocks[0]) + held) + WORKSPACE


def _conv(module: torch.nn.Module, last: bool) -> tuple[int, int]:
    """(channels, element bytes) of a module's last convolution (its input channels) or first (its output
    channels); (0, 0) when it has none."""
    convs = [m for m in module.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    if not convs:
        return 0, 0
    conv = convs[-1] if last else convs[0]
    return (conv.in_channels if last else conv.out_channels), conv.weight.element_size()


def _last_conv_channels(modules: list[torch.nn.Module]) -> tuple[int, int]:
    """(input channels, element bytes) of the widest last convolution among `modules`' decoders (a VAE's decoder,
    a vocoder)."""
    found = [_conv(getattr(module, "decoder", module), last=True) for module in modules]
    return max(c for c, _ in found), max(s for _, s in found)


def _vit_tokens(vae: Any, frames: int, height: int, width: int, tiled: bool) -> int:
    """Tokens one call of `vae`'s transformer decoder attends over for a `frames` x `height` x `width` video
    (module docstring: the clip's latent frames at a tile's, or untiled the frame's, latent size)."""
    config = vae.config
    spatial = math.prod(config.spatial_downsample_factors)
    temporal = math.prod(config.temporal_downsample_factors)
    clip = getattr(config, "clip_length", None)
    if clip:
        chunk = math.ceil(clip / temporal)
        latent_frames = chunk + (-getattr(config, "token_drop", 0)) % chunk
    else:
        latent_frames = (frames - 1) // temporal + 1
    if tiled:
        height, width = min(height, vae.tile_sample_min_height), min(width, vae.tile_sample_min_width)
    grid = latent_frames * math.ceil(height / spatial) * math.ceil(width / spatial)
    return grid + getattr(vae.decoder, "num_register_tokens", 0) + 1


def _vit_decode(vae: Any, frames: int, height: int, width: int, tiled: bool) -> int:
    out = _linears(vae.decoder)[-1]
    channels = vae.config.out_channels
    written = 2 * frames * height * width * channels * out.weight.element_size()
    return _vit_tokens(vae, frames, height, width, tiled) * row_bytes(vae.decoder) + written + WORKSPACE


def estimate_activation(model: Any, request: Any) -> tuple[dict[str, int], int | None]:
    """(stage -> estimated activation peak, the video decode's peak when tiled or None) for a resolved `request`
    (module docstring: the formulas). The tiled figure is None when the VAE has no tiling or tiles by default."""
    pipeline, family = model.pipeline, model.family
    rows, _ = family.denoise_shape(request)
    denoisers = [d for d in model.denoisers() if family.blocks(d)]
    estimate = {"denoise": max(denoise_activation(family, d, rows) for d in denoisers)}
    text = getattr(pipeline, "text_encoder", None)
    if text is not None:
        estimate["text_encode"] = TEXT_ROWS * row_bytes(text) + WORKSPACE
    tiled = None
    vae = getattr(pipeline, "vae", None)
    if vae is not None:
        frames, height, width = request.frames, request.height, request.width
        can_tile = hasattr(vae, "use_tiling") and hasattr(vae, "tile_sample_min_height")
        channels, size = _last_conv_channels([vae])
        if channels:
            per_pixel = size * channels * 3
            estimate["video_decode"] = per_pixel * frames * height * width + WORKSPACE
            if can_tile:
                tiled = (
                    per_pixel
                    * min(frames, getattr(vae, "tile_sample_min_num_frames", frames))
                    * min(height, vae.tile_sample_min_height)
                    * min(width, vae.tile_sample_min_width)
                    + WORKSPACE
                )
        else:  # a transformer decoder (MiniMax-H3): encoder-side widths for image_encode
            channels, size = _conv(getattr(vae, "encoder", vae), last=False)
            per_pixel = size * channels * 3
            estimate["video_decode"] = _vit_decode(vae, frames, height, width, tiled=False)
            if can_tile:
                tiled = _vit_decode(vae, frames, height, width, tiled=True)
        if request.image is not None or request.last_image is not None:
            estimate["image_encode"] = per_pixel * height * width + WORKSPACE
        if tiled is not None and vae.use_tiling:  # tiled is this model's own decode (MiniMax-H3): the only mode
            estimate["video_decode"], tiled = tiled, None
    audio = [m for name in ("audio_vae", "vocoder") if (m := getattr(pipeline, name, None)) is not None]
    if family.has_audio and audio:
        channels, size = _last_conv_channels(audio)
        rate = getattr(pipeline, "audio_sampling_rate", None) or _vocoder_rate(pipeline)
        estimate["audio_decode"] = size * channels * 3 * math.ceil(request.frames / request.fps * rate) + WORKSPACE
    return estimate, tiled


def _vocoder_rate(pipeline: Any) -> int:
    vocoder = getattr(pipeline, "vocoder", None)
    return int(vocoder.config.output_sampling_rate) if vocoder is not None else 48_000
