import numpy as np
import pytest

from workbench import Result


@pytest.fixture
def make_result(rng):
    """Results built directly (no model): random frames and audio of any shape the test needs, drawn from `rng` (the
    run's seed, tests/conftest.py)."""

    def make(frames=(9, 20, 28), fps=24, audio_samples: int | None = 4000, sample_rate=16000, like=None, noise=0):
        if like is not None:
            pixels = np.clip(like.frames.astype(np.int16) + rng.integers(-noise, noise + 1, like.frames.shape), 0, 255)
            sound = None if like.audio is None or audio_samples is None else like.audio + 0.01 * noise
        else:
            pixels = rng.integers(0, 256, (*frames, 3))
            sound = None if audio_samples is None else rng.uniform(-0.5, 0.5, (2, audio_samples))
        return Result(
            frames=pixels.astype(np.uint8),
            audio=None if sound is None else sound.astype(np.float32),
            sample_rate=None if sound is None else sample_rate,
            fps=fps,
            latents=None,
            timings={},
            memory={},
        )

    return make
