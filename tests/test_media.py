import ctypes

import numpy as np
import pytest

from workbench import Request, Result
from workbench.io import write_atomic
from workbench.media import AAC_LAYOUTS, AAC_SAMPLE_RATES, decode_mp4, encode_mp4, verify_mp4

M_PERTURB = -6  # glibc's mallopt parameter: fill each allocation with the byte given, XOR 0xFF


def test_result_save_round_trips_through_verifier(sessions, tmp_path):
    result = sessions("tiny-ltx2").generate(Request("a red circle", seed=2), progress=False)
    mp4 = result.save(tmp_path, "clip")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.html", "clip.json", "clip.mp4"]
    report = verify_mp4(mp4, expect_frames=9, expect_audio_seconds=result.audio_seconds)
    assert report.ok, report.problems
    assert (report.frames, report.width, report.height, report.audio_channels) == (9, 64, 64, 2)
    frames, audio, rate = decode_mp4(mp4)
    assert rate == 16000
    # random-weight frames are noise, which 4:2:0 chroma cannot keep per pixel; per-frame colour survives
    assert np.abs(frames.mean(axis=(1, 2)) - result.frames.mean(axis=(1, 2))).max() < 4
    assert "data:video/mp4;base64," in (tmp_path / "clip.html").read_text()
    assert "<script" not in result._repr_html_()


def test_smooth_video_survives_encoding_closely(tmp_path):
    y, x = np.mgrid[0:48, 0:64]
    frames = np.stack([np.stack([x * 3 + t * 5, y * 4, 128 + 0 * x], -1) for t in range(6)]).astype(np.uint8)
    audio = (0.5 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)).astype(np.float32)[None]
    path = write_atomic(tmp_path / "s.mp4", encode_mp4(frames, 12, audio, 16000))
    decoded, sound, rate = decode_mp4(path)
    assert decoded.shape == frames.shape and np.abs(decoded.astype(int) - frames).mean() < 3
    spectrum = np.abs(np.fft.rfft(sound[0, 2048:6144]))
    assert abs(np.argmax(spectrum) * rate / 4096 - 440) < 8  # the tone survives AAC


def test_equal_inputs_encode_to_equal_bytes_whatever_memory_held_before():
    """Two encodes of one clip are byte-identical (two saves of one Result match by hash), whatever the memory the
    encoder allocates held before: x264's macroblock tree reads some it has not written, so with it a flat clip gave
    other bytes when glibc handed out blocks filled with zeros than with 0xAB (`mallopt(M_PERTURB, b)` fills each
    allocation with b ^ 0xFF)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallopt"):
        pytest.skip("needs glibc's mallopt")
    y, x = np.mgrid[0:32, 0:32]
    frames = np.zeros((9, 32, 32, 3), np.uint8) + np.array([30, 60, 90], np.uint8)
    for t in range(9):  # a red disc moving left over a flat background
        frames[t][(y - 16) ** 2 + (x - 24 + 3 * t) ** 2 < 100] = [220, 30, 30]
    audio = (0.5 * np.sin(2 * np.pi * 440 * np.arange(6000) / 16000)).astype(np.float32)[None]
    encoded = []
    try:
        for perturb in (0xFF, 0x54, 0):  # allocations filled with 0x00, then 0xAB, then left as they come
            assert libc.mallopt(M_PERTURB, perturb) == 1
            encoded.append(encode_mp4(frames, 24, audio, 16000))
    finally:
        libc.mallopt(M_PERTURB, 0)
    assert encoded[0] == encoded[1] == encoded[2]


def test_verifier_flags_black_frames_and_wrong_counts(tmp_path):
    rng = np.random.default_rng(0)
    frames = rng.integers(60, 255, (5, 32, 32, 3), dtype=np.uint8)
    frames[2] = 0
    path = write_atomic(tmp_path / "x.mp4", encode_mp4(frames, 8))
    report = verify_mp4(path, expect_frames=6, expect_audio_seconds=1.0)
    assert not report.ok
    assert report.black_frames == 1
    assert any(p.startswith("frames: decoded 5") for p in report.problems)
    assert any(p.startswith("audio: expected an audio stream") for p in report.problems)


def test_encode_rejects_bad_frames():
    with pytest.raises(ValueError, match="frames: expected uint8"):
        encode_mp4(np.zeros((2, 8, 8, 3), np.float32), 8)


def test_encode_writes_every_aac_rate_in_mono_and_stereo(tmp_path):
    """AAC_SAMPLE_RATES and AAC_LAYOUTS are what the AAC encoder takes: each pair encodes and decodes back as given."""
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    for rate in AAC_SAMPLE_RATES:
        for channels in AAC_LAYOUTS:
            mp4 = encode_mp4(frames, 8, np.zeros((channels, 1024), np.float32), rate)
            _, audio, decoded_rate = decode_mp4(write_atomic(tmp_path / "a.mp4", mp4))
            assert (decoded_rate, audio.shape[0]) == (rate, channels)


@pytest.mark.parametrize(
    ("audio", "rate"),
    [(np.zeros((2, 1000), np.float32), rate) for rate in (None, 1, 7, 12345, 2**31 - 1, np.float64(16000))]
    + [(np.zeros(shape, np.float32), 16000) for shape in ((1000, 2), (6, 1000), (0, 1000), (1000,))]
    + [(np.zeros((2, 1000), np.int16), 16000)],
)
def test_encode_refuses_audio_aac_cannot_hold_as_a_result_does(audio, rate):
    """PyAV answers a rate outside the MPEG-4 table with a bare 'Invalid argument' from avcodec_open2: encode_mp4
    refuses it, and audio that is not mono or stereo (C, N), with the message a Result gives when it is made."""
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=r"^(audio|sample_rate): expected ") as encoding:
        encode_mp4(frames, 8, audio, rate)
    with pytest.raises(ValueError) as making:
        Result(frames, audio, rate, 8, None, {}, {})
    assert str(encoding.value) == str(making.value)


def test_result_save_writes_strict_json_with_numpy_numbers(tmp_path):
    import json
    import math

    from workbench.result import Result

    rng = np.random.default_rng()
    result = Result(
        frames=rng.integers(0, 255, (5, 16, 16, 3), dtype=np.uint8),
        audio=None,
        sample_rate=None,
        fps=8,
        latents=None,
        timings={"denoise": math.nan, "decode": np.float32(0.5)},
        memory={"denoise": np.int64(1 << 40)},
        metadata={"request": {"seed": np.uint64(2**63), "guidance": math.inf, "prompt": "p"}},
    )
    result.save(tmp_path, "clip")
    text = (tmp_path / "clip.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    record = json.loads(text)
    assert record["timings"] == {"denoise": None, "decode": 0.5} and record["memory"]["denoise"] == 1 << 40
    assert record["metadata"]["request"] == {"seed": 2**63, "guidance": None, "prompt": "p"}
    with pytest.raises(ValueError, match="name: must be a plain file stem"):
        result.save(tmp_path, "../escape")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.html", "clip.json", "clip.mp4"]


def test_encode_refuses_non_finite_audio_and_fps_naming_the_field():
    """PyAV answers NaN samples or a zero/negative frame rate with a bare 'Invalid argument' (or, for fps 0, writes a
    file no player can time): each is a ValueError naming the field before anything is encoded."""
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    audio = np.zeros((2, 2048), np.float32)
    audio[1, 5], audio[0, 7] = np.nan, -np.inf
    with pytest.raises(
        ValueError, match=r"^audio: 2 of 4096 samples are NaN/inf; allowed: finite samples in \[-1, 1\]"
    ):
        encode_mp4(frames, 8, audio, 16000)
    for fps in (0, -5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"^fps: expected a finite number of frames per second > 0"):
            encode_mp4(frames, fps)
    with pytest.raises(ValueError, match=r"^fps: 0\.0001 is below the 1/1000"):
        encode_mp4(frames, 0.0001)
