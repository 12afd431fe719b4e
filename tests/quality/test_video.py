import math

import numpy as np
import pytest
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from workbench.media import BLACK_LUMA, encode_mp4, verify_mp4
from workbench.quality import (
    black_frames,
    check_frame_count,
    psnr_per_frame,
    ssim_per_frame,
    ssim_window,
    temporal_consistency,
    video_psnr,
)


def _clip(rng, frames=5, height=19, width=23):
    return rng.integers(0, 256, size=(frames, height, width, 3), dtype=np.uint8)


def _perturb(rng, clip, amplitude):
    noise = rng.integers(-amplitude, amplitude + 1, size=clip.shape)
    return np.clip(clip.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def test_psnr_per_frame_matches_hand_computed():
    reference = np.full((2, 8, 8, 3), 100, np.uint8)
    candidate = reference.copy()
    candidate[1] = 110  # MSE 100 -> 10 log10(255^2 / 100) = 20 log10(25.5)
    psnr = psnr_per_frame(reference, candidate)
    assert psnr[0] == math.inf
    assert psnr[1] == pytest.approx(20 * math.log10(25.5), abs=1e-12)
    # whole clip: MSE 50 over both frames
    assert video_psnr(reference, candidate) == pytest.approx(10 * math.log10(255**2 / 50), abs=1e-12)


def test_psnr_matches_skimage(rng):
    reference = _clip(rng)
    candidate = _perturb(rng, reference, 9)
    expected = [peak_signal_noise_ratio(r, c, data_range=255) for r, c in zip(reference, candidate, strict=True)]
    np.testing.assert_allclose(psnr_per_frame(reference, candidate), expected, rtol=1e-12)
    whole = peak_signal_noise_ratio(reference, candidate, data_range=255)
    assert video_psnr(reference, candidate) == pytest.approx(whole, rel=1e-12)
    assert video_psnr(reference, candidate) <= psnr_per_frame(reference, candidate).mean()


def test_psnr_of_noncontiguous_view_equals_copy(rng):
    reference = _clip(rng, height=20)[:, ::2]
    candidate = _perturb(rng, _clip(rng, height=20), 5)[:, ::2]
    assert not reference.flags.c_contiguous
    np.testing.assert_array_equal(
        psnr_per_frame(reference, candidate), psnr_per_frame(reference.copy(), candidate.copy())
    )


def test_ssim_matches_hand_computed_for_flat_frames():
    # flat frames have zero variance, so SSIM reduces to (2ab + C1) / (a^2 + b^2 + C1), C1 = (0.01 * 255)^2
    reference = np.full((1, 9, 9, 3), 100, np.uint8)
    candidate = np.full((1, 9, 9, 3), 110, np.uint8)
    c1 = (0.01 * 255) ** 2
    expected = (2 * 100 * 110 + c1) / (100**2 + 110**2 + c1)
    assert ssim_per_frame(reference, candidate)[0] == pytest.approx(expected, rel=1e-12)
    assert ssim_per_frame(reference, reference)[0] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(("height", "width", "window"), [(19, 23, 7), (6, 40, 5), (4, 4, 3), (3, 11, 3), (8, 7, 7)])
def test_ssim_matches_skimage_with_small_frame_window(rng, height, width, window):
    assert ssim_window(height, width) == window
    reference = _clip(rng, frames=3, height=height, width=width)
    candidate = _perturb(rng, reference, 20)
    expected = [
        structural_similarity(r, c, channel_axis=-1, data_range=255, win_size=window)
        for r, c in zip(reference, candidate, strict=True)
    ]
    np.testing.assert_allclose(ssim_per_frame(reference, candidate), expected, rtol=1e-12)


def test_ssim_frames_below_3_pixels_raise():
    with pytest.raises(ValueError, match="2x5"):
        ssim_window(2, 5)


def test_metrics_bad_input_raises_naming_field():
    clip = np.zeros((2, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=r"candidate: expected uint8.*float32"):
        psnr_per_frame(clip, clip.astype(np.float32))
    with pytest.raises(ValueError, match=r"\(2, 8, 8, 3\).*\(3, 8, 8, 3\)"):
        ssim_per_frame(clip, np.zeros((3, 8, 8, 3), np.uint8))


def test_temporal_consistency_matches_hand_computed():
    moving = np.stack([np.full((4, 4, 3), v, np.uint8) for v in (0, 10, 20)])
    frozen = np.zeros_like(moving)
    assert temporal_consistency(moving, frozen) == pytest.approx(10 / 510)
    assert temporal_consistency(moving, moving) == 0.0
    assert temporal_consistency(moving, moving + 5) == 0.0  # a brightness offset is not a motion change
    flip = np.stack([np.zeros((2, 2, 3), np.uint8), np.full((2, 2, 3), 255, np.uint8)])
    assert temporal_consistency(flip, flip[::-1]) == 1.0
    assert temporal_consistency(moving[:1], frozen[:1]) == 0.0


def test_temporal_consistency_sees_sped_up_motion_that_frames_metrics_forgive(rng):
    # a candidate that moves twice as fast: each frame is a plausible picture, the motion is wrong
    texture = rng.integers(0, 256, size=(16, 64, 3), dtype=np.uint8)
    reference = np.stack([np.roll(texture, t, axis=1) for t in range(6)])
    faster = np.stack([np.roll(texture, 2 * t, axis=1) for t in range(6)])
    assert temporal_consistency(reference, faster) > 0.1
    assert 0.0 <= temporal_consistency(reference, faster) <= 1.0


def test_black_frames_threshold_inclusive_and_same_rule_as_media_verifier(tmp_path):
    assert 16 / 255.0 == BLACK_LUMA
    clip = np.stack([np.full((16, 16, 3), v, np.uint8) for v in (0, 16, 17, 200, 0)])
    assert black_frames(clip) == 3  # 0, 16 (at the threshold) and 0
    assert black_frames(clip, threshold=17) == 4
    clear = clip[[0, 3, 4, 3]]  # values far from the threshold survive H.264 unchanged in class
    path = tmp_path / "clip.mp4"
    path.write_bytes(encode_mp4(clear, fps=8))
    assert verify_mp4(path).black_frames == black_frames(clear) == 2


def test_check_frame_count(rng):
    clip = _clip(rng, frames=4)
    assert check_frame_count(clip, clip) is None
    assert check_frame_count(clip, clip[:3]) == "frame_count: candidate has 3 frames, reference 4"
