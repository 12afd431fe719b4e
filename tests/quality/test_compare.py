import json
import math

import numpy as np
import pytest
import torch

from workbench import Result
from workbench.quality import Budget, compare, compare_arrays


def _result(frames, audio=None, latents=None, sample_rate=16000):
    return Result(
        frames=frames,
        audio=audio,
        sample_rate=None if audio is None else sample_rate,
        fps=16,
        latents=latents,
        timings={},
        memory={},
    )


def _reference(rng, frames=5):
    return _result(
        frames=rng.integers(0, 256, size=(frames, 17, 21, 3), dtype=np.uint8),
        audio=(0.3 * rng.standard_normal((2, 3000))).astype(np.float32),
        latents=torch.from_numpy(rng.standard_normal((1, 4, 2, 3, 5))).float(),
    )


def _candidate(rng, reference, pixel_noise, latent_noise, audio_gain=1.0):
    noise = rng.integers(-pixel_noise, pixel_noise + 1, size=reference.frames.shape)
    frames = np.clip(reference.frames.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    latents = reference.latents + latent_noise * torch.from_numpy(rng.standard_normal(reference.latents.shape)).float()
    return _result(frames, reference.audio * np.float32(audio_gain), latents)


def test_compare_identical_results_are_exact_and_within_budget(rng):
    reference = _reference(rng)
    comparison = compare(reference, _result(reference.frames.copy(), reference.audio.copy(), reference.latents.clone()))
    assert comparison.exact and comparison.finite and comparison.within_budget
    assert comparison.failures == []
    assert comparison.psnr_db == math.inf and comparison.min_ssim == pytest.approx(1.0)
    assert comparison.latent_rel_l2 == 0.0 and comparison.audio_snr_db == math.inf
    record = comparison.to_dict()
    assert record["psnr_db"] == "inf" and record["psnr_per_frame"] == ["inf"] * 5
    assert record["within_budget"] is True and record["budget"] == Budget().to_dict()
    json.dumps(record, allow_nan=False)


def test_compare_small_error_is_within_budget_but_not_exact(rng):
    reference = _reference(rng)
    comparison = compare(reference, _candidate(rng, reference, pixel_noise=1, latent_noise=0.005, audio_gain=1.05))
    assert comparison.within_budget, comparison.failures
    assert not comparison.exact
    assert 0 < comparison.latent_rel_l2 < 0.03
    assert 45 < comparison.psnr_db < 55  # +-1 noise: MSE about 2/3, about 50 dB
    assert comparison.psnr_per_frame.shape == comparison.ssim_per_frame.shape == (5,)
    record = comparison.to_dict()
    assert set(Budget().to_dict()) <= set(record)  # every budget term is in the record, the derived one too
    assert record["rms_ratio_error"] == pytest.approx(0.05)  # audio 5 % louder


def test_compare_large_error_names_every_failed_metric(rng):
    reference = _reference(rng)
    comparison = compare(reference, _candidate(rng, reference, pixel_noise=60, latent_noise=0.2))
    assert not comparison.within_budget
    names = [failure.split(":")[0] for failure in comparison.failures]
    assert names == ["latent_rel_l2", "psnr_db", "min_ssim"]
    assert "0.03" in comparison.failures[0] and "33 dB" in comparison.failures[1]
    assert comparison.to_dict()["failures"] == comparison.failures


def test_compare_budget_boundary_through_measured_values(rng):
    reference = _reference(rng)
    candidate = _candidate(rng, reference, pixel_noise=3, latent_noise=0.01)
    measured = compare(reference, candidate)
    at_limit = Budget(latent_rel_l2=measured.latent_rel_l2, psnr_db=measured.psnr_db, min_ssim=measured.min_ssim)
    assert compare(reference, candidate, at_limit).within_budget
    beyond = Budget(psnr_db=math.nextafter(measured.psnr_db, math.inf), latent_rel_l2=measured.latent_rel_l2)
    assert [f.split(":")[0] for f in compare(reference, candidate, beyond).failures] == ["psnr_db"]


def test_compare_structural_differences_are_failures(rng):
    reference = _reference(rng)
    shorter = _result(reference.frames[:4], reference.audio[:, :2900], reference.latents)
    comparison = compare(reference, shorter)
    assert comparison.frames_compared == 4 and comparison.candidate_frames == 4 and comparison.reference_frames == 5
    assert comparison.audio_length_difference == -100
    assert comparison.failures == [
        "frame_count: candidate has 4 frames, reference 5",
        "audio_length: candidate 2900 samples, reference 3000",
    ]
    silent = compare(reference, _result(reference.frames, None, reference.latents))
    assert silent.failures == ["audio: candidate has no audio, the other has"] and silent.audio_snr_db is None
    other_rate = compare(reference, _result(reference.frames, reference.audio, reference.latents, sample_rate=8000))
    assert other_rate.failures == ["sample_rate: candidate 8000 Hz, reference 16000 Hz"]
    with pytest.raises(ValueError, match="sizes differ"):
        compare(reference, _result(reference.frames[:, :16], reference.audio, reference.latents))


def test_compare_nonfinite_candidate_is_not_finite_and_fails(rng):
    reference = _reference(rng)
    audio = reference.audio.copy()
    audio[0, 7] = np.inf
    latents = reference.latents.clone()
    latents[0, 0, 0, 0, 0] = math.nan
    comparison = compare(reference, _result(reference.frames, audio, latents))
    assert not comparison.finite and not comparison.within_budget
    assert "finite: candidate audio has non-finite samples" in comparison.failures
    assert "finite: candidate latents have non-finite values" in comparison.failures
    record = comparison.to_dict()
    assert record["latent_rel_l2"] is None  # NaN becomes None in JSON
    json.dumps(record, allow_nan=False)


def test_compare_without_latents_fails_the_latent_gate_unless_disabled(rng):
    reference = _reference(rng)
    bare_ref = _result(reference.frames, reference.audio)
    assert compare(bare_ref, bare_ref).failures == ["latent_rel_l2: not measured, limit <= 0.03"]
    assert compare(bare_ref, bare_ref, Budget(latent_rel_l2=None)).within_budget


def test_compare_new_black_frames_fail(rng):
    reference = _reference(rng)
    frames = reference.frames.copy()
    frames[2] = 0
    comparison = compare(reference, _result(frames, reference.audio, reference.latents), Budget(None, None, None))
    assert comparison.candidate_black_frames == 1 and comparison.reference_black_frames == 0
    assert comparison.failures == ["black_frames: candidate has 1, reference 0"]


def test_compare_arrays_is_the_pure_function_behind_compare(rng):
    reference = _reference(rng)
    candidate = _candidate(rng, reference, pixel_noise=3, latent_noise=1e-3, audio_gain=0.9)
    from_results = compare(reference, candidate)
    from_arrays = compare_arrays(
        reference.frames,
        candidate.frames,
        reference_audio=(reference.audio, reference.sample_rate),
        candidate_audio=(candidate.audio, candidate.sample_rate),
        reference_latents=reference.latents,
        candidate_latents=candidate.latents,
    )
    assert from_arrays.to_dict() == from_results.to_dict()
    video_only = compare_arrays(reference.frames, candidate.frames)
    assert video_only.audio_snr_db is None and video_only.latent_rel_l2 is None
    assert video_only.psnr_db == from_results.psnr_db
    other_rate = compare_arrays(
        reference.frames,
        reference.frames,
        reference_audio=(reference.audio, 16000),
        candidate_audio=(reference.audio, 8000),
    )
    assert any("sample_rate" in failure for failure in other_rate.failures)
