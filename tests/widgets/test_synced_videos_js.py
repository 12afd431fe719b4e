"""SyncedVideos' JavaScript, run in Node against a fake DOM: the sync rules hold without a browser."""

import shutil
import subprocess
from pathlib import Path

import pytest

from workbench.widgets.player import SyncedVideos

HARNESS = Path(__file__).with_name("synced_videos_harness.mjs")


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the widget's ESM; none on PATH")
def test_synced_videos_esm_seeks_plays_and_publishes_time(tmp_path):
    esm = tmp_path / "synced_videos.mjs"
    esm.write_text(SyncedVideos._esm)
    run = subprocess.run(["node", str(HARNESS), str(esm)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok ") == 10
