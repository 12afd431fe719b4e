import numpy as np
import pytest
from scipy import ndimage

from workbench.data.detect import RICH_ATTRIBUTES, caption_match, detect_colour, detect_pitch, detect_shape, match_rates
from workbench.data.synthetic import BACKGROUNDS, COLOURS, SHAPES, SPEEDS, all_combinations, caption_for, scene

OTHER_AXIS = {"left": "up", "right": "down", "up": "left", "down": "right"}


def _scenes(rng, count):
    return [scene(int(s)) for s in rng.integers(0, 2**31, size=count)]


def test_detectors_recover_the_generators_ground_truth(rng):
    clips = _scenes(rng, 24)
    rates = match_rates(caption_match(c.video, c.audio, c.sample_rate, c.caption) for c in clips)
    assert all(rates[k] == 1.0 for k in ("colour", "direction", "pitch", "rhythm")), rates


def test_detectors_reject_captions_that_name_something_else(rng):
    clips = _scenes(rng, 16)
    colours = list(COLOURS)
    rows = []
    for clip in clips:
        wrong = colours[(colours.index(clip.labels["colour"]) + 1) % len(colours)]
        caption = caption_for(wrong, clip.labels["shape"], OTHER_AXIS[clip.labels["direction"]])
        rows.append(caption_match(clip.video, clip.audio, clip.sample_rate, caption))
    rates = match_rates(rows)
    assert all(rates[k] == 0.0 for k in ("colour", "direction", "pitch", "rhythm")), rates


def test_detectors_score_noise_at_chance_not_agreement(rng):
    pairs = all_combinations()
    rows = []
    for i in range(32):
        colour, direction = pairs[i % len(pairs)]
        video = rng.integers(0, 256, size=(9, 64, 64, 3), dtype=np.uint8)
        audio = rng.normal(0.0, 0.3, size=(2, 6000)).astype(np.float32)
        rows.append(caption_match(video, audio, 16000, caption_for(colour, "circle", direction)))
    rates = match_rates(rows)
    # chance is 0.25 for colour, direction, pitch (balanced captions) and 0.5 for rhythm
    assert rates["colour"] <= 0.5 and rates["direction"] <= 0.5 and rates["pitch"] <= 0.5, rates
    assert rates["rhythm"] <= 0.75 and rates["all"] <= 0.1, rates


def test_blank_clip_and_silence_detect_nothing():
    video = np.full((9, 32, 32, 3), 90, dtype=np.uint8)
    silence = np.zeros((2, 6000), dtype=np.float32)
    match = caption_match(video, silence, 16000, caption_for("red", "circle", "left"))
    assert all(m["detected"] is None and not m["match"] for m in match.values())
    assert detect_colour(video) is None and detect_pitch(silence, 16000) is None


def test_detectors_bad_input_raises():
    with pytest.raises(ValueError, match="video"):
        detect_colour(np.zeros((9, 8, 8), dtype=np.uint8))
    with pytest.raises(ValueError, match="audio"):
        detect_pitch(np.zeros((2, 2, 10)), 16000)
    with pytest.raises(ValueError, match="matches"):
        match_rates([])


def _other(vocabulary, value):
    names = list(vocabulary)
    return names[(names.index(value) + 1) % len(names)]


def test_rich_detectors_recover_every_attribute_and_reject_every_wrong_one(rng):
    """demo-av 2 scenes (49 x 128 x 128, stereo): all nine attributes measured at 1.0 on ground truth, and
    0.0 when the caption names another colour, shape, axis, speed and background (pan: still <-> moving)."""
    clips = [scene(int(s), 49, 128, 128, rich=True) for s in rng.integers(0, 2**31, size=8)]
    right = match_rates(caption_match(c.video, c.audio, c.sample_rate, c.caption) for c in clips)
    assert all(right[k] == 1.0 for k in RICH_ATTRIBUTES), right
    wrong_rows = []
    for clip in clips:
        labels = clip.labels
        wrong = caption_for(
            _other(COLOURS, labels["colour"]),
            _other(SHAPES, labels["shape"]),
            OTHER_AXIS[labels["direction"]],
            _other(SPEEDS, labels["speed"]),
            _other(BACKGROUNDS, labels["background"]),
        )
        wrong_rows.append(caption_match(clip.video, clip.audio, clip.sample_rate, wrong))
    wrong = match_rates(wrong_rows)
    assert all(wrong[k] == 0.0 for k in RICH_ATTRIBUTES), wrong


def test_shape_detector_classifies_blurred_noisy_outlines(rng):
    """What a decoder gives back is soft-edged: a Gaussian blur (sigma 2 px) plus noise keeps the shape."""
    hits = 0
    for shape in SHAPES * 2:
        clip = scene(int(rng.integers(0, 2**31)), 9, 128, 128, shape=shape, rich=True)
        blurred = ndimage.gaussian_filter(clip.video.astype(float), sigma=(0, 2.0, 2.0, 0))
        noisy = np.clip(blurred + rng.normal(0, 8, blurred.shape), 0, 255).astype(np.uint8)
        hits += detect_shape(noisy) == shape
    assert hits == 2 * len(SHAPES)
