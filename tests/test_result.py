"""`Result`'s text repr: what a console, `print` or a list of results shows."""

import dataclasses

import numpy as np
import pytest
import torch

from workbench import Result


def test_result_repr_is_a_one_line_summary_not_the_pixels():
    frames = np.random.default_rng(0).integers(0, 256, (9, 32, 32, 3), dtype=np.uint8)
    result = Result(
        frames=frames,
        audio=np.zeros((2, 4000), np.float32),
        sample_rate=16000,
        fps=16,
        latents=torch.zeros(1, 4, 3, 4, 4),
        timings={"denoise": 0.4, "total": 0.5},
        memory={},
        exact=False,
        metadata={"model": "tiny-wan", "request": {"prompt": "a red circle", "seed": 3}},
    )
    assert repr(result) == (
        "Result(model='tiny-wan', prompt='a red circle', seed=3, frames=(9, 32, 32, 3) @ 16 fps, "
        "audio=(2, 4000) @ 16000 Hz, total=0.500 s, exact=False, finite=True)"
    )
    bare = dataclasses.replace(
        result, audio=None, sample_rate=None, timings={}, metadata={"request": {"prompt": "a" * 61}}
    )
    assert (
        repr(bare)
        == f"Result(prompt='{'a' * 57}...', frames=(9, 32, 32, 3) @ 16 fps, audio=None, exact=False, finite=True)"
    )


def test_save_refuses_what_is_not_a_directory_before_encoding(monkeypatch, tmp_path):
    result = Result(np.zeros((2, 16, 16, 3), np.uint8), None, None, 8, None, {}, {})
    monkeypatch.setattr(Result, "mp4_bytes", lambda *a, **k: pytest.fail("encoded before the directory was checked"))
    for directory in (None, 5, "", "  "):
        with pytest.raises(ValueError, match="^directory: expected a path"):
            result.save(directory)


@pytest.mark.parametrize("fps", [0, -5, 0.0, float("nan"), float("inf"), True, "24", None])
def test_a_result_refuses_an_fps_that_is_not_a_finite_positive_number(fps):
    """A non-positive or non-finite frame rate cannot be played: refused naming `fps` when the Result is made, not
    later as an MP4 with no time base, a PyAV error or a division by zero in the A/B player."""
    with pytest.raises(ValueError, match=r"^fps: expected a finite number of frames per second > 0, got "):
        Result(np.zeros((2, 16, 16, 3), np.uint8), None, None, fps, None, {}, {})
    assert Result(np.zeros((2, 16, 16, 3), np.uint8), None, None, 29.97, None, {}, {}).fps == 29.97


def test_save_refuses_a_name_utf8_cannot_encode_before_creating_anything(tmp_path):
    """An undecodable byte in a name arrives as a lone surrogate (b'a\\x80' -> 'a\\udc80'): the file system would take
    it, the UTF-8 record and page cannot; refused naming `name`, with no folder left behind."""
    result = Result(np.zeros((2, 16, 16, 3), np.uint8), None, None, 8, None, {}, {})
    with pytest.raises(ValueError, match=r"^name: 'a\\udc80' holds '\\udc80', which UTF-8 cannot encode"):
        result.save(tmp_path / "d", "a\udc80")
    assert list(tmp_path.iterdir()) == []
