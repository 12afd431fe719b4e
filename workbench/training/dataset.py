"""The demo-av training and evaluation sets: which scenes, which captions, which pairs are held out.

Training scenes use seeds [0, n); evaluation uses seeds from EVAL_SEED_START on, so no evaluated scene's
random draws (position, size, speed, tint, shape) were seen in training. Four colour-direction pairs
(one per colour and one per direction) never appear in training at all; evaluation reports them apart,
because a model that only memorised its 12 training pairs would fail exactly there.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from workbench.data.synthetic import COLOURS, DIRECTIONS, SHAPES, all_combinations, caption_for, scene
from workbench.training.model import FPS, FRAMES, HEIGHT, SAMPLE_RATE, WIDTH

HELD_OUT_PAIRS = (("red", "up"), ("green", "down"), ("blue", "left"), ("yellow", "right"))
TRAIN_PAIRS = tuple(p for p in all_combinations() if p not in HELD_OUT_PAIRS)
EVAL_SEED_START = 1_000_000


def captions() -> list[str]:
    """Every caption of the vocabulary, training pairs first, then the empty (unconditional) caption last."""
    pairs = list(TRAIN_PAIRS) + list(HELD_OUT_PAIRS)
    return [caption_for(c, s, d) for c, d in pairs for s in SHAPES] + [""]


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


def train_scene(seed: int):
    """Training scene `seed`: the pairs cycle so every training pair is equally frequent."""
    colour, direction = TRAIN_PAIRS[seed % len(TRAIN_PAIRS)]
    return scene(seed, FRAMES, HEIGHT, WIDTH, FPS, SAMPLE_RATE, colour=colour, direction=direction)


def eval_cases(count: int) -> list[tuple[int, str, bool]]:
    """`count` (seed, caption, held_out) cases; the seed is the request's noise seed, never a training scene's.

    Latin-square order: every block of 4 has each colour and each direction once, so any 8 consecutive
    cases test every colour and direction twice. Cases 0-7 are training pairs, 8-11 the held-out pairs,
    12-15 training pairs again (then it repeats with new seeds and shapes).
    """
    colours, directions = list(COLOURS), list(DIRECTIONS)
    cases = []
    for i in range(count):
        colour, direction = colours[i % 4], directions[(i + (i // 4) % 4) % 4]
        caption = caption_for(colour, SHAPES[i % len(SHAPES)], direction)
        cases.append((EVAL_SEED_START + i, caption, (colour, direction) in HELD_OUT_PAIRS))
    return cases


def _chunk(seeds: list[int]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    scenes = [train_scene(s) for s in seeds]
    return np.stack([s.video for s in scenes]), np.stack([s.audio for s in scenes]), [s.caption for s in scenes]


def build(count: int, workers: int | None = None) -> ClipSet:
    """Render training scenes 0..count-1 (in parallel processes when there are cores to spare)."""
    if count < 1:
        raise ValueError(f"train_clips: must be >= 1, got {count}")
    workers = workers or max(1, min(16, (os.cpu_count() or 1) - 1))
    seeds = list(range(count))
    chunks = [seeds[i : i + 256] for i in range(0, count, 256)]
    if workers > 1 and len(chunks) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(_chunk, chunks))
    else:
        parts = [_chunk(c) for c in chunks]
    index = {caption: i for i, caption in enumerate(captions())}
    ids = [index[c] for part in parts for c in part[2]]
    return ClipSet(
        video=torch.from_numpy(np.concatenate([p[0] for p in parts])),
        audio=torch.from_numpy(np.concatenate([p[1] for p in parts])),
        caption_ids=torch.tensor(ids, dtype=torch.long),
    )
