"""What a `workbench train-tiny` call does (`TrainConfig`), checked before anything is loaded or written."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.training.model import PRESETS, preset

AE_PARTS = {"video": ("vae",), "audio": ("audio_vae", "vocoder"), "all": ("vae", "audio_vae", "vocoder")}
STAGES = ("vocoder", "denoiser")  # what `stage` may name when resuming
SCHEDULES = ("cosine", "linear", "constant")
LR_FLOOR = 0.1  # an annealed learning rate ends at this fraction of the peak
AE_BATCH = 24  # a new run's ae_batch when none is given


def learning_rate(
    peak: float, step: int, seconds: float, plan_seconds: float | None, warmup_steps: int, schedule: str
) -> float:
    """The learning rate of a stage's `step` (0-based) after `seconds` of it: a linear warm-up over
    `warmup_steps`, then `schedule` from the peak down to LR_FLOOR x peak over the stage's planned seconds
    (and the floor after them). Without a plan it stays at the peak."""
    warm = min(1.0, (step + 1) / warmup_steps)
    if schedule == "constant" or not plan_seconds:
        return peak * warm
    progress = min(1.0, seconds / plan_seconds)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return peak * warm * (LR_FLOOR + (1 - LR_FLOOR) * shape)


@dataclass
class TrainConfig:
    """What `train-tiny` does; `validate` names a bad field, its value and what is allowed."""

    out: Path
    minutes: float = 6.0
    device: str = "auto"
    resume: bool = False
    preset: str = "demo-av"
    overrides: dict[str, Any] | None = None  # replace preset fields (tests shrink the sizes); kept on resume
    seed: int = 0
    train_clips: int = 4096
    ae_share: float = 0.4  # without ae_minutes: the first call's share of `minutes` planned for the autoencoders
    ae_minutes: float | None = None  # the autoencoder stage's planned total (minutes)
    ae_train: str = "all"  # which autoencoders the stage trains this call: one of AE_PARTS
    denoise_minutes: float | None = None  # the denoiser stage's planned total; None: no anneal
    wall_minutes: float | None = None  # hard limit on the whole call, export and evaluation included
    ae_batch: int | None = None  # None: the checkpoint's (a resumed run keeps its batch), else AE_BATCH
    denoise_batch: int = 256
    ae_lr: float = 5e-4
    denoise_lr: float = 4e-4
    vocoder_lr: float = 1e-4  # stage "vocoder" fine-tunes a trained vocoder: below ae_lr, annealed over the call
    vocoder_reset: bool = False  # stage "vocoder" starts from a freshly initialised vocoder (then raise vocoder_lr)
    schedule: str = "cosine"
    bf16: bool = True  # on CUDA, the denoiser's forward under bfloat16 autocast (weights, optimizer, EMA stay float32)
    compile: bool = (
        False  # the denoiser's transformer blocks through torch.compile (regional; compiled at the first step)
    )
    caption_dropout: float = 0.1
    checkpoint_seconds: float = 60.0
    warmup_steps: int = 200
    eval_requests: int = 32
    pack: Path | None = None
    profile_steps: int = 0  # profile this many steps of each stage this call (after PROFILE_SKIP): profile-<stage>.txt
    stage: str | None = None  # with resume: train only this stage ("vocoder" or "denoiser") for `minutes`

    def validate(self) -> None:
        if not (isinstance(self.minutes, int | float) and 0 <= self.minutes <= 24 * 60):
            raise ValueError(f"minutes: {self.minutes!r}; allowed: a number from 0 to 1440")
        for name in ("ae_minutes", "denoise_minutes", "wall_minutes"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and 0 < value <= 24 * 60):
                raise ValueError(f"{name}: {value!r}; allowed: None or a number above 0, at most 1440")
        for name in ("train_clips", "ae_batch", "denoise_batch", "warmup_steps"):
            value = getattr(self, name)
            if not (value is None and name == "ae_batch") and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: {value!r}; allowed: an integer >= 1" + (" or None" * (name == "ae_batch")))
        for name in ("eval_requests", "profile_steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)!r}; allowed: an integer >= 0")
        for name in ("ae_share", "caption_dropout"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}: {getattr(self, name)!r}; allowed: 0 to 1")
        for name in ("ae_lr", "denoise_lr", "vocoder_lr", "checkpoint_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: {value!r}; allowed: a finite number > 0")
        for name, allowed in (("preset", PRESETS), ("ae_train", AE_PARTS), ("schedule", SCHEDULES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: {getattr(self, name)!r}; allowed: one of {list(allowed)}")
        preset(self.preset, self.overrides)  # names a bad override field or size
        if self.stage is not None and self.stage not in STAGES:
            raise ValueError(f"stage: {self.stage!r}; allowed: None or one of {list(STAGES)}")
        if self.vocoder_reset and self.stage != "vocoder":
            raise ValueError(f"vocoder_reset: True needs stage='vocoder', got stage={self.stage!r}")
        if self.stage is not None and not self.resume:
            raise ValueError(f"stage: {self.stage!r} retrains one stage of a checkpoint; allowed only with resume")
