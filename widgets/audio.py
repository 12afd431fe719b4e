"""A/B audio: two players that never autoplay or loop, and a waveform/spectrogram/difference figure."""

from __future__ import annotations

import html
import io
import wave

import ipywidgets
import numpy as np

from workbench import Result
from workbench.plots import ab_audio_figure, figure_png

from ._common import ErrorBox, check_labels


class ABAudio(ipywidgets.VBox):
    """Listen to and look at the soundtracks of two results.

    Both players get the samples as they are (16-bit PCM WAV, clipped to [-1, 1], not normalised):
    normalising each arm separately would hide a loudness difference. Both results need audio at one
    sample rate, otherwise `ValueError` names which; a failure while drawing shows in the error box.
    """

    def __init__(self, result_a: Result, result_b: Result, labels: tuple[str, str] = ("A", "B")):
        self.labels = check_labels(labels)
        for label, result in zip(self.labels, (result_a, result_b), strict=True):
            if result.audio is None:
                raise ValueError(f"audio: result {label} has no audio track (its model makes video only)")
        if result_a.sample_rate != result_b.sample_rate:
            raise ValueError(
                f"sample_rate: {self.labels[0]} is {result_a.sample_rate} Hz, {self.labels[1]} is "
                f"{result_b.sample_rate} Hz; compare at one rate"
            )
        self.result_a, self.result_b = result_a, result_b
        self.sample_rate = int(result_a.sample_rate)
        self.players = [
            ipywidgets.Audio(value=wav_bytes(result.audio, self.sample_rate), format="wav", autoplay=False, loop=False)
            for result in (result_a, result_b)
        ]
        self.figure = ipywidgets.Image(format="png")
        self.errors = ErrorBox()
        columns = [
            ipywidgets.VBox([ipywidgets.HTML(f"<b>{html.escape(label)}</b>: {_describe(result)}"), player])
            for label, result, player in zip(self.labels, (result_a, result_b), self.players, strict=True)
        ]
        super().__init__([ipywidgets.HBox(columns), self.figure, self.errors])
        with self.errors.catching("audio figure"):
            figure = ab_audio_figure(result_a.audio, result_b.audio, self.sample_rate, labels=self.labels)
            self.figure.value = figure_png(figure, dpi=80)


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
