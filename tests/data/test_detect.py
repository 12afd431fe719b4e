import numpy as np
import pytest

from workbench.data.detect import caption_match, detect_colour, detect_pitch, match_rates
from workbench.data.synthetic import COLOURS, all_combinations, caption_for, scene

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
