import base64

import numpy as np
import pytest

from workbench.plots import array_png
from workbench.quality import psnr_per_frame, ssim_per_frame
from workbench.widgets import ABPlayer, SyncedVideos
from workbench.widgets._common import upscale


def test_slider_moves_both_images_and_sets_synced_videos_time(make_result):
    a = make_result()
    b = make_result(like=a, noise=6)
    player = ABPlayer(a, b, labels=("dense", "cached"))
    player.slider.value = 5
    assert player.image_a.value == array_png(upscale(a.frames[5]))
    assert player.image_b.value == array_png(upscale(b.frames[5]))
    assert player.image_diff.value == array_png(upscale(player.heatmap(5)))
    assert player.videos.time == pytest.approx(5 / 24)
    assert "frame 5 of 8" in player.caption.value
    assert not player.errors.value


def test_synced_videos_time_moves_the_slider(make_result):
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3))
    player.videos.time = 3.5 / 24  # the middle of frame 3, as a scrubbed video reports it
    assert player.slider.value == 3
    player.videos.time = 99.0  # past the end (the video's last frame lasts a whole frame period)
    assert player.slider.value == 8


def test_curves_are_the_quality_metrics_per_frame(make_result):
    a = make_result()
    b = make_result(like=a, noise=10)
    player = ABPlayer(a, b)
    np.testing.assert_allclose(player.psnr, psnr_per_frame(a.frames, b.frames))
    np.testing.assert_allclose(player.ssim, ssim_per_frame(a.frames, b.frames))
    before = player.curves.value
    player.slider.value = 2
    assert bytes(player.curves.value).startswith(b"\x89PNG") and player.curves.value != before  # the marker moved


def test_identical_results_give_a_flat_heatmap_and_infinite_psnr(make_result):
    a = make_result()
    player = ABPlayer(a, a)
    assert player.diff_max == 0
    assert len(np.unique(player.heatmap(4).reshape(-1, 3), axis=0)) == 1
    assert np.isposinf(player.psnr).all() and not player.errors.value


def test_synced_videos_carry_both_results_as_mp4_data_uris(make_result):
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3))
    assert isinstance(player.videos, SyncedVideos)
    for src in (player.videos.src_a, player.videos.src_b):
        prefix = "data:video/mp4;base64,"
        assert src.startswith(prefix) and base64.b64decode(src[len(prefix) :])[4:8] == b"ftyp"
    assert not player.videos.playing
    player.play.value = True  # the Python-side toggle drives the synced trait
    assert player.videos.playing


@pytest.mark.parametrize(
    "b_kwargs, match",
    [
        ({"frames": (5, 20, 28)}, r"frame count: A has 9 frames, B has 5"),
        ({"frames": (9, 20, 30)}, r"frame size: A is 28x20, B is 30x20"),
        ({"fps": 25}, r"fps: A is 24, B is 25"),
    ],
)
def test_mismatched_results_raise_naming_what_differs(make_result, b_kwargs, match):
    with pytest.raises(ValueError, match=match):
        ABPlayer(make_result(), make_result(**b_kwargs))


def test_a_failure_while_browsing_shows_in_the_widget(make_result):
    a = make_result()
    player = ABPlayer(a, a)
    player.show(42)  # no such frame: the error box says so, no traceback escapes
    assert "showing frame 42 failed" in player.errors.value and "IndexError" in player.errors.value
