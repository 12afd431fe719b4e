"""Evidence that a trained preset learned: generate from held-out captions and check the clips with the detectors.

`caption_match_eval` runs through the public path a user takes (`Session.open(path)` then
`session.generate(Request(...))`), so the number describes the shipped checkpoint as loaded, not the
training process's in-memory modules. Cases on colour-direction pairs that never appeared in training are
reported apart from the rest (see `workbench.training.dataset`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.data.detect import caption_match, match_rates
from workbench.models import SHIPPED_PRESETS
from workbench.training.audio import log_mel, mel_frames
from workbench.training.dataset import ClipSet, captions, eval_cases
from workbench.training.model import FPS, PRESETS

# What guessing scores on the balanced held-out cases, per attribute.
CHANCE = {"colour": 0.25, "shape": 1 / 3, "direction": 0.25, "speed": 0.5, "background": 0.5, "pitch": 0.25}
CHANCE |= {"rhythm": 0.5, "loudness": 0.5, "pan": 1 / 3}


def caption_match_eval(
    model: str | Path,
    count: int,
    device: str = "cpu",
    steps: int | None = None,
    guidance: float | None = None,
    progress: bool = True,
    rich: bool | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Generate `count` held-out cases with the model's defaults and score them against their captions
    (a text progress bar per request unless `progress` is False).

    `rich`: the cases use the rich vocabulary (colour, shape, direction, speed, background); None: as the shipped
    model named by `model` was trained (demo-av: rich, demo-av-mini: not), plain captions for any other model.
    `deadline` (a `time.perf_counter()` value): no request starts after it; the report then covers the requests
    that ran (`requested` says how many were asked for).
    """
    from workbench import Request, Session
    from workbench.progress import progress as progress_bar

    if count < 1:
        raise ValueError(f"count: must be >= 1, got {count}")
    if rich is None:
        rich = str(model) in SHIPPED_PRESETS and PRESETS[SHIPPED_PRESETS[str(model)]].rich
    start = time.perf_counter()
    session = Session.open(model, device=device, dtype="float32")
    rows, seconds = [], []
    for seed, caption, held_out in progress_bar(eval_cases(count, rich), count, "caption-match requests", progress):
        began = time.perf_counter()
        if deadline is not None and began > deadline and rows:
            break
        result = session.generate(Request(caption, seed=seed, steps=steps, guidance=guidance), progress=False)
        seconds.append(time.perf_counter() - began)
        match = caption_match(result.frames, result.audio, result.sample_rate, caption)
        rows.append({"seed": seed, "caption": caption, "held_out_pair": held_out, "match": match})
    seen = [r["match"] for r in rows if not r["held_out_pair"]]
    unseen = [r["match"] for r in rows if r["held_out_pair"]]
    return {
        "model": str(model),
        "device": device,
        "requested": count,
        "request": session.resolve(Request("x", steps=steps, guidance=guidance)).to_dict() | {"prompt": None},
        "all": match_rates(r["match"] for r in rows),
        "trained_pairs": match_rates(seen) if seen else None,
        "held_out_pairs": match_rates(unseen) if unseen else None,
        "chance": {k: CHANCE[k] for k in rows[0]["match"]},
        "seconds_per_request_median": float(np.median(seconds)),
        "seconds_total": time.perf_counter() - start,
        "cases": rows,
    }


@torch.no_grad()
def reconstruction_eval(
    pipeline: Any, data: ClipSet, rich: bool = False, count: int = 32, vocoder: torch.nn.Module | None = None
) -> dict[str, Any]:
    """Caption match of training clips passed through the autoencoders alone (video VAE; audio VAE + vocoder,
    `vocoder` in place of the pipeline's when given: the one an export ships).

    A diagnostic: if these fail, the denoiser cannot succeed whatever it learned.
    """
    device = next(pipeline.vae.parameters()).device
    count = min(count, len(data))
    video = data.video[:count].to(device).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
    decoded = pipeline.vae.decode(pipeline.vae.encode(video).latent_dist.mode()).sample
    frames = ((decoded.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 4, 1).cpu().numpy()
    latent_frames = round(data.video.shape[1] / FPS * pipeline.audio_sampling_rate / pipeline.audio_hop_length / 4)
    mel = log_mel(data.audio[:count].to(device), mel_frames(latent_frames))
    mel_decoded = pipeline.audio_vae.decode(pipeline.audio_vae.encode(mel).latent_dist.mode()).sample
    audio = (vocoder or pipeline.vocoder)(mel_decoded).float().cpu().numpy()
    psnr = float(10 * np.log10(4.0 / max(float(((decoded.clamp(-1, 1) - video) ** 2).mean()), 1e-12)))
    texts = captions(rich)
    rows = [
        caption_match(frames[i], audio[i], pipeline.audio_sampling_rate, texts[int(data.caption_ids[i])])
        for i in range(count)
    ]
    return {"count": count, "video_psnr_db": psnr, "match": match_rates(rows)}
