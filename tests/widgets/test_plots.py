import re
import warnings

import matplotlib.style
import numpy as np
import psutil
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.text import Text

from workbench.plots import (
    ab_audio_figure,
    array_png,
    figure_png,
    frame_metric_curves,
    label_points,
    memory_plot,
    memory_svg,
    stage_intervals,
    stage_timeline,
    timeline_svg,
)
from workbench.quality.audio import audio_snr_db
from workbench.telemetry import Event, Telemetry

PNG = b"\x89PNG\r\n\x1a\n"


def cpu_events() -> list[Event]:
    """The shape of a tiny LTX-2 request on the CPU: text encoded twice, two steps, two audio decodes."""
    return [
        Event("stage_start", 0.00, "text_encode"),
        Event("stage_end", 0.50, "text_encode", {"seconds": 0.50}),
        Event("stage_start", 0.50, "text_encode"),
        Event("stage_end", 0.60, "text_encode", {"seconds": 0.10}),
        Event("stage_start", 0.62, "denoise"),
        Event("step", 1.50, "denoise", {"index": 0}),
        Event("step", 2.40, "denoise", {"index": 1}),
        Event("stage_end", 2.40, "denoise", {"seconds": 1.78}),
        Event("stage_start", 2.40, "video_decode"),
        Event("stage_end", 2.60, "video_decode", {"seconds": 0.20}),
        Event("request_end", 2.61, None, {"total": 2.61}),
    ]


def test_stage_intervals_pair_repeated_stages_and_extend_open_ones_to_now():
    events = cpu_events()
    intervals = stage_intervals(events)
    assert [(i.stage, i.start, i.end) for i in intervals][:2] == [("text_encode", 0.0, 0.5), ("text_encode", 0.5, 0.6)]
    assert not any(i.open for i in intervals)
    running = stage_intervals(events[:6], now=2.0)
    assert running[-1].stage == "denoise" and running[-1].open and running[-1].end == 2.0


def test_stage_timeline_has_one_axes_with_a_row_per_stage_and_step_ticks():
    figure = stage_timeline(cpu_events())
    assert len(figure.axes) == 1
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_yticklabels()] == ["text_encode", "denoise", "video_decode"]
    assert len(axes.collections[-1].get_segments()) == 2  # one tick per denoising step
    assert axes.get_title() == "request done: 2.610 s total, 2 steps"
    assert figure_png(figure).startswith(PNG)


def test_cpu_telemetry_reads_host_rss_and_memory_plot_draws_it_over_the_request():
    """The CPU has no device memory: its memory panel is the process's resident set size, labelled as host RSS."""
    telemetry = Telemetry(torch.device("cpu"))
    telemetry.begin("denoise")
    telemetry.step(0, telemetry.marker())
    telemetry.end("denoise")
    telemetry.finish()
    assert [e.kind for e in telemetry.events] == ["stage_start", "step", "stage_end", "request_end"]
    rss = [e.data["rss_bytes"] for e in telemetry.events]
    now = psutil.Process().memory_info().rss  # each reading is this process's RSS at its event
    assert all(abs(value - now) < 64 * 2**20 for value in rss) and telemetry.memory == {}  # no device peaks
    events = [Event(e.kind, e.t, e.stage, {**e.data, "rss_bytes": (i + 1) * 2**20}) for i, e in enumerate(cpu_events())]
    figure = memory_plot(events)
    assert len(figure.axes) == 1
    axes = figure.axes[0]
    assert "host RSS" in axes.get_title() and "peak 11 MiB" in axes.get_title() and axes.get_ylabel() == "MiB"
    (line,) = axes.lines
    assert list(line.get_xdata()) == [e.t for e in events] and list(line.get_ydata()) == list(range(1, 12))
    assert axes.get_xlim()[1] >= 2.61  # the timeline's time axis: the whole request
    nothing = memory_plot(cpu_events())  # events without readings (recorded before there were any) say so
    assert [text.get_text() for text in nothing.axes[0].texts] == ["no memory readings in these events"]
    # a flat RSS (readings a few KiB apart) spans at least 2 % of its peak: its noise drew as a steep climb
    noise = [600 * 2**20 + 4096 * (i % 3) for i in range(len(events))]
    flat = [Event(e.kind, e.t, e.stage, {**e.data, "rss_bytes": rss}) for e, rss in zip(events, noise, strict=True)]
    low, high = memory_plot(flat).axes[0].get_ylim()
    assert high - low >= 0.02 * 600 and low < 600 < 600.01 < high
    # shown one above the other at the same size (the static copies), the two time axes line up, pixel for pixel,
    # and the longest stage name stays inside the timeline's figure
    timeline = stage_timeline(events)
    spans = [(f.get_figwidth(), f.axes[0].get_position().x0, f.axes[0].get_position().x1) for f in (timeline, figure)]
    assert spans[0] == spans[1] and timeline.axes[0].get_xlim() == figure.axes[0].get_xlim()
    renderer = FigureCanvasAgg(timeline).get_renderer()
    assert min(label.get_window_extent(renderer).x0 for label in timeline.axes[0].get_yticklabels()) > 0


def test_live_svgs_draw_memory_on_the_timelines_time_axis_and_mark_a_cut_off_stage():
    """`memory_svg` is the live plot's memory: host RSS as a line on `timeline_svg`'s time axis (the same x for the
    same instant), device peaks as a bar a finished stage, nothing without readings. A stage a request_failed event
    cut off gets the cut's dashed red edge in `timeline_svg`; one still running does not."""
    rss = [Event(e.kind, e.t, e.stage, {**e.data, "rss_bytes": (600 + i) * 2**20}) for i, e in enumerate(cpu_events())]
    running = rss[:6]  # in denoise, one step done
    line = memory_svg(running, now=2.0)
    assert line.startswith("<svg") and ">host RSS (process resident memory): 605 MiB, peak 605 MiB</text>" in line
    xs = [float(point.split(",")[0]) for point in re.search(r'<polyline points="([^"]+)"', line)[1].split()]
    step = re.search(r'<line x1="([\d.]+)"', timeline_svg(running, now=2.0))[1]  # the step's tick on the timeline
    assert len(xs) == 6 and xs[-1] == float(step)
    peaks = [Event("stage_end", 1.0, "denoise", {"seconds": 1.0, "peak_bytes": 300 * 2**20})]
    assert ">denoise</text>" in memory_svg(peaks) and ">300 MiB</text>" in memory_svg(peaks)
    assert memory_svg(cpu_events()) == ""  # no readings: nothing to draw
    cut = [*running, Event("request_failed", 2.0, None, {"error": "RuntimeError: boom", "stopped": False})]
    assert 'stroke="#e15759"' in timeline_svg(cut) and 'stroke="#e15759"' not in timeline_svg(running, now=2.0)


def test_memory_plot_bars_are_the_peak_per_stage_in_mib():
    events = [
        Event("stage_end", 1.0, "text_encode", {"seconds": 1.0, "peak_bytes": 2 * 2**20}),
        Event("stage_end", 2.0, "text_encode", {"seconds": 1.0, "peak_bytes": 5 * 2**20}),
        Event("stage_end", 3.0, "denoise", {"seconds": 1.0, "peak_bytes": 7 * 2**20}),
    ]
    axes = memory_plot(events).axes[0]
    assert [bar.get_height() for bar in axes.patches] == [5.0, 7.0]


def test_ab_audio_figure_has_waveforms_spectrograms_and_differences(rng):
    a = rng.uniform(-0.5, 0.5, (2, 3001)).astype(np.float32)
    b = a[:, :2500] + rng.normal(0, 0.01, (2, 2500)).astype(np.float32)
    figure = ab_audio_figure(a, b, 16000)
    assert len(figure.axes) == 6
    assert "lengths differ" in figure.axes[4].get_title()
    assert f"SNR {audio_snr_db(a, b):.1f} dB" in figure.axes[4].get_title()
    start = ab_audio_figure(a, a[:, :2500], 16000)  # identical over the common start only: still drawn
    assert len(start.axes) == 6 and "identical\n(first 0.16 s: lengths differ)" in start.axes[4].get_title()
    assert start.get_suptitle() == ""  # the labels are the arms' letters: nothing to spell out
    same = ab_audio_figure(a, a.copy(), 16000, labels=("#1", "#2"))  # no difference to draw: a statement instead
    assert len(same.axes) == 5 and not same.axes[4].axison
    assert [t.get_text() for t in same.axes[4].texts] == [
        "A and B are identical: every sample equal (2 ch x 3001 samples)"
    ]
    assert same.get_suptitle() == "A: #1\nB: #2"
    for spectrogram in figure.axes[2:4] + figure.axes[5:]:  # log frequency, from the first bin above 0 Hz to Nyquist
        assert (
            spectrogram.get_yscale() == "log" and 0 < spectrogram.get_ylim()[0] < 32 < 7900 < spectrogram.get_ylim()[1]
        )
        low, high = spectrogram.collections[0].get_clim()  # the colour scale, as the title gives it
        assert f": spectrogram, {low:.3g} to {high:.3g} dB" in spectrogram.get_title(), (low, high)
    assert figure_png(figure).startswith(PNG)


THREE_PLUGINS = "#3 cross_kv_cache + first_block_cache + selective_fp8"


@pytest.mark.parametrize(
    "labels, b_samples, same",
    [
        (("#1 stock", "#2 cross_kv_cache + first_block_cache"), 32000, False),  # the Dashboard's labels
        (("#2 cross_kv_cache + adaln_precompute + easycache", THREE_PLUGINS), 30000, False),  # lengths differ
        (("#2 cross_kv_cache + adaln_precompute + easycache", THREE_PLUGINS), 32000, True),  # identical
        (("#1 stock", " + ".join([THREE_PLUGINS] * 4)), 32000, False),  # longer than the figure is wide
    ],
)
def test_ab_audio_figure_keeps_long_labels_out_of_the_axes_titles_and_every_title_apart(rng, labels, b_samples, same):
    """Long labels (the Dashboard's "#n plugin + plugin + ...") are spelled out, wrapped, in the figure's title: the
    axes' titles (the SNR's among them) never overlap each other or that title, nothing leaves the figure, and
    constrained layout never gives up (it warned "axes sizes collapsed to zero" and drew the axes squashed)."""
    a = rng.uniform(-0.5, 0.5, (2, 32000)).astype(np.float32)
    b = a.copy() if same else a[:, :b_samples] + rng.normal(0, 0.05, (2, b_samples)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure = ab_audio_figure(a, b, 16000, labels=labels)
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
    renderer = canvas.get_renderer()
    caption = next(text for text in figure.findobj(Text) if text.get_text() == figure.get_suptitle())
    assert caption.get_text().replace("\n    ", " ").splitlines() == [f"A: {labels[0]}", f"B: {labels[1]}"]
    texts = [caption] + [axes.title for axes in figure.axes] + [text for axes in figure.axes for text in axes.texts]
    boxes = [text.get_window_extent(renderer) for text in texts if text.get_text()]
    assert len(boxes) == (6 if same else 7)
    assert all(figure.bbox.contains(box.x0, box.y0) and figure.bbox.contains(box.x1, box.y1) for box in boxes)
    assert not any(box.count_overlaps(boxes[:i]) for i, box in enumerate(boxes)), [t.get_text() for t in texts]
    if not same:
        assert figure.axes[4].get_title().startswith(f"B - A: waveform, SNR {audio_snr_db(a, b):.1f} dB")
    assert all(axes.get_position().width > 0.3 for axes in figure.axes[:4])  # not squashed: two columns of axes


@pytest.mark.parametrize(
    "a, b, rate, match",
    [
        (np.zeros((2, 0)), np.zeros((2, 10)), 16000, "a_audio"),
        (np.zeros((2, 10)), np.full((2, 10), np.nan), 16000, "b_audio"),
        (np.zeros((2, 10)), np.zeros((2, 10)), 0, "sample_rate"),
    ],
)
def test_ab_audio_figure_bad_input_raises(a, b, rate, match):
    with pytest.raises(ValueError, match=match):
        ab_audio_figure(a, b, rate)


def test_frame_metric_curves_has_two_axes_and_marks_the_current_frame(rng):
    psnr = rng.uniform(25, 45, 7)
    psnr[3] = np.inf  # an identical frame
    ssim = rng.uniform(0.8, 1.0, 7)
    figure = frame_metric_curves(psnr, ssim, current=4)
    assert len(figure.axes) == 2
    for axes in figure.axes:
        assert list(axes.lines[-1].get_xdata()) == [4, 4]
    assert "1 identical frame" in figure.axes[0].get_title()
    (same,) = frame_metric_curves(np.full(7, np.inf), np.ones(7)).axes  # every frame identical: no empty axes
    assert not same.axison and [t.get_text() for t in same.texts] == [
        "A and B are identical:\nevery frame equal\n(7 of 7 frames)"
    ]
    with pytest.raises(ValueError, match="current"):
        frame_metric_curves(psnr, ssim, current=7)
    with pytest.raises(ValueError, match="psnr, ssim"):
        frame_metric_curves(psnr, ssim[:-1])


@pytest.mark.parametrize("size", [(8, 3.6), (2.5, 3.2)])  # the report's and the A/B player's
def test_frame_metric_curves_of_one_frame_mark_frame_0_only(size):
    """A one-frame clip: the frame axis spans that frame (-0.5..0.5) with one tick, 0, not ticks at -0.03 and 0.03."""
    figure = frame_metric_curves(np.array([37.5]), np.array([0.9957]), current=0, size=size)
    figure.draw_without_rendering()
    for axes in figure.axes:  # they share the frame axis
        low, high = axes.get_xlim()
        assert (low, high) == (-0.5, 0.5) and [tick for tick in axes.get_xticks() if low <= tick <= high] == [0]


@pytest.mark.parametrize("style", ["default", "dark_background"])
def test_point_labels_sit_on_the_axes_background_in_light_and_dark_styles(style):
    """A dark matplotlib style (what a dark-theme user may set) draws white text on black axes: a label's box is the
    axes' colour, never a fixed white under white text."""
    with matplotlib.style.context(style):
        figure = Figure(figsize=(4, 3))
        axes = figure.subplots()
        axes.plot([0, 1, 2], [1, 2, 3], "o")
        label_points(axes, [(0, 1, "0"), (1, 2, "0.1"), (2, 3, "0.2")], fontsize=9)
    labels = axes.texts
    assert len(labels) == 3
    for label in labels:
        assert to_rgb(label.get_bbox_patch().get_facecolor()) == to_rgb(axes.get_facecolor())
        assert to_rgb(label.get_color()) != to_rgb(axes.get_facecolor())


def test_array_png_encodes_frames_and_refuses_floats(rng):
    assert array_png(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)).startswith(PNG)
    with pytest.raises(ValueError, match="image"):
        array_png(rng.random((5, 7, 3)))
