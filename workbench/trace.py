"""One request under torch.profiler, its stages and denoise steps as named ranges: `Session.generate(trace=True)`.

The trace is a Chrome trace (JSON, gzip-compressed), which Perfetto (ui.perfetto.dev) and chrome://tracing open.
Every stage the telemetry times (`text_encode`, `denoise`, `video_decode`, ...) is a range on the request's thread,
and inside `denoise` each step is one (`step 0`, `step 1`, ...); on a CUDA device the kernels are on the GPU's
tracks, linked to the launches inside those ranges. The profiler adds its own overhead to every operator, so a
traced request's timings are not the untraced request's: its result says `metadata["traced"]`, and evidence never
traces. The outputs are the untraced request's, bit for bit (the profiler only observes).
"""

from __future__ import annotations

import gzip
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from workbench.evidence.timing import profile_summary
from workbench.telemetry import Event


class RequestTrace:
    """A context manager profiling one request of `steps` denoise steps on `device`; `on_event` is its telemetry
    subscriber, which opens and closes the ranges. Ranges still open when it exits (a request stopped or failed
    mid-stage) are closed there, so the trace of an interrupted request is whole up to the interruption. After the
    exit: `chrome_trace()` and `summary()`."""

    def __init__(self, device: torch.device, steps: int):
        self.device, self.cuda, self.steps = device, device.type == "cuda", steps
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        # acc_events: one cycle either way; without it torch warns that each cycle clears the last one's events
        self.profiler = profile(activities=activities, acc_events=True)
        self.open: list[tuple[str, record_function]] = []  # innermost last
        self.names: set[str] = set()  # every range opened: not operators, left out of `summary`

    def __enter__(self) -> RequestTrace:
        with _quiet_stderr():
            self.profiler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        while self.open:
            self._close()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        with _quiet_stderr():
            self.profiler.__exit__(*exc)

    def on_event(self, event: Event) -> None:
        if event.kind == "stage_start":
            self._open(event.stage)
            if event.stage == "denoise":
                self._open("step 0")
        elif event.kind == "step":
            if self.open and self.open[-1][0] == f"step {event.data['index']}":
                self._close()
            if event.data["index"] + 1 < self.steps:
                self._open(f"step {event.data['index'] + 1}")
        elif event.kind == "stage_end":
            names = [name for name, _ in self.open]
            if event.stage in names:  # close it and whatever opened inside it (a step)
                while self.open and self.open[-1][0] != event.stage:
                    self._close()
                self._close()

    def _open(self, name: str) -> None:
        scope = record_function(name)
        scope.__enter__()
        self.names.add(name)
        self.open.append((name, scope))

    def _close(self) -> None:
        self.open.pop()[1].__exit__(None, None, None)

    def chrome_trace(self) -> bytes:
        """The Chrome trace JSON, gzip-compressed (a `.json.gz` that Perfetto opens as it is)."""
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "trace.json"
            self.profiler.export_chrome_trace(str(path))
            return gzip.compress(path.read_bytes(), compresslevel=6)

    def summary(self, top: int = 15) -> dict[str, Any]:
        """Self time by operator name (`timing.profile_summary`): CUDA kernels and copies on a CUDA device, CPU
        operators elsewhere; the stage and step ranges left out."""
        return profile_summary(self.profiler, self.cuda, top, skip=self.names)


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block: the profiler's native start and stop lines ("USDT: ...
    profiler_start"), which a notebook would show under the cell, written below Python's sys.stderr."""
    sys.stderr.flush()  # what Python wrote before the block reaches the real stderr
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
