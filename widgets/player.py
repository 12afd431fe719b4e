"""A/B frame player: one slider over two results, a difference heatmap, per-frame metric curves, synced videos."""

from __future__ import annotations

import base64
import html

import anywidget
import ipywidgets
import numpy as np
import traitlets
from matplotlib import colormaps

from workbench import Result
from workbench.plots import array_png, figure_png, frame_metric_curves

from ._common import ErrorBox, check_labels, progress, upscale

_SYNCED_VIDEOS_ESM = """
function render({ model, el }) {
  const TOLERANCE = 0.01;  // seconds: closer than this counts as "already there"
  const DRIFT = 0.15;  // seconds: while playing, B is re-seeked to A beyond this
  const row = document.createElement("div");
  row.style.display = "flex";
  row.style.gap = "8px";
  const videos = ["a", "b"].map((key) => {
    const box = document.createElement("figure");
    box.style.margin = "0";
    const video = document.createElement("video");
    video.controls = true;
    video.preload = "auto";
    video.playsInline = true;
    video.muted = key === "b";  // two soundtracks at once are noise; ABAudio compares the audio
    video.style.maxWidth = "100%";
    const caption = document.createElement("figcaption");
    box.append(video, caption);
    row.append(box);
    return { key, video, caption };
  });
  el.append(row);
  const [leader, follower] = videos.map(({ video }) => video);

  // Changes this view makes itself must not come back to it as seeks (that would stutter playback).
  let publishing = false;
  const publish = (name, value) => {
    if (model.get(name) === value) return;
    publishing = true;
    model.set(name, value);
    publishing = false;
    model.save_changes();
  };
  const load = () => videos.forEach(({ key, video, caption }) => {
    video.src = model.get("src_" + key);
    caption.textContent = model.get("label_" + key);
  });
  const seek = (t) => videos.forEach(({ video }) => {
    if (Math.abs(video.currentTime - t) > TOLERANCE) video.currentTime = t;
  });
  const play = (on) => videos.forEach(({ video }) => {
    if (on && video.paused) video.play().catch(() => publish("playing", false));
    if (!on && !video.paused) video.pause();
  });

  videos.forEach(({ video }) => {
    video.addEventListener("play", () => { publish("playing", true); play(true); });
    video.addEventListener("pause", () => { if (!video.ended) { publish("playing", false); play(false); } });
    video.addEventListener("ended", () => publish("playing", false));
    video.addEventListener("seeked", () => {  // the user scrubbed this one, or a seek landed
      const t = video.currentTime;
      publish("time", t);
      const slack = video.paused ? TOLERANCE : DRIFT;
      videos.forEach(({ video: other }) => { if (Math.abs(other.currentTime - t) > slack) other.currentTime = t; });
    });
  });
  leader.addEventListener("timeupdate", () => {
    if (leader.paused) return;
    publish("time", leader.currentTime);
    if (Math.abs(follower.currentTime - leader.currentTime) > DRIFT) follower.currentTime = leader.currentTime;
  });
  const onTime = () => { if (!publishing) seek(model.get("time")); };
  const onPlaying = () => { if (!publishing) play(model.get("playing")); };
  const sources = "change:src_a change:src_b change:label_a change:label_b";
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
    video or playing them writes `time` back, so Python (the frame slider) follows. `ipywidgets.Video`
    has no current-time trait, which is why this exists. `src_a`/`src_b` are data-URI MP4 strings.
    B starts muted: two soundtracks at once are noise.
    """

    _esm = _SYNCED_VIDEOS_ESM
    src_a = traitlets.Unicode("").tag(sync=True)
    src_b = traitlets.Unicode("").tag(sync=True)
    label_a = traitlets.Unicode("A").tag(sync=True)
    label_b = traitlets.Unicode("B").tag(sync=True)
    time = traitlets.Float(0.0, min=0.0).tag(sync=True)
    playing = traitlets.Bool(False).tag(sync=True)


class ABPlayer(ipywidgets.VBox):
    """Two results side by side under ONE frame slider, with |A - B| heatmap, PSNR/SSIM curves and videos.

    The slider's frame and the videos' `time` are linked (time = frame / fps, frame = the one shown at
    that time). The heatmap shares one colour scale over the whole video, so a brighter frame differs
    more. Results must have the same frame count, frame size and fps; otherwise `ValueError` names
    which. Failures while browsing show in the widget's error box.
    """

    def __init__(self, result_a: Result, result_b: Result, labels: tuple[str, str] = ("A", "B")):
        self.labels = check_labels(labels)
        _check_comparable(result_a, result_b, self.labels)
        self.result_a, self.result_b = result_a, result_b
        self.fps = result_a.fps
        self.frame_count = result_a.frames.shape[0]
        # One scale for the whole video: the maximum absolute difference of any pixel channel.
        self.diff_max = int(np.abs(result_a.frames.astype(np.int16) - result_b.frames.astype(np.int16)).max())
        self.psnr: np.ndarray | None = None
        self.ssim: np.ndarray | None = None
        a, b = (html.escape(label) for label in self.labels)
        self.errors = ErrorBox()
        self.slider = ipywidgets.IntSlider(
            0, min=0, max=self.frame_count - 1, description="frame", continuous_update=True
        )
        self.image_a = ipywidgets.Image(format="png")
        self.image_b = ipywidgets.Image(format="png")
        self.image_diff = ipywidgets.Image(format="png")
        self.curves = ipywidgets.Image(format="png")
        self.videos = SyncedVideos(label_a=self.labels[0], label_b=self.labels[1])
        with self.errors.catching("encoding the MP4s"):
            self.videos.src_a = _data_uri(result_a.mp4_bytes())
            self.videos.src_b = _data_uri(result_b.mp4_bytes())
        self.play = ipywidgets.ToggleButton(False, description="play both", icon="play")
        ipywidgets.link((self.videos, "playing"), (self.play, "value"))
        self.caption = ipywidgets.HTML()
        header = ipywidgets.HTML(
            f"<b>{a}</b> vs <b>{b}</b>: {self.frame_count} frames, {result_a.frames.shape[2]}x"
            f"{result_a.frames.shape[1]} @ {self.fps} fps; |{b} - {a}| max {self.diff_max}/255"
        )
        panes = ipywidgets.HBox(
            [
                ipywidgets.VBox([ipywidgets.HTML(f"<b>{a}</b>"), self.image_a]),
                ipywidgets.VBox([ipywidgets.HTML(f"<b>{b}</b>"), self.image_b]),
                ipywidgets.VBox([ipywidgets.HTML(f"<b>|{b} - {a}|</b>"), self.image_diff]),
            ]
        )
        controls = ipywidgets.HBox([self.slider, self.play])
        super().__init__([header, panes, controls, self.caption, self.curves, self.videos, self.errors])
        self.slider.observe(self._on_frame, names="value")
        self.videos.observe(self._on_time, names="time")
        self._compute_curves()
        self.show(0)

    def show(self, frame: int) -> None:
        """Draw frame `frame` of both results, their difference, and mark it on the curves."""
        with self.errors.catching(f"showing frame {frame}"):
            a = self.result_a.frames[frame]
            b = self.result_b.frames[frame]
            self.image_a.value = array_png(upscale(a))
            self.image_b.value = array_png(upscale(b))
            self.image_diff.value = array_png(upscale(self.heatmap(frame)))
            self.caption.value = self._caption(frame)
            if self.psnr is not None and self.ssim is not None:
                self.curves.value = figure_png(frame_metric_curves(self.psnr, self.ssim, current=frame), dpi=80)

    def heatmap(self, frame: int) -> np.ndarray:
        """|A - B| of frame `frame`, channel mean, coloured on the video-wide scale: uint8 (H, W, 3)."""
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
        text = f"frame {frame} of {self.frame_count - 1}, t = {frame / self.fps:.3f} s"
        if self.psnr is not None and self.ssim is not None:
            text += f"; PSNR {self.psnr[frame]:.2f} dB, SSIM {self.ssim[frame]:.4f}"
        return text

    def _on_frame(self, change: dict) -> None:
        frame = change["new"]
        if _frame_at(self.videos.time, self.fps, self.frame_count) != frame:
            self.videos.time = frame / self.fps
        self.show(frame)

    def _on_time(self, change: dict) -> None:
        self.slider.value = _frame_at(change["new"], self.fps, self.frame_count)


def _frame_at(seconds: float, fps: int, count: int) -> int:
    """The frame on screen at `seconds` (frame i spans [i/fps, (i+1)/fps)); a hair of slack for float error."""
    return min(count - 1, max(0, int(seconds * fps + 1e-6)))


def _data_uri(mp4: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(mp4).decode()


def _check_comparable(a: Result, b: Result, labels: tuple[str, str]) -> None:
    for label, result in zip(labels, (a, b), strict=True):
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
