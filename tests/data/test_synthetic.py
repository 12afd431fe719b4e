import numpy as np
import pytest

from workbench.data.synthetic import COLOURS, DIRECTIONS, SHAPES, caption_for, parse_caption, scene


def test_scene_is_deterministic_per_seed(rng):
    seed = int(rng.integers(0, 2**31))
    first, again, other = scene(seed), scene(seed), scene(seed + 1)
    assert np.array_equal(first.video, again.video) and np.array_equal(first.audio, again.audio)
    assert first.caption == again.caption and first.labels == again.labels
    assert not np.array_equal(first.video, other.video)


@pytest.mark.parametrize(("frames", "height", "width"), [(9, 64, 64), (17, 48, 80), (5, 33, 65)])
def test_scene_shapes_ranges_and_audio_length(rng, frames, height, width):
    clip = scene(int(rng.integers(0, 2**31)), frames=frames, height=height, width=width, fps=24, sample_rate=16000)
    assert clip.video.shape == (frames, height, width, 3) and clip.video.dtype == np.uint8
    assert clip.audio.shape == (2, round(frames / 24 * 16000)) and clip.audio.dtype == np.float32
    assert np.abs(clip.audio).max() <= 1.0 and np.abs(clip.audio).max() > 0.1
    assert clip.video.std() > 5  # a shape on a background, not a flat frame


def test_forced_labels_are_honoured_and_captioned(rng):
    colour = str(rng.choice(list(COLOURS)))
    direction = str(rng.choice(list(DIRECTIONS)))
    shape = str(rng.choice(SHAPES))
    clip = scene(int(rng.integers(0, 2**31)), colour=colour, direction=direction, shape=shape)
    assert clip.caption == caption_for(colour, shape, direction)
    assert parse_caption(clip.caption) == clip.labels
    assert clip.labels["colour"] == colour and clip.labels["direction"] == direction


def test_scene_bad_input_raises():
    with pytest.raises(ValueError, match="frames"):
        scene(0, frames=1)
    with pytest.raises(ValueError, match="colour.*purple"):
        scene(0, colour="purple")
    with pytest.raises(ValueError, match="seed"):
        scene(-1)
    with pytest.raises(ValueError, match="exactly one colour"):
        parse_caption("a purple blob moves left")
    with pytest.raises(ValueError, match="exactly one direction"):
        parse_caption("a red circle moves left and right")


def test_rich_scene_is_deterministic_and_its_caption_names_every_label(rng):
    from workbench.data.synthetic import BACKGROUNDS, SPEEDS

    seed = int(rng.integers(0, 2**31))
    first, again = scene(seed, 49, 128, 128, rich=True), scene(seed, 49, 128, 128, rich=True)
    assert np.array_equal(first.video, again.video) and np.array_equal(first.audio, again.audio)
    assert parse_caption(first.caption) == first.labels
    assert first.labels["speed"] in SPEEDS and first.labels["background"] in BACKGROUNDS
    assert first.labels["loudness"] == {"slow": "soft", "fast": "loud"}[first.labels["speed"]]
    assert first.video.shape == (49, 128, 128, 3) and first.audio.shape == (2, round(49 / 24 * 16000))
    forced = scene(seed, 49, 128, 128, speed="fast", background="light", direction="right", rich=True)
    left, right = np.abs(forced.audio[:, :4000]).mean(axis=1), np.abs(forced.audio[:, -4000:]).mean(axis=1)
    assert right[1] / right[0] > left[1] / left[0]  # the sound pans right with the shape
    assert forced.caption.startswith(
        f"a {forced.labels['colour']} {forced.labels['shape']} moves right fast on a light"
    )


def test_rich_vocabulary_bad_input_raises():
    with pytest.raises(ValueError, match="rich"):
        scene(0, speed="fast")
    with pytest.raises(ValueError, match="speed.*medium"):
        scene(0, speed="medium", rich=True)
    with pytest.raises(ValueError, match="exactly one background"):
        parse_caption("a red circle moves left fast, loud low hum")
