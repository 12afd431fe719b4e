import base64
import dataclasses
import io
import math
import re

import av
import numpy as np
import pytest

from workbench.plots import array_png
from workbench.quality import psnr_per_frame, ssim_per_frame
from workbench.widgets import ABPlayer, SyncedVideos, _common
from workbench.widgets._common import upscale
from workbench.widgets.player import display_size, frame_at, frame_time


def test_slider_moves_heatmap_and_sets_synced_videos_time_to_the_middle_of_the_frame(make_result):
    a = make_result()
    b = make_result(like=a, noise=6)
    player = ABPlayer(a, b, labels=("dense", "cached"))
    player.slider.value = 5
    assert player.image_diff.value == array_png(upscale(player.heatmap(5), 6))  # 28 px x6: the most within 192
    assert player.videos.time == pytest.approx(5.5 / 24)
    assert "frame 5 (frames 0-8)" in player.caption.value
    assert not player.errors.value


def test_synced_videos_time_moves_the_slider(make_result):
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3))
    player.videos.time = 3.5 / 24  # the middle of frame 3, as a scrubbed video reports it
    assert player.slider.value == 3
    player.videos.time = math.trunc(1e6 / 24) / 1e6  # a seek to 1/24 s as Chromium reads it back: still frame 0
    assert player.slider.value == 0
    player.videos.time = 99.0  # past the end (the video's last frame lasts a whole frame period)
    assert player.slider.value == 8


@pytest.mark.parametrize("fps", [8, 16, 24, 25, 30, 60, 120])
def test_every_frame_maps_to_a_time_and_back_through_microsecond_truncation(fps):
    count = 2 * fps + 1
    for frame in range(count):
        seen = math.trunc(frame_time(frame, fps) * 1e6) / 1e6  # what the browser reports after the seek
        assert frame_at(seen, fps, count) == frame
        assert frame * 1e6 / fps <= seen * 1e6 < (frame + 1) * 1e6 / fps  # inside the frame's display interval
    assert frame_at(-1.0, fps, count) == 0 and frame_at(1e9, fps, count) == count - 1


def test_previous_and_next_buttons_step_one_frame_and_stop_at_the_ends(make_result):
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3))
    player.previous.click()
    assert player.slider.value == 0
    for expected in range(1, 9):
        player.next.click()
        assert player.slider.value == expected and player.videos.time == pytest.approx((expected + 0.5) / 24)
    player.next.click()
    assert player.slider.value == 8
    player.previous.click()
    assert player.slider.value == 7


def test_a_one_frame_pair_is_said_as_one_frame(make_result):
    a = make_result(frames=(1, 20, 28))
    player = ABPlayer(a, make_result(like=a, noise=3))
    assert ": 1 frame of 28x20 px @ 24 fps;" in player.header.value
    assert player.caption.value.startswith("frame 0 (the only frame), t = 0.021 s;")
    assert (player.videos.fps, player.videos.frame_count) == (24, 1) and not player.errors.value
    same = ABPlayer(a, a)
    assert "(1 of 1 frame)" in same.identical.value


def test_small_clips_show_enlarged_nearest_neighbour_with_their_true_size(make_result):
    a = make_result(frames=(9, 20, 28))
    player = ABPlayer(a, make_result(like=a, noise=3), labels=("dense", "cached"))
    assert player.factor == 10 and (player.videos.display_width, player.videos.display_height) == (280, 200)
    assert "28x20 px, shown x10" in player.videos.label_a and player.videos.label_a.startswith("dense")
    assert player.videos.loop and not player.videos.playing
    mp4 = base64.b64decode(player.videos.src_a.split(",", 1)[1])
    with av.open(io.BytesIO(mp4)) as container:
        frame = next(container.decode(video=0))
    assert (frame.width, frame.height) == (280, 200)
    assert (player.image_diff.layout.width, player.image_diff.layout.height) == ("168px", "120px")  # x6, not past 192
    assert display_size(64, 64) == (4, (256, 256)) and display_size(480, 832) == (1, (320, 185))
    assert display_size(128, 128) == (2, (256, 256)) and display_size(128, 128, 192, 192) == (1, (128, 128))
    assert display_size(200, 200) == (1, (200, 200))  # x2 would pass 320: shown at its size


def test_compare_swaps_in_a_new_pair_in_place(make_result):
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3), labels=("#1 stock", "#2 x"))
    player.slider.value = 6
    c = make_result(frames=(5, 16, 16))
    d = make_result(like=c, noise=20)
    player.compare(c, d, labels=("#3 stock", "#4 y"))
    assert player.labels == ("#3 stock", "#4 y") and player.slider.max == 4 and player.slider.value == 0
    assert player.psnr.shape == (5,) and "#4 y" in player.header.value and not player.errors.value
    assert (player.videos.fps, player.videos.frame_count) == (24, 5)  # where the browser's pause snaps to
    player.slider.value = 4
    assert player.videos.time == pytest.approx(4.5 / 24)


def test_compare_is_all_or_nothing_and_a_shown_pair_clears_the_error_box(make_result):
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3), labels=("#1 stock", "#2 x"))
    player.show(42)  # a failure while browsing: in the error box

    def on_screen() -> tuple:
        return player.errors.value, player.header.value, player.videos.src_a, player.videos.src_b, player.curves.value

    shown = on_screen()
    assert "showing frame 42 failed" in shown[0]
    c = make_result(frames=(5, 16, 16))
    three_channels = make_result(like=c, noise=20)
    three_channels.audio = np.zeros((3, 4000), np.float32)  # set after it was made: a Result refuses it when made
    with pytest.raises(ValueError, match=r"audio: expected a float numpy array \(C, N\) with C = 1 \(mono\) or 2"):
        player.compare(c, three_channels, labels=("#3 stock", "#4 y"))
    assert on_screen() == shown  # nothing of the refused pair got in
    player.compare(c, make_result(like=c, noise=20), labels=("#3 stock", "#4 y"))
    assert not player.errors.value and "#4 y" in player.header.value
    assert player.videos.src_a != shown[2] and player.videos.src_b != shown[3]


def test_play_button_plays_both_and_says_pause(make_result):
    a = make_result()
    player = ABPlayer(a, a)
    player.play.value = True
    assert player.videos.playing and player.play.description == "pause both"
    player.videos.playing = False  # the browser paused (a video ended or the user paused one)
    assert not player.play.value and player.play.description == "play both"


def test_curves_are_the_quality_metrics_per_frame(make_result):
    a = make_result()
    b = make_result(like=a, noise=10)
    player = ABPlayer(a, b)
    np.testing.assert_allclose(player.psnr, psnr_per_frame(a.frames, b.frames))
    np.testing.assert_allclose(player.ssim, ssim_per_frame(a.frames, b.frames))
    before = player.curves.value
    player.slider.value = 2
    assert bytes(player.curves.value).startswith(b"\x89PNG") and player.curves.value != before  # the marker moved


def test_identical_results_say_so_in_place_of_a_black_heatmap_and_empty_curves(make_result):
    """Bitwise-equal arms (an exact acceleration, one profile run twice): a note, live and in the static copy; a pair
    with only some frames equal keeps its heatmap and curves (whose title counts the identical frames)."""
    a = make_result()
    player = ABPlayer(a, dataclasses.replace(a, frames=a.frames.copy()), labels=("#1 stock", "#2 exact"))
    assert player.diff_max == 0 and np.isposinf(player.psnr).all() and not player.errors.value
    assert len(np.unique(player.heatmap(4).reshape(-1, 3), axis=0)) == 1
    note = "<b>#1 stock and #2 exact are identical</b>: every frame equal, pixel for pixel (9 of 9 frames)"
    assert note in player.identical.value and player.identical.layout.display is None
    assert player.heat_box.layout.display == player.curves.layout.display == "none"
    player.slider.value = 3
    assert player.image_diff.value == player.curves.value == b"" and "frame 3" in player.caption.value
    page = player.static().data
    assert note in page and "<img" not in page and page.count("<video") == 2
    partly = a.frames.copy()
    partly[5] ^= 1  # one frame differs: frames 0-4 and 6-8 stay identical
    player.compare(a, dataclasses.replace(a, frames=partly))
    assert player.diff_max == 1 and np.isposinf(player.psnr).sum() == 8 and np.isfinite(player.psnr[5])
    assert player.identical.value == "" and player.identical.layout.display == "none"
    assert player.heat_box.layout.display is None and player.curves.layout.display is None
    assert player.static().data.count("<img") == 2 and "identical</b>" not in player.static().data


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


def test_static_copy_holds_both_videos_the_frames_heatmap_and_the_curves_as_data_uris(make_result):
    """What an offline HTML export keeps, where the widget is blank: the media inline, sized as on screen."""
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3), labels=("dense", "<cached>"))
    player.slider.value = 4
    page = player.static().data
    assert re.findall(r'<video controls loop width="(\d+)" height="(\d+)" src="([^"]+)"', page) == [
        (str(player.display_size[0]), str(player.display_size[1]), player.videos.src_a),
        (str(player.display_size[0]), str(player.display_size[1]), player.videos.src_b),
    ]
    pngs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert [alt for alt, _ in pngs] == ["|B - A| of frame 4", "per-frame PSNR and SSIM"]
    assert [base64.b64decode(data) for _, data in pngs] == [player.image_diff.value, player.curves.value]
    assert "&lt;cached&gt;" in page and "<cached>" not in page


def test_a_display_carries_the_static_copy_beside_the_view_and_never_fails_for_it(make_result, monkeypatch):
    """A front end without the widget (an HTML export without widget state) shows the copy; a copy too large for a
    notebook file, or one that fails, leaves a note in its place and the view still displays."""
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3))
    bundle = player._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == player.model_id
    assert bundle["text/html"] == player.static().data
    monkeypatch.setattr(_common, "STATIC_COPY_MAX_BYTES", len(bundle["text/html"]) - 1)
    note = player._repr_mimebundle_()["text/html"]
    assert "ABPlayer: its static copy" in note and "left out" in note and "base64" not in note
    monkeypatch.setattr(ABPlayer, "static", lambda self: 1 / 0)
    bundle = player._repr_mimebundle_()
    assert "ZeroDivisionError" in bundle["text/html"] and "application/vnd.jupyter.widget-view+json" in bundle
    player.close()
    assert player._repr_mimebundle_ is None  # a closed widget displays nothing (ipywidgets' own rule)


def test_every_display_shares_the_widgets_display_id_and_a_new_pair_updates_their_copy(make_result, monkeypatch):
    """A saved notebook keeps what an output last showed: a new pair replaces the copy in every earlier display
    (update_display_data under the display id), so an HTML export shows the pair compared last, not the first."""
    shown, updates = [], []
    monkeypatch.setattr(_common, "display", lambda bundle, raw, display_id: shown.append((bundle, display_id)))
    monkeypatch.setattr(_common, "update_display", lambda bundle, raw, display_id: updates.append((bundle, display_id)))
    a = make_result()
    player = ABPlayer(a, make_result(like=a, noise=3), labels=("#1", "#2"))
    player.refresh_static()
    assert updates == []  # nothing displayed yet: nothing to update
    player._ipython_display_()  # what a cell ending in `player`, or display(player), does
    player._ipython_display_()
    (first, display_id), (second, same_id) = shown
    assert display_id == same_id and first == second == player._repr_mimebundle_()
    c = make_result()
    player.compare(c, make_result(like=c, noise=3), labels=("#3", "#4"))
    ((bundle, updated),) = updates
    assert updated == display_id and bundle["text/html"] == player.static().data and "#4" in bundle["text/html"]


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


def test_what_is_not_a_result_is_refused_by_label(make_result):
    with pytest.raises(ValueError, match="B: expected a workbench.Result, got NoneType"):
        ABPlayer(make_result(), None)


def test_a_failure_while_browsing_shows_in_the_widget(make_result):
    a = make_result()
    player = ABPlayer(a, a)
    player.show(42)  # no such frame: the error box says so, no traceback escapes
    assert "showing frame 42 failed" in player.errors.value
    assert "frame: 42 is out of range; allowed: integers in [0, 8]" in player.errors.value
    for frame in (-1, 9, 2.0):  # called directly: refused naming `frame`, never wrapped around to the last frame
        with pytest.raises(ValueError, match=r"^frame: .*integers? in \[0, 8\]"):
            player.heatmap(frame)


def test_a_dashboard_player_already_on_screen_tracks_the_latest_pair(sessions):
    from workbench.widgets import Dashboard

    session = sessions("tiny-wan")
    session.accelerate({})
    dash = Dashboard(session)
    try:
        dash.set_request(prompt="a red circle", seed=3, frames=5, height=32, width=32, steps=1)
        dash.generate()
        dash.generate()
        shown = dash.ab_player  # what a notebook cell displayed a second time
        dash.set_request(seed=4)
        third = dash.generate()
        assert dash.ab_player is shown and shown.result_b is third and shown.labels[1].startswith("#3")
        assert dash.ab.children == (shown,)
    finally:
        dash.live.detach()
