"""Quality metrics and the budget: is a candidate's output still the reference's product?

Pure functions over numpy/torch values (no session, no I/O), so notebooks, widgets and the evidence
harness all judge outputs by the same arithmetic.
"""

from workbench.quality.audio import (
    audio_finite,
    audio_length_difference,
    audio_snr_db,
    log_spectral_distance,
    rms_ratio,
    spectral_cosine,
)
from workbench.quality.budget import Budget
from workbench.quality.compare import Comparison, compare, compare_arrays
from workbench.quality.latent import latent_rel_l2
from workbench.quality.video import (
    black_frames,
    check_frame_count,
    psnr_per_frame,
    ssim_per_frame,
    ssim_window,
    temporal_consistency,
    video_psnr,
)

__all__ = [
    "Budget",
    "Comparison",
    "audio_finite",
    "audio_length_difference",
    "audio_snr_db",
    "black_frames",
    "check_frame_count",
    "compare",
    "compare_arrays",
    "latent_rel_l2",
    "log_spectral_distance",
    "psnr_per_frame",
    "rms_ratio",
    "spectral_cosine",
    "ssim_per_frame",
    "ssim_window",
    "temporal_consistency",
    "video_psnr",
]
