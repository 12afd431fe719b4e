"""Compare a candidate's outputs with its reference's: every metric, the budget verdict, and why it failed.

`compare_arrays` is the pure function of arrays; `compare` is its thin adapter for two `Result`s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from workbench.quality.audio import (
    audio_finite,
    audio_length_difference,
    audio_snr_db,
    log_spectral_distance,
    rms_ratio,
    spectral_cosine,
)
from workbench.quality.budget import Budget
from workbench.quality.latent import latent_rel_l2
from workbench.quality.video import (
    black_frames,
    check_frame_count,
    check_frames,
    psnr_per_frame,
    ssim_per_frame,
    temporal_consistency,
    video_psnr,
)

if TYPE_CHECKING:
    from workbench.result import Result


@dataclass
class Comparison:
    """Metrics of one candidate against one reference, and whether they stay inside `budget`.

    Video metrics cover the common frames (`frames_compared`); audio metrics the common samples.
    `psnr_db` is the whole-clip PSNR the budget checks; `psnr_per_frame`/`ssim_per_frame` are float64 (T,).
    A metric is None when it could not be measured (no latents, no audio on one side, sample rates differ).
    `finite`: no NaN/inf in either side's audio or latents. `exact`: frames, audio and latents bitwise equal.
    `failures` lists, one message each, every budget limit missed and every structural difference (frame
    count, audio length or presence, sample rate, new black frames, non-finite output).
    """

    budget: Budget
    frames_compared: int
    reference_frames: int
    candidate_frames: int
    psnr_per_frame: np.ndarray
    ssim_per_frame: np.ndarray
    psnr_db: float
    psnr_min_db: float
    ssim_mean: float
    min_ssim: float
    temporal_consistency: float
    reference_black_frames: int
    candidate_black_frames: int
    latent_rel_l2: float | None
    audio_snr_db: float | None
    lsd_db: float | None
    spectral_cosine: float | None
    rms_ratio: float | None
    audio_length_difference: int | None
    finite: bool
    exact: bool
    failures: list[str] = field(default_factory=list)

    @property
    def within_budget(self) -> bool:
        return not self.failures

    def measured(self) -> dict[str, float | None]:
        """The metrics the budget limits, by limit name (`rms_ratio_error` is |rms_ratio - 1|)."""
        values = {f.name: getattr(self, f.name, None) for f in dataclasses.fields(self.budget)}
        values["rms_ratio_error"] = None if self.rms_ratio is None else abs(self.rms_ratio - 1.0)
        return values

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly: arrays become lists; inf/-inf become the strings "inf"/"-inf" and NaN becomes None.

        Strict JSON has no infinities, and an identical frame's PSNR (inf) must stay distinguishable from a
        missing metric (None), hence strings for the infinities. Every budget term is a key, `rms_ratio_error`
        (derived from `rms_ratio`) included, so a report can show each term the budget limits.
        """
        out: dict[str, Any] = {"budget": self.budget.to_dict(), "within_budget": self.within_budget}
        for name in self.__dataclass_fields__:
            if name != "budget":
                out[name] = _json_value(getattr(self, name))
        out["rms_ratio_error"] = _json_value(self.measured()["rms_ratio_error"])  # the budget's term, derived
        return out


def _json_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_json_value(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    return value


def _bitwise_equal(a: np.ndarray | torch.Tensor | None, b: np.ndarray | torch.Tensor | None) -> bool:
    """Same dtype, shape and bytes (so NaN equals the same NaN, and -0.0 differs from 0.0)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return False


def compare(reference_result: Result, candidate_result: Result, budget: Budget | None = None) -> Comparison:
    """`compare_arrays` on two `Result`s: their frames, audio (with sample rates) and latents."""
    return compare_arrays(
        reference_result.frames,
        candidate_result.frames,
        reference_audio=(reference_result.audio, reference_result.sample_rate),
        candidate_audio=(candidate_result.audio, candidate_result.sample_rate),
        reference_latents=reference_result.latents,
        candidate_latents=candidate_result.latents,
        budget=budget,
    )


def compare_arrays(
    reference_frames: np.ndarray,
    candidate_frames: np.ndarray,
    *,
    reference_audio: tuple[np.ndarray | None, int | None] = (None, None),
    candidate_audio: tuple[np.ndarray | None, int | None] = (None, None),
    reference_latents: torch.Tensor | None = None,
    candidate_latents: torch.Tensor | None = None,
    budget: Budget | None = None,
) -> Comparison:
    """Every quality metric of a candidate's outputs against a reference's, checked against `budget`.

    Frames are uint8 (T, H, W, 3); audio is `(samples (C, N) float32 or None, sample rate in Hz or None)`;
    latents any shape, the same on both sides. `budget` defaults to `Budget()` (the seeds' limits). Frames
    must share height and width, and latents their shape (a ValueError names both shapes otherwise: such
    outputs answer different requests). What else differs (frame count, audio length, sample rate) is
    compared over what the two share and reported in `failures`.
    """
    budget = Budget() if budget is None else budget
    ref_frames, cand_frames = reference_frames, candidate_frames
    check_frames("reference frames", ref_frames)
    check_frames("candidate frames", cand_frames)
    if ref_frames.shape[1:] != cand_frames.shape[1:]:
        raise ValueError(f"frames: sizes differ, reference {ref_frames.shape} vs candidate {cand_frames.shape}")
    failures = []
    if (problem := check_frame_count(ref_frames, cand_frames)) is not None:
        failures.append(problem)
    count = min(len(ref_frames), len(cand_frames))
    if count == 0:
        raise ValueError(f"frames: nothing to compare, reference {ref_frames.shape} vs candidate {cand_frames.shape}")
    ref_common, cand_common = ref_frames[:count], cand_frames[:count]
    psnr = psnr_per_frame(ref_common, cand_common)
    ssim = ssim_per_frame(ref_common, cand_common)
    ref_black, cand_black = black_frames(ref_frames), black_frames(cand_frames)
    if cand_black > ref_black:
        failures.append(f"black_frames: candidate has {cand_black}, reference {ref_black}")

    latents = _latents(reference_latents, candidate_latents)
    audio = _audio(reference_audio, candidate_audio, failures)
    finite = _finite(
        {"reference": (reference_audio[0], reference_latents), "candidate": (candidate_audio[0], candidate_latents)},
        failures,
    )
    comparison = Comparison(
        budget=budget,
        frames_compared=count,
        reference_frames=len(ref_frames),
        candidate_frames=len(cand_frames),
        psnr_per_frame=psnr,
        ssim_per_frame=ssim,
        psnr_db=video_psnr(ref_common, cand_common),
        psnr_min_db=float(psnr.min()),
        ssim_mean=float(ssim.mean()),
        min_ssim=float(ssim.min()),
        temporal_consistency=temporal_consistency(ref_common, cand_common),
        reference_black_frames=ref_black,
        candidate_black_frames=cand_black,
        latent_rel_l2=latents,
        audio_snr_db=audio["audio_snr_db"],
        lsd_db=audio["lsd_db"],
        spectral_cosine=audio["spectral_cosine"],
        rms_ratio=audio["rms_ratio"],
        audio_length_difference=audio["audio_length_difference"],
        finite=finite,
        exact=(
            _bitwise_equal(ref_frames, cand_frames)
            and _bitwise_equal(reference_audio[0], candidate_audio[0])
            and _bitwise_equal(reference_latents, candidate_latents)
        ),
    )
    comparison.failures = budget.failures(comparison.measured()) + failures
    return comparison


def _latents(reference: torch.Tensor | None, candidate: torch.Tensor | None) -> float | None:
    if reference is None or candidate is None:
        return None
    return latent_rel_l2(reference, candidate)


def _audio(
    reference: tuple[np.ndarray | None, int | None],
    candidate: tuple[np.ndarray | None, int | None],
    failures: list[str],
) -> dict[str, Any]:
    """Audio metrics (None when there is nothing comparable), appending structural problems to `failures`."""
    names = ("audio_snr_db", "lsd_db", "spectral_cosine", "rms_ratio", "audio_length_difference")
    out: dict[str, Any] = dict.fromkeys(names)
    (ref, ref_rate), (cand, cand_rate) = reference, candidate
    if ref is None and cand is None:
        return out
    if ref is None or cand is None:
        failures.append(f"audio: {'reference' if ref is None else 'candidate'} has no audio, the other has")
        return out
    if ref_rate != cand_rate:
        failures.append(f"sample_rate: candidate {cand_rate} Hz, reference {ref_rate} Hz")
        return out
    out["audio_length_difference"] = difference = audio_length_difference(ref, cand)
    if difference:
        failures.append(f"audio_length: candidate {cand.shape[1]} samples, reference {ref.shape[1]}")
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # non-finite audio is named by `_finite`
        out["audio_snr_db"] = audio_snr_db(ref, cand)
        out["lsd_db"] = log_spectral_distance(ref, cand)
        out["spectral_cosine"] = spectral_cosine(ref, cand)
        out["rms_ratio"] = rms_ratio(ref, cand)
    return out


def _finite(sides: dict[str, tuple[np.ndarray | None, torch.Tensor | None]], failures: list[str]) -> bool:
    """Audio and latents of both sides free of NaN/inf; each offender is named in `failures`."""
    finite = True
    for side, (audio, latents) in sides.items():
        if audio is not None and not audio_finite(audio):
            failures.append(f"finite: {side} audio has non-finite samples")
            finite = False
        if latents is not None and not bool(torch.isfinite(latents).all()):
            failures.append(f"finite: {side} latents have non-finite values")
            finite = False
    return finite
