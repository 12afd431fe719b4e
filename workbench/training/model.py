"""The architectures train-tiny builds: small LTX-2s (diffusers `LTX2Pipeline`) sized to train in minutes.

Every component is a stock diffusers/transformers class, so the trained result saves and loads exactly as
a real LTX-2 checkpoint does (`workbench.models.ltx2.load`). A `Spec` holds the sizes; `PRESETS` names two:

- `demo-av` (the shipped 9 x 64 x 64 model): video VAE 4x in space and time (8 x 3 x 16 x 16 latents),
  4 transformer layers (video 4 heads x 32, audio 2 x 32), the character tokenizer, demo-av 1's scenes.
- `av2` (demo-av 2: 49 frames at 24 fps, 128 x 128, stereo): the video VAE patchifies 4x4 pixels and then
  halves space twice and time three times (16x in space, 8x in time: 32 x 7 x 8 x 8 latents, 448 tokens),
  so a CPU request stays cheap; 5 transformer layers of 4 heads x 48 (audio 4 x 16); a tokenizer that keeps
  each caption word of the vocabulary as one token and a text encoder that does not mix them (the direction
  word is one position with the same features after any colour, which the cross-attention can find);
  rich scenes (speed, background, panned sound), and a vocoder that plays each stereo channel from its own
  mel (`separate_channels`: trained on one channel at a time, exported as one block-diagonal vocoder).

Shared by both: audio is 16 kHz stereo, 32-bin log-mel at hop 160 (the audio VAE compresses 4x in time and
mel), a HiFi-GAN-style vocoder, and a random-initialised Gemma3 text encoder (hidden 64, 2 layers) that is
never trained: distinct captions give distinct hidden states, and the trainable connectors and the
transformer's cross-attention learn to read them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
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
    PreTrainedTokenizerFast,
    SiglipVisionConfig,
)

from workbench.data import synthetic
from workbench.models.tokenizer import build_tokenizer

FPS, SAMPLE_RATE, HOP, MEL_BINS = 24, 16000, 160, 32
TEXT_HIDDEN, TEXT_LAYERS = 64, 2
SHIFT = 3.0  # flow-matching schedule shift: more steps at high noise, where the layout is decided
DOWNSAMPLE_TYPES = ("spatial", "temporal", "spatiotemporal")


@dataclass(frozen=True)
class Spec:
    """The sizes of one architecture. Invariants (`validate`): frames = 1 + a multiple of the VAE's time
    compression, height and width multiples of its space compression, VAE blocks each twice as wide as the
    last, and an audio width that splits evenly over the video heads."""

    frames: int
    height: int
    width: int
    video_latent: int  # latent channels of the video VAE
    vae_channels: tuple[int, ...]  # width of each encoder (and decoder) block; each doubles the last (diffusers)
    vae_downsample: tuple[str, ...]  # per block, what it halves: one of DOWNSAMPLE_TYPES
    vae_patch: int  # pixels per side folded into channels before the first block
    audio_latent: int  # latent channels of the audio VAE (x MEL_BINS / 4 latent mel bins)
    vocoder_channels: int
    layers: int  # transformer blocks
    heads: int  # video attention heads, each head_dim wide
    audio_heads: int  # audio attention heads, each audio_head_dim wide
    head_dim: int = 32
    audio_head_dim: int = 32
    max_tokens: int = 64
    word_tokens: bool = False  # the tokenizer keeps the scene vocabulary's words whole
    text_mixing: bool = True  # the random text encoder's attention mixes tokens (see `text_encoder`)
    rich: bool = False  # trained on rich scenes (speed, background, panned sound)
    separate_channels: bool = False  # the vocoder plays each channel from its own mel (`separate_channels`)
    steps: int = 16
    guidance: float = 3.0

    @property
    def spatial_ratio(self) -> int:
        return self.vae_patch * 2 ** sum(kind != "temporal" for kind in self.vae_downsample)

    @property
    def temporal_ratio(self) -> int:
        return 2 ** sum(kind != "spatial" for kind in self.vae_downsample)

    @property
    def audio_latent_frames(self) -> int:
        """Audio latent frames of a clip (the pipeline's rounding of its duration at 25 latents per second)."""
        return round(self.frames / FPS * SAMPLE_RATE / HOP / 4)

    def validate(self) -> None:
        for name in ("frames", "height", "width", "video_latent", "vae_patch", "audio_latent", "vocoder_channels"):
            _positive(name, getattr(self, name))
        for name in ("layers", "heads", "audio_heads", "head_dim", "audio_head_dim", "max_tokens", "steps"):
            _positive(name, getattr(self, name))
        if len(self.vae_channels) != len(self.vae_downsample) or not self.vae_channels:
            raise ValueError(
                f"vae_channels, vae_downsample: {self.vae_channels}, {self.vae_downsample}; allowed: equal non-empty lengths"
            )
        if any(b != 2 * a for a, b in itertools.pairwise(self.vae_channels)):
            raise ValueError(f"vae_channels: {self.vae_channels}; allowed: each twice the last (diffusers' resampler)")
        if any(kind not in DOWNSAMPLE_TYPES for kind in self.vae_downsample):
            raise ValueError(f"vae_downsample: {self.vae_downsample}; allowed: entries of {list(DOWNSAMPLE_TYPES)}")
        if (self.frames - 1) % self.temporal_ratio:
            raise ValueError(f"frames: {self.frames}; allowed: 1 + a multiple of {self.temporal_ratio}")
        for name in ("height", "width"):
            if getattr(self, name) % self.spatial_ratio:
                raise ValueError(f"{name}: {getattr(self, name)}; allowed: a multiple of {self.spatial_ratio}")
        # the audio-video cross-attention's rotary table is audio-wide and split over both streams' heads
        if (self.audio_heads * self.audio_head_dim // 2) % self.heads or self.audio_head_dim % 2:
            raise ValueError(
                f"audio_head_dim: {self.audio_head_dim}; allowed: even, with audio_heads x audio_head_dim / 2 "
                f"a multiple of heads ({self.heads})"
            )

    def defaults(self) -> dict[str, Any]:
        """Request defaults stored beside the checkpoint (workbench.json)."""
        size = {"frames": self.frames, "height": self.height, "width": self.width}
        return size | {"steps": self.steps, "guidance": self.guidance, "fps": FPS}

    def call(self) -> dict[str, Any]:
        """Pipeline keyword arguments stored beside the checkpoint (workbench.json)."""
        return {"max_sequence_length": self.max_tokens} | CALL


PRESETS: dict[str, Spec] = {
    "demo-av": Spec(
        frames=9,
        height=64,
        width=64,
        video_latent=8,
        vae_channels=(32, 64),
        vae_downsample=("spatiotemporal", "spatiotemporal"),
        vae_patch=1,
        audio_latent=4,
        vocoder_channels=128,
        layers=4,
        heads=4,
        audio_heads=2,
    ),
    "av2": Spec(
        frames=49,
        height=128,
        width=128,
        video_latent=32,
        vae_channels=(32, 64, 128),
        vae_downsample=("spatiotemporal", "spatiotemporal", "temporal"),
        vae_patch=4,
        audio_latent=4,
        vocoder_channels=128,
        layers=5,
        heads=4,
        audio_heads=4,
        head_dim=48,
        audio_head_dim=16,
        max_tokens=32,
        word_tokens=True,
        text_mixing=False,
        rich=True,
        separate_channels=True,
    ),
}


def preset(name: str, overrides: dict[str, Any] | None = None) -> Spec:
    """The named preset, with fields replaced by `overrides` (tests shrink the sizes), validated."""
    if name not in PRESETS:
        raise ValueError(f"preset: {name!r}; allowed: {sorted(PRESETS)}")
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - {f.name for f in fields(Spec)})
    if unknown:
        raise ValueError(f"overrides: unknown fields {unknown}; allowed: {[f.name for f in fields(Spec)]}")
    spec = replace(PRESETS[name], **{k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})
    spec.validate()
    return spec


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: {value!r}; allowed: an integer >= 1")


def vocabulary_words() -> list[str]:
    """Every word of the scene vocabulary (the word tokenizer keeps these whole)."""
    words = [*synthetic.COLOURS, *synthetic.SHAPES, *synthetic.DIRECTIONS, *synthetic.SPEEDS, *synthetic.BACKGROUNDS]
    words += [*synthetic.LOUDNESS.values(), *synthetic.RHYTHMS.values(), "moves", "on", "background"]
    words += [w for phrase in synthetic.PITCH_WORDS.values() for w in phrase.split()]
    return sorted(set(words))


# Pipeline kwargs every preset stores beside the checkpoint (with its max_sequence_length).
CALL = {
    "stg_scale": 0.0,
    "modality_scale": 1.0,
    "guidance_rescale": 0.0,
    "audio_guidance_scale": None,
    "audio_stg_scale": 0.0,
    "audio_modality_scale": 1.0,
    "audio_guidance_rescale": 0.0,
    "spatio_temporal_guidance_blocks": None,
}
DEMO_AV = PRESETS["demo-av"]


def text_encoder(seed: int, spec: Spec = DEMO_AV) -> Gemma3ForConditionalGeneration:
    """The frozen random text encoder. Without `spec.text_mixing` its attention output projections are zero,
    so every token's hidden states depend on that token alone: a word means the same in every caption, and
    a colour-direction pair never seen in training is made of features that were (the trainable connectors
    do the mixing)."""
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
    encoder = Gemma3ForConditionalGeneration(config).eval()
    if not spec.text_mixing:
        with torch.no_grad():
            for layer in encoder.model.language_model.layers:
                layer.self_attn.o_proj.weight.zero_()
    return encoder


def transformer(spec: Spec = DEMO_AV) -> LTX2VideoTransformer3DModel:
    """Rotary positions are normalised by twice the clip (seconds, pixels), as demo-av 1 was."""
    seconds = max(2, int(2 * spec.frames / FPS + 0.999))
    return LTX2VideoTransformer3DModel(
        in_channels=spec.video_latent,
        out_channels=spec.video_latent,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=spec.heads,
        attention_head_dim=spec.head_dim,
        cross_attention_dim=spec.heads * spec.head_dim,
        vae_scale_factors=(spec.temporal_ratio, spec.spatial_ratio, spec.spatial_ratio),
        pos_embed_max_pos=seconds,
        base_height=2 * spec.height,
        base_width=2 * spec.width,
        audio_in_channels=spec.audio_latent * (MEL_BINS // 4),
        audio_out_channels=spec.audio_latent * (MEL_BINS // 4),
        audio_num_attention_heads=spec.audio_heads,
        audio_attention_head_dim=spec.audio_head_dim,
        audio_cross_attention_dim=spec.audio_heads * spec.audio_head_dim,
        audio_pos_embed_max_pos=seconds,
        audio_sampling_rate=SAMPLE_RATE,
        audio_hop_length=HOP,
        num_layers=spec.layers,
        qk_norm="rms_norm_across_heads",
        caption_channels=TEXT_HIDDEN,
        rope_double_precision=False,
        rope_type="split",
    )


def connectors(spec: Spec = DEMO_AV) -> LTX2TextConnectors:
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
        connector_rope_base_seq_len=spec.max_tokens,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    )


def video_vae(spec: Spec = DEMO_AV) -> AutoencoderKLLTX2Video:
    """Encoder blocks halve what `spec.vae_downsample` names; the decoder undoes it in reverse order.

    The compression ratios are passed explicitly: diffusers' default (patch x 2 ** blocks, in both space
    and time) is right only when every block is spatiotemporal.
    """
    blocks = len(spec.vae_channels)
    vae = AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=spec.video_latent,
        block_out_channels=spec.vae_channels,
        decoder_block_out_channels=spec.vae_channels,
        layers_per_block=(1,) * (blocks + 1),
        decoder_layers_per_block=(1,) * (blocks + 1),
        spatio_temporal_scaling=(True,) * blocks,
        decoder_spatio_temporal_scaling=(True,) * blocks,
        decoder_inject_noise=(False,) * (blocks + 1),
        downsample_type=spec.vae_downsample,
        upsample_type=tuple(reversed(spec.vae_downsample)),
        upsample_residual=(True,) * blocks,
        upsample_factor=(2,) * blocks,
        timestep_conditioning=False,
        patch_size=spec.vae_patch,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
        spatial_compression_ratio=spec.spatial_ratio,
        temporal_compression_ratio=spec.temporal_ratio,
    )
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    return vae


def audio_vae(spec: Spec = DEMO_AV) -> AutoencoderKLLTX2Audio:
    # base_channels doubles as the size of the latent statistics the pipeline normalises packed audio
    # latents with (channels x latent mel bins), so it must equal audio_latent * MEL_BINS / 4.
    return AutoencoderKLLTX2Audio(
        base_channels=spec.audio_latent * (MEL_BINS // 4),
        output_channels=2,
        ch_mult=(1, 2, 2),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=spec.audio_latent,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=SAMPLE_RATE,
        mel_hop_length=HOP,
        is_causal=True,
        mel_bins=MEL_BINS,
    )


def vocoder(spec: Spec = DEMO_AV) -> LTX2Vocoder:
    return LTX2Vocoder(
        in_channels=2 * MEL_BINS,
        hidden_channels=spec.vocoder_channels,
        out_channels=2,
        upsample_kernel_sizes=[10, 8, 8, 4],
        upsample_factors=[5, 4, 4, 2],  # product = HOP
        resnet_kernel_sizes=[3, 7],
        resnet_dilations=[[1, 3, 5], [1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=SAMPLE_RATE,
    )


def separate_channels(dense: LTX2Vocoder) -> LTX2Vocoder:
    """The stereo vocoder that plays each channel alone: its output channel c is `dense`'s row c when both of
    `dense`'s mel inputs are channel c's mel, so each channel's level follows only its own mel (stereo pan).

    Why: a vocoder that reads both mels at once can (and ours did) play both channels at their mean level.
    Same class, twice the hidden width: `dense`'s weights on the block diagonal (conv_in's two input halves
    summed, conv_out's rows split between the blocks), zeros across, so one channel's mel cannot reach the
    other channel's output. Float32 outputs equal `dense`'s on duplicated inputs up to summation order.
    """
    config = {k: v for k, v in dense.config.items() if not k.startswith("_")}
    if config["out_channels"] != 2 or config["in_channels"] % 2 or config["act_fn"] != "leaky_relu":
        raise ValueError("vocoder: a stereo leaky-ReLU LTX2Vocoder (out_channels 2, in_channels 2 x mel bins) expected")
    stereo = LTX2Vocoder(**(config | {"hidden_channels": 2 * config["hidden_channels"]}))
    mels = config["in_channels"] // 2
    weights = {}
    for name, old in dense.state_dict().items():
        if name == "conv_in.weight":  # (hidden, 2 x mels, k): one channel's mel feeds both halves
            merged = old[:, :mels] + old[:, mels:]
            new = old.new_zeros(2 * old.shape[0], *old.shape[1:])
            new[: old.shape[0], :mels], new[old.shape[0] :, mels:] = merged, merged
        elif name == "conv_out.weight":  # (2, C, k): row c reads block c
            new = old.new_zeros(2, 2 * old.shape[1], old.shape[2])
            new[0, : old.shape[1]], new[1, old.shape[1] :] = old[0], old[1]
        elif name == "conv_out.bias":
            new = old.clone()
        elif old.ndim == 1:  # a bias of the hidden layers: one copy per block
            new = torch.cat([old, old])
        else:  # (out, in, k) convs and (in, out, k) transposed convs alike: block diagonal
            new = old.new_zeros(2 * old.shape[0], 2 * old.shape[1], old.shape[2])
            new[: old.shape[0], : old.shape[1]], new[old.shape[0] :, old.shape[1] :] = old, old
        weights[name] = new
    stereo.load_state_dict(weights, strict=True)
    return stereo.to(next(dense.parameters()).device)


def shipped_vocoder(dense: LTX2Vocoder, spec: Spec) -> LTX2Vocoder:
    """The vocoder an export of `spec` holds: `dense` itself, or with `spec.separate_channels` its
    `separate_channels` form stored in float16 (twice the width, four times the weights of `dense`: float16
    keeps the av2 export under 40 MiB; loading casts it to the requested dtype)."""
    return separate_channels(dense).half() if spec.separate_channels else dense


def tokenizer(spec: Spec = DEMO_AV) -> PreTrainedTokenizerFast:
    """The project's character tokenizer; with `spec.word_tokens`, the vocabulary's words are single tokens."""
    words = vocabulary_words() if spec.word_tokens else ()
    return build_tokenizer(128, model_max_length=spec.max_tokens, words=words)


def build_pipeline(seed: int = 0, spec: Spec = DEMO_AV) -> LTX2Pipeline:
    """A freshly initialised pipeline of `spec` (deterministic in `seed`); training fills in the weights."""
    parts = {}
    for offset, (name, make) in enumerate(
        (("transformer", transformer), ("connectors", connectors), ("vae", video_vae))
        + (("audio_vae", audio_vae), ("vocoder", vocoder))
    ):
        torch.manual_seed(seed + 1 + offset)
        parts[name] = make(spec)
    return LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT),
        text_encoder=text_encoder(seed, spec),
        tokenizer=tokenizer(spec),
        **parts,
    )
