"""A traced request (`Session.generate(trace=True)`, workbench/trace.py): its outputs are the untraced request's, bit
for bit; its Chrome trace holds every stage and denoise step as a named range, the steps inside denoise; the summary
counts operators, not those ranges; `save` writes the trace with the set; a stopped traced request leaves no profiler
running; and the profiler's native start/stop lines never reach stderr."""

import gzip
import json

import numpy as np
import pytest
import torch

from workbench import Request, RequestStopped, Session

REQUEST = Request("a red kite", seed=3, steps=3, frames=9, height=32, width=32)


@pytest.fixture(scope="module")
def session():
    return Session.open("tiny-wan", device="cpu")


def ranges(result):
    """The trace's named ranges in the order they opened: [(name, start us, end us)]."""
    events = json.loads(gzip.decompress(result.trace))["traceEvents"]
    marked = sorted((e["ts"], e["name"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "user_annotation")
    return [(name, start, end) for start, name, end in marked]


def test_a_traced_request_equals_the_untraced_one_and_marks_its_stages_and_steps(session, tmp_path, capfd):
    plain = session.generate(REQUEST, progress=False)
    capfd.readouterr()
    traced = session.generate(REQUEST, progress=False, trace=True)
    assert "profiler" not in capfd.readouterr().err  # kineto's "USDT: ... profiler_start" stays off the notebook
    assert plain.trace is None and "traced" not in plain.metadata
    assert torch.equal(traced.latents, plain.latents) and np.array_equal(traced.frames, plain.frames)
    marked = ranges(traced)
    names = [name for name, _, _ in marked]
    assert names == ["text_encode", "denoise", "step 0", "step 1", "step 2", "video_decode"]
    (_, denoise_start, denoise_end), steps = marked[1], marked[2:5]
    assert all(denoise_start <= start <= end <= denoise_end for _, start, end in steps)
    assert all(a[2] <= b[1] for a, b in zip(steps, steps[1:], strict=False))  # one after another, never overlapping
    summary = traced.metadata["trace"]
    assert traced.metadata["traced"] and summary["activity"] == "cpu" and summary["top"]
    assert not {row["name"] for row in summary["top"]} & set(names)  # operators only
    assert summary["total_ms"] >= sum(row["ms"] for row in summary["top"])
    traced.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "result.html", "result.json", "result.mp4", "result.trace.json.gz"
    ]  # fmt: skip
    assert (tmp_path / "result.trace.json.gz").read_bytes() == traced.trace
    assert "Profiled" in (tmp_path / "result.html").read_text()


def test_a_stopped_traced_request_leaves_no_profiler_behind(session):
    unsubscribe = session.subscribe(lambda e: e.kind == "step" and e.data["index"] == 0 and session.stop())
    try:
        with pytest.raises(RequestStopped, match="in denoise, 1 of 3"):
            session.generate(REQUEST, progress=False, trace=True)
    finally:
        unsubscribe()
    again = session.generate(REQUEST, progress=False, trace=True)  # a profiler left running would refuse to start
    assert [name for name, _, _ in ranges(again)][-1] == "video_decode"
    with pytest.raises(ValueError, match="trace: expected a bool, got str 'yes'"):
        session.generate(REQUEST, trace="yes")


@pytest.mark.gpu
def test_a_traced_cuda_request_counts_kernels_once_and_marks_its_stages():
    """On a GPU the summary is the kernels' device time (operators, which launched them, left out: no time counted
    twice), and the ranges are there as on the CPU."""
    session = Session.open("tiny-wan", device="cuda")
    try:
        traced = session.generate(REQUEST, progress=False, trace=True)
    finally:
        session.close()
    summary = traced.metadata["trace"]
    assert summary["activity"] == "cuda" and summary["top"]
    assert not [row["name"] for row in summary["top"] if row["name"].startswith("aten::")]
    assert [name for name, _, _ in ranges(traced)] == ["text_encode", "denoise", "step 0", "step 1", "step 2",
                                                       "video_decode"]  # fmt: skip
