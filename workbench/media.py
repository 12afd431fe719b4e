"""MP4 in and out through PyAV: H.264 video, AAC audio, and a verifier that decodes everything back."""

from __future__ import annotations

import io
import math
import numbers
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from workbench.request import shown

BLACK_LUMA = 16.0 / 255.0  # mean luma at or below this counts as a black frame
# Hz: the MPEG-4 sampling frequency table, the only rates an AAC stream can signal (FFmpeg's encoder refuses others)
AAC_SAMPLE_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
AAC_LAYOUTS = {1: "mono", 2: "stereo"}  # audio channels -> the AAC channel layout `encode_mp4` writes


def check_fps(fps: object, field: str = "fps") -> float:
    """`fps` as a float if it is a finite real number > 0 (not a bool); else ValueError naming `field`."""
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"{field}: expected a finite number of frames per second > 0, got {fps!r}")
    return float(fps)


def check_audio(audio: Any, sample_rate: Any) -> int | None:
    """What `encode_mp4` can write as AAC, checked before anything is encoded: `audio` None or a floating numpy array
    (C, N) with C in AAC_LAYOUTS (1 mono, 2 stereo); `sample_rate` one of AAC_SAMPLE_RATES (numpy integers taken)
    with audio, None or such a rate without. Returns the rate as a Python int (None for None); anything else is a
    ValueError naming the field and what is allowed. Finiteness is left to the caller (a pass over every sample)."""
    if audio is not None:
        if not (isinstance(audio, np.ndarray) and np.issubdtype(audio.dtype, np.floating) and audio.ndim == 2):
            raise ValueError(f"audio: expected None or a float numpy array (C, N), got {described(audio)}")
        if audio.shape[0] not in AAC_LAYOUTS:
            transposed = " (transposed? channels come first)" if audio.shape[1] in AAC_LAYOUTS else ""
            raise ValueError(
                f"audio: expected a float numpy array (C, N) with C = 1 (mono) or 2 (stereo) channels, got shape "
                f"{audio.shape}{transposed}"
            )
    if audio is None and sample_rate is None:
        return None
    if not isinstance(sample_rate, int | np.integer) or int(sample_rate) not in AAC_SAMPLE_RATES:
        raise ValueError(
            f"sample_rate: expected an AAC sample rate in Hz, one of {', '.join(map(str, AAC_SAMPLE_RATES))} "
            f"(the MPEG-4 sampling frequency table), got {described(sample_rate)}"
        )
    return int(sample_rate)


def described(value: Any) -> str:
    """A value's type, and for an array its dtype and shape, for an error message."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return f"{type(value).__name__} {shown(value)}"


def encode_mp4(frames: np.ndarray, fps: int, audio: np.ndarray | None = None, sample_rate: int | None = None) -> bytes:
    """Encode uint8 frames (T, H, W, 3) and optional float audio (C, N) in [-1, 1] (louder samples are clipped) to
    MP4 bytes. `fps` must be finite and > 0, and not round to 0 as the time base's fraction (denominator at most
    1000); audio and its sample rate must pass `check_audio` (mono or stereo, an AAC rate) and audio must be finite:
    anything else is a ValueError naming the field before anything is encoded. Deterministic: equal arguments give
    equal bytes, so two saves of one Result match by hash."""
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames: expected uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    rate = Fraction(check_fps(fps)).limit_denominator(1000)
    if rate <= 0:
        raise ValueError(f"fps: {fps!r} is below the 1/1000 the encoder's time base can hold")
    sample_rate = check_audio(audio, sample_rate)
    if audio is not None and not np.isfinite(audio).all():
        bad = int((~np.isfinite(audio)).sum())
        raise ValueError(f"audio: {bad} of {audio.size} samples are NaN/inf; allowed: finite samples in [-1, 1]")
    buffer = io.BytesIO()
    import av  # loaded on first encode: GPU benchmark runs carry no PyAV wheel

    with av.open(buffer, mode="w", format="mp4") as container:
        video = container.add_stream("libx264", rate=rate)
        video.width, video.height = frames.shape[2] + frames.shape[2] % 2, frames.shape[1] + frames.shape[1] % 2
        video.pix_fmt = "yuv420p"
        # x264's macroblock-tree rate control reads memory it has not written on a CPU with AVX-512 (its C and AVX2
        # code do not), so the bytes depended on what the heap held; without it equal frames give equal bytes
        video.options = {"crf": "18", "preset": "medium", "x264-params": "mbtree=0"}
        sound = None
        if audio is not None:
            sound = container.add_stream("aac", rate=sample_rate, layout=AAC_LAYOUTS[audio.shape[0]])
        for image in _even(frames):
            container.mux(video.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(video.encode())
        if sound is not None:
            samples = np.ascontiguousarray(np.clip(audio, -1.0, 1.0).astype(np.float32))
            chunk = sound.codec_context.frame_size or 1024
            for start in range(0, samples.shape[1], chunk):
                piece = np.ascontiguousarray(samples[:, start : start + chunk])
                frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout=sound.layout.name)
                frame.sample_rate = sample_rate
                frame.pts = start
                container.mux(sound.encode(frame))
            container.mux(sound.encode())
    return buffer.getvalue()


def _even(frames: np.ndarray) -> np.ndarray:
    """yuv420p needs even sides; pad by edge replication rather than crop away a row of content."""
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return frames


@dataclass
class MediaReport:
    """What the verifier decoded from a file, and what it found wrong."""

    frames: int
    width: int
    height: int
    audio_samples: int
    audio_channels: int
    sample_rate: int | None
    audio_finite: bool
    black_frames: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def decode_mp4(path: str | Path) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    """Decode an MP4 fully: frames uint8 (T, H, W, 3), audio float32 (C, N) or None, sample rate."""
    import av

    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    audio, rate = None, None
    with av.open(str(path)) as container:
        if container.streams.audio:
            rate = container.streams.audio[0].rate
            pieces = [f.to_ndarray() for f in container.decode(audio=0)]
            audio = np.concatenate(pieces, axis=1).astype(np.float32) if pieces else np.zeros((1, 0), np.float32)
    return np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8), audio, rate


def verify_mp4(
    path: str | Path, expect_frames: int | None = None, expect_audio_seconds: float | None = None
) -> MediaReport:
    """Decode the whole file and check frame count, audio length, finite samples and black frames.

    AAC adds an encoder delay and pads to whole 1024-sample frames, so the audio length is allowed to
    exceed the expectation by up to two AAC frames, never to fall short of it by more than one.
    """
    frames, audio, rate = decode_mp4(path)
    luma = frames.astype(np.float32).mean(axis=(1, 2, 3)) / 255.0 if len(frames) else np.zeros(0)
    report = MediaReport(
        frames=len(frames),
        height=frames.shape[1] if len(frames) else 0,
        width=frames.shape[2] if len(frames) else 0,
        audio_samples=0 if audio is None else audio.shape[1],
        audio_channels=0 if audio is None else audio.shape[0],
        sample_rate=rate,
        audio_finite=True if audio is None else bool(np.isfinite(audio).all()),
        black_frames=int((luma <= BLACK_LUMA).sum()),
    )
    if expect_frames is not None and report.frames != expect_frames:
        report.problems.append(f"frames: decoded {report.frames}, expected {expect_frames}")
    if expect_audio_seconds is not None:
        if audio is None:
            report.problems.append("audio: expected an audio stream, found none")
        else:
            expected = expect_audio_seconds * rate
            if not (expected - 1024 <= report.audio_samples <= expected + 2 * 1024):
                report.problems.append(f"audio: decoded {report.audio_samples} samples, expected about {expected:.0f}")
    if not report.audio_finite:
        report.problems.append("audio: non-finite samples")
    if report.black_frames:
        report.problems.append(f"video: {report.black_frames} black frame(s)")
    return report
