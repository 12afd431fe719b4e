"""A/B frame player: one slider over two results, a difference heatmap, per-frame metric curves, synced videos."""

from __future__ import annotations

import base64
import html
import math

import anywidget
import ipywidgets
import numpy as np
import traitlets
from IPython.display import HTML
from matplotlib import colormaps

from workbench import Result
from workbench.plots import array_png, figure_png, frame_metric_curves, png_figure_html
from workbench.progress import progress
from workbench.request import integer
from workbench.result import enlargement

from ._common import ErrorBox, StaticCopy, check_labels, upscale

MIN_SIDE = 256  # px: the long side of a video in the A/B row is at least this
MAX_SIDE = 320  # px: larger frames are shown scaled down to this, so the row fits a 1400 px screen
HEATMAP_SIDE = 192  # px: the heatmap's long side (smaller than the videos: the row fits beside Lab's file browser)
CURVES_SIZE = (2.5, 3.2)  # inches at 80 dpi: 200 x 256 px, as tall as the videos

_SYNCED_VIDEOS_ESM = """
function render({ model, el }) {
  // Seconds closer than this count as "already there". Far below half a frame at any frame rate the
  // slider offers (0.5 / 240 fps = 2 ms), far above Chromium's microsecond truncation of currentTime.
  const TOLERANCE = 1e-4;
  const row = document.createElement("div");
  row.className = "vflash-synced-videos";
  row.style.display = "flex";
  row.style.flexWrap = "wrap";
  row.style.gap = "8px";
  const videos = ["a", "b"].map((key) => {
    const box = document.createElement("figure");
    box.style.margin = "0";
    const video = document.createElement("video");
    video.controls = true;
    video.preload = "auto";
    video.playsInline = true;
    video.muted = key === "b";  // two soundtracks at once are noise; ABAudio compares the audio
    video.style.imageRendering = "pixelated";  // enlarged pixels stay square: differences stay visible
    video.style.background = "#000";
    const caption = document.createElement("figcaption");
    caption.style.fontSize = "12px";
    box.append(video, caption);
    row.append(box);
    return { key, video, caption, target: null };
  });
  el.append(row);
  const [leader, follower] = videos.map(({ video }) => video);
  // While playing, B (muted: its speed is inaudible) keeps pace with A by its playback rate: each timeupdate of A
  // (about 4 a second) sets it to close the gap at PACE x gap per second, at most MAX_PACE off 1. A seek is no way
  // to keep pace: it stalls B for longer than half a frame, so B lands behind, again and again. B is seeked only
  // when FAR (seconds) from A: the user scrubbed, or a loop wrapped one video first.
  const PACE = 2, MAX_PACE = 0.5, FAR = 1;
  const halfFrame = () => 0.5 / model.get("fps");
  // The middle of the frame on screen at `t`: floor(t * fps) clamped to 0..frame_count-1, shown at (frame + 0.5) / fps
  // (Python's frame_at and frame_time), so the browser's rounding of the seek cannot land on the frame before.
  const frameMiddle = (t) => {
    const fps = model.get("fps");
    const frame = Math.min(model.get("frame_count") - 1, Math.max(0, Math.floor(t * fps + 1e-9)));
    return (frame + 0.5) / fps;
  };

  // Changes this view makes itself must not come back to it as seeks (that would stutter playback).
  let publishing = false;
  const publish = (name, value) => {
    if (model.get(name) === value) return;
    publishing = true;
    model.set(name, value);
    publishing = false;
    model.save_changes();
  };
  // A seek this view starts remembers its target: when it lands, the browser reports the time rounded
  // (Chromium truncates to microseconds), and writing that back would move the slider to an earlier frame.
  const seekTo = (entry, t) => {
    entry.target = t;
    entry.video.currentTime = t;
  };
  const load = () => videos.forEach(({ key, video, caption }) => {
    video.src = model.get("src_" + key);
    caption.textContent = model.get("label_" + key);
    video.loop = model.get("loop");
    video.style.width = model.get("display_width") + "px";
    video.style.height = model.get("display_height") + "px";
  });
  const seek = (t) => videos.forEach((entry) => {
    if (Math.abs(entry.video.currentTime - t) > TOLERANCE) seekTo(entry, t);
  });
  const play = (on) => videos.forEach(({ video }) => {
    if (on && video.paused) video.play().catch(() => publish("playing", false));
    if (!on && !video.paused) video.pause();
  });
  // Paused (either video, or Python) or at the end: both videos stop on the middle of the frame the leader shows,
  // and that time goes to Python, so the slider, the heatmap and the caption show the same frame as both videos.
  const stop = () => {
    publish("playing", false);
    play(false);
    follower.playbackRate = 1;  // B's pace while playing
    const t = frameMiddle(leader.currentTime);
    seek(t);
    publish("time", t);
  };

  videos.forEach((entry) => {
    const { video } = entry;
    video.addEventListener("play", () => { publish("playing", true); play(true); });
    video.addEventListener("pause", stop);
    video.addEventListener("ended", stop);
    video.addEventListener("seeked", () => {
      const t = video.currentTime;
      const ours = entry.target !== null && Math.abs(t - entry.target) < 1e-3;
      entry.target = null;
      if (ours) return;  // a seek this view made landed: the model already holds the exact time
      publish("time", t);  // the user scrubbed this video: Python (the slider) follows
      const slack = video.paused ? TOLERANCE : halfFrame();
      videos.forEach((other) => { if (other !== entry && Math.abs(other.video.currentTime - t) > slack) seekTo(other, t); });
    });
  });
  leader.addEventListener("timeupdate", () => {
    if (leader.paused) return;
    publish("time", leader.currentTime);
    const gap = leader.currentTime - follower.currentTime;  // > 0: B is behind
    if (Math.abs(gap) > FAR) seekTo(videos[1], leader.currentTime);
    follower.playbackRate = Math.abs(gap) > FAR ? 1 : 1 + Math.max(-MAX_PACE, Math.min(MAX_PACE, PACE * gap));
  });
  const onTime = () => { if (!publishing) seek(model.get("time")); };
  const onPlaying = () => { if (!publishing) play(model.get("playing")); };
  const sources = "change:src_a change:src_b change:label_a change:label_b change:loop change:display_width change:display_height";
  model.on(sources, load);
  model.on("change:time", onTime);
  model.on("change:playing", onPlaying);
  load();
  seek(model.get("time"));
  return () => {
    model.off(sources, load);
    model.off("change:time", onTime);
    model.off("change:playing", onPlaying);
  };
}
export default { render };
"""


class SyncedVideos(anywidget.AnyWidget):
    """Two `<video>` elements driven by one `time` and one `playing` trait.

    Setting `time` (seconds) seeks both; playing or pausing either plays or pauses both; scrubbing one
    video or playing them writes `time` back, so Python (the frame slider) follows. While playing, B keeps
    pace with A (the leader) by its playback rate (a seek stalls it) and is seeked only a second or more away.
    Pausing (either video, or `playing = False`) and reaching the end stop both videos on one frame: the
    middle of the frame A shows (`frame_time` of `frame_at` over `fps` and `frame_count`, which describe both
    videos), written back as `time`. A seek the widget made itself never writes back the browser's rounded
    reading of it. `ipywidgets.Video` has no current-time trait, which is why this exists. `src_a`/`src_b`
    are data-URI MP4 strings; both videos show at `display_width` x `display_height` CSS pixels with square
    (nearest-neighbour) pixels, native controls, and `loop` (on by default). B starts muted: two soundtracks
    at once are noise.
    """

    _esm = _SYNCED_VIDEOS_ESM
    src_a = traitlets.Unicode("").tag(sync=True)
    src_b = traitlets.Unicode("").tag(sync=True)
    label_a = traitlets.Unicode("A").tag(sync=True)
    label_b = traitlets.Unicode("B").tag(sync=True)
    time = traitlets.Float(0.0, min=0.0).tag(sync=True)
    fps = traitlets.Float(24.0).tag(sync=True)  # frames per second of both videos (> 0)
    frame_count = traitlets.Int(1, min=1).tag(sync=True)  # frames in each video
    playing = traitlets.Bool(False).tag(sync=True)
    loop = traitlets.Bool(True).tag(sync=True)
    display_width = traitlets.Int(MIN_SIDE, min=1).tag(sync=True)
    display_height = traitlets.Int(MIN_SIDE, min=1).tag(sync=True)


class ABPlayer(StaticCopy, ipywidgets.VBox):
    """Two results side by side under ONE frame slider: synced videos, |A - B| heatmap, PSNR/SSIM curves.

    One row holds what differs: both videos, the heatmap of the slider's frame and the per-frame PSNR/SSIM
    curves with that frame marked; when A and B are identical (every pixel of every frame equal), a note says so in
    place of the heatmap and the curves, which would be black and empty. Small clips are enlarged by a whole factor
    (nearest-neighbour) to at least `MIN_SIDE` pixels on the long side, and captioned with their true size. Frame i
    is shown at time (i + 0.5) / fps, the middle of its display interval, so a browser's rounding of the seek
    (Chromium truncates `currentTime` to microseconds) cannot land on the frame before; a time maps back to
    floor(t * fps), clamped to 0..T-1. The heatmap shares one colour scale over the whole video, so a
    brighter frame differs more. `compare` swaps in a new pair in place, so a player already on screen
    tracks the latest results. Results must have the same frame count, frame size and fps; otherwise
    `ValueError` names which. Failures while browsing show in the widget's error box.
    """

    def __init__(self, result_a: Result, result_b: Result, labels: tuple[str, str] = ("A", "B")):
        self.errors = ErrorBox()
        self.header = ipywidgets.HTML()
        # wide enough that a click on the track lands on its frame: ~9 px a frame for a 2 s clip at 24 fps
        self.slider = ipywidgets.IntSlider(
            0, min=0, max=1, description="frame", continuous_update=True, layout={"width": "520px"}
        )
        self.previous = ipywidgets.Button(icon="step-backward", tooltip="previous frame", layout={"width": "40px"})
        self.next = ipywidgets.Button(icon="step-forward", tooltip="next frame", layout={"width": "40px"})
        self.play = ipywidgets.ToggleButton(False, description="play both", icon="play")
        self.image_diff = ipywidgets.Image(format="png")
        self.diff_title = ipywidgets.HTML()
        self.curves = ipywidgets.Image(format="png")
        self.heat_box = ipywidgets.VBox([self.image_diff, self.diff_title])
        self.identical = ipywidgets.HTML(layout={"display": "none"})  # in their place when A and B are identical
        self.videos = SyncedVideos()
        self.caption = ipywidgets.HTML()
        ipywidgets.link((self.videos, "playing"), (self.play, "value"))
        row = ipywidgets.HBox(
            [self.videos, self.heat_box, self.identical, self.curves],
            layout={"flex_flow": "row wrap", "align_items": "flex-start", "grid_gap": "8px"},
        )
        controls = ipywidgets.HBox(
            [self.previous, self.slider, self.next, self.play, self.caption], layout={"flex_flow": "row wrap"}
        )
        super().__init__([self.header, row, controls, self.errors])
        self.add_class("vflash-ab-player")
        self._ready = False
        self.psnr: np.ndarray | None = None
        self.ssim: np.ndarray | None = None
        self.compare(result_a, result_b, labels)
        self.slider.observe(self._on_frame, names="value")
        self.videos.observe(self._on_time, names="time")
        self.play.observe(self._on_play, names="value")
        self.previous.on_click(lambda _: self.step(-1))
        self.next.on_click(lambda _: self.step(1))

    def compare(self, result_a: Result, result_b: Result, labels: tuple[str, str] = ("A", "B")) -> None:
        """Show a new pair (same checks as the constructor), back at frame 0 and paused.

        All or nothing: the pair is checked and both MP4s are encoded before anything on screen changes, so a
        pair that is refused (`ValueError`) or fails to encode (the encoder's error, e.g. `ValueError` for audio
        of more than 2 channels) raises and leaves the previous pair showing, whole. A pair shown clears the
        error box and becomes the static copy of the player's displays (`StaticCopy.refresh_static`).
        """
        labels = check_labels(labels)
        _check_comparable(result_a, result_b, labels)
        src_a = _data_uri(result_a.mp4_bytes(min_side=MIN_SIDE))
        src_b = _data_uri(result_b.mp4_bytes(min_side=MIN_SIDE))
        self.errors.clear()
        self._ready = False
        self.labels = labels
        self.result_a, self.result_b = result_a, result_b
        self.fps = result_a.fps
        self.frame_count, height, width = result_a.frames.shape[:3]
        self.factor, self.display_size = display_size(height, width)
        # One scale for the whole video: the maximum absolute difference of any pixel channel.
        self.diff_max = int(np.abs(result_a.frames.astype(np.int16) - result_b.frames.astype(np.int16)).max())
        a, b = (html.escape(label) for label in labels)
        shown = f"{width}x{height} px" + (f", shown x{self.factor}" if self.factor > 1 else "")
        self.header.value = (
            f"<b>{a}</b> vs <b>{b}</b>: {_frames(self.frame_count)} of {width}x{height} px @ {self.fps} fps; "
            f"|{b} - {a}| max {self.diff_max}/255"
        )
        self.videos.playing = False
        self.videos.fps, self.videos.frame_count = self.fps, self.frame_count
        self.slider.value = 0
        self.slider.max = self.frame_count - 1
        self.videos.time = frame_time(0, self.fps)
        dw, dh = self.display_size
        self.heat_factor, (hw, hh) = display_size(height, width, HEATMAP_SIDE, HEATMAP_SIDE)
        heat_shown = f"{width}x{height} px" + (f", shown x{self.heat_factor}" if self.heat_factor > 1 else "")
        # ipywidgets' HTML row height spaces wrapped lines a row apart: this caption keeps its lines together
        self.diff_title.value = f'<div style="line-height:1.3"><b>|{b} - {a}|</b> ({heat_shown})</div>'
        self.videos.display_width, self.videos.display_height = dw, dh
        self.image_diff.layout.width, self.image_diff.layout.height = f"{hw}px", f"{hh}px"
        self.diff_title.layout.width = f"{hw}px"  # the title wraps under the heatmap, never widens the row
        self.videos.label_a, self.videos.label_b = (f"{label} ({shown})" for label in labels)
        self.videos.src_a, self.videos.src_b = src_a, src_b
        same = self.diff_max == 0
        self.identical.value = _identical_html(labels, self.frame_count) if same else ""
        self.identical.layout.display = None if same else "none"
        self.heat_box.layout.display = self.curves.layout.display = "none" if same else None
        self.psnr = self.ssim = None
        self.image_diff.value = self.curves.value = b""  # the previous pair's figures must not stay up
        self._compute_curves()
        self._ready = True
        self.show(0)
        self.refresh_static()

    def step(self, frames: int) -> None:
        """Move the slider by `frames` (negative: back), stopping at the first and last frame."""
        self.videos.playing = False
        self.slider.value = min(self.frame_count - 1, max(0, self.slider.value + frames))

    def show(self, frame: int) -> None:
        """Caption frame `frame`, draw its difference and mark it on the curves (nothing to draw when identical).
        A frame outside [0, frame_count - 1] shows as an error in the widget's error box, naming `frame`."""
        with self.errors.catching(f"showing frame {frame}"):
            frame = integer("frame", frame, 0, self.frame_count - 1)
            self.caption.value = self._caption(frame)
            if self.diff_max == 0:
                return
            self.image_diff.value = array_png(upscale(self.heatmap(frame), self.heat_factor))
            if self.psnr is not None and self.ssim is not None:
                figure = frame_metric_curves(self.psnr, self.ssim, current=frame, size=CURVES_SIZE)
                self.curves.value = figure_png(figure, dpi=80)

    def static(self) -> HTML:
        """The pair as self-contained HTML, for where the widget is blank (an offline HTML export, a reopened
        notebook): the header, both videos at their display size with their labels, the slider frame's heatmap
        and the PSNR/SSIM curves (or the note that A and B are identical), the media as data URIs. A copy of what is
        on screen now, not a live view."""
        dw, dh = self.display_size
        labels = (self.videos.label_a, self.videos.label_b)
        parts = [
            f'<figure style="margin:0"><video controls loop width="{dw}" height="{dh}" src="{src}" '
            f'style="image-rendering:pixelated"></video><figcaption>{html.escape(label)}</figcaption></figure>'
            for label, src in zip(labels, (self.videos.src_a, self.videos.src_b), strict=True)
        ]
        frame = self.slider.value
        images = [(self.image_diff.value, f"|B - A| of frame {frame}"), (self.curves.value, "per-frame PSNR and SSIM")]
        parts += [png_figure_html(png, alt, style="margin:0") for png, alt in images if png]
        parts += [self.identical.value] if self.identical.value else []
        row = f'<div style="display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start">{"".join(parts)}</div>'
        return HTML(f'<div class="vflash-ab-static"><p>{self.header.value}</p>{row}</div>')

    def heatmap(self, frame: int) -> np.ndarray:
        """|A - B| of frame `frame`, channel mean, coloured on the video-wide scale: uint8 (H, W, 3). `frame` is an
        int in [0, frame_count - 1] (ValueError naming `frame` otherwise: no wrap-around to the end)."""
        frame = integer("frame", frame, 0, self.frame_count - 1)
        diff = np.abs(self.result_a.frames[frame].astype(np.float32) - self.result_b.frames[frame].astype(np.float32))
        scaled = diff.mean(axis=-1) / max(self.diff_max, 1)
        return (colormaps["magma"](scaled)[..., :3] * 255).round().astype(np.uint8)

    def _compute_curves(self) -> None:
        """Per-frame PSNR/SSIM through workbench.quality, one frame at a time so progress shows."""
        with self.errors.catching("per-frame PSNR/SSIM"):
            from workbench.quality import psnr_per_frame, ssim_per_frame

            psnr, ssim = [], []
            frames = zip(self.result_a.frames, self.result_b.frames, strict=True)
            for a, b in progress(frames, self.frame_count, "PSNR/SSIM"):
                psnr.append(psnr_per_frame(a[None], b[None])[0])
                ssim.append(ssim_per_frame(a[None], b[None])[0])
            self.psnr, self.ssim = np.asarray(psnr, dtype=np.float64), np.asarray(ssim, dtype=np.float64)

    def _caption(self, frame: int) -> str:
        frames = f"frames 0-{self.frame_count - 1}" if self.frame_count > 1 else "the only frame"
        text = f"frame {frame} ({frames}), t = {frame_time(frame, self.fps):.3f} s"
        if self.psnr is not None and self.ssim is not None:
            text += f"; PSNR {self.psnr[frame]:.2f} dB, SSIM {self.ssim[frame]:.4f}"
        return text

    def _on_frame(self, change: dict) -> None:
        if not self._ready:
            return
        frame = change["new"]
        if frame_at(self.videos.time, self.fps, self.frame_count) != frame:
            self.videos.time = frame_time(frame, self.fps)
        self.show(frame)

    def _on_time(self, change: dict) -> None:
        if self._ready:
            self.slider.value = frame_at(change["new"], self.fps, self.frame_count)

    def _on_play(self, change: dict) -> None:
        self.play.description, self.play.icon = ("pause both", "pause") if change["new"] else ("play both", "play")


def frame_time(frame: int, fps: float) -> float:
    """Seconds at the middle of frame `frame`'s display interval [frame/fps, (frame+1)/fps)."""
    return (frame + 0.5) / fps


def frame_at(seconds: float, fps: float, count: int) -> int:
    """The frame on screen at `seconds`: floor(seconds * fps), clamped to 0..count-1.

    The 1e-9 frame of slack absorbs float error in the product only; a browser's rounding of a seek
    (microseconds) is far larger and, with `frame_time`'s mid-frame seeks, never crosses a boundary.
    """
    return min(count - 1, max(0, math.floor(seconds * fps + 1e-9)))


def display_size(
    height: int, width: int, min_side: int = MIN_SIDE, max_side: int = MAX_SIDE
) -> tuple[int, tuple[int, int]]:
    """(whole enlargement factor, (width, height) in CSS px) of a frame in the A/B row.

    Small frames are enlarged by the smallest whole factor that reaches `min_side` on the long side, unless that
    passes `max_side`: then by the largest whole factor that stays within it. Frames that no whole factor > 1 fits
    show at their size, or scaled down by the browser to `max_side` on the long side.
    """
    factor = min(enlargement(height, width, min_side), max(1, max_side // max(height, width)))
    if factor > 1:
        return factor, (width * factor, height * factor)
    scale = min(1.0, max_side / max(height, width))
    return 1, (round(width * scale), round(height * scale))


def _identical_html(labels: tuple[str, str], frames: int) -> str:
    """The note shown in place of the heatmap and the curves when both results are the same, frame for frame."""
    a, b = (html.escape(label) for label in labels)
    style = (
        "max-width:260px;padding:8px 12px;border-left:4px solid #59a14f;background:rgba(89,161,79,0.1);"
        "font-size:13px;line-height:1.4;white-space:normal"
    )
    return (
        f'<div class="vflash-identical" style="{style}"><b>{a} and {b} are identical</b>: every frame equal, pixel '
        f"for pixel ({frames} of {_frames(frames)}), so there is no difference to map and no PSNR/SSIM to plot.</div>"
    )


def _frames(count: int) -> str:
    """The count with its noun: "1 frame", "9 frames"."""
    return f"{count} frame" + ("" if count == 1 else "s")


def _data_uri(mp4: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(mp4).decode()


def _check_comparable(a: Result, b: Result, labels: tuple[str, str]) -> None:
    for label, result in zip(labels, (a, b), strict=True):
        if not isinstance(result, Result):
            raise ValueError(f"{label}: expected a workbench.Result, got {type(result).__name__}")
        frames = result.frames
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
            raise ValueError(
                f"frames: {label} must be uint8 (T, H, W, 3) with T >= 1, got {frames.dtype} {frames.shape}"
            )
    (la, lb), (fa, fb) = labels, (a.frames, b.frames)
    if fa.shape[0] != fb.shape[0]:
        raise ValueError(f"frame count: {la} has {fa.shape[0]} frames, {lb} has {fb.shape[0]}")
    if fa.shape[1:3] != fb.shape[1:3]:
        raise ValueError(
            f"frame size: {la} is {fa.shape[2]}x{fa.shape[1]}, {lb} is {fb.shape[2]}x{fb.shape[1]} (width x height)"
        )
    if a.fps != b.fps:
        raise ValueError(f"fps: {la} is {a.fps}, {lb} is {b.fps}; one slider needs one frame rate")
