"""The one timing code of the project: how long a call takes, and A/B/A interleaved rounds of arms.

Clocks (`time_call`):
- CUDA, `synchronised_s`: each call alone between a CUDA-event pair, the device synchronised after it. A call made
  of many launches also pays the host's launch time here (the GPU idles while the host catches up).
- CUDA, `queued_s`: `repeats` calls queued back to back between one event pair, per call: the device time a call
  costs when the host runs ahead, as inside a model forward.
- CUDA graph (`graph=True`): the call captured once in a CUDA graph (after warm-up on a side stream, as
  `torch.cuda.graphs` requires) and the replays timed with both clocks above: device time without launch overhead.
- CPU: `time.perf_counter` around each call (`queued_s` is the back-to-back mean, which on a CPU is the same work).
Warm-up calls (Triton compiles, allocator growth, cuDNN plans) are never timed.

Where the time goes (`kernel_times`): one call under torch.profiler, device kernels (CPU ops off CUDA) summed by
name. A view for finding a gap between two arms, not a clock: the profiler adds its own overhead.

A/B/A (`aba_rounds`): one baseline visit, then per round each candidate followed by a baseline visit (A, B1, A, B2,
A, B1, A, ...), so every candidate sits between two baseline visits and is paired with their mean; a round reuses
the previous round's last baseline visit as its first. The speed-up and its CI95 come from
`workbench.evidence.stats.paired_ratio_ci` (median of per-round ratios, bootstrap over rounds).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from workbench.evidence.stats import MIN_PAIRS, RatioCI, paired_ratio_ci


@dataclass(frozen=True)
class Timing:
    """Seconds of one call: `synchronised_s` per timed call (each alone), `queued_s` per call when queued
    (None when the queued clock was not asked for)."""

    clock: str  # "cuda-events", "cuda-graph" or "perf_counter"
    synchronised_s: tuple[float, ...]
    queued_s: float | None
    warmup: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.synchronised_s)

    @property
    def device_s(self) -> float:
        """Seconds per call as a model pays them: the queued clock when measured, else the synchronised median.
        The clock for kernels of microseconds, whose synchronised time is mostly launch latency and idle clocks."""
        return self.median_s if self.queued_s is None else self.queued_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "synchronised_s": list(self.synchronised_s), "median_s": self.median_s,
                "device_s": self.device_s}  # fmt: skip


def time_call(
    fn: Callable[[], Any],
    device: torch.device | str,
    repeats: int = 10,
    warmup: int = 3,
    graph: bool = False,
    queued: bool = True,
) -> Timing:
    """Time `fn()` on `device` with both clocks (module doc); `graph=True` times CUDA-graph replays of it;
    `queued=False` skips the queued clock (for calls of seconds, where `repeats` more calls cost too much).

    ValueError for repeats < 1 or warmup < 0 (graph capture needs warmup >= 1); RuntimeError for a graph
    on a device that is not CUDA.
    """
    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    if warmup < (1 if graph else 0):
        raise ValueError(f"warmup: must be >= {1 if graph else 0}{' with graph=True' if graph else ''}, got {warmup}")
    device = torch.device(device)
    if device.type != "cuda":
        if graph:
            raise RuntimeError(f"time_call: CUDA-graph replay needs a CUDA device, got {device}")
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        if not queued:
            return Timing("perf_counter", tuple(times), None, warmup)
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return Timing("perf_counter", tuple(times), (time.perf_counter() - start) / repeats, warmup)
    if graph:
        fn = _graphed(fn, warmup, device)
    else:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    clock = "cuda-graph" if graph else "cuda-events"
    if not queued:
        return Timing(clock, tuple(times), None, warmup)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return Timing(clock, tuple(times), start.elapsed_time(end) / 1e3 / repeats, warmup)


def kernel_times(fn: Callable[[], Any], device: torch.device | str, top: int = 15) -> dict[str, Any]:
    """One call of `fn()` under torch.profiler, self time summed by name (`profile_summary`: CUDA kernels and copies
    on a CUDA device, CPU ops elsewhere). ValueError for top < 1."""
    if top < 1:
        raise ValueError(f"top: must be >= 1, got {top}")
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize(device)
    return profile_summary(prof, cuda, top)


def profile_summary(prof: Any, cuda: bool, top: int = 15, skip: Collection[str] = ()) -> dict[str, Any]:
    """A finished torch.profiler run's self time summed by name: device time of CUDA kernels and copies when `cuda`,
    CPU time of operators otherwise; the names in `skip` (a caller's own ranges) left out. Returns {"activity":
    "cuda" | "cpu", "total_ms": all names, "top": [{"name" (first 120 characters), "calls", "ms"}] for the `top`
    names by time, longest first, "other_ms": the rest}."""
    rows = []
    for event in prof.key_averages():
        if event.key in skip or (cuda and event.device_type == torch.autograd.DeviceType.CPU):
            continue  # an operator, whose kernels' time is theirs: counted once, under the kernels' names
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if us > 0:
            rows.append({"name": event.key[:120], "calls": event.count, "ms": us / 1e3})
    rows.sort(key=lambda row: row["ms"], reverse=True)
    total = sum(row["ms"] for row in rows)
    return {"activity": "cuda" if cuda else "cpu", "total_ms": total, "top": rows[:top],
            "other_ms": total - sum(row["ms"] for row in rows[:top])}  # fmt: skip


def _graphed(fn: Callable[[], Any], warmup: int, device: torch.device) -> Callable[[], None]:
    """`fn` captured in one CUDA graph after `warmup` calls on a side stream; returns its replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


@dataclass
class Rounds:
    """What `aba_rounds` measured: seconds per visit in round order, each candidate's paired baseline
    (mean of the two baseline visits around it), and the errors of candidates dropped after failing."""

    baseline: str
    seconds: dict[str, list[float]] = field(default_factory=dict)
    paired_baseline: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def ratios(self) -> dict[str, RatioCI]:
        """`"<baseline>/<candidate>"` -> speed-up (> 1: candidate faster) with CI95, for >= 3 pairs."""
        return {
            f"{self.baseline}/{name}": paired_ratio_ci(self.paired_baseline[name], times)
            for name, times in self.seconds.items()
            if name != self.baseline and len(times) >= MIN_PAIRS
        }

    def medians(self) -> dict[str, float]:
        return {name: statistics.median(times) for name, times in self.seconds.items() if times}


def aba_rounds(
    baseline: tuple[str, Callable[[], float]],
    candidates: dict[str, Callable[[], float]],
    rounds: int,
    stop: Callable[[Rounds], bool] | None = None,
) -> Rounds:
    """Up to `rounds` rounds of B1, A, B2, A, ... after one first A: each callable runs one visit of its arm and
    returns its seconds; `1 + rounds * len(candidates)` baseline visits in all.

    A candidate whose visit raises is recorded in `errors` and left out of later rounds; a failing baseline
    visit raises (nothing can be paired without it). `stop`, asked after every round but the last, ends the rounds early when it returns True (a time limit).
    """
    if rounds < 1:
        raise ValueError(f"rounds: must be >= 1, got {rounds}")
    name, visit_baseline = baseline
    if name in candidates:
        raise ValueError(f"candidates: {name!r} is the baseline's name")
    result = Rounds(name, {name: [], **{c: [] for c in candidates}}, {c: [] for c in candidates})
    before = visit_baseline()
    result.seconds[name].append(before)
    for round_index in range(rounds):
        for candidate, visit in candidates.items():
            if candidate in result.errors:
                continue
            try:
                seconds = visit()
            except Exception as error:  # one failing arm must not lose the others
                result.errors[candidate] = repr(error)
                continue
            after = visit_baseline()
            result.seconds[candidate].append(seconds)
            result.seconds[name].append(after)
            result.paired_baseline[candidate].append((before + after) / 2)
            before = after
        if stop is not None and round_index < rounds - 1 and stop(result):
            break
    return result
