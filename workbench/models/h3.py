"""MiniMax-H3 audio+video (diffusers `MiniMaxH3ModularPipeline`: Qwen3-VL conditioner, one packed sequence).

H3 is modular only: `MiniMaxH3Blocks().init_pipeline()` plus `update_components(...)`; there is no classic
`DiffusionPipeline`, no guidance (the checkpoint is guidance-distilled) and no step callback. This module adapts
it to the session's contract:

- `runner` calls the modular pipeline and, for the duration of the call only, wraps two sub-blocks of the
  denoising loop (`LoopSequentialPipelineBlocks.sub_blocks`): the `denoiser` block runs inside
  `transformer.cache_context("cond", step_index=i, timestep=t, num_inference_steps=calls)` (the stock loop
  sets no context, and feature
  caches need one), and the scheduler `update` block calls `on_step_end(pipe, i, t, {"latents": ...})` after every
  step with the packed video rows of the sequence (conditioning rows first, as the loop holds them). The wrappers
  delegate `inputs`/`intermediate_outputs` to the wrapped block, so the loop's state layout is unchanged.
- N `steps` give N - 1 transformer calls (the scheduler's last sigma is 0 and is not evaluated).
- Frames are `17 n + 5` at a fixed 24 fps and must last 5-15 s: 124, 141, ..., 345. Out-of-range counts, and fewer
  than 2 steps, are refused (`check_request`), never snapped.
- Modes: `t2va`, `i2va` (first keyframe = `Request.image`), `l2va` (last keyframe = `Request.last_image`), `fl2va`
  (both). Keyframes are PIL images or uint8 (H, W, 3) arrays; arrays are handed to the pipeline as PIL images
  (its resize step reads `.size`), which is lossless.
- Full size: `Session.open(path, device="cuda")` on a local diffusers copy of the release (`load`), then
  `session.generate(Request(prompt, **BASE16))` runs the released Base16 setting: 124 frames at 768x1344, 17 steps =
  16 transformer forwards, stereo 32 kHz. The 33.1B-parameter transformer alone is about 62 GiB in bf16; one
  forward at 10 s 736x992 (52,648 packed rows) is timed by `python -m benchmarks run forward-h3`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import (
    AutoencoderKLMiniMaxH3,
    AutoencoderKLMiniMaxH3Audio,
    MiniMaxH3Scheduler,
    MiniMaxH3Transformer3DModel,
)
from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry
from diffusers.image_processor import VaeImageProcessor
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock
from diffusers.modular_pipelines import MiniMaxH3Blocks
from diffusers.modular_pipelines.minimax_h3.denoise import MiniMaxH3LoopDenoiser, MiniMaxH3LoopSchedulerStep
from diffusers.video_processor import VideoProcessor
from transformers import (
    Qwen2TokenizerFast,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    TokenizersBackend,
)
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from workbench.models.family import (
    Family,
    SelfAttention,
    TeaCache,
    block_arg,
    component_folder,
    load_components,
    read_model_index,
    read_workbench_file,
)
from workbench.models.fused.h3 import FUSED
from workbench.models.loaded import LoadedModel
from workbench.models.tokenizer import build_tokenizer

# diffusers' block-level caches (first-block cache, MagCache) find blocks through this registry, which
# does not list MiniMax-H3's block in 0.42.1. Its forward takes `hidden_states` first and returns the
# new hidden states alone (there is no separate encoder stream: text rows are part of the sequence).
TransformerBlockRegistry.register(
    MiniMaxH3TransformerBlock,
    TransformerBlockMetadata(return_hidden_states_index=0, return_encoder_hidden_states_index=None),
)

FPS = 24
MIN_FRAMES, MAX_FRAMES = 124, 345  # 5 s and 15 s at 24 fps, both of the form 17 n + 5
ALLOWED_FRAMES = tuple(range(MIN_FRAMES, MAX_FRAMES + 1, 17))
MIN_STEPS = 2  # the scheduler's `set_timesteps` refuses fewer (1 step would run no transformer call)
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# Which keyframes each mode takes: (needs Request.image, needs Request.last_image).
MODE_KEYFRAMES = {"t2va": (False, False), "i2va": (True, False), "l2va": (False, True), "fl2va": (True, True)}
INDEX_FILE = "modular_model_index.json"


def _keyframe(value: Any) -> Any:
    if value is None or not isinstance(value, np.ndarray):
        return value
    from PIL import Image

    return Image.fromarray(value, mode="RGB")


def _call_kwargs(request: Any) -> dict[str, Any]:
    kwargs = {
        "prompt": request.prompt,
        "num_frames": request.frames,
        "height": request.height,
        "width": request.width,
        "num_inference_steps": request.steps,
    }
    for name in ("image", "last_image"):
        if getattr(request, name) is not None:
            kwargs[name] = _keyframe(getattr(request, name))
    return kwargs


def _denoise_shape(request: Any) -> tuple[int, int]:
    """(rows, forwards) of the t2va packing: latent frames 5n + 2 for 17n + 5 frames at 1/16 of the pixels in
    (1, 2, 2) patches, up to 512 text rows, 40 audio latents per second x 2 channels; N - 1 forwards for N steps."""
    latent_frames = 5 * ((request.frames - 5) // 17) + 2
    rows = latent_frames * (request.height // 32) * (request.width // 32)
    return rows + 512 + 2 * math.ceil(40 * request.frames / request.fps), max(request.steps - 1, 1)


class _InCacheContext:
    """Runs the loop's transformer block inside `transformer.cache_context("cond", ...)`."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __getattr__(self, name: str) -> Any:  # inputs, intermediate_outputs, ... of the wrapped block
        return getattr(self.inner, name)

    def __call__(self, components: Any, block_state: Any, i: int, t: torch.Tensor) -> Any:
        transformer = getattr(components, self.inner.transformer_name)
        # The loop runs one transformer call per entry of `timesteps` (N steps give N - 1 calls); caches
        # count warm-up and final steps in calls, so they are told that number, not the request's steps.
        calls = len(block_state.timesteps)
        with transformer.cache_context("cond", step_index=i, timestep=t, num_inference_steps=calls):
            return self.inner(components, block_state, i=i, t=t)


class _StepEnd:
    """Runs the loop's scheduler block, then reports the finished step to `on_step_end`."""

    def __init__(self, inner: Any, pipeline: Any, on_step_end: Callable[..., Any]):
        self.inner, self.pipeline, self.on_step_end = inner, pipeline, on_step_end

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, components: Any, block_state: Any, i: int, t: torch.Tensor) -> Any:
        components, block_state = self.inner(components, block_state, i=i, t=t)
        # The loop updates the packed rows in place, so a reference kept by a listener would change under it.
        self.on_step_end(self.pipeline, i, t, {"latents": block_state.latents.clone()})
        return components, block_state


def _denoise_loops(blocks: Any) -> list[Any]:
    """Every denoising loop in the block tree (one per workflow: t2va, fl2va, ref2va)."""
    found, stack = [], [blocks]
    while stack:
        block = stack.pop()
        sub_blocks = getattr(block, "sub_blocks", None) or {}
        if any(isinstance(b, MiniMaxH3LoopSchedulerStep) for b in sub_blocks.values()):
            found.append(block)
        stack.extend(sub_blocks.values())
    return found


@contextlib.contextmanager
def quiet_weight_norm() -> Iterator[None]:
    """Build the audio VAE without torch's FutureWarning about `torch.nn.utils.weight_norm`: diffusers' H3 audio VAE
    keeps that spelling for its checkpoints' weight_g/weight_v names, so the warning says nothing a user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`torch\.nn\.utils\.weight_norm` is deprecated", category=FutureWarning
        )
        yield


def run_modular_pipeline(pipeline: Any, kwargs: dict[str, Any], generator: Any, on_step_end: Any) -> tuple:
    """Call the H3 modular pipeline; returns float frames (T, H, W, 3) in [0, 1] and audio (2, N)."""
    undo: list[Callable[[], None]] = []
    try:
        for loop in _denoise_loops(pipeline._blocks):  # `.blocks` is a deep copy
            for name, block in list(loop.sub_blocks.items()):
                if isinstance(block, MiniMaxH3LoopDenoiser):
                    loop.sub_blocks[name] = _InCacheContext(block)
                elif isinstance(block, MiniMaxH3LoopSchedulerStep):
                    loop.sub_blocks[name] = _StepEnd(block, pipeline, on_step_end)
                else:
                    continue
                undo.append(lambda loop=loop, name=name, block=block: loop.sub_blocks.__setitem__(name, block))
            labelled = getattr(pipeline, "progress_bar", None)  # a session's labelled bar; the loop's own has no label
            if labelled is not None:
                loop.progress_bar = labelled
                undo.append(lambda loop=loop: loop.__dict__.pop("progress_bar"))
        state = pipeline(**kwargs, generator=generator, output_type="np")
    finally:
        for restore in reversed(undo):
            restore()
    videos, audio = state.get("videos"), state.get("audio")
    return np.asarray(videos[0]), audio[0]


@dataclasses.dataclass(frozen=True)
class H3Family(Family):
    """Adds `check_request` (called by `Request.resolved`): keyframes per mode, the 5-15 s range, fixed 24 fps,
    at least 2 steps."""

    def check_request(self, request: Any) -> None:
        if request.steps < MIN_STEPS:
            raise ValueError(
                f"steps: {request.steps}; allowed: integers >= {MIN_STEPS} for {self.name} "
                "(N steps run N - 1 transformer calls: the scheduler's last sigma is 0)"
            )
        if request.frames not in ALLOWED_FRAMES:
            raise ValueError(
                f"frames: {request.frames} is outside what {self.name} generates (5-15 s at {FPS} fps, 17*n + 5); "
                f"allowed: {list(ALLOWED_FRAMES)}"
            )
        if request.fps != FPS:
            raise ValueError(f"fps: {request.fps}; {self.name} generates at a fixed {FPS} fps")
        if request.guidance is not None:
            raise ValueError(f"guidance: {self.name} is guidance-distilled and takes no guidance scale; leave it None")
        if request.negative_prompt:
            raise ValueError(f"negative_prompt: {self.name} is guidance-distilled and takes no negative prompt")
        needs_image, needs_last = MODE_KEYFRAMES[request.mode]
        for name, needed in (("image", needs_image), ("last_image", needs_last)):
            given = getattr(request, name) is not None
            if needed and not given:
                raise ValueError(f"{name}: mode {request.mode!r} needs a keyframe here; none was given")
            if given and not needed:
                modes = [m for m, keys in MODE_KEYFRAMES.items() if keys[name == "last_image"]]
                raise ValueError(f"{name}: mode {request.mode!r} takes no {name}; modes that do: {modes}")


def target_video_start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Rows of the packed sequence before the target video, from one transformer call's keyword arguments.

    diffusers 0.42.1 packs `[text | keyframe conditioning | target audio | target video]` (t2va/i2va/l2va/fl2va;
    ref2va puts its reference blocks where the keyframes are), so the target video is the run of video rows
    that ends the sequence; everything before it (text, conditioning, audio) is the prefix. RuntimeError when the
    call does not carry the layout or the sequence does not end with video rows.
    """
    position_ids, video = kwargs.get("position_ids"), kwargs.get("video_indices")
    if position_ids is None or video is None:
        raise RuntimeError("h3: the transformer was called without position_ids / video_indices keywords")
    length = position_ids.shape[0]
    rows = torch.sort(video.reshape(-1)).values
    # rows[i] == length - n + i holds exactly on the trailing run of rows that ends the sequence
    tail = rows == torch.arange(length - rows.numel(), length, device=rows.device)
    run = int(tail.flip(0).int().cumprod(0).sum())
    if run == 0:
        raise RuntimeError(f"h3: the packed sequence of {length} rows does not end with video rows")
    return length - run


# One packed self-attention (`transformer_blocks[i].attn`) over every row; the token refiner's attention sees
# text only and is not routed.
SELF_ATTENTION = SelfAttention(
    modules=lambda denoiser: [block.attn for block in denoiser.transformer_blocks],
    prefix_rows=target_video_start,
    layout="[text | keyframe/reference conditioning | target audio | target video] in one packed sequence",
)


def teacache_indicator(block: torch.nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """The first block's `norm1(x) * (1 + scale[idx]) + shift[idx]` over the whole packed sequence (text,
    conditioning, audio and video rows), with the per-row (timestep, modality) modulation rows taken from that
    block's `adaln_proj(temb)`, as the block computes them. No rescale coefficients are fitted on H3."""
    x = block_arg(args, kwargs, "hidden_states", 0)
    temb = block_arg(args, kwargs, "temb", 1)
    indices = block_arg(args, kwargs, "adaln_indices", 2)
    shift, scale = block.adaln_proj(temb)[:2]
    return block.norm1(x) * (1.0 + scale.index_select(0, indices)) + shift.index_select(0, indices)


# What an H3 model folder may name, per component (`MiniMaxH3Blocks().expected_components`, plus the tokenizer
# class and the torchvision-free processor `LoadedModel.save` writes). `transformer_ref` (ref2va) is checked but
# not loaded; the processor is rebuilt from its folder by `_load_processor`.
_TRANSFORMER = {("diffusers", "MiniMaxH3Transformer3DModel"): MiniMaxH3Transformer3DModel}
_SCHEDULER = {("diffusers", "MiniMaxH3Scheduler"): MiniMaxH3Scheduler}
COMPONENTS = {
    "transformer": _TRANSFORMER,
    "transformer_ref": _TRANSFORMER,
    "vae": {("diffusers", "AutoencoderKLMiniMaxH3"): AutoencoderKLMiniMaxH3},
    "audio_vae": {("diffusers", "AutoencoderKLMiniMaxH3Audio"): AutoencoderKLMiniMaxH3Audio},
    "text_encoder": {("transformers", "Qwen3VLForConditionalGeneration"): Qwen3VLForConditionalGeneration},
    "tokenizer": {
        ("transformers", "Qwen2TokenizerFast"): Qwen2TokenizerFast,
        ("transformers", "Qwen2Tokenizer"): Qwen2TokenizerFast,
        ("transformers", "TokenizersBackend"): TokenizersBackend,
    },
    "processor": {
        ("transformers", "Qwen3VLProcessor"): Qwen3VLProcessor,
        ("workbench.models.h3", "_ProcessorWithoutVideo"): Qwen3VLProcessor,
    },
    "scheduler": _SCHEDULER,
    "audio_scheduler": _SCHEDULER,
    "image_processor": {("diffusers", "VaeImageProcessor"): VaeImageProcessor},
    "video_processor": {("diffusers", "VideoProcessor"): VideoProcessor},
}

FAMILY = H3Family(
    name="h3",
    pipeline_class="MiniMaxH3ModularPipeline",
    # The checkpoint's own canvas (short edge 768, 16:9) and shortest duration; 17 steps = 16 evaluations (Base16).
    defaults={"frames": 124, "height": 768, "width": 1344, "steps": 17, "fps": FPS},
    frame_step=17,
    frame_offset=5,
    size_multiple=32,
    has_audio=True,
    modes=tuple(MODE_KEYFRAMES),
    block_classes=("MiniMaxH3TransformerBlock",),
    stage_probes=(
        # The conditioner runs `text_encoder.model` (it reads hidden state 50, never the LM head), so the probe
        # sits on that submodule; for keyframe modes it includes the Qwen3-VL vision tower.
        ("text_encode", "text_encoder.model", None),
        ("image_encode", "vae", "encode"),
        ("video_decode", "vae", "decode"),
        ("audio_decode", "audio_vae", "decode"),
    ),
    call_kwargs=_call_kwargs,
    runner=run_modular_pipeline,
    self_attention=SELF_ATTENTION,
    # The denoiser transforms the packed video and audio latents; a block carries one packed sequence.
    streams=("hidden_states", "audio_hidden_states"),
    teacache=TeaCache(indicator=teacache_indicator),
    fused=FUSED,
    unsupported={
        "fused_qkv": "not verified against stock on MiniMaxH3Attention",
        "gelu_epilogue": "its feed-forward is SwiGLU: there is no tanh-GELU projection to fuse",
        "cache_dit": "not verified with cache-dit 1.5.3 on the modular MiniMax-H3 pipeline",
    },
    exact_fast=(
        ("fused_block_norms", {}),
        ("flash4_attention", {}),
    ),
    components=COMPONENTS,
    stage_components={
        "text_encode": ("text_encoder",),
        "image_encode": ("vae",),
        "video_decode": ("vae",),
        "audio_decode": ("audio_vae",),
    },
    denoise_shape=_denoise_shape,
    denoise_held=("proj_in",),  # `video_embeds`, float32, a local of the forward until it returns
    text_layers="model.language_model.layers",
)
TINY_DEFAULTS = {"frames": 124, "height": 32, "width": 64, "steps": 3, "fps": FPS}
TINY_CANVAS = {"canvas_short_edge": 32, "canvas_max_pixels": 2048}
TEXT_HIDDEN = 16
# The pipeline reads `hidden_states[text_encoder_layer]` (50), so the tiny conditioner has 51 layers of width 16
# rather than a pipeline subclass overriding `text_encoder_layer`: the stock class stays in use.
TEXT_LAYERS = 51
# tiny-h3's transformer config (forward-h3's --smoke builds it bare, with head dim 128).
TINY_TRANSFORMER = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "hidden_size": 24,
    "num_layers": 2,
    "num_refiner_layers": 1,
    "ffn_dim": 32,
    "in_channels": 4,
    "audio_in_channels": 4,
    "patch_size": (1, 2, 2),
    "text_dim": TEXT_HIDDEN,
    "freq_dim": 8,
    "time_embed_hidden_dim": 24,
    "time_embed_dim": 16,
    "rope_freq_dim": 2,
}
# tiny-h3's other configurations (`tiny_components`; `random_components` takes them too)
TINY_TEXT = {
    "vocab_size": 128,
    "hidden_size": TEXT_HIDDEN,
    "intermediate_size": 16,
    "num_hidden_layers": TEXT_LAYERS,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "max_position_embeddings": 256,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}
TINY_VISION = {
    "depth": 1,
    "hidden_size": 16,
    "intermediate_size": 16,
    "num_heads": 2,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": TEXT_HIDDEN,
    "num_position_embeddings": 16,
    "deepstack_visual_indexes": [0],
}
TINY_VAE = {  # the released 16x spatial / 17n+5 -> 5n+2 temporal geometry, tiny widths
    "latent_channels": 4,
    "block_out_channels": (4, 4, 4, 4),
    "layers_per_block": 1,
    "spatial_downsample_factors": (2, 2, 2, 2),
    "temporal_downsample_factors": (2, 2, 1, 1),
    "norm_num_groups": 2,
    "decoder_num_layers": 1,
    "decoder_num_attention_heads": 1,
    "decoder_attention_head_dim": 8,  # int(0.75 * 8) = 6, divisible by 6 as the decoder's RoPE needs
    "decoder_num_register_tokens": 1,
    "decoder_ffn_mult": 1,
    "clip_length": 17,
    "token_drop": 3,
    "latents_mean": (0.0,) * 4,
    "latents_std": (1.0,) * 4,
}
TINY_AUDIO_VAE = {  # 800-sample hop at 32 kHz like the release: 40 latents per second
    "encoder_dim": 1,
    "encoder_rates": (20, 40),
    "latent_dim": 4,
    "latent_channels": 4,
    "num_attention_heads": 2,
    "decoder_dim": 4,
    "decoder_rates": (40, 20),
    "decoder_kernel_sizes": (80, 40),
    "resblock_kernel_sizes": (3,),
    "resblock_dilation_sizes": ((1,),),
    "sampling_rate": 32000,
    "latents_mean": [0.0] * 4,
    "latents_std": [1.0] * 4,
}
# Qwen3-VL's config names for the vision tokens (`VISION_TOKENS`)
VISION_TOKEN_IDS = {
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
}

# The released Base16 setting: 17 steps = 16 transformer evaluations (H3 evaluates N - 1 times for N steps), one
# forward per step (guidance-distilled: no negative prompt, no guidance scale). Sizes come from the model's
# defaults: 124x32x64 on `tiny-h3`; with the released checkpoint 124 frames (5.17 s at 24 fps), 768x1344 (short
# edge 768, at most 768*1344 pixels), stereo 32 kHz audio. Use as `Request(prompt, **BASE16)`.
BASE16: dict[str, Any] = {"steps": 17}


class _ProcessorWithoutVideo(Qwen3VLProcessor):
    """A `Qwen3VLProcessor` without its video half, for environments without torchvision.

    transformers builds Qwen3-VL video processors only with torchvision; the t2va/fl2va blocks use just the
    tokenizer, the image processor and `create_mm_token_type_ids`, so `video_processor=None` is accepted here.
    """

    def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> list[str]:
        """Saves the two halves it has; `_load_processor` rebuilds it from them."""
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        return [*self.tokenizer.save_pretrained(save_directory), *self.image_processor.save_pretrained(save_directory)]


def build_processor(tokenizer: Any, image_processor: Any) -> Qwen3VLProcessor:
    """A Qwen3-VL processor of `tokenizer` and `image_processor` without its video half (`_ProcessorWithoutVideo`)."""
    return _ProcessorWithoutVideo(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)


def _tiny_text_encoder(seed: int, tokenizer: Any) -> Qwen3VLForConditionalGeneration:
    torch.manual_seed(seed)
    config = Qwen3VLConfig(text_config=TINY_TEXT, vision_config=TINY_VISION, **vision_token_ids(tokenizer))
    return Qwen3VLForConditionalGeneration(config).eval()


def tiny_components(seed: int = 0) -> dict[str, Any]:
    """Every component of a random-initialised H3 small enough for the CPU tests at 124x32x64 (3 steps)."""
    tokenizer = build_tokenizer(TINY_TEXT["vocab_size"], model_max_length=256, extra_special_tokens=VISION_TOKENS)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32, max_pixels=64 * 64
    )
    text_encoder = _tiny_text_encoder(seed, tokenizer)
    torch.manual_seed(seed + 1)
    transformer = MiniMaxH3Transformer3DModel(**TINY_TRANSFORMER)
    torch.manual_seed(seed + 2)
    vae = AutoencoderKLMiniMaxH3(**TINY_VAE)
    torch.manual_seed(seed + 3)
    with quiet_weight_norm():
        audio_vae = AutoencoderKLMiniMaxH3Audio(**TINY_AUDIO_VAE)
    return {
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "processor": build_processor(tokenizer, image_processor),
        "transformer": transformer.eval(),
        "vae": vae.eval(),
        "audio_vae": audio_vae.eval(),
        "scheduler": MiniMaxH3Scheduler(shift=12.0),
        "audio_scheduler": MiniMaxH3Scheduler(shift=3.0),
    }


def assemble(components: dict[str, Any], **config: Any) -> Any:
    """A `MiniMaxH3ModularPipeline` from components (plus canvas configs such as `canvas_short_edge`)."""
    pipeline = MiniMaxH3Blocks().init_pipeline()
    pipeline.update_components(**components)
    if config:
        pipeline.update_components(**config)
    return pipeline


def tiny_pipeline(seed: int = 0) -> Any:
    return assemble(tiny_components(seed), **TINY_CANVAS)


def tiny(seed: int = 0) -> LoadedModel:
    return LoadedModel("tiny-h3", FAMILY, tiny_pipeline(seed), dict(TINY_DEFAULTS), {})


def vision_token_ids(tokenizer: Any) -> dict[str, int]:
    """Qwen3-VL's config fields for the vision tokens (`VISION_TOKEN_IDS`), as `tokenizer` numbers them."""
    return {field: tokenizer.convert_tokens_to_ids(token) for field, token in VISION_TOKEN_IDS.items()}


def release_configs() -> dict[str, dict[str, Any]]:
    """The released H3's component configurations (`model_sizes`, whose sources say where they come from):
    `transformer` and `vae` are their classes' defaults; `audio_vae` the class default with the identity latent
    statistics over its 32 channels the pipeline's decode needs (the class leaves them None; random weights have no
    statistics of their own); `text` and `vision` are Qwen3-VL-32B's."""
    from workbench.model_sizes import QWEN3_VL_32B_TEXT, QWEN3_VL_32B_VISION

    channels = 32  # AutoencoderKLMiniMaxH3Audio's latent_channels
    audio = {"latents_mean": [0.0] * channels, "latents_std": [1.0] * channels}
    return {"transformer": {}, "vae": {}, "audio_vae": audio, "text": QWEN3_VL_32B_TEXT, "vision": QWEN3_VL_32B_VISION}


def random_components(
    configs: dict[str, dict[str, Any]],
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, Any]:
    """Every component of an H3 of these `configs` (keyed as `release_configs()`) with random weights, on `device`
    in `dtype` as `model_sizes.cast_like_from_pretrained` casts, plus a synthetic tokenizer (`build_tokenizer` over the
    text model's whole vocabulary, the vision tokens its last ids; nothing is downloaded), processor and schedulers.

    The VAEs are built normally on `device` and cast, first: their float32 peak (about 10 GiB for the released video
    VAE) is over before the large two exist. The transformer and the text encoder go through
    `model_sizes.materialise`: never in float32 (the released transformer would be 132 GB), every parameter and buffer
    initialised. Seeds: the text encoder `seed`, the transformer `seed + 1`, the VAEs `seed + 2` and `seed + 3`."""
    from workbench.model_sizes import cast_like_from_pretrained, materialise, qwen3_vl

    text, vision = configs["text"], configs["vision"]
    tokenizer = build_tokenizer(text["vocab_size"], model_max_length=512, extra_special_tokens=VISION_TOKENS)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=vision["patch_size"],
        merge_size=vision["spatial_merge_size"],
        temporal_patch_size=vision["temporal_patch_size"],
    )
    with torch.device(device):
        torch.manual_seed(seed + 2)
        vae = AutoencoderKLMiniMaxH3(**configs["vae"])
        torch.manual_seed(seed + 3)
        with quiet_weight_norm():
            audio_vae = AutoencoderKLMiniMaxH3Audio(**configs["audio_vae"])
    for module in (vae, audio_vae):
        cast_like_from_pretrained(module, dtype)
    transformer = materialise(lambda: MiniMaxH3Transformer3DModel(**configs["transformer"]), device, dtype, seed + 1)
    ids = vision_token_ids(tokenizer)
    text_encoder = materialise(lambda: qwen3_vl(text, vision, **ids), device, dtype, seed)
    return {
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "processor": build_processor(tokenizer, image_processor),
        "transformer": transformer,
        "vae": vae.eval().requires_grad_(False),
        "audio_vae": audio_vae.eval().requires_grad_(False),
        "scheduler": MiniMaxH3Scheduler(shift=12.0),
        "audio_scheduler": MiniMaxH3Scheduler(shift=3.0),
    }


def random_full(seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16) -> LoadedModel:
    """The released MiniMax-H3 at full size with random weights, built on `device` in `dtype` (`random_components`
    of `release_configs()`): the 33.1B transformer and Qwen3-VL-32B (62 GiB each in bf16), the video and audio VAEs,
    about 130 GiB in all on `device` while it is built. Requests default to the reference one of
    `model_sizes.RELEASED["MiniMax-H3 33.1B"]` at Base16: t2va, 10 s (243 frames) of 736x992 at 24 fps, 17 steps.
    For a GPU: a CPU would need as much host memory and minutes; `Session.open(model, memory=...)` then moves what
    its plan offloads to host memory."""
    from workbench.model_sizes import RELEASED

    pipeline = assemble(random_components(release_configs(), seed, device, dtype))
    defaults = {**RELEASED["MiniMax-H3 33.1B"].request, **BASE16}
    return LoadedModel("random-h3-full", FAMILY, pipeline, defaults, {})


def load(path: str | Path, dtype: torch.dtype = torch.bfloat16) -> LoadedModel:
    """Load a local H3 directory (its `modular_model_index.json`), component by component, strictly.

    A modular repository names its components in `modular_model_index.json` as `[library, class, loading spec]`;
    `family.load_components` checks every class against `COMPONENTS` and loads each folder with the strict loader
    (inside the directory, safetensors only, missing/unexpected/mis-shaped tensors are an error naming the folder).
    The loading spec's own path is ignored: a component is always its folder here. `transformer_ref` (the ref2va
    partition) and components without a folder are not loaded: the workbench runs t2va/i2va/l2va/fl2va. The
    processor is rebuilt from its tokenizer and image processor when torchvision is unavailable.
    """
    root = Path(path)
    index_file, index = read_model_index(root, INDEX_FILE)
    if index.get("_class_name") not in (FAMILY.pipeline_class, "MiniMaxH3Blocks"):
        raise ValueError(f"{index_file}: _class_name is {index.get('_class_name')!r}, expected a MiniMax-H3 pipeline")
    absent = tuple(name for name in index if not name.startswith("_") and not (root / name).is_dir())
    with quiet_weight_norm():
        components, config = load_components(
            root, index_file, index, FAMILY, dtype, skip=("transformer_ref", "processor", *absent)
        )
    components = {name: value for name, value in components.items() if value is not None}
    components["processor"] = _load_processor(
        component_folder(root, "processor", index_file), components.get("tokenizer")
    )
    pipeline = assemble(components, **{k: v for k, v in config.items() if k.startswith("canvas_")})
    return LoadedModel(str(path), FAMILY, pipeline, *read_workbench_file(root, FAMILY))


def _load_processor(folder: Path, tokenizer: Any) -> Qwen3VLProcessor:
    """The processor from a checked component folder (`family.component_folder`)."""
    try:
        return Qwen3VLProcessor.from_pretrained(folder, local_files_only=True)
    except (ImportError, AttributeError, TypeError, ValueError):  # no torchvision: no Qwen3-VL video processor
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(folder, local_files_only=True)
        if tokenizer is None:
            tokenizer = Qwen2TokenizerFast.from_pretrained(folder, local_files_only=True)
        return build_processor(tokenizer, image_processor)
