"""Simple detectors that check a clip against its caption: colour, shape, direction, speed, background,
pitch, rhythm, loudness and stereo pan.

They are deliberately plain (a hue vote, a template fit, a centroid trajectory, a grey level, an FFT peak,
an envelope's variation and level, a left/right balance trend), so a match is evidence about the clip and
not about another learned model. Each returns a label from the synthetic vocabulary or None when there is
nothing to measure (no foreground, no motion, silence); None never matches a caption. Their accuracy on the
generator's own scenes and on mismatched or noise clips is tested, so a passing caption-match score cannot
come from a detector that always agrees.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from skimage.color import rgb2hsv

from workbench.data.synthetic import COLOURS, RHYTHMS, SHAPES, TONES_HZ, parse_caption, shape_pixels

HUES = {name: float(rgb2hsv(np.array([[rgb]], dtype=np.uint8))[0, 0, 0]) for name, rgb in COLOURS.items()}
ATTRIBUTES = ("colour", "direction", "pitch", "rhythm")  # what a demo-av 1 caption is checked on
RICH_ATTRIBUTES = ("colour", "shape", "direction", "speed", "background", "pitch", "rhythm", "loudness", "pan")
# A triangle of `shape_pixels` with half width s: area 1.8 s^2, centroid 0.2 s below its nominal centre.
TRIANGLE_AREA, TRIANGLE_CENTROID = 1.8, 0.2


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
    fast_travel: float = 0.35  # travel over the clip, as a fraction of the canvas, above this is "fast"
    light_level: float = 110.0  # median grey level above this is a "light" background
    loud_level: float = 0.15  # 90th percentile of the 10 ms RMS envelope above this is "loud"
    min_pan: float = 0.1  # change of the (R - L) / (R + L) balance over the clip that counts as panning


DEFAULT = Thresholds()


def foreground(video: np.ndarray, limits: Thresholds = DEFAULT) -> np.ndarray:
    """Boolean (F, H, W): saturated pixels far from the frame's median colour (the background).

    The video detectors take it as `mask` when a caller has computed it already (`caption_match` does).
    """
    video = _check_video(video)
    pixels = video.astype(np.float32)
    sample = video[:, ::2, ::2].reshape(video.shape[0], -1, 3)  # a quarter of the pixels give the same median
    median = np.median(sample, axis=1).astype(np.float32)[:, None, None, :]
    contrast = np.sqrt(np.square(pixels - median).sum(axis=-1))
    high, low = pixels.max(axis=-1), pixels.min(axis=-1)
    saturation = (high - low) / np.maximum(high, 1.0)  # HSV saturation (0 for black)
    return (contrast > limits.min_contrast) & (saturation > limits.min_saturation)


def detect_colour(video: np.ndarray, limits: Thresholds = DEFAULT, mask: np.ndarray | None = None) -> str | None:
    """The palette colour whose hue is nearest to most foreground pixels (a vote), or None."""
    video = _check_video(video)
    mask = foreground(video, limits) if mask is None else mask
    if mask.sum() < limits.min_pixels:
        return None
    hues = rgb2hsv(video[mask][None])[0, :, 0]
    names = list(HUES)
    centres = np.array([HUES[n] for n in names])
    distance = np.abs(hues[:, None] - centres[None, :])
    distance = np.minimum(distance, 1.0 - distance)  # hue is circular
    votes = np.bincount(distance.argmin(axis=1), minlength=len(names))
    return names[int(votes.argmax())]


def trajectory(
    video: np.ndarray, limits: Thresholds = DEFAULT, mask: np.ndarray | None = None
) -> tuple[float, float, int] | None:
    """Travel (x, y) in pixels over the clip from straight-line fits of the foreground centroid, and the
    frame span measured; None when too few frames have a foreground."""
    mask = foreground(_check_video(video), limits) if mask is None else mask
    times, xs, ys = [], [], []
    for t, frame in enumerate(mask):
        rows, cols = np.nonzero(frame)
        if rows.size >= limits.min_pixels:
            times.append(t)
            xs.append(cols.mean())
            ys.append(rows.mean())
    if len(times) < max(3, len(mask) // 2):
        return None
    span = len(mask) - 1
    return float(np.polyfit(times, xs, 1)[0] * span), float(np.polyfit(times, ys, 1)[0] * span), span


def detect_direction(video: np.ndarray, limits: Thresholds = DEFAULT, mask: np.ndarray | None = None) -> str | None:
    """left/right/up/down from a straight-line fit of the foreground centroid, or None if it barely moves."""
    video = _check_video(video)
    moved = _movement(video, limits, mask)
    return None if moved is None else moved[0]


def detect_speed(video: np.ndarray, limits: Thresholds = DEFAULT, mask: np.ndarray | None = None) -> str | None:
    """'fast' when the centroid travels more than `fast_travel` of the canvas along its main axis, else
    'slow'; None when it does not move (see `detect_direction`)."""
    video = _check_video(video)
    moved = _movement(video, limits, mask)
    if moved is None:
        return None
    direction, travel_x, travel_y = moved
    horizontal = direction in ("left", "right")
    fraction = abs(travel_x) / video.shape[2] if horizontal else abs(travel_y) / video.shape[1]
    return "fast" if fraction > limits.fast_travel else "slow"


def _movement(video: np.ndarray, limits: Thresholds, mask: np.ndarray | None) -> tuple[str, float, float] | None:
    """(direction, travel x, travel y) of the foreground centroid, or None if it barely moves."""
    travel = trajectory(video, limits, mask)
    if travel is None:
        return None
    travel_x, travel_y, _ = travel
    needed = limits.min_travel * min(video.shape[1], video.shape[2]) / 64.0
    if max(abs(travel_x), abs(travel_y)) < needed:
        return None
    if abs(travel_x) >= abs(travel_y):
        return ("right" if travel_x > 0 else "left"), travel_x, travel_y
    return ("down" if travel_y > 0 else "up"), travel_x, travel_y


def detect_shape(video: np.ndarray, limits: Thresholds = DEFAULT, mask: np.ndarray | None = None) -> str | None:
    """circle/square/triangle: per frame, the largest foreground blob is compared (intersection over union)
    with each shape of the blob's own area placed on the blob's centroid; the best fit of most frames wins.

    Fitting templates of equal area makes the answer independent of the size, and a blurred or slightly
    eroded outline still overlaps its own shape most. None when no frame has a blob.
    """
    video = _check_video(video)
    canvas = video.shape[1:3]
    votes = dict.fromkeys(SHAPES, 0)
    for frame in foreground(video, limits) if mask is None else mask:
        labelled, count = ndimage.label(frame)
        if count == 0:
            continue
        sizes = ndimage.sum_labels(frame, labelled, index=np.arange(1, count + 1))
        blob = labelled == 1 + int(sizes.argmax())
        area = float(blob.sum())
        if area < limits.min_pixels:
            continue
        cy, cx = ndimage.center_of_mass(blob)
        fits = {}
        for shape in SHAPES:
            template = np.zeros(canvas, dtype=bool)
            if shape == "circle":
                size = np.sqrt(area / np.pi)
            elif shape == "square":
                size = np.sqrt(area) / 2
            else:
                size = np.sqrt(area / TRIANGLE_AREA)
            centre_y = cy - TRIANGLE_CENTROID * size if shape == "triangle" else cy
            template[shape_pixels(shape, centre_y, cx, size, canvas)] = True
            fits[shape] = (blob & template).sum() / max((blob | template).sum(), 1)
        votes[max(fits, key=fits.get)] += 1
    if not any(votes.values()):
        return None
    return max(votes, key=votes.get)


def detect_background(video: np.ndarray, limits: Thresholds = DEFAULT) -> str:
    """'light' when the clip's median grey level (the background covers most of it) is above `light_level`."""
    video = _check_video(video)
    return "light" if float(np.median(video.mean(axis=-1))) > limits.light_level else "dark"


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
    envelope = _envelope(audio, sample_rate, limits)
    if envelope is None:
        return None
    variation = envelope.std() / max(envelope.mean(), 1e-8)
    return "beeps" if variation > limits.beep_variation else "hum"


def detect_loudness(audio: np.ndarray, sample_rate: int, limits: Thresholds = DEFAULT) -> str | None:
    """'loud' or 'soft' from the 90th percentile of the 10 ms envelope (the level while the tone sounds, so
    beeps and hum of one loudness agree; both channels' power, so panning does not change it); None for silence."""
    envelope = _envelope(audio, sample_rate, limits)
    if envelope is None:
        return None
    return "loud" if float(np.percentile(envelope, 90)) > limits.loud_level else "soft"


def detect_pan(audio: np.ndarray, sample_rate: int, limits: Thresholds = DEFAULT) -> str | None:
    """'left'/'right' when the stereo balance (R - L) / (R + L) of 100 ms windows drifts that way by more than
    `min_pan` over the clip (a straight-line fit), 'still' when it does not; None for silence or mono input."""
    audio = np.asarray(audio, dtype=np.float64)
    if audio.ndim != 2 or audio.shape[0] != 2:
        return None
    if _envelope(audio, sample_rate, limits) is None:
        return None
    window = max(1, sample_rate // 10)
    count = audio.shape[1] // window
    if count < 3:
        return None
    levels = np.sqrt(np.mean(audio[:, : count * window].reshape(2, count, window) ** 2, axis=2))  # (2, count)
    loud = levels.sum(axis=0) > 0.25 * levels.sum(axis=0).max()
    if loud.sum() < 3:
        return None
    balance = (levels[1] - levels[0]) / np.maximum(levels.sum(axis=0), 1e-8)
    times = np.arange(count)[loud]
    drift = np.polyfit(times, balance[loud], 1)[0] * (count - 1)
    if abs(drift) < limits.min_pan:
        return "still"
    return "right" if drift > 0 else "left"


def caption_match(
    video: np.ndarray, audio: np.ndarray | None, sample_rate: int | None, caption: str, limits: Thresholds = DEFAULT
) -> dict[str, dict[str, object]]:
    """Per attribute: what the caption says, what was detected, and whether they agree.

    A demo-av 1 caption is checked on `ATTRIBUTES`, a rich one on `RICH_ATTRIBUTES`. Pitch is reported as
    the colour whose tone it is (red = low); pan as the horizontal direction the sound moves, or "still"
    for vertical motion. Without audio, every sound attribute is detected as None.
    """
    expected = parse_caption(caption)
    rich = "speed" in expected
    has_audio = audio is not None and sample_rate is not None
    mask = foreground(video, limits)
    wanted = {k: expected[k] for k in ("colour", "direction", "rhythm")} | {"pitch": expected["colour"]}
    detectors = {
        "colour": lambda: detect_colour(video, limits, mask),
        "direction": lambda: detect_direction(video, limits, mask),
        "pitch": lambda: detect_pitch(audio, sample_rate, limits) if has_audio else None,
        "rhythm": lambda: detect_rhythm(audio, sample_rate, limits) if has_audio else None,
    }
    if rich:
        horizontal = RHYTHMS[expected["direction"]] == "hum"
        wanted |= {k: expected[k] for k in ("shape", "speed", "background", "loudness")}
        wanted["pan"] = expected["direction"] if horizontal else "still"
        detectors |= {
            "shape": lambda: detect_shape(video, limits, mask),
            "speed": lambda: detect_speed(video, limits, mask),
            "background": lambda: detect_background(video, limits),
            "loudness": lambda: detect_loudness(audio, sample_rate, limits) if has_audio else None,
            "pan": lambda: detect_pan(audio, sample_rate, limits) if has_audio else None,
        }
    rows = {}
    for attribute in RICH_ATTRIBUTES if rich else ATTRIBUTES:
        detected = detectors[attribute]()
        rows[attribute] = {"expected": wanted[attribute], "detected": detected, "match": detected == wanted[attribute]}
    return rows


def match_rates(matches: Iterable[dict[str, dict[str, object]]]) -> dict[str, float]:
    """Fraction of clips matching per attribute (those every clip was checked on), plus `all` (every one of
    those attributes matched) and `count`."""
    rows = list(matches)
    if not rows:
        raise ValueError("matches: need at least one caption_match result")
    attributes = [k for k in RICH_ATTRIBUTES if all(k in r for r in rows)]
    rates: dict[str, float] = {k: float(np.mean([bool(r[k]["match"]) for r in rows])) for k in attributes}
    rates["all"] = float(np.mean([all(bool(r[k]["match"]) for k in attributes) for r in rows]))
    rates["count"] = float(len(rows))
    return rates


def _envelope(audio: np.ndarray, sample_rate: int, limits: Thresholds) -> np.ndarray | None:
    """RMS over 10 ms windows and over the channels, less 2 windows at each end (fades); None for silence."""
    audio = np.asarray(audio, dtype=np.float64)
    _mono(audio)  # shape check
    power = (audio**2).mean(axis=0) if audio.ndim == 2 else audio**2
    if np.sqrt(power.mean()) < limits.min_rms:
        return None
    window = max(1, sample_rate // 100)
    count = power.size // window
    if count < 8:
        return None
    return np.sqrt(power[: count * window].reshape(count, window).mean(axis=1))[2:-2]


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
