import math

import numpy as np
import pytest

from workbench.quality import (
    audio_finite,
    audio_length_difference,
    audio_snr_db,
    log_spectral_distance,
    rms_ratio,
    spectral_cosine,
)


def _noise(rng, channels=2, samples=4001):
    return (0.3 * rng.standard_normal((channels, samples))).astype(np.float32)


def _tone(frequency_bin, samples=4096, n_fft=512):
    """A sine centred on an STFT bin, so its energy stays in that bin's neighbourhood."""
    t = np.arange(samples)
    return (0.5 * np.sin(2 * np.pi * frequency_bin * t / n_fft)).astype(np.float32)[None]


def test_audio_snr_matches_hand_computed(rng):
    reference = _noise(rng)
    candidate = reference * np.float32(1.1)  # error = 0.1 * signal -> 20 dB
    assert audio_snr_db(reference, candidate) == pytest.approx(20.0, abs=1e-5)
    assert audio_snr_db(reference, reference) == math.inf
    assert audio_snr_db(np.zeros_like(reference), reference) == -math.inf


def test_log_spectral_distance_of_a_gain_is_its_decibels(rng):
    reference = _noise(rng)
    assert log_spectral_distance(reference, reference) == 0.0
    assert log_spectral_distance(reference, 2 * reference) == pytest.approx(20 * math.log10(2), abs=1e-3)
    assert log_spectral_distance(2 * reference, reference) == pytest.approx(20 * math.log10(2), abs=1e-3)
    silence = np.zeros_like(reference)
    assert log_spectral_distance(silence, silence) == 0.0


def test_spectral_cosine_ignores_gain_and_sees_a_changed_spectrum(rng):
    reference = _noise(rng)
    assert spectral_cosine(reference, 0.25 * reference) == pytest.approx(1.0, abs=1e-12)
    assert spectral_cosine(_tone(20), _tone(20)) == pytest.approx(1.0, abs=1e-12)
    assert spectral_cosine(_tone(20), _tone(90)) < 0.05
    silence = np.zeros((1, 600), np.float32)
    assert spectral_cosine(silence, silence) == 1.0
    assert spectral_cosine(silence, _tone(20, samples=600)) == 0.0


def test_rms_ratio_matches_hand_computed(rng):
    reference = _noise(rng)
    assert rms_ratio(reference, 0.5 * reference) == pytest.approx(0.5, rel=1e-6)
    square = np.array([[1.0, -1.0, 1.0, -1.0]], np.float32)  # RMS 1
    assert rms_ratio(square, np.array([[3.0, 0.0, 0.0, 0.0]], np.float32)) == pytest.approx(1.5)
    assert rms_ratio(np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32)) == 1.0


def test_different_lengths_compare_the_common_part_and_report_the_difference(rng):
    reference = _noise(rng, samples=3000)
    candidate = np.concatenate([reference * np.float32(0.9), _noise(rng, samples=100)], axis=1)
    assert audio_length_difference(reference, candidate) == 100
    assert audio_length_difference(candidate, reference) == -100
    common = candidate[:, :3000]
    for metric in (audio_snr_db, log_spectral_distance, spectral_cosine, rms_ratio):
        assert metric(reference, candidate) == metric(reference, common)


def test_short_clip_shrinks_the_stft_window():
    # a fixed clip: about 1 random 101-sample clip in 200 leaves an STFT bin near POWER_FLOOR (-100 dB), where the
    # floor, not the gain, sets the difference and the distance reads a little under 20 log10(2)
    reference = _noise(np.random.default_rng(0), channels=1, samples=101)
    assert log_spectral_distance(reference, reference * 2, n_fft=512) == pytest.approx(20 * math.log10(2), abs=1e-3)


def test_audio_finite_and_bad_input():
    clip = np.zeros((2, 10), np.float32)
    assert audio_finite(clip)
    clip[1, 3] = np.nan
    assert not audio_finite(clip)
    with pytest.raises(ValueError, match=r"channel counts differ.*\(2, 10\).*\(1, 10\)"):
        audio_snr_db(clip, clip[:1])
    with pytest.raises(ValueError, match=r"reference: expected float audio"):
        rms_ratio(np.zeros(10, np.float32), np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="n_fft"):
        log_spectral_distance(clip, clip, n_fft=1)
    with pytest.raises(ValueError, match="no common samples"):
        rms_ratio(clip[:, :0], clip)
