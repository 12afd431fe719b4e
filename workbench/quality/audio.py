"""Audio metrics on float waveforms (C, N), reference first, candidate second.

Clips whose lengths differ are compared over the common length (the first min(N) samples of each);
`audio_length_difference` says by how much they differ so that a caller can report it rather than
have the truncation pass unnoticed. All arithmetic is float64.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import stft

POWER_FLOOR = 1e-10  # STFT power floor (-100 dB re full scale): silent bins compare equal, not as log(0)


def check_audio(name: str, audio: np.ndarray) -> None:
    """Raise ValueError unless `audio` is a floating-point array (C, N)."""
    if not isinstance(audio, np.ndarray) or audio.ndim != 2 or not np.issubdtype(audio.dtype, np.floating):
        got = f"{audio.dtype} {audio.shape}" if isinstance(audio, np.ndarray) else type(audio).__name__
        raise ValueError(f"{name}: expected float audio (C, N), got {got}")


def _common(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both clips as float64 over their common length; channel counts must agree."""
    check_audio("reference", reference)
    check_audio("candidate", candidate)
    if reference.shape[0] != candidate.shape[0]:
        raise ValueError(f"audio: channel counts differ, reference {reference.shape} vs candidate {candidate.shape}")
    length = min(reference.shape[1], candidate.shape[1])
    if length == 0:
        raise ValueError(f"audio: no common samples, reference {reference.shape} vs candidate {candidate.shape}")
    return reference[:, :length].astype(np.float64), candidate[:, :length].astype(np.float64)


def audio_length_difference(reference: np.ndarray, candidate: np.ndarray) -> int:
    """Candidate samples minus reference samples (0 when the metrics saw both clips whole)."""
    check_audio("reference", reference)
    check_audio("candidate", candidate)
    return int(candidate.shape[1] - reference.shape[1])


def audio_finite(audio: np.ndarray) -> bool:
    """True when every sample is finite: a NaN/inf waveform is broken output, whatever else it scores."""
    check_audio("audio", audio)
    return bool(np.isfinite(audio).all())


def audio_snr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """10 log10(reference energy / error energy) in dB.

    inf when identical, -inf against a silent reference or an infinite error, NaN when either holds NaN.
    """
    ref, cand = _common(reference, candidate)
    signal = float(np.sum(ref * ref))
    noise = float(np.sum((cand - ref) ** 2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    with np.errstate(divide="ignore", invalid="ignore"):  # an inf/NaN error gives -inf/NaN, not an exception
        return float(10.0 * np.log10(signal / noise))


def _spectrogram(audio: np.ndarray, n_fft: int) -> np.ndarray:
    """Complex STFT (C, F, frames), Hann window, half overlap; the window shrinks for clips shorter than n_fft."""
    _, _, spectrum = stft(audio, nperseg=min(n_fft, audio.shape[1]), axis=-1)
    return spectrum


def _check_n_fft(n_fft: int) -> None:
    if isinstance(n_fft, bool) or not isinstance(n_fft, int) or n_fft < 2:
        raise ValueError(f"n_fft: must be an integer >= 2, got {n_fft!r}")


def log_spectral_distance(reference: np.ndarray, candidate: np.ndarray, n_fft: int = 512) -> float:
    """Log-spectral distance in dB: RMS over frequency of the dB power difference, averaged over frames and channels.

    It weighs quiet bands like loud ones, so a codec or cache that smears the spectrum shows even when
    the waveform SNR is dominated by a few loud partials. A gain g on the whole clip gives |20 log10 g|.
    Power below POWER_FLOOR counts as the floor, so silence against silence is 0 dB.
    """
    _check_n_fft(n_fft)
    ref, cand = _common(reference, candidate)
    ref_power = np.abs(_spectrogram(ref, n_fft)) ** 2
    cand_power = np.abs(_spectrogram(cand, n_fft)) ** 2
    difference = 10.0 * np.log10((ref_power + POWER_FLOOR) / (cand_power + POWER_FLOOR))  # (C, F, frames)
    return float(np.sqrt(np.mean(difference**2, axis=1)).mean())


def spectral_cosine(reference: np.ndarray, candidate: np.ndarray, n_fft: int = 512) -> float:
    """Cosine similarity of the two magnitude spectrograms (all channels together); 1.0 = same spectral shape.

    Blind to overall gain (see `rms_ratio`) and to phase, so it isolates changes in what is heard from how loud.
    Two silent clips give 1.0; a silent clip against a sounding one gives 0.0.
    """
    _check_n_fft(n_fft)
    ref, cand = _common(reference, candidate)
    ref_mag = np.abs(_spectrogram(ref, n_fft)).ravel()
    cand_mag = np.abs(_spectrogram(cand, n_fft)).ravel()
    ref_norm, cand_norm = float(np.linalg.norm(ref_mag)), float(np.linalg.norm(cand_mag))
    if ref_norm == 0.0 and cand_norm == 0.0:
        return 1.0
    if ref_norm == 0.0 or cand_norm == 0.0:
        return 0.0
    return float(np.dot(ref_mag, cand_mag) / (ref_norm * cand_norm))


def rms_ratio(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Candidate RMS / reference RMS: 1.0 = same loudness; catches a candidate that went quiet or clipped loud."""
    ref, cand = _common(reference, candidate)
    ref_rms = math.sqrt(float(np.mean(ref * ref)))
    cand_rms = math.sqrt(float(np.mean(cand * cand)))
    if ref_rms == 0.0:
        return 1.0 if cand_rms == 0.0 else math.inf
    return cand_rms / ref_rms
