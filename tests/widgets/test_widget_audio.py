import io
import wave

import numpy as np
import pytest

from workbench.widgets import ABAudio


def test_ab_audio_has_two_quiet_players_and_a_figure(make_result):
    a = make_result(audio_samples=4000)
    b = make_result(like=a, noise=2)
    widget = ABAudio(a, b)
    assert len(widget.players) == 2
    for player, result in zip(widget.players, (a, b), strict=True):
        assert player.autoplay is False and player.loop is False and player.format == "wav"
        with wave.open(io.BytesIO(player.value)) as file:
            assert (file.getnchannels(), file.getnframes(), file.getframerate()) == (2, 4000, 16000)
            pcm = np.frombuffer(file.readframes(4000), dtype="<i2").reshape(4000, 2).T
        np.testing.assert_allclose(pcm / 32767, result.audio, atol=1 / 32767)  # not normalised
    assert bytes(widget.figure.value).startswith(b"\x89PNG") and not widget.errors.value


def test_ab_audio_refuses_a_result_without_audio(make_result):
    with pytest.raises(ValueError, match="result B has no audio"):
        ABAudio(make_result(), make_result(audio_samples=None))


def test_ab_audio_refuses_different_sample_rates(make_result):
    with pytest.raises(ValueError, match="sample_rate: A is 16000 Hz, B is 24000 Hz"):
        ABAudio(make_result(), make_result(sample_rate=24000))


def test_non_finite_audio_shows_in_the_widget(make_result):
    a = make_result()
    b = make_result()
    b.audio[0, 10] = np.nan
    widget = ABAudio(a, b)
    assert "audio figure failed" in widget.errors.value and "non-finite" in widget.errors.value
