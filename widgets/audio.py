"""A/B audio: two players that never autoplay or loop, and a waveform/spectrogram/difference figure."""

from __future__ import annotations

import base64
import html
import io
import wave

import anywidget
import ipywidgets
import numpy as np
import traitlets
from IPython.display import HTML

from workbench import Result
from workbench.plots import ab_audio_figure, figure_png, png_figure_html

from ._common import ErrorBox, StaticCopy, check_labels, figure_image

_AUDIO_PLAYER_ESM = """
function render({ model, el }) {
  const box = document.createElement("div");
  box.style.display = "flex";
  box.style.alignItems = "center";
  box.style.gap = "8px";
  const audio = document.createElement("audio");
  audio.controls = true;
  audio.preload = "auto";
  // Chromium's control reads whole seconds ("0:00 / 0:00" for a 0.33 s clip): this readout is exact.
  const readout = document.createElement("span");
  readout.className = "vflash-audio-time";
  readout.style.fontFamily = "monospace";
  box.append(audio, readout);
  el.append(box);
  const show = () => {
    readout.textContent = audio.currentTime.toFixed(2) + " / " + model.get("duration").toFixed(2) + " s";
  };
  const load = () => {
    audio.src = model.get("src");
    audio.loop = model.get("loop");
    show();
  };
  ["timeupdate", "seeked", "loadedmetadata", "ended"].forEach((name) => audio.addEventListener(name, show));
  model.on("change:src change:loop change:duration", load);
  load();
  return () => model.off("change:src change:loop change:duration", load);
}
export default { render };
"""


class AudioPlayer(anywidget.AnyWidget):
    """One `<audio>` with native controls and a readout of the position and true `duration` in seconds.

    `src` is a data-URI WAV; it never autoplays; `loop` is off by default. The readout exists because
    Chromium's own control rounds to whole seconds, so a sub-second clip reads "0:00 / 0:00".
    """

    _esm = _AUDIO_PLAYER_ESM
    src = traitlets.Unicode("").tag(sync=True)
    duration = traitlets.Float(0.0, min=0.0).tag(sync=True)
    loop = traitlets.Bool(False).tag(sync=True)

    def set_wav(self, wav: bytes, duration: float) -> None:
        """Play `wav` (a whole WAV file's bytes) lasting `duration` seconds."""
        self.src = "data:audio/wav;base64," + base64.b64encode(wav).decode()
        self.duration = duration


class ABAudio(StaticCopy, ipywidgets.VBox):
    """Listen to and look at the soundtracks of two results.

    Both players get the samples as they are (16-bit PCM WAV, clipped to [-1, 1], not normalised):
    normalising each arm separately would hide a loudness difference. Both results need audio at one
    sample rate, otherwise `ValueError` names which; a failure while drawing shows in the error box.
    `compare` swaps in a new pair in place, so a view already on screen tracks the latest results.
    """

    def __init__(self, result_a: Result, result_b: Result, labels: tuple[str, str] = ("A", "B")):
        self.players = [AudioPlayer(), AudioPlayer()]
        self.titles = [ipywidgets.HTML(), ipywidgets.HTML()]
        self.figure = figure_image()  # at its drawn size, not stretched to the window's width
        self.errors = ErrorBox()
        columns = [ipywidgets.VBox([title, player]) for title, player in zip(self.titles, self.players, strict=True)]
        super().__init__([ipywidgets.HBox(columns, layout={"grid_gap": "16px"}), self.figure, self.errors])
        self.add_class("vflash-ab-audio")
        self.compare(result_a, result_b, labels)

    def compare(self, result_a: Result, result_b: Result, labels: tuple[str, str] = ("A", "B")) -> None:
        """Show a new pair (same checks as the constructor); it becomes the static copy of the widget's displays.

        All or nothing: what is not a `workbench.Result` with audio, or a pair at two sample rates, raises
        `ValueError` naming the label, and both WAVs are made before anything on screen changes, so a refused pair
        leaves the previous one showing, whole."""
        labels = check_labels(labels)
        for label, result in zip(labels, (result_a, result_b), strict=True):
            if not isinstance(result, Result):
                raise ValueError(f"{label}: expected a workbench.Result, got {type(result).__name__}")
            if result.audio is None:
                raise ValueError(f"audio: result {label} has no audio track (its model makes video only)")
        if result_a.sample_rate != result_b.sample_rate:
            raise ValueError(
                f"sample_rate: {labels[0]} is {result_a.sample_rate} Hz, {labels[1]} is "
                f"{result_b.sample_rate} Hz; compare at one rate"
            )
        sample_rate = int(result_a.sample_rate)
        wavs = [wav_bytes(result.audio, sample_rate) for result in (result_a, result_b)]
        self.labels = labels
        self.result_a, self.result_b = result_a, result_b
        self.sample_rate = sample_rate
        pairs = zip(labels, (result_a, result_b), wavs, self.titles, self.players, strict=True)
        for label, result, wav, title, player in pairs:
            title.value = f"<b>{html.escape(label)}</b>: {_describe(result)}"
            player.set_wav(wav, result.audio.shape[1] / sample_rate)
        self.errors.clear()
        with self.errors.catching("audio figure"):
            figure = ab_audio_figure(result_a.audio, result_b.audio, self.sample_rate, labels=self.labels)
            self.figure.value = figure_png(figure, dpi=80)
        self.refresh_static()

    def static(self) -> HTML:
        """Both soundtracks and their figure as self-contained HTML (WAV and PNG data URIs), for where the widget
        is blank (an offline HTML export, a reopened notebook); not normalised, as the players are."""
        parts = [
            f'<figure style="margin:0"><figcaption>{title.value}</figcaption>'
            f'<audio controls src="{player.src}"></audio></figure>'
            for title, player in zip(self.titles, self.players, strict=True)
        ]
        same = np.array_equal(self.result_a.audio, self.result_b.audio)  # no difference drawn (`ab_audio_figure`)
        difference = ", which are identical" if same else " and of their difference"
        alt = f"waveforms and spectrograms of both soundtracks{difference}"
        figure = png_figure_html(self.figure.value, alt, style="margin:0") if self.figure.value else ""
        row = f'<div style="display:flex;flex-wrap:wrap;gap:16px">{"".join(parts)}</div>'
        return HTML(f'<div class="vflash-ab-audio-static">{row}{figure}</div>')


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """Float audio (C, N) in [-1, 1] as a 16-bit PCM WAV file (what every browser plays)."""
    if audio.ndim != 2 or audio.shape[0] == 0:
        raise ValueError(f"audio: expected (C, N) with C >= 1, got shape {audio.shape}")
    samples = np.round(np.clip(np.nan_to_num(audio), -1.0, 1.0) * 32767).astype("<i2")  # (C, N)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(samples.shape[0])
        file.setsampwidth(2)
        file.setframerate(sample_rate)
        file.writeframes(np.ascontiguousarray(samples.T).tobytes())  # interleaved (N, C)
    return buffer.getvalue()


def _describe(result: Result) -> str:
    channels, samples = result.audio.shape
    return f"{channels} ch, {samples / result.sample_rate:.2f} s @ {result.sample_rate} Hz"
