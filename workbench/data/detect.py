"""Simple detectors that check a clip against its caption: colour, direction of motion, pitch, rhythm.

They are deliberately plain (a hue vote, a centroid trajectory, an FFT peak, an envelope's variation), so
a match is evidence about the clip and not about another learned model. Each returns a label from the
synthetic vocabulary or None when there is nothing to measure (no foreground, no motion, silence); None
never matches a caption. Their accuracy on the generator's own scenes and on mismatched or noise clips is
tested, so a passing caption-match score cannot come from a detector that always agrees.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from skimage.color import rgb2hsv

from workbench.data.synthetic import COLOURS, TONES_HZ, parse_caption

HUES = {name: float(rgb2hsv(np.array([[rgb]], dtype=np.uint8))[0, 0, 0]) for name, rgb in COLOURS.items()}
ATTRIBUTES = ("colour", "direction", "pitch", "rhythm")


@dataclass(frozen=True)
class Thresholds:
    """What counts as foreground, motion, sound and pulsing (pixels scale with a 64-pixel canvas)."""

    min_saturation: float = 0.35  # foreground pixels are saturated; backgrounds are near-grey
    min_contrast: float = 40.0  # RGB distance from the frame's median colour
    min_pixels: int = 8  # per frame, for a centroid
    min_travel: float = 4.0  # pixels over the clip, at 64 pixels across
    min_rms: float = 0.01  # audio below this is silence
    max_octaves: float = 0.5  # how far the spectral peak may sit from the nearest tone
    beep_variation: float = 0.5  # envelope std/mean above this is "beeps"


DEFAULT = Thresholds()


def foreground(video: np.ndarray, limits: Thresholds = DEFAULT) -> np.ndarray:
    """Boolean (F, H, W): saturated pixels far from the frame's median colour (the background)."""
    video = _check_video(video)
    pixels = video.astype(np.float32)
    median = np.median(pixels.reshape(pixels.shape[0], -1, 3), axis=1)[:, None, None, :]
    contrast = np.linalg.norm(pixels - median, axis=-1)
    saturation = rgb2hsv(video.reshape(-1, video.shape[2], 3)).reshape(video.shape)[..., 1]
    return (contrast > limits.min_contrast) & (saturation > limits.min_saturation)


def detect_colour(video: np.ndarray, limits: Thresholds = DEFAULT) -> str | None:
    """The palette colour whose hue is nearest to most foreground pixels (a vote), or None."""
    video = _check_video(video)
    mask = foreground(video, limits)
    if mask.sum() < limits.min_pixels:
        return None
    hues = rgb2hsv(video.reshape(-1, video.shape[2], 3)).reshape(video.shape)[..., 0][mask]
    names = list(HUES)
    centres = np.array([HUES[n] for n in names])
    distance = np.abs(hues[:, None] - centres[None, :])
    distance = np.minimum(distance, 1.0 - distance)  # hue is circular
    votes = np.bincount(distance.argmin(axis=1), minlength=len(names))
    return names[int(votes.argmax())]


def detect_direction(video: np.ndarray, limits: Thresholds = DEFAULT) -> str | None:
    """left/right/up/down from a straight-line fit of the foreground centroid, or None if it barely moves."""
    video = _check_video(video)
    mask = foreground(video, limits)
    times, xs, ys = [], [], []
    for t, frame in enumerate(mask):
        rows, cols = np.nonzero(frame)
        if rows.size >= limits.min_pixels:
            times.append(t)
            xs.append(cols.mean())
            ys.append(rows.mean())
    if len(times) < max(3, len(mask) // 2):
        return None
    span = times[-1] - times[0]
    slope_x = np.polyfit(times, xs, 1)[0]
    slope_y = np.polyfit(times, ys, 1)[0]
    travel_x, travel_y = slope_x * span, slope_y * span
    needed = limits.min_travel * min(video.shape[1], video.shape[2]) / 64.0
    if max(abs(travel_x), abs(travel_y)) < needed:
        return None
    if abs(travel_x) >= abs(travel_y):
        return "right" if travel_x > 0 else "left"
    return "down" if travel_y > 0 else "up"


def detect_pitch(audio: np.ndarray, sample_rate: int, limits: Thresholds = DEFAULT) -> str | None:
    """The colour whose tone is nearest (in octaves) to the spectral peak between 80 Hz and 4 kHz, or None."""
    mono = _mono(audio)
    if np.sqrt(np.mean(mono**2)) < limits.min_rms:
        return None
    spectrum = np.abs(np.fft.rfft(mono * np.hanning(mono.size)))
    frequencies = np.fft.rfftfreq(mono.size, 1.0 / sample_rate)
    band = (frequencies >= 80.0) & (frequencies <= min(4000.0, sample_rate / 2))
    if not band.any():
        return None
    peak = frequencies[band][int(spectrum[band].argmax())]
    names = list(TONES_HZ)
    octaves = np.abs(np.log2(peak / np.array([TONES_HZ[n] for n in names])))
    best = int(octaves.argmin())
    return names[best] if octaves[best] <= limits.max_octaves else None


def detect_rhythm(audio: np.ndarray, sample_rate: int, limits: Thresholds = DEFAULT) -> str | None:
    """'beeps' when the 10 ms loudness envelope varies strongly, 'hum' when it is steady, None for silence."""
    mono = _mono(audio)
    if np.sqrt(np.mean(mono**2)) < limits.min_rms:
        return None
    window = max(1, sample_rate // 100)
    count = mono.size // window
    if count < 8:
        return None
    envelope = np.sqrt(np.mean(mono[: count * window].reshape(count, window) ** 2, axis=1))
    envelope = envelope[2:-2]  # fade-in and fade-out are not rhythm
    variation = envelope.std() / max(envelope.mean(), 1e-8)
    return "beeps" if variation > limits.beep_variation else "hum"


def caption_match(
    video: np.ndarray, audio: np.ndarray | None, sample_rate: int | None, caption: str, limits: Thresholds = DEFAULT
) -> dict[str, dict[str, object]]:
    """Per attribute: what the caption says, what was detected, and whether they agree.

    Pitch and rhythm are reported in the caption's words' source terms: pitch as the colour whose tone
    it is (red = low), rhythm as hum/beeps. Without audio, pitch and rhythm are detected as None.
    """
    expected = parse_caption(caption)
    has_audio = audio is not None and sample_rate is not None
    detected = {
        "colour": detect_colour(video, limits),
        "direction": detect_direction(video, limits),
        "pitch": detect_pitch(audio, sample_rate, limits) if has_audio else None,
        "rhythm": detect_rhythm(audio, sample_rate, limits) if has_audio else None,
    }
    wanted = {"colour": expected["colour"], "direction": expected["direction"]}
    wanted |= {"pitch": expected["colour"], "rhythm": expected["rhythm"]}
    return {k: {"expected": wanted[k], "detected": detected[k], "match": detected[k] == wanted[k]} for k in ATTRIBUTES}


def match_rates(matches: Iterable[dict[str, dict[str, object]]]) -> dict[str, float]:
    """Fraction of clips matching per attribute, plus `all` (every attribute matched) and `count`."""
    rows = list(matches)
    if not rows:
        raise ValueError("matches: need at least one caption_match result")
    rates: dict[str, float] = {k: float(np.mean([bool(r[k]["match"]) for r in rows])) for k in ATTRIBUTES}
    rates["all"] = float(np.mean([all(bool(r[k]["match"]) for k in ATTRIBUTES) for r in rows]))
    rates["count"] = float(len(rows))
    return rates


def _check_video(video: np.ndarray) -> np.ndarray:
    video = np.asarray(video)
    if video.dtype != np.uint8 or video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"video: expected uint8 (F, H, W, 3), got {video.dtype} {video.shape}")
    return video


def _mono(audio: np.ndarray) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float64)
    if audio.ndim == 2:
        audio = audio.mean(axis=0)
    if audio.ndim != 1 or audio.size < 64:
        raise ValueError(f"audio: expected (N,) or (C, N) with N >= 64 samples, got shape {audio.shape}")
    return audio
