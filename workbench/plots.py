"""Static matplotlib figures of a request's telemetry and of A/B comparisons, PNG encoders, and `label_points`
(a scatter's point labels placed clear of each other, for the reports' Pareto plots).

Everything here except `timeline_svg` builds `matplotlib.figure.Figure` objects directly (no pyplot state), so it is safe on
any thread and under the Agg backend, and it imports no widget library: reports, notebooks and the
widgets all draw with the same functions. PNG bytes (`figure_png`, `array_png`) are what survives an
offline HTML export, where every widget is blank. `timeline_svg` is the live view's cheap twin of
`stage_timeline`: plain string formatting, no matplotlib, so a renderer thread redrawing it holds the
GIL for microseconds rather than for a figure's rasterization.
"""

from __future__ import annotations

import base64
import html
import io
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox
from PIL import Image
from scipy import signal

from workbench.quality.audio import audio_snr_db
from workbench.telemetry import STAGES, Event

_COLORS = {
    "text_encode": "#4e79a7",
    "image_encode": "#76b7b2",
    "denoise": "#f28e2b",
    "video_decode": "#59a14f",
    "audio_decode": "#b07aa1",
    "mux": "#9c755f",
}
_OTHER_COLOR = "#bab0ac"
_CUT_COLOR = "#e15759"  # where a stop, an interrupt or a failure cut a request off


@dataclass(frozen=True)
class Interval:
    """One stage interval in seconds since request start; `open` while the stage has not ended yet."""

    stage: str
    start: float
    end: float
    open: bool = False


def stage_intervals(events: Iterable[Event], now: float | None = None) -> list[Interval]:
    """Pair stage_start/stage_end events into intervals, in start order.

    A stage may run several times in one request (LTX-2 encodes text twice), so each start pairs with
    the next end of the same stage. A stage still running ends at `now` (default: the latest event).
    """
    events = list(events)
    latest = max((e.t for e in events), default=0.0) if now is None else now
    started: dict[str, float] = {}
    intervals: list[Interval] = []
    for event in events:
        if event.stage is None:
            continue
        if event.kind == "stage_start":
            started[event.stage] = event.t
        elif event.kind == "stage_end" and event.stage in started:
            intervals.append(Interval(event.stage, started.pop(event.stage), event.t))
    intervals += [Interval(stage, start, max(start, latest), open=True) for stage, start in started.items()]
    return sorted(intervals, key=lambda interval: interval.start)


@dataclass(frozen=True)
class Outcome:
    """How a request's events end. `kind`: "done" (request_end), "stopped" (request_failed, ended by `Session.stop()`),
    "interrupted" (request_failed by a KeyboardInterrupt: Ctrl-C, a kernel interrupt), "failed" (request_failed by any
    other exception) or "running" (neither event yet). `seconds`: the request's total (done), the time of its
    request_failed event (stopped, interrupted, failed) or of its latest event (running); `steps`: the denoising steps
    finished; `error`: the exception as request_failed names it ("RuntimeError: device fell over"; failed only, else
    "")."""

    kind: str
    seconds: float
    steps: int
    error: str = ""

    @property
    def ended(self) -> bool:
        return self.kind != "running"

    def __str__(self) -> str:
        """One line: "done: 2.610 s total, 2 steps", "stopped after 2.920 s, 1 step", "failed after 0.410 s, 0 steps:
        RuntimeError: device fell over", "running: 2.61 s, 1 step"."""
        steps = f"{self.steps} step" + ("" if self.steps == 1 else "s")
        if self.kind == "done":
            return f"done: {self.seconds:.3f} s total, {steps}"
        if self.kind == "running":
            return f"running: {self.seconds:.2f} s, {steps}"
        return f"{self.kind} after {self.seconds:.3f} s, {steps}" + (f": {self.error}" if self.error else "")


def request_outcome(events: Sequence[Event]) -> Outcome:
    """How the request of `events` ended (or that it runs yet): its first request_end or request_failed event."""
    steps = sum(event.kind == "step" for event in events)
    for event in events:
        if event.kind == "request_end":
            return Outcome("done", float(event.data.get("total", event.t)), steps)
        if event.kind == "request_failed":
            error = str(event.data.get("error", ""))
            if event.data.get("stopped"):
                return Outcome("stopped", event.t, steps)
            if event.data.get("interrupted"):
                return Outcome("interrupted", event.t, steps)
            return Outcome("failed", event.t, steps, error)
    return Outcome("running", max((event.t for event in events), default=0.0), steps)


def stage_timeline(events: Sequence[Event]) -> Figure:
    """A Gantt-like chart: one row per stage, one bar per interval, a tick per finished denoising step.

    The title says how the request ended (`request_outcome`): "request done: 2.610 s total, 2 steps", "request
    stopped after ...", "request interrupted after ...", "request failed after ...: <error>", or "running: ..." while
    no end event is among `events`. A stage still running ends at the latest event and is hatched; one a stop, an
    interrupt or a failure cut off ends at that instant, translucent with a dashed red edge, and a red line there says
    how the request ended. Returns a figure with one axes.
    """
    intervals = stage_intervals(events)
    outcome = request_outcome(events)
    rows = _stage_order(interval.stage for interval in intervals)
    figure = _time_figure(0.4 * max(len(rows), 1))
    axes = figure.add_subplot()
    for interval in intervals:
        y = rows.index(interval.stage)
        cut = interval.open and outcome.ended  # it will never finish
        axes.broken_barh(
            [(interval.start, interval.end - interval.start)],
            (y - 0.35, 0.7),
            facecolors=_COLORS.get(interval.stage, _OTHER_COLOR),
            alpha=0.55 if interval.open else 1.0,
            hatch="//" if interval.open and not cut else None,
            edgecolors=_CUT_COLOR if cut else "none",
            linestyles="--",
            linewidth=1.5 if cut else 0,
        )
    steps = [e.t for e in events if e.kind == "step"]
    if steps and "denoise" in rows:
        y = rows.index("denoise")
        axes.vlines(steps, y - 0.35, y + 0.35, colors="black", linewidth=1)
    axes.set_yticks(range(len(rows)), rows)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    end = _chart_end(intervals, events, None)
    axes.set_xlim(0, end * 1.02)
    axes.set_xlabel("seconds since request start")
    if outcome.kind not in ("done", "running"):
        axes.axvline(outcome.seconds, color=_CUT_COLOR, linestyle="--", linewidth=1.5)
        at_top = {"xycoords": ("data", "axes fraction"), "xytext": (-3, -3), "textcoords": "offset points"}
        axes.annotate(outcome.kind, (outcome.seconds, 1.0), **at_top, ha="right", va="top", color=_CUT_COLOR)
    axes.set_title(str(outcome) if outcome.kind == "running" else f"request {outcome}", fontsize=10)
    if not intervals:
        axes.text(0.5, 0.5, "no stage events yet", ha="center", va="center", transform=axes.transAxes)
    return figure


# the live SVGs' plot area: `width` less these margins (px), the stage names right-aligned in the left one
_SVG_LEFT, _SVG_RIGHT = 100, 10


def timeline_svg(events: Sequence[Event], now: float | None = None, width: int = 640) -> str:
    """`stage_timeline`'s chart as an inline SVG string: one row per stage, open stages translucent (a stage a
    request_failed event cut off also with a dashed red edge), a tick per finished denoising step, seconds on a bottom
    axis. For live redraws; `width` in pixels, the time axis the same as `memory_svg`'s of the same `now` and `width`."""
    intervals = stage_intervals(events, now)
    ended = request_outcome(events).ended
    rows = _stage_order(interval.stage for interval in intervals)
    steps = [e.t for e in events if e.kind == "step"]
    scale = _svg_scale(intervals, events, now, width)
    plot_width = width - _SVG_LEFT - _SVG_RIGHT
    row_height, top = 22, 6
    height = top + row_height * max(len(rows), 1) + 24

    def x(seconds: float) -> float:
        return _SVG_LEFT + scale * seconds

    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif"'
    parts = [svg + ' font-size="11" fill="currentColor">']  # text in the theme's colour (black without one)
    for y, stage in enumerate(rows):
        parts.append(
            f'<text x="{_SVG_LEFT - 6}" y="{top + row_height * y + 15}" text-anchor="end">{html.escape(stage)}</text>'
        )
    for interval in intervals:
        y = top + row_height * rows.index(interval.stage) + 3
        color = _COLORS.get(interval.stage, _OTHER_COLOR)
        opacity = 0.55 if interval.open else 1.0
        cut = f' stroke="{_CUT_COLOR}" stroke-dasharray="4 2"' if interval.open and ended else ""
        parts.append(
            f'<rect x="{x(interval.start):.1f}" y="{y}" width="{max(x(interval.end) - x(interval.start), 1.0):.1f}" '
            f'height="{row_height - 6}" fill="{color}" fill-opacity="{opacity}"{cut}/>'
        )
    if steps and "denoise" in rows:
        y = top + row_height * rows.index("denoise") + 3
        for t in steps:
            parts.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y}" y2="{y + row_height - 6}" stroke="black"/>')
    axis = top + row_height * max(len(rows), 1) + 2
    parts.append(f'<line x1="{_SVG_LEFT}" x2="{_SVG_LEFT + plot_width}" y1="{axis}" y2="{axis}" stroke="#666"/>')
    end = plot_width / scale  # seconds at the plot area's right edge
    for tick in MaxNLocator(nbins=6).tick_values(0.0, end):
        if 0.0 <= tick <= end:
            parts.append(f'<text x="{x(tick):.1f}" y="{axis + 14}" text-anchor="middle">{tick:g} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def memory_svg(events: Sequence[Event], now: float | None = None, width: int = 640) -> str:
    """`memory_plot`'s live twin as an inline SVG string (plain string formatting, like `timeline_svg`), or "" while
    no event carries a memory reading.

    On a GPU: the peak allocated memory (stage_end `peak_bytes`) of each stage finished so far, one bar a stage in MiB
    (the largest spans the plot area). On the CPU: host RSS (`rss_bytes`) at each event that carries it as a line over
    seconds since request start, on `timeline_svg`'s time axis for the same `now` and `width` (drawn one above the
    other, the two line up); its y axis spans `_memory_limits` (at least a few MiB), its ends labelled in MiB."""
    peaks, readings = _memory_readings(events)
    if not peaks and not readings:
        return ""
    row_height, top = 18, 16
    open_tag = f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{{height}}" font-family="sans-serif"'
    open_tag += ' font-size="11" fill="currentColor">'
    if peaks:
        stages = _stage_order(peaks)
        scale = (width - _SVG_LEFT - _SVG_RIGHT - 60) / max(max(peaks.values()), 1)  # 60 px for the largest's label
        parts = [open_tag.format(height=top + row_height * len(stages) + 4)]
        parts.append(f'<text x="{_SVG_LEFT}" y="11">peak allocated memory per stage</text>')
        for row, stage in enumerate(stages):
            y = top + row_height * row
            bar = max(peaks[stage] * scale, 1.0)
            parts.append(f'<text x="{_SVG_LEFT - 6}" y="{y + 12}" text-anchor="end">{html.escape(stage)}</text>')
            parts.append(
                f'<rect x="{_SVG_LEFT}" y="{y + 2}" width="{bar:.1f}" height="{row_height - 4}" '
                f'fill="{_COLORS.get(stage, _OTHER_COLOR)}"/>'
            )
            parts.append(f'<text x="{_SVG_LEFT + bar + 4:.1f}" y="{y + 12}">{peaks[stage] / 2**20:.0f} MiB</text>')
        return "".join(parts) + "</svg>"
    scale = _svg_scale(stage_intervals(events, now), events, now, width)
    plot_height = 40
    low, high = _memory_limits([mib for _, mib in readings])

    def x(seconds: float) -> float:
        return _SVG_LEFT + scale * seconds

    def y(mib: float) -> float:
        return top + plot_height * (high - mib) / (high - low)

    points = " ".join(f"{x(t):.1f},{y(mib):.1f}" for t, mib in readings)
    now_mib, peak = readings[-1][1], max(mib for _, mib in readings)
    title = f"host RSS (process resident memory): {now_mib:.0f} MiB, peak {peak:.0f} MiB"
    parts = [open_tag.format(height=top + plot_height + 4), f'<text x="{_SVG_LEFT}" y="11">{title}</text>']
    for mib, baseline in ((high, top + 9), (low, top + plot_height)):  # the axis' ends
        parts.append(f'<text x="{_SVG_LEFT - 6}" y="{baseline}" text-anchor="end">{mib:.0f} MiB</text>')
    parts.append(f'<polyline points="{points}" fill="none" stroke="currentColor" stroke-width="1.5"/>')
    return "".join(parts) + "</svg>"


def memory_plot(events: Sequence[Event]) -> Figure:
    """The request's memory in MiB, as the device it ran on measures it. Returns a figure with one axes.

    On a GPU: the peak allocated device memory per stage, one bar each, the maximum over that stage's intervals
    (stage_end `peak_bytes`). On the CPU, which has no device memory: the process's resident set size (host RSS,
    `rss_bytes`) at each event that carries it (stage starts and ends, steps, the request's end) over seconds since
    request start, on the timeline's time axis with the stages shaded in its colours. RSS is read at those instants
    only, so memory taken and given back between two readings does not show. Events with neither say so in text.
    """
    peaks, readings = _memory_readings(events)
    if not peaks and readings:
        return _host_rss_plot(events, readings)
    figure = Figure(figsize=(6, 2.6 if peaks else 0.9), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title("peak allocated memory per stage", fontsize=10)
    if not peaks:
        _say(axes, "no memory readings in these events")
        return figure
    stages = _stage_order(peaks)
    mib = [peaks[stage] / 2**20 for stage in stages]
    bars = axes.bar(stages, mib, color=[_COLORS.get(stage, _OTHER_COLOR) for stage in stages])
    axes.bar_label(bars, labels=[f"{value:.0f}" for value in mib], fontsize=8)
    axes.set_ylabel("MiB")
    return figure


def _host_rss_plot(events: Sequence[Event], readings: Sequence[tuple[float, float]]) -> Figure:
    """`memory_plot` on the CPU: host RSS `readings` (seconds, MiB) as a line over the stages of `events`, the y axis
    over `_memory_limits` (at least a few MiB: the noise between readings does not fill it as a steep climb)."""
    intervals = stage_intervals(events)
    figure = _time_figure(1.6)
    axes = figure.add_subplot()
    for interval in intervals:
        color = _COLORS.get(interval.stage, _OTHER_COLOR)
        axes.axvspan(interval.start, interval.end, color=color, alpha=0.18, linewidth=0)
    times, mib = zip(*readings, strict=True)
    axes.plot(times, mib, marker=".", color="#333333", linewidth=1)
    axes.set_xlim(0, _chart_end(intervals, events, None) * 1.02)
    axes.set_ylim(*_memory_limits(mib))
    axes.set_xlabel("seconds since request start")
    axes.set_ylabel("MiB")
    axes.set_title(f"host RSS (process resident memory; no device memory on CPU): peak {max(mib):.0f} MiB", fontsize=10)
    return figure


_CAPTION_CHARACTERS = 110  # a caption line of `ab_audio_figure` at 10 pt: well inside its 10 in (720 pt) width


def ab_audio_figure(
    a_audio: np.ndarray, b_audio: np.ndarray, sample_rate: int, labels: tuple[str, str] = ("A", "B")
) -> Figure:
    """Waveforms and spectrograms of A and B, and their difference (B - A), in a 3x2 grid (six axes).

    Audio is float (C, N) or (N,); channels are averaged to what a listener hears summed. A and B share
    their amplitude and dB scales so a louder arm looks louder; each spectrogram's title gives its colour scale's
    range in dB (the difference's is symmetric about 0). The difference's title gives B's SNR against A
    over the channels (`quality.audio_snr_db`, the budget's waveform SNR) when both have the same layout. When
    lengths differ, the differences cover the common start and say so. When A and B are equal sample for sample
    (same shape), there is no difference to draw: the bottom row is one text-only axes saying so (five axes).

    The axes are titled "A: ...", "B: ..." and "B - A: ..." whatever the labels, so titles stay short enough not to
    overlap their neighbours; `labels` other than ("A", "B") are spelled out in full in the figure's title (its
    suptitle), "A: <label>" and "B: <label>", each wrapped to lines that fit the figure's width.
    """
    if not isinstance(sample_rate, int | np.integer) or sample_rate <= 0:
        raise ValueError(f"sample_rate: expected a positive integer in Hz, got {sample_rate!r}")
    a = _mono(a_audio, "a_audio")
    b = _mono(b_audio, "b_audio")
    n = min(a.size, b.size)
    identical = np.array_equal(a_audio, b_audio)
    figure = Figure(figsize=(10, 5.4 if identical else 7), layout="constrained")
    if tuple(labels) != ("A", "B"):
        lines = [
            textwrap.fill(f"{arm}: {label}", _CAPTION_CHARACTERS, subsequent_indent="    ")
            for arm, label in zip("AB", labels, strict=True)
        ]
        figure.suptitle("\n".join(lines), x=0.01, ha="left", fontsize=10)
    rows = figure.add_gridspec(3, 2, height_ratios=(1, 1, 0.25 if identical else 1))
    waves = [figure.add_subplot(rows[0, column]) for column in range(2)]
    spectrograms = [figure.add_subplot(rows[1, column]) for column in range(2)]
    peak = max(np.abs(a).max(initial=0.0), np.abs(b).max(initial=0.0), 1e-6)
    spectra = [_spectrogram(x, sample_rate) for x in (a, b)]
    low = min(np.percentile(db, 5) for _, _, db in spectra)
    high = max(db.max() for _, _, db in spectra)
    for column, (x, arm, (freqs, times, db)) in enumerate(zip((a, b), "AB", spectra, strict=True)):
        wave_axes, spec_axes = waves[column], spectrograms[column]
        wave_axes.plot(np.arange(x.size) / sample_rate, x, linewidth=0.6)
        wave_axes.set_ylim(-peak * 1.05, peak * 1.05)
        wave_axes.set_title(f"{arm}: waveform ({x.size / sample_rate:.2f} s)", fontsize=10)
        _show_spectrogram(spec_axes, freqs, times, db, "magma", low, high)
        spec_axes.set_title(f"{arm}: spectrogram, {low:.3g} to {high:.3g} dB", fontsize=10)
    for axes in (waves[0], spectrograms[0]):
        axes.set_xlabel("s")
    if identical:
        channels = 1 if np.ndim(a_audio) == 1 else np.shape(a_audio)[0]
        equal = f"every sample equal ({channels} ch x {np.shape(a_audio)[-1]} samples)"
        _say(figure.add_subplot(rows[2, :]), f"A and B are identical: {equal}", fontsize=12)
        return figure
    grid = [figure.add_subplot(rows[2, column]) for column in range(2)]
    suffix = "" if a.size == b.size else f"\n(first {n / sample_rate:.2f} s: lengths differ)"
    difference = b[:n] - a[:n]
    grid[0].plot(np.arange(n) / sample_rate, difference, color="#e15759", linewidth=0.6)
    grid[0].set_ylim(-peak * 1.05, peak * 1.05)
    snr = (
        audio_snr_db(*(np.atleast_2d(x) for x in (a_audio, b_audio))) if np.ndim(a_audio) == np.ndim(b_audio) else None
    )
    snr_text = "" if snr is None else ", identical" if snr == np.inf else f", SNR {snr:.1f} dB"
    grid[0].set_title(f"B - A: waveform{snr_text}{suffix}", fontsize=10)
    grid[0].set_xlabel("s")
    freqs, times, db_a = _spectrogram(a[:n], sample_rate)
    _, _, db_b = _spectrogram(b[:n], sample_rate)
    delta = db_b - db_a
    limit = max(float(np.abs(delta).max(initial=0.0)), 1e-3)
    _show_spectrogram(grid[1], freqs, times, delta, "RdBu_r", -limit, limit)
    grid[1].set_title(f"B - A: spectrogram, {-limit:.3g} to {limit:.3g} dB{suffix}", fontsize=10)
    return figure


def frame_metric_curves(
    psnr: np.ndarray,
    ssim: np.ndarray,
    current: int | None = None,
    budget: dict[str, float | None] | None = None,
    size: tuple[float, float] = (8, 3.6),
) -> Figure:
    """Per-frame PSNR (dB) and SSIM as two stacked curves, with frame `current` marked.

    Identical frames have infinite PSNR; they are left out of the curve and counted in its title.
    `budget` (a `Budget.to_dict()`) draws its limits as dashed lines: `psnr_db` on the PSNR axes (the
    budget applies it to the whole clip; per frame it is a guide) and `min_ssim` on the SSIM axes (the
    budget applies it to the worst frame). `size` is the figure size in inches. The frame axis has whole-frame ticks
    only (a single frame: one tick at 0, in -0.5..0.5). Returns a figure with two axes; when every frame is identical
    (no finite PSNR to draw), one text-only axes saying so.
    """
    psnr = np.asarray(psnr, dtype=np.float64)
    ssim = np.asarray(ssim, dtype=np.float64)
    if psnr.ndim != 1 or psnr.shape != ssim.shape:
        raise ValueError(f"psnr, ssim: expected two 1-D arrays of one length, got {psnr.shape} and {ssim.shape}")
    if current is not None and not 0 <= current < psnr.size:
        raise ValueError(f"current: frame {current} is outside 0..{psnr.size - 1}")
    frames = np.arange(psnr.size)
    identical = int(np.isposinf(psnr).sum())
    small = size[0] < 5
    figure = Figure(figsize=size, layout="constrained")
    if psnr.size and identical == psnr.size:
        _say(figure.add_subplot(), f"A and B are identical:\nevery frame equal\n({psnr.size} of {psnr.size} frames)")
        return figure
    top, bottom = figure.subplots(2, 1, sharex=True)
    top.plot(frames, np.where(np.isfinite(psnr), psnr, np.nan), marker=".", color="#4e79a7")
    top.set_ylabel("PSNR (dB)")
    finite = psnr[np.isfinite(psnr)]
    title = f"min PSNR {finite.min():.2f} dB" if finite.size else "no finite PSNR"
    if identical and finite.size:
        title += f"; {identical} identical" if small else f"; {identical} identical frame(s) (PSNR = inf, not drawn)"
    top.set_title(title, fontsize=9 if small else 10)
    bottom.plot(frames, ssim, marker=".", color="#59a14f")
    bottom.set_ylabel("SSIM")
    bottom.set_xlabel("frame")
    # ticks on whole frames only, a single frame's included (min_n_ticks=1; else it falls back to -0.03, 0, 0.03)
    bottom.xaxis.set_major_locator(MaxNLocator(nbins=4 if small else "auto", integer=True, min_n_ticks=1))
    if psnr.size == 1:
        bottom.set_xlim(-0.5, 0.5)  # autoscaling a single point spans +-0.03 of a frame
    bottom.set_title(f"min SSIM {ssim.min():.4f}" if ssim.size else "no frames", fontsize=9 if small else 10)
    limits = budget or {}
    for axes, key, label in ((top, "psnr_db", "budget {:g} dB"), (bottom, "min_ssim", "budget {:g}")):
        if limits.get(key) is not None:
            axes.axhline(limits[key], color="#e15759", linestyle="--", linewidth=1, label=label.format(limits[key]))
            axes.legend(loc="lower right", fontsize=8)
    if current is not None:
        for axes in (top, bottom):
            axes.axvline(current, color="#e15759", linewidth=1.5)
    return figure


_RUN_TICKS = 12  # the most run names `round_times` writes under its axes (A99 at 10 pt is 28 px of the axes' ~440)


def round_times(baseline_seconds: Sequence[float], candidate_seconds: Sequence[float]) -> Figure:
    """Seconds of each timed run of both arms in A/B/A order: baseline runs 0..R, candidate runs 1..R.

    The harness times A, B, A, ..., A: candidate round r (1-based) sits between baseline runs r-1 and r,
    and is paired with their mean. The x ticks name the runs (A0, B1, A1, ...), every run up to `_RUN_TICKS` runs and
    evenly spaced ones beyond, so the names never run together; the y axis starts at 0 with room above the slowest
    run, and the legend sits outside the axes, so no point is hidden under it or on the frame.
    """
    a = np.asarray(baseline_seconds, dtype=np.float64)
    b = np.asarray(candidate_seconds, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or b.size == 0 or a.size != b.size + 1:
        raise ValueError(
            f"baseline_seconds, candidate_seconds: expected R + 1 and R >= 1 timings (A/B/A), got {a.size} and {b.size}"
        )
    figure = Figure(figsize=(6, 3), layout="constrained")
    axes = figure.subplots()
    order_a = np.arange(a.size) * 2  # run position in the A, B, A, ... sequence
    axes.plot(order_a, a, marker="o", color="#4e79a7", label="baseline")
    axes.plot(order_a[:-1] + 1, b, marker="s", color="#f28e2b", label="candidate")
    runs = a.size + b.size
    step = 1 if runs <= _RUN_TICKS else 2 * int(np.ceil(runs / _RUN_TICKS / 2))  # even: the ticks name A runs
    ticks = np.arange(0, runs, step)
    axes.set_xticks(ticks, [f"A{i // 2}" if i % 2 == 0 else f"B{i // 2 + 1}" for i in ticks])
    axes.set_xlabel("timed run (A = baseline, B = candidate round)")
    axes.set_ylabel("seconds")
    axes.set_ylim(0, 1.1 * max(a.max(), b.max()))
    figure.legend(loc="outside right upper", fontsize=8)
    axes.set_title("per-round request time", fontsize=10)
    return figure


LABEL_PT = 9  # the size of the report figures' point labels and legends: 12.5 px at 100 dpi, the ticks' 10 are 13.9
# Where a point's label may go, in points from the point, in the order tried: beside it, then 2.5 times as far.
_LABEL_OFFSETS = [
    (x * k, y * k) for k in (1, 2.5) for x, y in ((7, 0), (6, 6), (6, -6), (-7, 0), (-6, 6), (-6, -6), (0, 7), (0, -7))
]
_MARKER_REACH = 4  # points from a point's centre that its label must keep clear of
_LABEL_BOX = {"boxstyle": "square,pad=0.1", "edgecolor": "none", "alpha": 0.7}  # its face: the axes' background


def label_points(axes: Axes, points: Sequence[tuple[float, float, str]], fontsize: float) -> None:
    """Write each (x, y, text) of `points` beside its point, in order: at the first of `_LABEL_OFFSETS` where the
    label stays inside `axes` and covers no point and no label written before it, else at the first offset.

    Call it once the axes' limits, scales and layout are final: positions are measured on the figure as drawn. The
    labels take no part in the figure's layout and sit on a translucent box of the axes' background colour (white in
    matplotlib's default style; black under a dark one such as "dark_background", whose text is white), readable over
    lines and grid.
    """
    axes.figure.draw_without_rendering()
    inside = axes.get_window_extent()
    reach = _MARKER_REACH * axes.figure.dpi / 72
    centres = [axes.transData.transform((x, y)) for x, y, _ in points]
    taken = [Bbox.from_extents(x - reach, y - reach, x + reach, y + reach) for x, y in centres]
    under = {**_LABEL_BOX, "facecolor": axes.get_facecolor()}
    for x, y, text in points:
        label = axes.annotate(
            text, (x, y), xytext=_LABEL_OFFSETS[0], textcoords="offset points", fontsize=fontsize, bbox=under
        )
        label.set_in_layout(False)
        for dx, dy in [*_LABEL_OFFSETS, _LABEL_OFFSETS[0]]:  # the last: where it goes when no offset is free
            label.xyann = (dx, dy)
            label.set_horizontalalignment("left" if dx > 0 else "right" if dx < 0 else "center")
            label.set_verticalalignment("bottom" if dy > 0 else "top" if dy < 0 else "center")
            box = label.get_window_extent()
            if inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1) and not box.count_overlaps(taken):
                break
        taken.append(box)


def figure_png(figure: Figure, dpi: int = 100) -> bytes:
    """Render `figure` to PNG bytes (Agg, thread-safe: no pyplot state)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def png_figure_html(png: bytes, caption: str, style: str = "") -> str:
    """PNG bytes as a self-contained HTML `<figure>` (a data-URI image), `caption` (escaped) its alt text and its
    caption; `style`, when given, the figure's inline style."""
    text = html.escape(caption)
    data = base64.b64encode(png).decode()
    styled = f' style="{style}"' if style else ""
    return (
        f'<figure{styled}><img alt="{text}" src="data:image/png;base64,{data}"><figcaption>{text}</figcaption></figure>'
    )


def array_png(image: np.ndarray) -> bytes:
    """Encode a uint8 (H, W, 3) or (H, W) image to PNG bytes; fast compression, since views re-encode often."""
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise ValueError(f"image: expected uint8 (H, W) or (H, W, 3), got {image.dtype} {image.shape}")
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


# the static figures over seconds since request start (`stage_timeline`, `_host_rss_plot`): inches, the same in both,
# so that shown one above the other at the same size their time axes line up (the left one holds a stage's name)
_TIME_WIDTH, _TIME_LEFT, _TIME_RIGHT, _TIME_TOP, _TIME_BOTTOM = 8.0, 1.2, 0.2, 0.35, 0.5


def _time_figure(plot_height: float) -> Figure:
    """A figure `_TIME_WIDTH` wide whose one axes will span `plot_height` inches at the fixed margins above."""
    height = plot_height + _TIME_TOP + _TIME_BOTTOM
    figure = Figure(figsize=(_TIME_WIDTH, height))
    figure.subplots_adjust(
        left=_TIME_LEFT / _TIME_WIDTH,
        right=1 - _TIME_RIGHT / _TIME_WIDTH,
        top=1 - _TIME_TOP / height,
        bottom=_TIME_BOTTOM / height,
    )
    return figure


def _chart_end(intervals: Sequence[Interval], events: Sequence[Event], now: float | None) -> float:
    """A timeline's last instant in seconds: the latest interval end, event or `now`, and at least 1 ms."""
    return max([i.end for i in intervals] + [e.t for e in events] + [now or 0.0, 1e-3])


def _memory_readings(events: Sequence[Event]) -> tuple[dict[str, int], list[tuple[float, float]]]:
    """The memory `events` carry: ({stage: its peak allocated device bytes, the maximum of its stage_end
    `peak_bytes`}, [(seconds, host RSS in MiB) of each event with `rss_bytes`, in order])."""
    peaks: dict[str, int] = {}
    for event in events:
        if event.kind == "stage_end" and event.stage is not None and "peak_bytes" in event.data:
            peaks[event.stage] = max(peaks.get(event.stage, 0), int(event.data["peak_bytes"]))
    readings = [(event.t, event.data["rss_bytes"] / 2**20) for event in events if "rss_bytes" in event.data]
    return peaks, readings


def _svg_scale(intervals: Sequence[Interval], events: Sequence[Event], now: float | None, width: int) -> float:
    """The live SVGs' pixels per second: their plot area (`width` less `_SVG_LEFT` and `_SVG_RIGHT`) spans 1.02 times
    `_chart_end`, so a timeline and a memory line of the same events, `now` and `width` share their time axis."""
    return (width - _SVG_LEFT - _SVG_RIGHT) / (_chart_end(intervals, events, now) * 1.02)


# a memory axis spans at least this fraction of the peak reading or this many MiB, whichever is more
_MEMORY_MIN_SPAN_FRACTION, _MEMORY_MIN_SPAN_MIB = 0.02, 4.0


def _memory_limits(mib: Sequence[float]) -> tuple[float, float]:
    """Y-axis limits (low, high) in MiB for the non-empty memory readings `mib`: their range widened about its middle
    to at least `_MEMORY_MIN_SPAN_FRACTION` of the peak or `_MEMORY_MIN_SPAN_MIB` (a flat RSS, whose readings differ by
    a few KiB of noise, would otherwise fill the axis as a steep climb), plus 5 % margins each side, never below 0."""
    low, high = min(mib), max(mib)
    span = max(high - low, _MEMORY_MIN_SPAN_FRACTION * high, _MEMORY_MIN_SPAN_MIB) * 1.1
    bottom = max(0.0, (low + high - span) / 2)
    return bottom, bottom + span


def _stage_order(stages: Iterable[str]) -> list[str]:
    """Known stages in pipeline order, unknown ones after them in first-seen order."""
    seen = list(dict.fromkeys(stages))
    return [s for s in STAGES if s in seen] + [s for s in seen if s not in STAGES]


def _say(axes, text: str, fontsize: float = 10) -> None:
    """Turn `axes` into a plain statement: `text` centred, no frame or ticks (where a plot would show nothing)."""
    axes.set_axis_off()
    axes.text(0.5, 0.5, text, ha="center", va="center", fontsize=fontsize, transform=axes.transAxes)


def _mono(audio: np.ndarray, name: str) -> np.ndarray:
    audio = np.asarray(audio)
    if audio.ndim not in (1, 2) or audio.size == 0:
        raise ValueError(f"{name}: expected non-empty audio (C, N) or (N,), got shape {audio.shape}")
    mono = audio.astype(np.float64) if audio.ndim == 1 else audio.astype(np.float64).mean(axis=0)
    if not np.isfinite(mono).all():
        raise ValueError(f"{name}: contains non-finite samples")
    return mono


def _spectrogram(x: np.ndarray, sample_rate: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Power spectrogram in dB: (frequencies Hz, times s, dB (F, T))."""
    segment = int(min(512, x.size))
    freqs, times, power = signal.spectrogram(x, fs=sample_rate, nperseg=segment, noverlap=segment // 2)
    return freqs, times, 10.0 * np.log10(power + 1e-12)


def _show_spectrogram(axes, freqs, times, values, cmap: str, low: float, high: float) -> None:
    """`values` (F, T) over `freqs` (Hz) and `times` (s), on a log frequency axis from the first bin above 0 Hz: on a
    linear one the octaves where hums, voices and most artifacts sit get a few pixels at the bottom. Linear when
    there are too few bins to drop 0 Hz."""
    if freqs.size > 2:
        freqs, values = freqs[1:], values[1:]
        axes.set_yscale("log")
    axes.pcolormesh(times, freqs, values, shading="nearest", cmap=cmap, vmin=low, vmax=high)
    axes.set_ylabel("Hz")
