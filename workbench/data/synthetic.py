"""Synthetic audio+video scenes with captions, deterministic from a seed.

The shipped `demo-av` model is trained on these, and its evidence of learning is measured against them:
a scene is one coloured shape moving in a straight line over a dark, slightly tinted background, with a
tone whose pitch is tied to the shape's colour and whose rhythm is tied to its axis of motion. The caption
names all of it ("a red circle moves left, low hum"), so a simple detector (`workbench.data.detect`) can
check a generated clip against its caption without any learned judge.

Vocabulary (small on purpose, so a tiny model can learn it in minutes):
colour -> pitch: red 200 Hz "low", green 400 Hz "mid", blue 800 Hz "high", yellow 1600 Hz "very high";
axis of motion -> rhythm: left/right "hum" (steady tone), up/down "beeps" (8 Hz on/off).

Why whole multiples of 100 Hz, exactly (no per-clip detuning): demo-av's vocoder (a HiFi-GAN-style stack of
convolutions, `LTX2Vocoder`) turns mel frames at hop 160 (100 frames per second at 16 kHz) into samples and is
shift-equivariant by one frame; a steady tone has identical mel frames, so whatever it emits for a steady tone
repeats every 160 samples, i.e. only has partials at multiples of 100 Hz. A 220 Hz tone is unreachable; the
spectral loss then rates near-silence as the best answer, and the trained vocoder goes quiet.
`TONE_GRID_HZ` names that constraint and the tests hold the tones to it.

Rich scenes (`rich=True`, demo-av 2's vocabulary) add two attributes and make the sound follow the picture
more closely: speed (slow: the shape crosses about a fifth of the canvas over the clip, fast: about half)
sets the loudness (slow "soft", fast "loud"), the background is dark or light, and the tone is panned
(constant power) to follow the shape's horizontal position. Their captions name everything:
"a red circle moves left fast on a light background, loud low hum". `parse_caption` reads both forms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from skimage.draw import disk, polygon, rectangle

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 235),
    "yellow": (230, 210, 40),
}
TONES_HZ: dict[str, float] = {"red": 200.0, "green": 400.0, "blue": 800.0, "yellow": 1600.0}
TONE_GRID_HZ = 100.0  # 16 kHz / hop 160: tones must be whole multiples of this (see the module docstring)
PITCH_WORDS: dict[str, str] = {"red": "low", "green": "mid", "blue": "high", "yellow": "very high"}
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
RHYTHMS: dict[str, str] = {"left": "hum", "right": "hum", "up": "beeps", "down": "beeps"}
SHAPES = ("circle", "square", "triangle")
BEEP_HZ = 8.0  # on/off rate of "beeps"
SPEEDS: dict[str, tuple[float, float]] = {"slow": (0.15, 0.25), "fast": (0.45, 0.55)}  # canvas fraction travelled
LOUDNESS: dict[str, str] = {"slow": "soft", "fast": "loud"}
AMPLITUDES: dict[str, tuple[float, float]] = {"soft": (0.08, 0.14), "loud": (0.35, 0.45)}  # tone peak, per loudness
BACKGROUNDS: dict[str, tuple[float, float]] = {"dark": (20.0, 70.0), "light": (150.0, 200.0)}  # base grey level


@dataclass(frozen=True)
class Scene:
    """One clip: `video` uint8 (F, H, W, 3), `audio` float32 (2, N) in [-1, 1] (stereo; rich scenes are panned)."""

    video: np.ndarray
    audio: np.ndarray
    sample_rate: int
    fps: int
    caption: str
    labels: dict[str, str]


def caption_for(
    colour: str, shape: str, direction: str, speed: str | None = None, background: str | None = None
) -> str:
    """The caption of a scene; pitch, rhythm (and loudness) words follow from colour, direction (and speed).

    Without speed and background it is demo-av 1's form; a rich caption names both.
    """
    _check("colour", colour, COLOURS)
    _check("shape", shape, SHAPES)
    _check("direction", direction, DIRECTIONS)
    sound = f"{PITCH_WORDS[colour]} {RHYTHMS[direction]}"
    if speed is None and background is None:
        return f"a {colour} {shape} moves {direction}, {sound}"
    _check("speed", speed, SPEEDS)
    _check("background", background, BACKGROUNDS)
    return f"a {colour} {shape} moves {direction} {speed} on a {background} background, {LOUDNESS[speed]} {sound}"


def parse_caption(caption: str) -> dict[str, str]:
    """Labels named by a caption of this vocabulary: colour, shape, direction, pitch, rhythm, and for a
    rich caption (one naming a speed) also speed, background and loudness."""
    words = caption.lower().replace(",", " ").split()
    fields: list[tuple[str, object]] = [("colour", COLOURS), ("shape", SHAPES), ("direction", DIRECTIONS)]
    if any(w in SPEEDS for w in words):
        fields += [("speed", SPEEDS), ("background", BACKGROUNDS)]
    found = {}
    for field, vocabulary in fields:
        hits = [w for w in words if w in vocabulary]
        if len(hits) != 1:
            raise ValueError(f"caption: {caption!r} must name exactly one {field} of {sorted(vocabulary)}")
        found[field] = hits[0]
    found["pitch"] = PITCH_WORDS[found["colour"]]
    found["rhythm"] = RHYTHMS[found["direction"]]
    if "speed" in found:
        found["loudness"] = LOUDNESS[found["speed"]]
    return found


def all_combinations() -> list[tuple[str, str]]:
    """Every (colour, direction) pair, in a fixed order."""
    return [(c, d) for c in COLOURS for d in DIRECTIONS]


def scene(
    seed: int,
    frames: int = 9,
    height: int = 64,
    width: int = 64,
    fps: int = 24,
    sample_rate: int = 16000,
    colour: str | None = None,
    direction: str | None = None,
    shape: str | None = None,
    speed: str | None = None,
    background: str | None = None,
    rich: bool = False,
) -> Scene:
    """Render one scene; everything not given is drawn from `seed` (same seed, same scene, bit for bit).

    Sizes and speeds scale with the canvas so the shape stays inside it for the whole clip; audio lasts
    `frames / fps` seconds, as the LTX-2 pipeline's audio does. `speed` and `background` exist only in
    rich scenes (`rich=True`); a demo-av 1 scene draws its speed from a continuous range instead.
    """
    for name, value, minimum in (("frames", frames, 2), ("height", height, 16), ("width", width, 16)):
        if not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    for name, value in (("fps", fps), ("sample_rate", sample_rate)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
    if not rich and (speed is not None or background is not None):
        raise ValueError(f"speed, background: {speed!r}, {background!r} exist only in rich scenes (rich=True)")
    rng = np.random.default_rng(int(seed))
    labels = {
        "colour": _pick(rng, "colour", colour, list(COLOURS)),
        "direction": _pick(rng, "direction", direction, list(DIRECTIONS)),
        "shape": _pick(rng, "shape", shape, list(SHAPES)),
    }
    if rich:
        labels["speed"] = _pick(rng, "speed", speed, list(SPEEDS))
        labels["background"] = _pick(rng, "background", background, list(BACKGROUNDS))
    motion = _motion(rng, frames, height, width, labels["direction"], labels.get("speed"))
    video = _render_video(rng, motion, frames, height, width, labels)
    audio = _render_audio(rng, motion, frames, fps, sample_rate, width, labels)
    labels |= {"pitch": PITCH_WORDS[labels["colour"]], "rhythm": RHYTHMS[labels["direction"]]}
    if rich:
        labels["loudness"] = LOUDNESS[labels["speed"]]
    caption = caption_for(
        labels["colour"], labels["shape"], labels["direction"], labels.get("speed"), labels.get("background")
    )
    return Scene(video, audio, sample_rate, fps, caption, labels)


def _pick(rng: np.random.Generator, name: str, value: str | None, allowed: list[str]) -> str:
    drawn = allowed[int(rng.integers(len(allowed)))]  # always drawn, so a forced field leaves the rest unchanged
    if value is None:
        return drawn
    _check(name, value, allowed)
    return value


def _check(name: str, value: str | None, allowed: object) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not in the vocabulary; allowed: {sorted(allowed)}")


@dataclass(frozen=True)
class _Motion:
    """The shape's size (radius or half side, pixels), start (x0, y0) and velocity (pixels per frame)."""

    size: float
    x0: float
    y0: float
    vx: float
    vy: float

    def at(self, t: np.ndarray | float) -> tuple:
        """Centre (x, y) at frame time `t` (fractional frames allowed)."""
        return self.x0 + self.vx * t, self.y0 + self.vy * t


def _motion(
    rng: np.random.Generator, frames: int, height: int, width: int, direction: str, speed: str | None
) -> _Motion:
    scale = min(height, width) / 64.0
    size = rng.uniform(7.0, 11.0) * scale
    if speed is None:  # demo-av 1: 1.6-2.6 pixels per frame at 64 pixels, capped to fit short clips
        pixels_per_frame = min(rng.uniform(1.6, 2.6) * scale, 0.45 * min(height, width) / (frames - 1))
    else:
        pixels_per_frame = rng.uniform(*SPEEDS[speed]) * min(height, width) / (frames - 1)
    travel = pixels_per_frame * (frames - 1)
    dx, dy = DIRECTIONS[direction]
    margin = size + 2.0
    x0 = _start(rng, width, margin, travel, dx)
    y0 = _start(rng, height, margin, travel, dy)
    return _Motion(size, x0, y0, dx * pixels_per_frame, dy * pixels_per_frame)


def _render_video(
    rng: np.random.Generator, motion: _Motion, frames: int, height: int, width: int, labels: dict[str, str]
) -> np.ndarray:
    base = rng.uniform(*BACKGROUNDS[labels.get("background", "dark")])
    tint = rng.uniform(-10.0, 10.0, size=3)
    gradient = rng.uniform(-15.0, 15.0) * np.linspace(-1.0, 1.0, height)[:, None, None]
    background = np.clip(base + tint[None, None, :] + gradient, 0, 255)
    background = np.broadcast_to(background, (height, width, 3))
    fill = np.clip(np.array(COLOURS[labels["colour"]], dtype=np.float64) + rng.uniform(-15.0, 15.0, size=3), 0, 255)

    video = np.empty((frames, height, width, 3), dtype=np.uint8)
    for t in range(frames):
        canvas = background.copy()
        cx, cy = motion.at(t)
        rows, cols = shape_pixels(labels["shape"], cy, cx, motion.size, (height, width))
        canvas[rows, cols] = fill
        video[t] = np.rint(canvas).astype(np.uint8)
    return video


def _start(rng: np.random.Generator, extent: int, margin: float, travel: float, sign: int) -> float:
    """A start coordinate that keeps the shape `margin` inside the canvas for the whole travel."""
    if sign == 0:
        return rng.uniform(margin, extent - margin)
    low, high = margin, extent - margin - travel
    start = rng.uniform(low, max(low, high))
    return start if sign > 0 else extent - start


def shape_pixels(shape: str, cy: float, cx: float, size: float, canvas: tuple[int, int]) -> tuple:
    """(rows, cols) of a shape centred at (cy, cx): a disk of radius `size`, an axis-aligned square of half
    side `size`, or an upward triangle with its apex `size` above and its base 0.8 `size` below the centre."""
    if shape == "circle":
        return disk((cy, cx), size, shape=canvas)
    if shape == "square":
        start = (int(round(cy - size)), int(round(cx - size)))
        end = (int(round(cy + size)), int(round(cx + size)))
        return rectangle(start, end=end, shape=canvas)
    rows = np.array([cy - size, cy + size * 0.8, cy + size * 0.8])
    cols = np.array([cx, cx - size, cx + size])
    return polygon(rows, cols, shape=canvas)


def _render_audio(
    rng: np.random.Generator,
    motion: _Motion,
    frames: int,
    fps: int,
    sample_rate: int,
    width: int,
    labels: dict[str, str],
) -> np.ndarray:
    seconds = frames / fps
    count = int(round(seconds * sample_rate))
    time = np.arange(count) / sample_rate
    rng.uniform(0.98, 1.02)  # was a detuning; still drawn so every other draw of a seed stays as it was
    frequency = TONES_HZ[labels["colour"]]  # exact: a frame-periodic vocoder can only emit multiples of TONE_GRID_HZ
    speed = labels.get("speed")
    amplitude = rng.uniform(*AMPLITUDES[LOUDNESS[speed]]) if speed else rng.uniform(0.25, 0.4)
    tone = amplitude * np.sin(2 * np.pi * frequency * time + rng.uniform(0, 2 * np.pi))
    if RHYTHMS[labels["direction"]] == "beeps":
        phase = (time * BEEP_HZ + rng.uniform(0, 1)) % 1.0
        ramp = 0.01 * BEEP_HZ  # 10 ms fades, so gating adds no clicks
        gate = np.clip(np.minimum(phase, 0.5 - phase) / ramp, 0.0, 1.0)
        tone = tone * gate
    else:
        fade = np.clip(np.minimum(time, seconds - time) / 0.01, 0.0, 1.0)
        tone = tone * fade
    if speed is None:
        return np.stack([tone, tone]).astype(np.float32)
    # constant-power pan (left^2 + right^2 = 2, so both sides equal the tone at the centre) following x
    position = np.clip(motion.at(time * fps)[0] / width, 0.0, 1.0)
    angle = position * np.pi / 2
    return np.stack([np.sqrt(2) * np.cos(angle) * tone, np.sqrt(2) * np.sin(angle) * tone]).astype(np.float32)
