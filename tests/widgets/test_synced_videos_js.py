"""SyncedVideos' JavaScript, run in Node against a fake DOM: the sync rules hold without a browser.

The fake `<video>` reads `currentTime` back truncated to microseconds, as Chromium does (a seek to 1/24 s
reads 0.041666), which is what once made the slider skip frames at 24 fps.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from workbench.widgets.player import SyncedVideos, frame_at, frame_time

HARNESS = Path(__file__).with_name("synced_videos_harness.mjs")
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the widget's ESM")


def run_harness(tmp_path: Path, times: list[float] | None = None) -> subprocess.CompletedProcess:
    esm = tmp_path / "synced_videos.mjs"
    esm.write_text(SyncedVideos._esm)
    command = ["node", str(HARNESS), str(esm)]
    if times is not None:
        (tmp_path / "steps.json").write_text(json.dumps({"times": times}))
        command.append(str(tmp_path / "steps.json"))
    run = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


@needs_node
def test_synced_videos_esm_seeks_plays_and_publishes_time(tmp_path):
    run = run_harness(tmp_path)
    assert run.stdout.count("ok ") == 16


@needs_node
@pytest.mark.parametrize("fps", [24, 25, 30, 16, 60, 120])
def test_every_frame_is_reached_with_both_videos_together_under_microsecond_truncation(tmp_path, fps):
    count = 3 * fps // 2 + 1  # 1.5 s of frames: the slider's ArrowRight steps 0, 1, 2, ..., then End
    frames = [*range(count), count - 1]
    run = run_harness(tmp_path, [frame_time(frame, fps) for frame in frames])
    steps = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("steps "))[6:])
    for frame, step in zip(frames, steps, strict=True):
        assert step["a"] == step["b"], f"frame {frame}: the videos are at {step['a']} and {step['b']}"
        shown = frame_at(step["a"], fps, count)  # the frame the browser shows and a scrub would report
        assert shown == frame, f"frame {frame} at {fps} fps: the video is at {step['a']} s, which is frame {shown}"
        assert frame_at(step["time"], fps, count) == frame
        assert [frame_at(t, fps, count) for t in step["published"]] in ([], [frame]), step
