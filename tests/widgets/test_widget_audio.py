import base64
import io
import re
import wave

import numpy as np
import pytest

from workbench.widgets import ABAudio, AudioPlayer


def test_ab_audio_has_two_quiet_players_with_their_true_duration_and_a_figure(make_result):
    a = make_result(audio_samples=4000)
    b = make_result(like=a, noise=2)
    widget = ABAudio(a, b)
    assert len(widget.players) == 2
    for player, result in zip(widget.players, (a, b), strict=True):
        assert isinstance(player, AudioPlayer) and player.loop is False
        assert player.duration == pytest.approx(0.25)  # 4000 samples at 16 kHz; Chromium's control says 0:00
        prefix = "data:audio/wav;base64,"
        assert player.src.startswith(prefix)
        with wave.open(io.BytesIO(base64.b64decode(player.src[len(prefix) :]))) as file:
            assert (file.getnchannels(), file.getnframes(), file.getframerate()) == (2, 4000, 16000)
            pcm = np.frombuffer(file.readframes(4000), dtype="<i2").reshape(4000, 2).T
        np.testing.assert_allclose(pcm / 32767, result.audio, atol=1 / 32767)  # not normalised
    assert bytes(widget.figure.value).startswith(b"\x89PNG") and not widget.errors.value


def test_ab_audio_static_copy_holds_both_players_and_the_figure_inline(make_result):
    a = make_result(audio_samples=4000)
    widget = ABAudio(a, make_result(like=a, noise=2), labels=("A", "B"))
    page = widget.static().data
    assert re.findall(r'<audio controls src="([^"]+)"></audio>', page) == [p.src for p in widget.players]
    (data,) = re.findall(r'<img alt="[^"]+" src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(data) == widget.figure.value
    assert 'alt="waveforms and spectrograms of both soundtracks and of their difference"' in page
    widget.compare(a, a, labels=("A", "B"))  # equal sample for sample: the figure says so, and so does its text
    assert 'alt="waveforms and spectrograms of both soundtracks, which are identical"' in widget.static().data


def test_ab_audio_refuses_a_pair_it_cannot_play_and_keeps_the_previous_pair_whole(make_result):
    """What is not a Result with audio, or labels that are not two strings, is refused naming the label or field;
    a pair whose WAV cannot be made changes nothing on screen."""
    a, b = make_result(), make_result()
    widget = ABAudio(a, b)
    shown = ([t.value for t in widget.titles], [p.src for p in widget.players], widget.labels)
    cases = [
        ((a, make_result(audio_samples=None)), "^audio: result B has no audio"),
        ((a, "b.mp4"), "^B: expected a workbench.Result, got str"),
        ((None, b), "^A: expected a workbench.Result, got NoneType"),
        ((a, b, None), r"^labels: expected two non-empty strings, got None"),
        ((a, b, "AB"), r"^labels: expected two non-empty strings, got 'AB'"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            widget.compare(*args)
    b.audio = np.zeros((0, 4000), np.float32)  # changed after it was made: no channel to play
    with pytest.raises(ValueError, match=r"^audio: expected \(C, N\) with C >= 1"):
        widget.compare(make_result(audio_samples=8000), b, labels=("C", "D"))
    assert ([t.value for t in widget.titles], [p.src for p in widget.players], widget.labels) == shown


def test_ab_audio_refuses_different_sample_rates(make_result):
    with pytest.raises(ValueError, match="sample_rate: A is 16000 Hz, B is 24000 Hz"):
        ABAudio(make_result(), make_result(sample_rate=24000))


def test_non_finite_audio_shows_in_the_widget(make_result):
    a = make_result()
    b = make_result()
    b.audio[0, 10] = np.nan
    widget = ABAudio(a, b)
    assert "audio figure failed" in widget.errors.value and "non-finite" in widget.errors.value


def test_ab_audio_compare_swaps_in_a_new_pair(make_result):
    widget = ABAudio(make_result(), make_result(), labels=("#1", "#2"))
    c = make_result(audio_samples=8000)
    widget.compare(c, make_result(like=c, noise=1), labels=("#3", "#4"))
    assert widget.labels == ("#3", "#4") and widget.players[0].duration == pytest.approx(0.5)
    assert "#3" in widget.titles[0].value and not widget.errors.value
