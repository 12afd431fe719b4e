"""One forward of the full-size MiniMax-H3 transformer (33.1B parameters, random weights, bf16): stock against the
`exact-fast` profile (and exact-fast with fp8_attention as its self-attention), block_sparse at 20 % density, and the
stacks block_sparse + fused norms (+ FP8 linears), also with block_sparse's exact blocks in INT8 Q.K^T / FP8 P.V
(`precision="int8"`: the composition with the low-bit kernel).

Model: diffusers' default `MiniMaxH3Transformer3DModel` config, built on the meta device and materialised straight on
the GPU (`model_sizes.materialise`), bf16 with its `_keep_in_fp32_modules` parameters in float32 (as
`from_pretrained(torch_dtype=bf16)` keeps them); each `nn.Linear` / `nn.RMSNorm` runs its own `reset_parameters()`
there, `rope.inv_freq` is the constructor's. It is served to the plugins through a `Session` over a `LoadedModel`
holding just this transformer.

Inputs: a t2va packing built by the modular pipeline's own static methods: 512 text rows, 400 audio latents x 2
channels, 72 x 46 x 62 video latents (72 x 23 x 31 rows after the (1, 2, 2) patch) = 52,648 rows; timesteps of step 8
of the 17-step Base16 schedules (video shift 12, audio shift 3). block_sparse's tau is found by bisection on the
kernel's `routing` over q/k captured from the middle block of a stock forward, for 20 % exact block pairs, with the
text + audio prefix as sink rows (skipped when no block_sparse arm runs). One timed forward per visit (Triton
compiles in each arm's untimed check). `H3_ARMS` (a comma list of the arms below but stock; default all) measures a
subset against stock, so that a long A/B/A fits one device call, e.g. `H3_ARMS=exact-fast,exact-fast+fp8_attention`.
`--smoke`: tiny-h3's transformer config at head dim 128 (the sparse kernel's only one) and a small packing, on the CPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import (
    ForwardArm,
    Forwards,
    captured_attention,
    compare_forwards,
    exact_fast,
    tau_for,
    with_fp8_attention,
)
from workbench import Session
from workbench.models import h3
from workbench.models.loaded import LoadedModel

NAME = "forward-h3"
SUMMARY = (
    "MiniMax-H3 full-size (33.1B) transformer forward, 52,648 rows bf16: stock vs exact-fast, block_sparse 20 %, stacks"
)
GPUS = 1
SETTINGS = ("H3_ARMS",)  # environment it reads (the record names it when set)
ARMS = (
    "exact-fast",
    "exact-fast+fp8_attention",
    "block_sparse",
    "block_sparse+norms",
    "block_sparse+norms+fp8",
    "block_sparse(int8)+norms",
    "block_sparse(int8)+norms+fp8",
)
DENSITY = 0.20
# text rows, latent frames, latent height, latent width (pixels / 16), audio latents per channel
FULL = {"text": 512, "latent_frames": 72, "latent_height": 46, "latent_width": 62, "audio_latents": 400}
SMOKE = {"text": 8, "latent_frames": 3, "latent_height": 4, "latent_width": 6, "audio_latents": 4}
SMOKE_CONFIG = {**h3.TINY_TRANSFORMER, "attention_head_dim": 128}
SCHEDULE_STEPS, STEP = 17, 8  # Base16's schedule; the step whose timesteps the forward sees
# selective_fp8's selection for the stacks: q, k, v, out and both FFN projections of every transformer block
FP8_BLOCK_LINEARS = [
    f"transformer_blocks.*.{path}"
    for path in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
]
GIB = 2**30


def build(config: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    """The transformer from the meta device, materialised on `device` (`model_sizes.materialise`)."""
    from diffusers import MiniMaxH3Transformer3DModel

    from workbench.model_sizes import materialise

    start = time.perf_counter()
    model = materialise(lambda: MiniMaxH3Transformer3DModel(**config), device, dtype, seed)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dtypes: dict[str, int] = {}
    for p in model.parameters():
        dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + p.numel()
    return {
        "model": model,
        "seconds": time.perf_counter() - start,
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameters_by_dtype": dtypes,
        "weights_gib": torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None,
    }


def packed_inputs(model: torch.nn.Module, shape: dict[str, int], device: torch.device, seed: int) -> dict[str, Any]:
    """One t2va transformer call's keyword arguments, built as the modular pipeline builds them."""
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
        patchify_video_latents,
    )
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
        MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG,
        MINIMAX_H3_TEXT_TAG,
        MINIMAX_H3_VIDEO_TAG,
    )

    config = model.config
    layout = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.full((shape["text"],), MINIMAX_H3_TEXT_TAG, dtype=torch.long),
        shape["latent_frames"],
        shape["latent_height"],
        shape["latent_width"],
        shape["audio_latents"],
        tuple(config.patch_size),
        MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG,
        MINIMAX_H3_VIDEO_TAG,
        (),  # t2va: no keyframe anchors
    )
    position_ids, token_tags, video_indices, audio_indices, text_indices, cond_video, cond_audio = layout
    video_scheduler, audio_scheduler = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    video_scheduler.set_timesteps(SCHEDULE_STEPS)
    audio_scheduler.set_timesteps(SCHEDULE_STEPS)
    t_video, t_audio = float(video_scheduler.timesteps[STEP]), float(audio_scheduler.timesteps[STEP])
    timestep, timestep_indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        video_indices, audio_indices, cond_video, cond_audio, text_indices.numel(), t_video, t_audio,
        max(t_video, 0.999), 1.0,
    )  # fmt: skip
    g = torch.Generator(device).manual_seed(seed)
    latents = torch.randn(
        1, config.in_channels, shape["latent_frames"], shape["latent_height"], shape["latent_width"],
        generator=g, device=device,
    )  # fmt: skip
    audio_rows = torch.randn(
        shape["audio_latents"] * MINIMAX_H3_AUDIO_CHANNELS, config.audio_in_channels, generator=g, device=device
    )
    text = torch.randn(1, shape["text"], config.text_dim, generator=g, device=device).to(torch.bfloat16)
    return {
        "hidden_states": patchify_video_latents(latents, tuple(config.patch_size))[None],
        "audio_hidden_states": audio_rows[None],
        "encoder_hidden_states": text,
        "timestep": timestep.to(device),
        "timestep_indices": timestep_indices.to(device),
        "token_tags": token_tags.to(device),
        "position_ids": position_ids.to(device),
        "video_indices": video_indices.to(device),
        "audio_indices": audio_indices.to(device),
        "text_indices": text_indices.to(device),
        "return_dict": False,
    }


def transformer_session(model: torch.nn.Module, device: torch.device) -> Session:
    """A Session whose pipeline holds just `model` as the H3 family's denoiser, so plugins install through it."""
    pipeline = torch.nn.Module()
    pipeline.transformer = model
    return Session.open(
        LoadedModel("random-h3-full", h3.FAMILY, pipeline, {}, {}), device=str(device), dtype="bfloat16"
    )


def chosen_arms() -> list[str]:
    """The arms `H3_ARMS` names (all of ARMS when unset); ValueError for an unknown name."""
    names = [name for name in os.environ.get("H3_ARMS", ",".join(ARMS)).split(",") if name]
    unknown = sorted(set(names) - set(ARMS))
    if unknown or not names:
        raise ValueError(f"H3_ARMS: {unknown or 'no arm'}; allowed: a comma list of {', '.join(ARMS)}")
    return names


def calibrate(model: torch.nn.Module, forward: Callable[[], Any], rows: int, prefix: int) -> dict[str, Any]:
    """block_sparse's tau for DENSITY on q/k captured from the middle block of one stock forward."""
    middle = model.config.num_layers // 2
    with torch.inference_mode(), captured_attention(model.transformer_blocks[middle], rows) as records:
        forward()
    if not records:
        raise RuntimeError("forward-h3: no self-attention call over all rows was seen in the middle block")
    q, k = records[0]
    return {"block": middle, **tau_for(q, k, prefix, DENSITY)}


def run(context: Context) -> Measurement:
    device, notes = context.device, []
    built = build(SMOKE_CONFIG if context.smoke else {}, device, torch.bfloat16, seed=0)
    model = built.pop("model")
    shape = dict(SMOKE if context.smoke else FULL)
    inputs = packed_inputs(model, shape, device, seed=1)
    rows = inputs["position_ids"].shape[0]
    prefix = h3.target_video_start((), inputs)
    shape.update(rows=rows, prefix_rows=prefix, heads=model.config.num_attention_heads,
                 head_dim=model.config.attention_head_dim, layers=model.config.num_layers, dtype="bfloat16",
                 parameters=built["parameters"], build_seconds=built["seconds"])  # fmt: skip
    session = transformer_session(model, device)

    def forward() -> tuple[torch.Tensor, ...]:
        return tuple(model(**inputs))

    chosen = chosen_arms()
    configs: dict[str, dict[str, Any]] = {}
    calibration = None
    if any(name.startswith("block_sparse") for name in chosen):
        calibration = calibrate(model, forward, rows, prefix)
        if not calibration["reachable"]:
            notes.append(
                f"block_sparse: density {DENSITY} is below what routing allows here; tau {calibration['tau']}."
            )
        sparse = {"block_sparse": {"tau": calibration["tau"]}}
        low_bit = {"block_sparse": {"tau": calibration["tau"], "precision": "int8"}}  # INT8 Q.K^T, FP8 P.V
        norms, fp8 = {"fused_block_norms": {}}, {"selective_fp8": {"include": FP8_BLOCK_LINEARS, "path": "fused"}}
        configs.update({
            "block_sparse": sparse,
            "block_sparse+norms": {**sparse, **norms},
            "block_sparse+norms+fp8": {**sparse, **norms, **fp8},
            "block_sparse(int8)+norms": {**low_bit, **norms},
            "block_sparse(int8)+norms+fp8": {**low_bit, **norms, **fp8},
        })  # fmt: skip
    if {"exact-fast", "exact-fast+fp8_attention"} & set(chosen):
        fast = exact_fast("h3", device, notes)
        configs.update({"exact-fast": fast, "exact-fast+fp8_attention": with_fp8_attention(fast)})
    arms = [ForwardArm("stock", {})] + [ForwardArm(name, configs[name]) for name in ARMS if name in chosen]
    forwards = Forwards(session, forward, per_visit=1, warmup=0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    arms_rows, ratios = compare_forwards(forwards, arms, context.rounds, notes)
    if calibration is not None:
        arms_rows["stock"]["calibration"] = calibration
    if device.type == "cuda":
        shape["peak_gib"] = torch.cuda.max_memory_allocated(device) / GIB
    notes.append(
        "Random weights: routing density and rel-L2 are properties of this random model, not of the checkpoint. "
        + ("Smoke: tiny config on the CPU (perf_counter); the numbers say nothing about speed." if context.smoke
           else "Times: CUDA events around one synchronised forward per visit.")
    )  # fmt: skip
    return Measurement(SUMMARY, shape, arms_rows, ratios, notes)
