"""`Result`'s text repr: what a console, `print` or a list of results shows; its HTML, what a notebook shows."""

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


FPS_REFUSED = r"^fps: expected a finite number of frames per second > 0, got "
FRAMES_REFUSED = r"^frames: expected a uint8 numpy array \(T, H, W, 3\)"
AUDIO_REFUSED = r"^audio: expected "
RATE_REFUSED = r"^sample_rate: expected an AAC sample rate in Hz, one of 7350, 8000, .*, 96000 \(the MPEG-4 "
CHANNELS_REFUSED = AUDIO_REFUSED + r"a float numpy array \(C, N\) with C = 1 \(mono\) or 2 \(stereo\) channels, got "


@pytest.mark.parametrize(
    ("given", "match"),
    [({"fps": fps}, FPS_REFUSED) for fps in (0, -5, 0.0, float("nan"), float("inf"), True, "24", None)]
    + [
        ({"frames": [[[[0, 0, 0]]]]}, FRAMES_REFUSED + r", got list "),
        ({"frames": np.zeros((2, 16, 16, 3), np.float32)}, FRAMES_REFUSED + r", got float32 array"),
        ({"frames": np.zeros((16, 16, 3), np.uint8)}, FRAMES_REFUSED),
        ({"frames": np.zeros((2, 16, 16, 4), np.uint8)}, FRAMES_REFUSED + r" with T, H, W >= 1, got \(2, 16, 16, 4\)"),
        ({"frames": np.zeros((0, 16, 16, 3), np.uint8)}, FRAMES_REFUSED + r" with T, H, W >= 1, got \(0, 16, 16, 3\)"),
        ({"audio": np.zeros(400, np.float32)}, AUDIO_REFUSED + r"None or a float numpy array \(C, N\), got float32"),
        ({"audio": np.zeros((2, 400), np.int16)}, AUDIO_REFUSED + r"None or a float numpy array \(C, N\), got int16"),
        ({"audio": [[0.0] * 400]}, AUDIO_REFUSED + r"None or a float numpy array \(C, N\), got list"),
        ({"audio": np.zeros((0, 400), np.float32)}, CHANNELS_REFUSED + r"shape \(0, 400\)$"),
        ({"audio": np.zeros((6, 400), np.float32)}, CHANNELS_REFUSED + r"shape \(6, 400\)$"),
        ({"audio": np.zeros((400, 2), np.float32)}, CHANNELS_REFUSED + r"shape \(400, 2\) \(transposed\? channels"),
    ]
    + [
        ({"sample_rate": rate}, RATE_REFUSED + r"sampling frequency table\), got " + got)
        for rate, got in [
            (None, "NoneType None"),
            (0, "int 0"),
            (1, "int 1"),
            (7, "int 7"),
            (12345, "int 12345"),
            (2**31 - 1, "int 2147483647"),
            (16000.0, "float 16000.0"),
            (True, "bool True"),
            (2**40, "int 1099511627776"),
        ]
    ],
)
def test_a_result_refuses_what_it_cannot_play_naming_the_field(given, match):
    """Frames, audio, sample rate and fps a clip cannot be made of are refused naming the field when the Result is
    made, not later as an AttributeError in `save`, a division by zero in `audio_seconds` or the A/B widgets, an
    MP4 with no time base or a PyAV error (PyAV's AAC encoder takes only the MPEG-4 table's rates, mono or stereo
    as `encode_mp4` writes it)."""
    fields = {"frames": np.zeros((2, 16, 16, 3), np.uint8), "audio": np.zeros((2, 400), np.float32)}
    fields |= {"sample_rate": 16000, "fps": 8, "latents": None, "timings": {}, "memory": {}}
    with pytest.raises(ValueError, match=match):
        Result(**(fields | given))
    assert Result(**(fields | {"fps": 29.97})).fps == 29.97
    taken = Result(**(fields | {"sample_rate": np.int64(16000), "audio": np.zeros((1, 400), np.float64)}))
    assert type(taken.sample_rate) is int and taken.audio_seconds == 0.025  # a numpy integer is taken as an int
    for rate in (16000, 24000, 32000, 48000):  # the demo models', LTX-2's vocoder's, H3's, LTX-2's upsampler's
        assert Result(**(fields | {"sample_rate": rate})).sample_rate == rate
    assert Result(**(fields | {"audio": None, "sample_rate": None})).audio_seconds is None


def test_save_refuses_a_name_utf8_cannot_encode_before_creating_anything(tmp_path):
    """An undecodable byte in a name arrives as a lone surrogate (b'a\\x80' -> 'a\\udc80'): the file system would take
    it, the UTF-8 record and page cannot; refused naming `name`, with no folder left behind."""
    result = Result(np.zeros((2, 16, 16, 3), np.uint8), None, None, 8, None, {}, {})
    with pytest.raises(ValueError, match=r"^name: 'a\\udc80' holds '\\udc80', which UTF-8 cannot encode"):
        result.save(tmp_path / "d", "a\udc80")
    assert list(tmp_path.iterdir()) == []


def test_result_html_shows_peak_memory_only_where_it_was_measured_and_receipts_in_words(monkeypatch):
    """`memory` is CUDA's peak allocation per stage, `{}` elsewhere: a CPU result's stage table has no column of
    blanks, a CUDA one names what the column measured. Receipts read as the reports write them, not as JSON."""
    monkeypatch.setattr(Result, "mp4_bytes", lambda *a, **k: b"")
    cpu = Result(np.zeros((2, 16, 16, 3), np.uint8), None, None, 8, None, {"denoise": 0.4, "total": 0.5}, {})
    page = cpu._repr_html_()
    assert "<tr><th>stage</th><th>ms</th></tr><tr><td>denoise</td><td>400.0</td></tr>" in page and "MiB" not in page
    cuda = dataclasses.replace(cpu, memory={"denoise": 3 * 2**20})
    page = cuda._repr_html_()
    assert "<th>peak CUDA MiB allocated</th>" in page and "<td>denoise</td><td>400.0</td><td>3.0</td>" in page
    receipt = {"contract": "approximate", "options": {"threshold": 0.2}, "executed": True, "reused": 1, "notes": {}}
    page = dataclasses.replace(cpu, receipts={"easycache": receipt})._repr_html_()
    said = "approximate, options {&quot;threshold&quot;: 0.2}: executed, reused 1"
    assert f"<tr><td>easycache</td><td>{said}</td></tr>" in page and "&quot;executed&quot;" not in page
