"""The shipped demo-av checkpoint: loads by name, runs on a CPU in under a minute, and did learn.

The checks that need the checkpoint skip (with the reason) only when its folder is absent; once it is
shipped they must pass. Thresholds are stated here, before measuring: on 8 held-out seeds of training
colour-direction pairs (each colour and direction twice), colour and pitch must match in at least 6 of 8
clips and direction in at least 5 of 8, where chance is 2 of 8.
"""

import time

import numpy as np
import pytest

from workbench import Request, Session
from workbench.models import SHIPPED_MODELS, resolve

DEMO = SHIPPED_MODELS["demo-av"]
needs_checkpoint = pytest.mark.skipif(
    not (DEMO / "model_index.json").is_file(),
    reason=f"demo-av checkpoint not shipped yet: {DEMO} is absent (made by `workbench train-tiny`)",
)
THRESHOLDS = {"colour": 0.75, "direction": 0.625, "pitch": 0.75}


def test_demo_av_name_without_checkpoint_raises_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(SHIPPED_MODELS, "demo-av", tmp_path / "missing")
    with pytest.raises(RuntimeError, match="demo-av.*train-tiny"):
        resolve("demo-av")


@needs_checkpoint
def test_demo_av_checkpoint_is_small_and_safetensors_only():
    files = [p for p in DEMO.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 40 * 2**20
    assert not [p for p in files if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")]


@needs_checkpoint
def test_demo_av_loads_by_name_and_generates_video_with_audio_on_cpu_within_a_minute():
    start = time.perf_counter()
    session = Session.open("demo-av", device="cpu")
    result = session.generate(Request("a red circle moves left, low hum", seed=1_000_000), progress=False)
    elapsed = time.perf_counter() - start
    assert session.family.name == "ltx2" and elapsed < 60.0, elapsed
    assert result.frames.shape[0] >= 9 and result.frames.shape[-1] == 3
    assert result.audio is not None and result.audio.shape[-1] > 0 and np.isfinite(result.audio).all()
    assert result.sample_rate == 16000


@needs_checkpoint
def test_demo_av_matches_held_out_captions_above_threshold():
    from workbench.training.evaluate import caption_match_eval

    report = caption_match_eval("demo-av", count=8, device="cpu")
    rates = report["all"]
    failing = {k: rates[k] for k, minimum in THRESHOLDS.items() if rates[k] < minimum}
    assert not failing, f"below {THRESHOLDS}: {failing}; cases: {[r['match'] for r in report['cases']]}"
