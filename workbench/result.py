"""What a request produced, how long each stage took, and what ran; saved as MP4 + JSON + HTML."""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.io import check_path, check_stem, json_bytes, write_set
from workbench.media import check_audio, check_fps, described, encode_mp4
from workbench.telemetry import Event

VISIBLE_SIDE = 256  # px: a video in a report or notebook shows at least this on its long side


def enlargement(height: int, width: int, min_side: int = VISIBLE_SIDE) -> int:
    """The smallest whole factor that brings the long side of a height x width frame to `min_side` (1 if
    it is already there): whole factors keep a nearest-neighbour enlargement's pixels square."""
    if height < 1 or width < 1:
        raise ValueError(f"frame size: expected height, width >= 1, got {height}x{width}")
    return max(1, -(-min_side // max(height, width)))


def video_style(height: int, width: int, min_side: int = VISIBLE_SIDE, max_side: int = 480) -> str:
    """CSS for a `<video>` of a height x width clip: at least `min_side` px on the long side, at most
    `max_side`, square pixels when enlarged."""
    factor = enlargement(height, width, min_side)
    scale = factor if factor > 1 else min(1.0, max_side / max(height, width))
    return f"width:{round(width * scale)}px;height:{round(height * scale)}px;image-rendering:pixelated"


@dataclass
class Result:
    """`frames` uint8 (T, H, W, 3); `audio` float32 (C, N) or None; `timings` seconds per stage; `memory` peak
    CUDA bytes allocated per stage (CUDA only: `{}` on CPU and other devices); `receipts` what each acceleration
    actually executed; `exact` False once an approximate acceleration ran; `finite` False when latents, frames
    or audio held NaN/inf (only returned when the caller allowed it; `metadata["non_finite"]` names the stages and
    counts the values as produced; the frames and audio returned then carry NaN as black and silence and +-inf as
    full scale, so they encode; the latents are kept as they were). Checked when made (ValueError naming the field
    and what is allowed): `frames` a uint8 numpy array (T, H, W, 3) with T, H, W >= 1; `audio` and `sample_rate` what
    `encode_mp4` can write (`media.check_audio`): audio None or a floating numpy array (C, N) with C 1 (mono) or 2
    (stereo), the rate one of `media.AAC_SAMPLE_RATES` with audio (numpy integers taken as ints), None or such a
    rate without; `fps` a finite number > 0. The other fields are taken as given. `trace`: the request's profiler
    trace (`Session.generate(trace=True)`: gzip Chrome trace JSON), else None. Its text repr is a one-line summary
    (no pixels); in a notebook it shows as HTML with the video."""

    frames: np.ndarray
    audio: np.ndarray | None
    sample_rate: int | None
    fps: int
    latents: torch.Tensor | None
    timings: dict[str, float]
    memory: dict[str, int]
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)
    exact: bool = True
    finite: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    trace: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        frames = self.frames
        if not (isinstance(frames, np.ndarray) and frames.dtype == np.uint8 and frames.ndim == 4):
            raise ValueError(f"frames: expected a uint8 numpy array (T, H, W, 3), got {described(frames)}")
        if frames.shape[3] != 3 or min(frames.shape[:3]) < 1:
            raise ValueError(f"frames: expected a uint8 numpy array (T, H, W, 3) with T, H, W >= 1, got {frames.shape}")
        self.sample_rate = check_audio(self.audio, self.sample_rate)
        check_fps(self.fps)

    @property
    def audio_seconds(self) -> float | None:
        return None if self.audio is None else self.audio.shape[1] / self.sample_rate

    def __repr__(self) -> str:
        """One line: model, prompt (shortened past 60 characters), seed, frame and audio shapes, total seconds and the
        exact / finite flags; the model, prompt, seed and total only where the result records them."""
        request = self.metadata.get("request", {})
        prompt = request.get("prompt")
        if isinstance(prompt, str) and len(prompt) > 60:
            prompt = prompt[:57] + "..."
        recorded = {"model": self.metadata.get("model"), "prompt": prompt, "seed": request.get("seed")}
        fields = [f"{name}={value!r}" for name, value in recorded.items() if value is not None]
        fields.append(f"frames={tuple(self.frames.shape)} @ {self.fps} fps")
        fields.append(
            "audio=None" if self.audio is None else f"audio={tuple(self.audio.shape)} @ {self.sample_rate} Hz"
        )
        if "total" in self.timings:
            fields.append(f"total={self.timings['total']:.3f} s")
        fields += [f"exact={self.exact}", f"finite={self.finite}"]
        return f"Result({', '.join(fields)})"

    def mp4_bytes(self, min_side: int = 0) -> bytes:
        """The clip as MP4 (H.264 + AAC). With `min_side`, frames whose long side is shorter are first
        enlarged by `enlargement(...)` (nearest-neighbour, so pixels stay square and the codec's chroma
        subsampling blurs nothing smaller than one source pixel): what a viewer can see at a glance."""
        factor = enlargement(*self.frames.shape[1:3], min_side)
        frames = self.frames if factor == 1 else self.frames.repeat(factor, axis=1).repeat(factor, axis=2)
        return encode_mp4(frames, self.fps, self.audio, self.sample_rate)

    def summary(self) -> dict[str, Any]:
        """The JSON-friendly part of the result (no pixels, no tensors)."""
        return {
            "frames_shape": list(self.frames.shape),
            "audio_shape": None if self.audio is None else list(self.audio.shape),
            "sample_rate": self.sample_rate,
            "fps": self.fps,
            "timings": dict(self.timings),
            "memory": dict(self.memory),
            "step_seconds": list(self.step_seconds),
            "receipts": self.receipts,
            "exact": self.exact,
            "finite": self.finite,
            "metadata": self.metadata,
            "events": [e.to_dict() for e in self.events],
        }

    @staticmethod
    def saved_names(
        name: str, field: str = "name", directory: str | Path | None = None, trace: bool = False
    ) -> tuple[str, ...]:
        """The files `save(directory, name)` writes: `<name>.mp4`, `.json`, `.html`, and with `trace` (a traced
        result) `<name>.trace.json.gz` (ValueError naming `field` for a name that is not a plain file stem, or too
        long for `directory`'s file system: `io.check_stem`)."""
        check_stem(name, field, directory)
        return (f"{name}.mp4", f"{name}.json", f"{name}.html") + ((f"{name}.trace.json.gz",) if trace else ())

    def save(self, directory: str | Path, name: str = "result") -> Path:
        """Write `<name>.mp4`, `<name>.json` (strict JSON), `<name>.html` and, for a traced result,
        `<name>.trace.json.gz` (open it in Perfetto) into `directory` as one set (`workbench.io.write_set`): the
        folder holds the complete previous set or the complete new one, never a mix, even when the process is killed
        part-way. Returns the MP4 path."""
        mp4_name, json_name, html_name, *trace_name = self.saved_names(name, trace=self.trace is not None)
        check_path(directory, "directory")  # before the encoding, not after it
        request = self.metadata.get("request", {})
        title = " · ".join(str(x) for x in (request.get("prompt"), self.metadata.get("model")) if x) or name
        page = (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body style='font-family:sans-serif'>{self._html(self.mp4_bytes(min_side=VISIBLE_SIDE))}</body></html>"
        )
        files = {mp4_name: self.mp4_bytes(), json_name: json_bytes(self.summary()), html_name: page.encode()}
        files.update(dict.fromkeys(trace_name, self.trace))
        return write_set(directory, files)[mp4_name]

    def _repr_html_(self) -> str:
        return self._html(self.mp4_bytes(min_side=VISIBLE_SIDE))

    def _html(self, mp4: bytes) -> str:
        """Self-contained: the video is a data URI (of frames enlarged to >= VISIBLE_SIDE px), tables are
        plain HTML (the peak memory column only where it was measured: CUDA), no script."""
        request = self.metadata.get("request", {})
        measured = bool(self.memory)  # CUDA only: elsewhere no column of blanks
        rows = "".join(
            f"<tr><td>{html.escape(stage)}</td><td>{seconds * 1000:.1f}</td>"
            + (f"<td>{_mib(self.memory.get(stage))}</td>" if measured else "")
            + "</tr>"
            for stage, seconds in self.timings.items()
        )
        memory_head = "<th>peak CUDA MiB allocated</th>" if measured else ""
        receipts = (
            "".join(
                f"<tr><td>{html.escape(name)}</td><td>{html.escape(receipt_text(receipt))}</td></tr>"
                for name, receipt in self.receipts.items()
            )
            or "<tr><td colspan=2>none installed</td></tr>"
        )
        video = base64.b64encode(mp4).decode()
        title = html.escape(str(request.get("prompt", "")))
        return (
            f"<div><p><b>{title}</b> &middot; model {html.escape(str(self.metadata.get('model', '')))}"
            f" &middot; seed {request.get('seed', '')} &middot; {self.frames.shape[0]} frames "
            f"{self.frames.shape[2]}x{self.frames.shape[1]} @ {self.fps} fps"
            f"{'' if self.audio is None else f' &middot; audio {self.audio_seconds:.2f} s'}"
            f" &middot; exact={self.exact}</p>"
            f'<video controls loop src="data:video/mp4;base64,{video}" style="{video_style(*self.frames.shape[1:3])}">'
            "</video>"
            f"<table><tr><th>stage</th><th>ms</th>{memory_head}</tr>{rows}</table>"
            f"<table><tr><th>acceleration</th><th>receipt</th></tr>{receipts}</table>{_trace_html(self.metadata)}</div>"
        )


def receipt_text(receipt: Any, name: str = "") -> str:
    """An acceleration's receipt as a reader takes it in, not as a JSON dump: its name (if given) with its contract
    and options, whether it executed, then its counters and any non-empty note ("cross_kv_cache (bitwise): executed,
    hits 48, misses 16"; without a name "bitwise: executed, hits 48, misses 16")."""
    receipt = receipt if isinstance(receipt, dict) else {"receipt": receipt}
    about = [str(receipt["contract"])] if "contract" in receipt else []
    about += [f"options {json.dumps(receipt['options'])}"] if receipt.get("options") else []
    said = ["executed" if receipt.get("executed") else "did not execute"] if "executed" in receipt else []
    said += [
        f"{key} {json.dumps(value) if isinstance(value, dict | list | bool) else value}"
        for key, value in receipt.items()
        if key not in ("contract", "options", "executed") and value not in ({}, [], None, "")
    ]
    head = f"{name} ({', '.join(about)})" if name and about else name or ", ".join(about)
    return f"{head}: {', '.join(said) or 'no counters'}" if head else ", ".join(said) or "no counters"


def receipts_text(receipts: dict[str, Any]) -> str:
    """A request's receipts in words, each `receipt_text` with its name, apart by " | "; "none installed" for none.
    The record keeps the receipts whole."""
    return " | ".join(receipt_text(receipt, name) for name, receipt in receipts.items()) or "none installed"


def _trace_html(metadata: dict[str, Any]) -> str:
    """A traced request's operators with the most self time (`metadata["trace"]`), or "" for an untraced one."""
    summary = metadata.get("trace")
    if not isinstance(summary, dict) or not summary.get("top"):
        return ""
    what = "CUDA kernels and copies" if summary.get("activity") == "cuda" else "CPU operators"
    rows = "".join(
        f"<tr><td>{html.escape(str(row['name']))}</td><td>{row['calls']}</td><td>{row['ms']:.1f}</td></tr>"
        for row in summary["top"]
    )
    return (
        f"<p>Profiled (the timings above include the profiler's overhead): {what} by self time, "
        f"{summary['total_ms']:.1f} ms in all, {summary['other_ms']:.1f} ms outside this table.</p>"
        f"<table><tr><th>name</th><th>calls</th><th>ms</th></tr>{rows}</table>"
    )


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**20:.1f}"
