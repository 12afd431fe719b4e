"""Pixel metrics on decoded video: uint8 frames (T, H, W, 3), reference first, candidate second.

PSNR and SSIM come from scikit-image so that the numbers mean what readers of other reports expect;
the workbench only adds the per-frame loop, the small-frame window rule and the checks around them.
"""

from __future__ import annotations

import numpy as np
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from workbench.media import BLACK_LUMA

DATA_RANGE = 255
SSIM_MAX_WINDOW = 7  # scikit-image's default window; smaller only when a frame is smaller
BLACK_THRESHOLD = round(BLACK_LUMA * 255)  # the media verifier's black-frame level on the 0..255 scale


def check_frames(name: str, frames: np.ndarray) -> None:
    """Raise ValueError unless `frames` is uint8 (T, H, W, 3): the one layout every metric here assumes."""
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        got = f"{frames.dtype} {frames.shape}" if isinstance(frames, np.ndarray) else type(frames).__name__
        raise ValueError(f"{name}: expected uint8 frames (T, H, W, 3), got {got}")


def _pair(reference: np.ndarray, candidate: np.ndarray) -> None:
    check_frames("reference", reference)
    check_frames("candidate", candidate)
    if reference.shape != candidate.shape:
        raise ValueError(f"frames: shapes differ, reference {reference.shape} vs candidate {candidate.shape}")


def _psnr(reference: np.ndarray, candidate: np.ndarray) -> float:
    """scikit-image PSNR, except that identical inputs give inf without a divide-by-zero warning."""
    if np.array_equal(reference, candidate):
        return float("inf")
    return float(peak_signal_noise_ratio(reference, candidate, data_range=DATA_RANGE))


def psnr_per_frame(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """PSNR in dB of each frame, float64 (T,); inf where a frame is bitwise identical."""
    _pair(reference, candidate)
    return np.array([_psnr(r, c) for r, c in zip(reference, candidate, strict=True)], dtype=np.float64)


def video_psnr(reference: np.ndarray, candidate: np.ndarray) -> float:
    """PSNR in dB of the whole clip: from the mean squared error over every frame, inf only if all are identical.

    This is the figure the budget's `psnr_db` applies to. Averaging errors before taking the log gives a
    value never above the mean of per-frame dB values, and one identical frame (inf dB) cannot lift it.
    """
    _pair(reference, candidate)
    return _psnr(reference, candidate)


def ssim_window(height: int, width: int) -> int:
    """The SSIM window: 7, or the largest odd size that fits a smaller frame (scikit-image needs odd, <= side)."""
    side = min(height, width)
    if side < 3:
        raise ValueError(f"frames: SSIM needs frames of at least 3x3 pixels, got {height}x{width}")
    return min(SSIM_MAX_WINDOW, side if side % 2 else side - 1)


def ssim_per_frame(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """SSIM of each frame (colour channels averaged, as scikit-image does), float64 (T,); 1.0 means identical."""
    _pair(reference, candidate)
    window = ssim_window(reference.shape[1], reference.shape[2])
    return np.array(
        [
            structural_similarity(r, c, channel_axis=-1, data_range=DATA_RANGE, win_size=window)
            for r, c in zip(reference, candidate, strict=True)
        ],
        dtype=np.float64,
    )


def temporal_consistency(reference: np.ndarray, candidate: np.ndarray) -> float:
    """How differently the two clips move: 0 = the same frame-to-frame changes, 1 = opposite extremes.

    Per-frame PSNR/SSIM can stay high while a feature cache freezes or skips motion; comparing the
    consecutive-frame differences catches that. Value = mean |dC - dR| / 510 where dX = X[t+1] - X[t];
    510 (= 2 * 255) is the largest possible |dC - dR|, which keeps the value in [0, 1]. Clips of fewer
    than two frames have no motion to disagree on and give 0.0.
    """
    _pair(reference, candidate)
    if reference.shape[0] < 2:
        return 0.0
    ref_motion = np.diff(reference.astype(np.int16), axis=0)
    cand_motion = np.diff(candidate.astype(np.int16), axis=0)
    return float(np.abs(cand_motion - ref_motion).mean(dtype=np.float64) / (2 * DATA_RANGE))


def black_frames(frames: np.ndarray, threshold: float = BLACK_THRESHOLD) -> int:
    """Count frames whose mean value is at or below `threshold` (0..255 scale).

    The default (16) and the arithmetic are those of `workbench.media.verify_mp4` (BLACK_LUMA = 16/255), so
    a clip counted here and the same clip decoded from its MP4 are judged by one rule.
    """
    check_frames("frames", frames)
    luma = frames.astype(np.float32).mean(axis=(1, 2, 3)) / 255.0
    return int((luma <= threshold / 255.0).sum())


def check_frame_count(reference: np.ndarray, candidate: np.ndarray) -> str | None:
    """None when both clips have the same number of frames, else a message naming both counts."""
    check_frames("reference", reference)
    check_frames("candidate", candidate)
    if reference.shape[0] == candidate.shape[0]:
        return None
    return f"frame_count: candidate has {candidate.shape[0]} frames, reference {reference.shape[0]}"
