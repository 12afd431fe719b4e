"""LTX-2 audio+video (diffusers `LTX2Pipeline`: video VAE, audio VAE, vocoder, Gemma3 text encoder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    FlowMatchEulerDiscreteScheduler,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
)
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    GemmaTokenizerFast,
    SiglipVisionConfig,
    TokenizersBackend,
)

from workbench.models.family import (
    Family,
    SelfAttention,
    TeaCache,
    VaeDecode,
    block_arg,
    load_pipeline,
    read_workbench_file,
)
from workbench.models.fused import ltx2_vae
from workbench.models.fused.ltx2 import FUSED
from workbench.models.loaded import LoadedModel
from workbench.models.tokenizer import build_tokenizer


def _call_kwargs(request: Any) -> dict[str, Any]:
    return {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "num_frames": request.frames,
        "height": request.height,
        "width": request.width,
        "frame_rate": float(request.fps),
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
    }


def _denoise_shape(request: Any) -> tuple[int, int]:
    """(rows, forwards): video latents (frames - 1) / 8 + 1 at 1/32 of the pixels, patch 1, the CFG branches batched
    in one forward (the audio stream's rows, a few % of these, are left out)."""
    rows = ((request.frames - 1) // 8 + 1) * (request.height // 32) * (request.width // 32)
    return rows * (2 if request.guidance > 1 else 1), request.steps


def _text_forwards(request: Any) -> int:
    """Gemma-3 runs once for the prompt and, with CFG (guidance > 1), once more for the negative prompt."""
    return 2 if request.guidance > 1 else 1


# LTX-2 runs two streams: video self-attention (`attn1`) sees video rows only; audio has its own stream
# (`audio_attn1`, head dim 64 in the release) and meets video only in the a2v/v2a cross-attentions; text enters
# through `attn2` / `audio_attn2`. So the routable self-attention is `attn1`, with no sink rows.
SELF_ATTENTION = SelfAttention(
    modules=lambda denoiser: [block.attn1 for block in denoiser.transformer_blocks],
    layout="video stream only (audio is a separate stream; text enters through attn2 cross-attention)",
)


def teacache_indicator(block: torch.nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """The first block's video self-attention input `norm1(x) * (1 + scale) + shift`, with shift and scale from the
    block's `get_mod_params` over its `scale_shift_table` and the timestep embedding, as the block computes them.
    No rescale coefficients are fitted on LTX-2 (TeaCache's LTX-Video set was fitted on an earlier, different model
    and is not reused): a threshold is on the raw relative change, to be calibrated on LTX-2 itself."""
    x = block_arg(args, kwargs, "hidden_states", 0)
    temb = block_arg(args, kwargs, "temb", 4)
    shift, scale = block.get_mod_params(block.scale_shift_table, temb, x.size(0))[:2]
    return block.norm1(x) * (1 + scale) + shift


# What an LTX-2 model folder may name, per component: the released LTX-2 index (connectors and vocoder from the
# `ltx2` pipeline module, Gemma-3 encoder and tokenizer) and what `LoadedModel.save` writes for the tiny builds.
COMPONENTS = {
    "transformer": {("diffusers", "LTX2VideoTransformer3DModel"): LTX2VideoTransformer3DModel},
    "vae": {("diffusers", "AutoencoderKLLTX2Video"): AutoencoderKLLTX2Video},
    "audio_vae": {("diffusers", "AutoencoderKLLTX2Audio"): AutoencoderKLLTX2Audio},
    "connectors": {("ltx2", "LTX2TextConnectors"): LTX2TextConnectors},
    "vocoder": {("ltx2", "LTX2Vocoder"): LTX2Vocoder},
    "text_encoder": {("transformers", "Gemma3ForConditionalGeneration"): Gemma3ForConditionalGeneration},
    "tokenizer": {
        ("transformers", "GemmaTokenizerFast"): GemmaTokenizerFast,
        ("transformers", "GemmaTokenizer"): GemmaTokenizerFast,
        ("transformers", "TokenizersBackend"): TokenizersBackend,
    },
    "scheduler": {("diffusers", "FlowMatchEulerDiscreteScheduler"): FlowMatchEulerDiscreteScheduler},
}

FAMILY = Family(
    name="ltx2",
    pipeline_class="LTX2Pipeline",
    defaults={"frames": 121, "height": 512, "width": 768, "steps": 40, "guidance": 4.0, "fps": 24},
    frame_step=8,
    frame_offset=1,
    size_multiple=32,
    has_audio=True,
    modes=("t2va",),
    block_classes=("LTX2VideoTransformerBlock",),
    stage_probes=(
        ("text_encode", "", "encode_prompt"),
        ("text_encode", "connectors", None),
        ("video_decode", "vae", "decode"),
        ("audio_decode", "audio_vae", "decode"),
        ("audio_decode", "vocoder", None),
    ),
    call_kwargs=_call_kwargs,
    self_attention=SELF_ATTENTION,
    streams=("hidden_states", "audio_hidden_states"),
    block_streams=(("hidden_states", 0), ("audio_hidden_states", 1)),
    text_cross_attention=("attn2", "audio_attn2"),  # a2v / v2a attend to the other stream, which changes every step
    teacache=TeaCache(indicator=teacache_indicator),
    fused=FUSED,
    vae_decode=VaeDecode(check=ltx2_vae.check, install=ltx2_vae.install),
    unsupported={
        "fused_qkv": "diffusers 0.42.1's LTX-2 attention processor never reads fused projections (it could not run)",
        "cache_dit": "cache-dit 1.5.3's patched LTX-2 transformer forward rejects the pipeline's `sigma` argument",
    },
    exact_fast=(("cross_kv_cache", {}),),
    components=COMPONENTS,
    stage_components={
        "text_encode": ("text_encoder", "connectors"),
        "video_decode": ("vae",),
        "audio_decode": ("audio_vae", "vocoder"),
    },
    denoise_shape=_denoise_shape,
    text_layers="model.language_model.layers",
    text_forwards=_text_forwards,
)
TINY_DEFAULTS = {"frames": 9, "height": 64, "width": 64, "steps": 2, "guidance": 4.0, "fps": 24}
# The tiny config keeps the sampler's auxiliary guidance passes off so a CPU request stays one
# transformer call per CFG branch; real checkpoints use the pipeline's own defaults.
TINY_CALL = {
    "max_sequence_length": 32,
    "stg_scale": 0.0,
    "modality_scale": 1.0,
    "guidance_rescale": 0.0,
    "audio_guidance_scale": None,
    "audio_stg_scale": 0.0,
    "audio_modality_scale": 1.0,
    "audio_guidance_rescale": 0.0,
    "spatio_temporal_guidance_blocks": None,
}
TEXT_HIDDEN = 32
TEXT_LAYERS = 2


def _tiny_text_encoder(seed: int) -> Gemma3ForConditionalGeneration:
    torch.manual_seed(seed)
    text = Gemma3TextConfig(
        vocab_size=128,
        hidden_size=TEXT_HIDDEN,
        intermediate_size=32,
        num_hidden_layers=TEXT_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=128,
        sliding_window=16,
    )
    vision = SiglipVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
    )
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=127)
    return Gemma3ForConditionalGeneration(config).eval()


def tiny_pipeline(seed: int = 0) -> LTX2Pipeline:
    """A random-initialised LTX-2 (video + stereo audio) small enough for the CPU tests at 9x64x64."""
    text_encoder = _tiny_text_encoder(seed)
    torch.manual_seed(seed + 1)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        caption_channels=TEXT_HIDDEN,
        rope_double_precision=False,
        rope_type="split",
    )
    torch.manual_seed(seed + 2)
    connectors = LTX2TextConnectors(
        caption_channels=TEXT_HIDDEN,
        text_proj_in_factor=TEXT_LAYERS + 1,
        video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    )
    torch.manual_seed(seed + 3)
    vae = AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1,),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatial",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    torch.manual_seed(seed + 4)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=16000,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=8,
    )
    torch.manual_seed(seed + 5)
    vocoder = LTX2Vocoder(
        in_channels=2 * 8,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[20, 32],
        upsample_factors=[10, 16],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=16000,
    )
    return LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae.eval(),
        audio_vae=audio_vae.eval(),
        text_encoder=text_encoder,
        tokenizer=build_tokenizer(128, model_max_length=64),
        connectors=connectors.eval(),
        transformer=transformer.eval(),
        vocoder=vocoder.eval(),
    )


def tiny(seed: int = 0) -> LoadedModel:
    return LoadedModel("tiny-ltx2", FAMILY, tiny_pipeline(seed), TINY_DEFAULTS, dict(TINY_CALL))


# The LTX-2 release's video VAE (Lightricks/LTX-2, as diffusers' scripts/convert_ltx2_to_diffusers.py "2.0" configures
# it): AutoencoderKLLTX2Video's defaults (latent 128, decoder 1024 / 512 / 256 channels of 5 + 5 x 3 resnets, three
# residual spatiotemporal upsamplers, patch 4) except the decoder, which is not causal, and the compression ratios,
# which the release states (the class would derive 64 and 16 from the encoder's four downsamplers); reflect padding,
# no timestep conditioning.
RELEASE_VAE = {
    "decoder_causal": False,
    "decoder_spatial_padding_mode": "reflect",
    "timestep_conditioning": False,
    "spatial_compression_ratio": 32,
    "temporal_compression_ratio": 8,
}


def random_release_vae(seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16) -> Any:
    """The LTX-2 release's video VAE configuration (`RELEASE_VAE`) with random weights, built directly on `device`,
    for timing its decode without a checkpoint."""
    with torch.device(device):
        torch.manual_seed(seed)
        vae = AutoencoderKLLTX2Video(**RELEASE_VAE)
    return vae.to(dtype).eval()


def load(path: str | Path, dtype: torch.dtype = torch.bfloat16) -> LoadedModel:
    pipe = load_pipeline(path, FAMILY, LTX2Pipeline, dtype)
    return LoadedModel(str(path), FAMILY, pipe, *read_workbench_file(path, FAMILY))
