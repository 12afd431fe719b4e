"""The log-mel representation demo-av's audio VAE and vocoder share, and the vocoder's training loss.

The LTX-2 pipeline never computes a mel spectrogram for text-to-audio+video: its audio VAE decodes latents
to "a mel spectrogram" and the vocoder turns that into a waveform. So the representation is ours to choose,
as long as the two are trained on the same one; it lives here and nowhere in the shipped checkpoint.
Filterbank from `transformers.audio_utils` (Slaney scale), STFT from torch.
"""

from __future__ import annotations

import functools

import torch
from transformers.audio_utils import mel_filter_bank

from workbench.training.model import HOP, MEL_BINS, SAMPLE_RATE

N_FFT = 512
F_MIN, F_MAX = 60.0, 4000.0
LOG_FLOOR = 1e-4
LOG_CENTRE, LOG_SCALE = -4.0, 4.0  # maps log-magnitudes of silence..loud tones to about [-1, 1.5]
STFT_LOG_EPS = 1e-2  # see stft_loss
STFT_RESOLUTIONS = ((256, 64), (512, 128), (1024, 256))  # (n_fft, hop) pairs of the vocoder loss
CHANNEL_GAIN_LOW = 0.25  # channel_gains draws each channel's gain log-uniformly from [this, 1]


@functools.cache
def _filterbank(device: str) -> torch.Tensor:
    bank = mel_filter_bank(
        num_frequency_bins=N_FFT // 2 + 1,
        num_mel_filters=MEL_BINS,
        min_frequency=F_MIN,
        max_frequency=F_MAX,
        sampling_rate=SAMPLE_RATE,
        norm="slaney",
        mel_scale="slaney",
    )
    return torch.tensor(bank, dtype=torch.float32, device=device)  # (freqs, mels)


def mel_frames(latent_frames: int) -> int:
    """Mel frames the audio VAE decodes `latent_frames` latents to (causal: 4 per latent, less the first 3)."""
    return max(4 * latent_frames - 3, 1)


def log_mel(waveform: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, C, N) waveform -> (B, C, frames, MEL_BINS) normalised log-mel (frame k centred on sample k * HOP)."""
    batch, channels, samples = waveform.shape
    flat = waveform.reshape(batch * channels, samples).float()
    window = torch.hann_window(N_FFT, device=flat.device)
    spectrum = torch.stft(flat, N_FFT, hop_length=HOP, window=window, center=True, return_complex=True).abs()
    if spectrum.shape[-1] < frames:
        raise ValueError(f"waveform: {samples} samples give {spectrum.shape[-1]} mel frames, need {frames}")
    mel = torch.einsum("bft,fm->btm", spectrum[..., :frames], _filterbank(str(flat.device)))
    normalised = (torch.log(mel.clamp(min=LOG_FLOOR)) - LOG_CENTRE) / LOG_SCALE
    return normalised.reshape(batch, channels, frames, MEL_BINS)


def stft_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Multi-resolution STFT loss (spectral convergence + log-magnitude L1), blind to phase.

    Phase-blind on purpose: the tones' phases are random, so a waveform L1 would teach the vocoder to
    output silence; the spectra say what a listener (and the pitch detector) hears. The log term compares
    `log(|S| + STFT_LOG_EPS)`: with a tiny floor every silent bin of a pure tone weighs as much as the tone
    itself and a near-silent output scores well, so a vocoder trained on it falls silent. With this floor
    it keeps the tones' loudness (benchmarks/results/probes/2026-11-29-vocoder-loss-cpu.json compares the floors).
    """
    length = min(prediction.shape[-1], target.shape[-1])
    prediction = prediction[..., :length].reshape(-1, length).float()
    target = target[..., :length].reshape(-1, length).float()
    total = prediction.new_zeros(())
    for n_fft, hop in STFT_RESOLUTIONS:
        window = torch.hann_window(n_fft, device=prediction.device)
        predicted, wanted = (
            torch.stft(x, n_fft, hop, window=window, return_complex=True).abs() for x in (prediction, target)
        )
        convergence = torch.linalg.norm(wanted - predicted) / torch.linalg.norm(wanted).clamp(min=1e-5)
        log_error = (torch.log(predicted + STFT_LOG_EPS) - torch.log(wanted + STFT_LOG_EPS)).abs().mean()
        total = total + convergence + log_error
    return total / len(STFT_RESOLUTIONS)


def channel_gains(wave: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(B, C, N) waveform with an independent random gain per clip and channel (log-uniform in
    [CHANNEL_GAIN_LOW, 1]), for the vocoder's training.

    Why: the scenes' pan moves the two channels' levels only slightly apart, so a vocoder can lower its loss
    a long way with one level for both channels and stay there. With independent gains one common level is
    a poor answer: each output channel's level has to follow its own mel channel, which is what panning needs.
    """
    shape = (wave.shape[0], wave.shape[1], 1)
    u = torch.rand(shape, generator=generator, device=wave.device)
    return wave * CHANNEL_GAIN_LOW**u


def one_channel(mel: torch.Tensor, wave: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Mels (B, 2, T, M) and waveforms (B, 2, N) -> one randomly chosen channel of each clip on both channels:
    what each block of a `separate_channels` vocoder plays (see `workbench.training.model.separate_channels`)."""
    rows = torch.arange(mel.shape[0], device=mel.device)
    pick = torch.randint(0, 2, (mel.shape[0],), generator=generator, device=mel.device)
    mono_mel, mono_wave = mel[rows, pick], wave[rows, pick]
    return torch.stack([mono_mel, mono_mel], 1), torch.stack([mono_wave, mono_wave], 1)


def vocoder_loss(prediction: torch.Tensor, target: torch.Tensor, mel: torch.Tensor) -> torch.Tensor:
    """What the vocoder is trained on: `stft_loss` against the true waveform plus the L1 between the log-mel
    of its output and the mel it was given (`mel`, (B, C, frames, MEL_BINS), as `log_mel` makes them).

    The mel term asks for exactly what the vocoder is for: its output, analysed as its input was, gives that
    input back.
    """
    return stft_loss(prediction, target) + (log_mel(prediction, mel.shape[2]) - mel).abs().mean()
