"""The training and evaluation sets of a preset: which scenes, which captions, which pairs are held out.

Training scenes use seeds [0, n); evaluation uses seeds from EVAL_SEED_START on, so no evaluated scene's
random draws (position, size, speed, tint, shape) were seen in training. Four colour-direction pairs
(a Latin square: one per colour and one per direction) never appear in training at all; evaluation reports
them apart, because a model that only memorised its 12 training pairs would fail exactly there.
Everything is rendered from seeds where it is needed (no dataset files).
"""

from __future__ import annotations

import functools
import itertools
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from workbench.data.synthetic import (
    BACKGROUNDS,
    COLOURS,
    DIRECTIONS,
    SHAPES,
    SPEEDS,
    Scene,
    all_combinations,
    caption_for,
    scene,
)
from workbench.training.model import DEMO_AV, FPS, SAMPLE_RATE, Spec

HELD_OUT_PAIRS = (("red", "up"), ("green", "down"), ("blue", "left"), ("yellow", "right"))
TRAIN_PAIRS = tuple(p for p in all_combinations() if p not in HELD_OUT_PAIRS)
EVAL_SEED_START = 1_000_000


def captions(rich: bool = False) -> list[str]:
    """Every caption of the vocabulary, training pairs first, then the empty (unconditional) caption last."""
    pairs = list(TRAIN_PAIRS) + list(HELD_OUT_PAIRS)
    if not rich:
        return [caption_for(c, s, d) for c, d in pairs for s in SHAPES] + [""]
    rest = list(itertools.product(SHAPES, SPEEDS, BACKGROUNDS))
    return [caption_for(c, s, d, v, b) for c, d in pairs for s, v, b in rest] + [""]


@dataclass
class ClipSet:
    """Clips as tensors: video uint8 (N, F, H, W, 3), audio float32 (N, 2, S), caption ids into `captions()`."""

    video: torch.Tensor
    audio: torch.Tensor
    caption_ids: torch.Tensor

    def to(self, device: torch.device) -> ClipSet:
        return ClipSet(self.video.to(device), self.audio.to(device), self.caption_ids.to(device))

    def __len__(self) -> int:
        return int(self.video.shape[0])


def train_scene(seed: int, spec: Spec = DEMO_AV) -> Scene:
    """Training scene `seed`: the pairs cycle so every training pair is equally frequent."""
    colour, direction = TRAIN_PAIRS[seed % len(TRAIN_PAIRS)]
    size = (spec.frames, spec.height, spec.width, FPS, SAMPLE_RATE)
    return scene(seed, *size, colour=colour, direction=direction, rich=spec.rich)


def eval_cases(count: int, rich: bool = False) -> list[tuple[int, str, bool]]:
    """`count` (seed, caption, held_out) cases; the seed is the request's noise seed, never a training scene's.

    Latin-square order: every block of 4 has each colour and each direction once, so any 8 consecutive
    cases test every colour and direction twice. Cases 0-7 are training pairs, 8-11 the held-out pairs,
    12-15 training pairs again (then it repeats with new seeds and shapes). Rich cases also alternate speed
    and background so every block of 4 has both of each and each colour gets both speeds in 8 cases.
    """
    colours, directions = list(COLOURS), list(DIRECTIONS)
    speeds, backgrounds = list(SPEEDS), list(BACKGROUNDS)
    cases = []
    for i in range(count):
        colour, direction = colours[i % 4], directions[(i + (i // 4) % 4) % 4]
        extra = (speeds[(i + i // 4) % 2], backgrounds[(i // 2 + i // 8) % 2]) if rich else ()
        caption = caption_for(colour, SHAPES[i % len(SHAPES)], direction, *extra)
        cases.append((EVAL_SEED_START + i, caption, (colour, direction) in HELD_OUT_PAIRS))
    return cases


def _chunk(seeds: list[int], spec: Spec) -> tuple[np.ndarray, np.ndarray, list[str]]:
    scenes = [train_scene(s, spec) for s in seeds]
    return np.stack([s.video for s in scenes]), np.stack([s.audio for s in scenes]), [s.caption for s in scenes]


def build(count: int, spec: Spec = DEMO_AV, workers: int | None = None) -> ClipSet:
    """Render training scenes 0..count-1 of `spec` (in parallel processes when there are cores to spare)."""
    if count < 1:
        raise ValueError(f"train_clips: must be >= 1, got {count}")
    workers = workers or max(1, min(16, (os.cpu_count() or 1) - 1))
    seeds = list(range(count))
    chunks = [seeds[i : i + 64] for i in range(0, count, 64)]
    render = functools.partial(_chunk, spec=spec)
    if workers > 1 and len(chunks) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(render, chunks))
    else:
        parts = [render(c) for c in chunks]
    index = {caption: i for i, caption in enumerate(captions(spec.rich))}
    ids = [index[c] for part in parts for c in part[2]]
    return ClipSet(
        video=torch.from_numpy(np.concatenate([p[0] for p in parts])),
        audio=torch.from_numpy(np.concatenate([p[1] for p in parts])),
        caption_ids=torch.tensor(ids, dtype=torch.long),
    )
