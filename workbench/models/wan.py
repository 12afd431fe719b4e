"""Wan2.1 / Wan2.2 text-to-video (diffusers `WanPipeline`; Wan2.2 adds `transformer_2` and a boundary)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    UniPCMultistepScheduler,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import T5TokenizerFast, TokenizersBackend, UMT5Config, UMT5EncoderModel

from workbench.models.family import (
    Family,
    SelfAttention,
    TeaCache,
    VaeDecode,
    block_arg,
    load_pipeline,
    read_workbench_file,
)
from workbench.models.fused import wan_vae
from workbench.models.fused.wan import FUSED
from workbench.models.loaded import LoadedModel, cast_components, cast_module
from workbench.models.tokenizer import build_tokenizer


def _call_kwargs(request: Any) -> dict[str, Any]:
    return {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "num_frames": request.frames,
        "height": request.height,
        "width": request.width,
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
    }


def _denoise_shape(request: Any) -> tuple[int, int]:
    """(rows, forwards): latent frames (frames - 1) / 4 + 1 at 1/8 of the pixels, (1, 2, 2) patches; the CFG
    branches are separate forwards."""
    rows = ((request.frames - 1) // 4 + 1) * (request.height // 16) * (request.width // 16)
    return rows, request.steps * (2 if request.guidance > 1 else 1)


def _text_forwards(request: Any) -> int:
    """The UMT5 encoder runs once for the prompt and, with CFG (guidance > 1), once more for the negative prompt."""
    return 2 if request.guidance > 1 else 1


# Wan's self-attention (`attn1` of each block) sees video rows only: the text, and for image-to-video the CLIP
# image tokens, enter through cross-attention (`attn2`, whose `add_k_proj` carries the image tokens), and the
# I2V conditioning latents are concatenated on the channel axis, not as rows. No sink rows, whatever the mode.
SELF_ATTENTION = SelfAttention(
    modules=lambda denoiser: [block.attn1 for block in denoiser.blocks],
    layout="video rows only (text and image tokens enter through attn2 cross-attention)",
)


def teacache_indicator(block: torch.nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """The first block's self-attention input `norm1(x) * (1 + scale_msa) + shift_msa` as the block computes it:
    fp32 norm and modulation from its `scale_shift_table` plus the timestep projection, cast back to x's dtype."""
    x = block_arg(args, kwargs, "hidden_states", 0)
    temb = block_arg(args, kwargs, "temb", 2)
    if temb.ndim == 4:  # batch, seq, 6, dim (Wan2.2 TI2V)
        shift, scale = (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)[:2]
        shift, scale = shift.squeeze(2), scale.squeeze(2)
    else:  # batch, 6, dim
        shift, scale = (block.scale_shift_table + temb.float()).chunk(6, dim=1)[:2]
    return (block.norm1(x.float()) * (1 + scale) + shift).type_as(x)


# TeaCache's rescale polynomial for Wan2.1 T2V 1.3B, highest power first: published in the TeaCache repository,
# ali-vilab/TeaCache, TeaCache4Wan2.1/teacache_generate.py (the `use_ret_steps` set, also listed as
# `wan2.1_t2v_1.3B_ret_mode` by ports). They were fitted against upstream's Wan indicator, the timestep projection
# `e0`, not against the modulated input `teacache_indicator` returns, so here they are a borrowed calibration.
TEACACHE = TeaCache(
    indicator=teacache_indicator,
    coefficients={
        "wan2.1-t2v-1.3b": (-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02),
    },
)

# What a Wan model folder may name, per component: the released Wan2.1/2.2 T2V indexes (UniPC scheduler, UMT5
# encoder, T5 tokenizer) and what `LoadedModel.save` writes for the tiny builds (FlowMatch Euler, tokenizers backend).
_TRANSFORMER = {("diffusers", "WanTransformer3DModel"): WanTransformer3DModel}
COMPONENTS = {
    "transformer": _TRANSFORMER,
    "transformer_2": _TRANSFORMER,
    "vae": {("diffusers", "AutoencoderKLWan"): AutoencoderKLWan},
    "text_encoder": {("transformers", "UMT5EncoderModel"): UMT5EncoderModel},
    "tokenizer": {
        ("transformers", "T5TokenizerFast"): T5TokenizerFast,
        ("transformers", "TokenizersBackend"): TokenizersBackend,
    },
    "scheduler": {
        ("diffusers", "UniPCMultistepScheduler"): UniPCMultistepScheduler,
        ("diffusers", "FlowMatchEulerDiscreteScheduler"): FlowMatchEulerDiscreteScheduler,
    },
}


def expert_schedule(pipeline: WanPipeline, steps: int) -> tuple[str, ...]:
    """The expert `WanPipeline.__call__` picks at each of `steps` steps: `transformer` while the timestep is at or
    above `boundary_ratio * num_train_timesteps`, `transformer_2` below (Wan2.2); `transformer` throughout when the
    pipeline has no boundary or no second expert. The timesteps come from a copy of the pipeline's scheduler set
    for `steps`, as the pipeline sets its own."""
    ratio = pipeline.config.boundary_ratio
    if ratio is None or getattr(pipeline, "transformer_2", None) is None:
        return ("transformer",) * steps
    scheduler = copy.deepcopy(pipeline.scheduler)
    scheduler.set_timesteps(steps, device="cpu")
    boundary = ratio * scheduler.config.num_train_timesteps
    return tuple("transformer" if t >= boundary else "transformer_2" for t in scheduler.timesteps.tolist())


FAMILY = Family(
    name="wan",
    pipeline_class="WanPipeline",
    defaults={"frames": 81, "height": 480, "width": 832, "steps": 50, "guidance": 5.0, "fps": 16},
    frame_step=4,
    frame_offset=1,
    size_multiple=16,
    has_audio=False,
    denoisers=("transformer", "transformer_2"),
    block_classes=("WanTransformerBlock",),
    stage_probes=(("text_encode", "", "encode_prompt"), ("video_decode", "vae", "decode")),
    call_kwargs=_call_kwargs,
    self_attention=SELF_ATTENTION,
    text_cross_attention=("attn2",),
    teacache=TEACACHE,
    fused=FUSED,
    vae_decode=VaeDecode(check=wan_vae.check, install=wan_vae.install),
    timestep_embedder="condition_embedder",
    exact_fast=(
        ("fused_block_norms", {}),
        ("adaln_precompute", {}),
        ("cross_kv_cache", {}),
        ("gelu_epilogue", {}),
        ("flash4_attention", {}),
        ("fused_vae_decode", {}),  # its default options: bitwise (padded conv buffers only)
    ),
    components=COMPONENTS,
    stage_components={"text_encode": ("text_encoder",), "video_decode": ("vae",)},
    denoise_shape=_denoise_shape,
    text_layers="encoder.block",
    text_forwards=_text_forwards,
    expert_schedule=expert_schedule,
)
TINY_DEFAULTS = {"frames": 9, "height": 64, "width": 64, "steps": 2, "guidance": 5.0, "fps": 16}
TINY_TEXT_DIM = 32


def _tiny_transformer(seed: int, heads: int = 2, head_dim: int = 16) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=16,
        out_channels=16,
        text_dim=TINY_TEXT_DIM,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        cross_attn_norm=True,
        rope_max_seq_len=32,
    )


def tiny_pipeline(seed: int = 0, two_experts: bool = False) -> WanPipeline:
    """A random-initialised Wan small enough for the CPU tests at 9x64x64 (`TINY_DEFAULTS`)."""
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    torch.manual_seed(seed + 1)
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=128,
            d_model=TINY_TEXT_DIM,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            is_encoder_decoder=False,
        )
    )
    return WanPipeline(
        tokenizer=build_tokenizer(128, model_max_length=64),
        text_encoder=text_encoder.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=_tiny_transformer(seed + 2).eval(),
        transformer_2=_tiny_transformer(seed + 3).eval() if two_experts else None,
        boundary_ratio=0.875 if two_experts else None,
    )


def tiny_d128(seed: int = 0) -> LoadedModel:
    """tiny-wan with one attention head of dimension 128 (what the sparse-attention kernels take) instead of
    two of 16; everything else is tiny-wan's. 128x192 frames give 8x12 = 96 tokens per latent frame."""
    pipe = tiny_pipeline(seed)
    pipe.register_modules(transformer=_tiny_transformer(seed + 2, heads=1, head_dim=128).eval())
    defaults = {**TINY_DEFAULTS, "height": 128, "width": 192}
    return LoadedModel("tiny-wan-d128", FAMILY, pipe, defaults, {"max_sequence_length": 32})


def tiny(seed: int = 0) -> LoadedModel:
    return LoadedModel("tiny-wan", FAMILY, tiny_pipeline(seed), TINY_DEFAULTS, {"max_sequence_length": 32})


def tiny22(seed: int = 0) -> LoadedModel:
    pipe = tiny_pipeline(seed, two_experts=True)
    return LoadedModel("tiny-wan22", FAMILY, pipe, TINY_DEFAULTS, {"max_sequence_length": 32})


def random_1_3b(seed: int = 0, device: str | torch.device = "cpu") -> LoadedModel:
    """Wan2.1-T2V-1.3B shapes with random weights, for timing on a GPU without a checkpoint.

    Transformer and VAE have the real configuration. The UMT5-XXL text encoder is shape-reduced to two
    layers at its real width (4096): only its output width reaches the transformer, and its time is a
    few milliseconds of a request either way; the text_encode stage of this model is therefore not
    representative. Built directly on `device` so a GPU initialises 1.4 B parameters in seconds.
    """
    with torch.device(device):
        torch.manual_seed(seed)
        transformer = _random_transformer(heads=12, ffn=8960, layers=30)
        vae, text_encoder = _random_vae_and_text()
    pipe = WanPipeline(
        tokenizer=build_tokenizer(128, model_max_length=512),
        text_encoder=text_encoder.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=transformer.eval(),
    )
    return LoadedModel("random-wan-1.3b", FAMILY, pipe, dict(FAMILY.defaults), {})


def random_14b(seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16) -> LoadedModel:
    """Wan2.1-T2V-14B shapes with random weights: one transformer of 40 layers, 40 heads x 128 (dim 5120), FFN 13824
    (14.3 B parameters, 28.6 GB in bf16), the Wan2.1 VAE, the text encoder shape-reduced as in `random_1_3b`, and
    `random_1_3b`'s scheduler (flow matching, shift 3: Wan's 480p setting), so its requests differ from the 1.3B's in
    the transformer only. Built on `device` and cast to `dtype` as `random_a14b` builds each expert (the float32 peak
    is the transformer alone, 57 GB; a GPU initialises it in seconds)."""
    with torch.device(device):
        torch.manual_seed(seed)
        transformer = _random_transformer_as(dtype)
        vae, text_encoder = _random_vae_and_text()
    pipe = WanPipeline(
        tokenizer=build_tokenizer(128, model_max_length=512),
        text_encoder=text_encoder.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=transformer,
    )
    cast_components(pipe, dtype)
    return LoadedModel("random-wan-14b", FAMILY, pipe, dict(FAMILY.defaults), {})


A14B_SHIFT, A14B_BOUNDARY = 12.0, 0.875  # Wan2.2's T2V-A14B inference config: sample_shift, boundary
A14B_DEFAULTS = {**FAMILY.defaults, "steps": 40, "guidance": 4.0}  # its sample_steps; high-noise guide scale


def random_a14b(seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16) -> LoadedModel:
    """Wan2.2-T2V-A14B shapes with random weights: two experts of 40 layers, 40 heads x 128 (dim 5120), FFN 13824
    (`transformer` for high noise, `transformer_2` for low), the Wan2.1 VAE, the text encoder shape-reduced as in
    `random_1_3b`; UniPC flow-matching scheduler with shift 12 and the boundary at 0.875 (Wan2.2's T2V-A14B config);
    request defaults 40 steps, guidance 4 (its high-noise scale; diffusers uses it for both experts when
    `guidance_scale_2` is not given).

    Built on `device` and cast to `dtype` as `from_pretrained(torch_dtype=dtype)` casts (`cast_components`), each
    expert as soon as it is initialised: the float32 peak is one expert (57 GB) beside the other in `dtype` (29 GB
    in bf16), and a GPU initialises the 28.6 B parameters in seconds (on a CPU it takes minutes).
    """
    with torch.device(device):
        torch.manual_seed(seed)
        experts = [_random_transformer_as(dtype) for _ in range(2)]
        vae, text_encoder = _random_vae_and_text()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=A14B_SHIFT)
    pipe = WanPipeline(
        tokenizer=build_tokenizer(128, model_max_length=512),
        text_encoder=text_encoder.eval(),
        vae=vae.eval(),
        scheduler=scheduler,
        transformer=experts[0],
        transformer_2=experts[1],
        boundary_ratio=A14B_BOUNDARY,
    )
    cast_components(pipe, dtype)
    return LoadedModel("random-wan2.2-a14b", FAMILY, pipe, dict(A14B_DEFAULTS), {})


def _random_transformer_as(dtype: torch.dtype) -> WanTransformer3DModel:
    """A 14B-shaped transformer (40 heads x 128, FFN 13824, 40 layers), cast to `dtype` as soon as it is initialised
    (its fp32-kept modules stay float32)."""
    transformer = _random_transformer(heads=40, ffn=13824, layers=40)
    cast_module(transformer, dtype)
    return transformer.eval()


def _random_transformer(heads: int, ffn: int, layers: int) -> WanTransformer3DModel:
    """A Wan transformer of the released configuration at this width and depth (heads x 128), random weights."""
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=4096,
        freq_dim=256,
        ffn_dim=ffn,
        num_layers=layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        rope_max_seq_len=1024,
    )


def _random_vae_and_text() -> tuple[AutoencoderKLWan, UMT5EncoderModel]:
    """The Wan2.1 VAE (its configuration is the class default) and UMT5-XXL shape-reduced to two layers at its real
    width (4096), random weights."""
    vae = AutoencoderKLWan()
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=128, d_model=4096, d_kv=64, d_ff=10240, num_layers=2, num_heads=64, is_encoder_decoder=False
        )
    )
    return vae, text_encoder


def load(path: str | Path, dtype: torch.dtype = torch.bfloat16) -> LoadedModel:
    pipe = load_pipeline(path, FAMILY, WanPipeline, dtype)
    return LoadedModel(str(path), FAMILY, pipe, *read_workbench_file(path, FAMILY))
