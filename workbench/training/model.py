"""The architecture of `demo-av`: a small LTX-2 (diffusers `LTX2Pipeline`) sized to train in minutes.

Every component is a stock diffusers/transformers class, so the trained result saves and loads exactly as
a real LTX-2 checkpoint does (`workbench.models.ltx2.load`). Sizes, and why:
- video VAE: 64x64x9 RGB <-> 8 x 3 x 16 x 16 latents (4x in space and time, encoder and decoder agree);
- audio VAE: 2 x 33 x 32 log-mel <-> 4 x 9 x 8 latents (the pipeline's fixed 4x in time and mel);
- vocoder: 32-bin stereo log-mel at hop 160 -> 16 kHz stereo waveform;
- text: a random-initialised Gemma3 (hidden 64, 2 layers) over the project's character tokenizer. It is
  never trained: distinct captions give distinct hidden states, and the trainable connectors and the
  transformer's cross-attention learn to read them;
- transformer: 4 layers, video 4 heads x 32, audio 2 heads x 32, attending across modalities.
"""

from __future__ import annotations

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
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

from workbench.models.tokenizer import build_tokenizer

FRAMES, HEIGHT, WIDTH, FPS = 9, 64, 64, 24
SAMPLE_RATE, HOP, MEL_BINS = 16000, 160, 32
VIDEO_LATENT, AUDIO_LATENT = 8, 4
TEXT_HIDDEN, TEXT_LAYERS, MAX_TOKENS = 64, 2, 64
SHIFT = 3.0  # flow-matching schedule shift: more steps at high noise, where the layout is decided

# Request defaults and pipeline kwargs stored beside the checkpoint (workbench.json).
DEFAULTS = {"frames": FRAMES, "height": HEIGHT, "width": WIDTH, "steps": 16, "guidance": 3.0, "fps": FPS}
CALL = {
    "max_sequence_length": MAX_TOKENS,
    "stg_scale": 0.0,
    "modality_scale": 1.0,
    "guidance_rescale": 0.0,
    "audio_guidance_scale": None,
    "audio_stg_scale": 0.0,
    "audio_modality_scale": 1.0,
    "audio_guidance_rescale": 0.0,
    "spatio_temporal_guidance_blocks": None,
}


def text_encoder(seed: int) -> Gemma3ForConditionalGeneration:
    torch.manual_seed(seed)
    text = Gemma3TextConfig(
        vocab_size=128,
        hidden_size=TEXT_HIDDEN,
        intermediate_size=128,
        num_hidden_layers=TEXT_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=64,
    )
    vision = SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8
    )
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=127)
    return Gemma3ForConditionalGeneration(config).eval()


def transformer() -> LTX2VideoTransformer3DModel:
    return LTX2VideoTransformer3DModel(
        in_channels=VIDEO_LATENT,
        out_channels=VIDEO_LATENT,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=32,
        cross_attention_dim=128,
        vae_scale_factors=(4, 4, 4),
        pos_embed_max_pos=2,
        base_height=128,
        base_width=128,
        audio_in_channels=AUDIO_LATENT * (MEL_BINS // 4),
        audio_out_channels=AUDIO_LATENT * (MEL_BINS // 4),
        audio_num_attention_heads=2,
        audio_attention_head_dim=32,
        audio_cross_attention_dim=64,
        audio_pos_embed_max_pos=2,
        audio_sampling_rate=SAMPLE_RATE,
        audio_hop_length=HOP,
        num_layers=4,
        qk_norm="rms_norm_across_heads",
        caption_channels=TEXT_HIDDEN,
        rope_double_precision=False,
        rope_type="split",
    )


def connectors() -> LTX2TextConnectors:
    return LTX2TextConnectors(
        caption_channels=TEXT_HIDDEN,
        text_proj_in_factor=TEXT_LAYERS + 1,
        video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=16,
        video_connector_num_layers=2,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=16,
        audio_connector_num_layers=2,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=MAX_TOKENS,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    )


def video_vae() -> AutoencoderKLLTX2Video:
    vae = AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=VIDEO_LATENT,
        block_out_channels=(32, 64),
        decoder_block_out_channels=(32, 64),
        layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1, 1),
        spatio_temporal_scaling=(True, True),
        decoder_spatio_temporal_scaling=(True, True),
        decoder_inject_noise=(False, False, False),
        downsample_type=("spatiotemporal", "spatiotemporal"),
        upsample_type=("spatiotemporal", "spatiotemporal"),
        upsample_residual=(True, True),
        upsample_factor=(2, 2),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    return vae


def audio_vae() -> AutoencoderKLLTX2Audio:
    # base_channels doubles as the size of the latent statistics the pipeline normalises packed audio
    # latents with (channels x latent mel bins), so it must equal AUDIO_LATENT * MEL_BINS / 4.
    return AutoencoderKLLTX2Audio(
        base_channels=AUDIO_LATENT * (MEL_BINS // 4),
        output_channels=2,
        ch_mult=(1, 2, 2),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=AUDIO_LATENT,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=SAMPLE_RATE,
        mel_hop_length=HOP,
        is_causal=True,
        mel_bins=MEL_BINS,
    )


def vocoder() -> LTX2Vocoder:
    return LTX2Vocoder(
        in_channels=2 * MEL_BINS,
        hidden_channels=128,
        out_channels=2,
        upsample_kernel_sizes=[10, 8, 8, 4],
        upsample_factors=[5, 4, 4, 2],  # product = HOP
        resnet_kernel_sizes=[3, 7],
        resnet_dilations=[[1, 3, 5], [1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=SAMPLE_RATE,
    )


def build_pipeline(seed: int = 0) -> LTX2Pipeline:
    """A freshly initialised demo-av pipeline (deterministic in `seed`); training fills in the weights."""
    parts = {}
    for offset, (name, make) in enumerate(
        (("transformer", transformer), ("connectors", connectors), ("vae", video_vae))
        + (("audio_vae", audio_vae), ("vocoder", vocoder))
    ):
        torch.manual_seed(seed + 1 + offset)
        parts[name] = make()
    return LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT),
        text_encoder=text_encoder(seed),
        tokenizer=build_tokenizer(128, model_max_length=MAX_TOKENS),
        **parts,
    )
