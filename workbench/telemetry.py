"""Stage timing, per-stage memory peaks and device samples, emitted as events while a request runs.

On a GPU, intervals are CUDA events (the host-side clock would measure kernel launches, not work) and
each stage end synchronises once so live plots and memory peaks are true; per-step events are read
back after the request without extra synchronisation. On the CPU, `perf_counter`, and the memory there is
the process's: each stage start and end, step and request end carries its resident set size (`rss_bytes`, one
`/proc` read through psutil), where a GPU's stage ends carry the device's allocated peak.

Subscribers run on the request's thread, inside the intervals being timed; their time is not the request's. `emit`
times its subscriber calls (`subscriber_seconds`, carried by the request_end event). On the CPU every interval (a
stage, a step, the total) is its clock reading less the subscriber seconds spent inside it, so stages + other still
sum to total. On a GPU the intervals are the device's clock, which runs on through a subscriber while queued work
remains; nothing is subtracted there, and no synchronisation is added for it (it would change what is timed).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil
import torch

STAGES = ("text_encode", "image_encode", "denoise", "video_decode", "audio_decode", "mux")


@dataclass
class Event:
    """`kind` is one of stage_start, stage_end, step, sample, and one of request_end (the request ran to its end) or
    request_failed (it raised: `data` has `error`, the exception named, and `stopped`, whether `Session.stop()` ended
    it; stages still open then were cut off there); `t` is seconds since request start."""

    kind: str
    t: float
    stage: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Subscriber = Callable[[Event], None]


@dataclass(frozen=True)
class Mark:
    """A point on the request's clock: `clock` a CUDA event (GPU) or a perf_counter reading (CPU), `paused` the
    subscriber seconds spent before it. On the CPU the time between two marks is their clock difference less their
    `paused` difference."""

    clock: Any
    paused: float


class Telemetry:
    """One request's clock. Subscribers are called on the thread that runs the request."""

    def __init__(self, device: torch.device, subscribers: list[Subscriber] | None = None):
        self.device = device
        self.cuda = device.type == "cuda"
        self.subscribers = list(subscribers or [])
        self.events: list[Event] = []
        self.timings: dict[str, float] = defaultdict(float)
        self.memory: dict[str, int] = {}
        self.steps: list[tuple[int, Mark, Mark]] = []  # (index, start, end)
        self.subscriber_errors: list[str] = []
        self.subscriber_seconds = 0.0  # time in subscriber calls, excluded from the CPU's intervals
        self._process = None if self.cuda else psutil.Process()  # host RSS is the CPU's memory reading
        self._t0 = time.perf_counter()
        self._origin = self._marker()
        self._open: dict[str, tuple[Mark, int]] = {}
        self._ended = False  # request_end or request_failed emitted

    # -- clock ---------------------------------------------------------------------------------
    def _marker(self) -> Mark:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return Mark(event, self.subscriber_seconds)
        return Mark(time.perf_counter(), self.subscriber_seconds)

    def _seconds(self, start: Mark, end: Mark) -> float:
        """Seconds from `start` to `end`: on the device's clock (GPU), or less the subscriber time between them (CPU)."""
        if self.cuda:
            end.clock.synchronize()
            return start.clock.elapsed_time(end.clock) / 1000.0
        return max(0.0, end.clock - start.clock - (end.paused - start.paused))

    def now(self) -> float:
        return time.perf_counter() - self._t0

    # -- events --------------------------------------------------------------------------------
    def emit(self, kind: str, stage: str | None = None, **data: Any) -> None:
        """Record an event and call the subscribers, their time counted in `subscriber_seconds`."""
        event = Event(kind, self.now(), stage, data)
        self.events.append(event)
        if not self.subscribers:
            return
        began = time.perf_counter()
        try:
            for callback in self.subscribers:
                try:
                    callback(event)
                except Exception as error:  # a broken plot must not break the request it watches
                    self.subscriber_errors.append(f"{getattr(callback, '__name__', callback)}: {error!r}")
        finally:
            self.subscriber_seconds += time.perf_counter() - began

    # -- stages --------------------------------------------------------------------------------
    def begin(self, stage: str) -> None:
        if stage in self._open:
            return  # re-entrant: an inner call of the same stage belongs to the outer interval
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        host = self._host_memory()  # read before the stage's clock starts
        self._open[stage] = (self._marker(), self._allocated())
        self.emit("stage_start", stage, **host)

    def end(self, stage: str) -> None:
        if stage not in self._open:
            return
        start, _ = self._open.pop(stage)
        seconds = self._seconds(start, self._marker())
        self.timings[stage] += seconds
        data: dict[str, Any] = {"seconds": seconds}
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            self.memory[stage] = max(self.memory.get(stage, 0), peak)
            data["peak_bytes"] = peak
            data["reserved_peak_bytes"] = torch.cuda.max_memory_reserved(self.device)  # the allocator's, cache included
        self.emit("stage_end", stage, **data, **self._host_memory())

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def step(self, index: int, start: Mark) -> Mark:
        """Close denoising step `index` that began at marker `start`; returns the marker that ends it."""
        end = self._marker()
        self.steps.append((index, start, end))
        self.emit("step", "denoise", index=index, **self._host_memory())
        return end

    def marker(self) -> Mark:
        return self._marker()

    def step_seconds(self) -> list[float]:
        return [self._seconds(start, end) for _, start, end in self.steps]

    def _allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.cuda else 0

    def _host_memory(self) -> dict[str, int]:
        """{"rss_bytes": the process's resident set size now} off a GPU; {} on one."""
        return {} if self._process is None else {"rss_bytes": self._process.memory_info().rss}

    def finish(self) -> float:
        """Total request seconds on the device clock, subscriber time excluded; emits request_end."""
        total = self._seconds(self._origin, self._marker())
        self.emit("request_end", total=total, subscriber_seconds=self.subscriber_seconds, **self._host_memory())
        self._ended = True
        return total

    def fail(self, error: BaseException, stopped: bool = False) -> None:
        """Emits request_failed, so subscribers learn the request is over, unless request_end came first (a check
        after the request, such as non-finite outputs, failed it). Reads no device clock: a failed device may not
        answer."""
        if not self._ended:
            self._ended = True
            interrupted = isinstance(error, KeyboardInterrupt) and not stopped  # Ctrl-C, a kernel interrupt
            self.emit(
                "request_failed", error=f"{type(error).__name__}: {error}", stopped=stopped, interrupted=interrupted
            )


class NvmlSampler:
    """Samples device-wide memory, temperature, SM clock and throttle reasons on a background thread.

    Device-wide readings show what the allocator cannot: other processes on a shared GPU, and thermal
    or power throttling that invalidates a speed claim.
    """

    def __init__(self, device: torch.device, telemetry: Telemetry, period_s: float = 0.1):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        # by UUID: NVML numbers every GPU of the host, torch only those CUDA_VISIBLE_DEVICES shows, in its order
        index = torch.cuda.current_device() if device.index is None else device.index
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(index).uuid}")
        self._telemetry = telemetry
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self.samples: list[dict[str, Any]] = []

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()

    def read(self) -> dict[str, Any]:
        nv, h = self._nvml, self._handle
        memory = nv.nvmlDeviceGetMemoryInfo(h)
        return {
            "t": self._telemetry.now(),
            "used_bytes": int(memory.used),
            "temperature_c": int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "sm_clock_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "throttle_reasons": int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
            "processes": len(nv.nvmlDeviceGetComputeRunningProcesses(h)),
        }

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.read())
            self._stop.wait(self._period)


class maybe_sampler:
    """An NVML sampler when pynvml can reach the driver; without NVML the summary is simply empty."""

    def __init__(self, device: torch.device, telemetry: Telemetry):
        self.device, self.telemetry, self.sampler = device, telemetry, None

    def __enter__(self) -> Any:
        try:
            self.sampler = NvmlSampler(self.device, self.telemetry).__enter__()
        except Exception as error:  # NVML missing in a container is a reportable fact, not a failure
            self.telemetry.emit("sample", error=repr(error))
            return None
        return self.sampler

    def __exit__(self, *exc: object) -> None:
        if self.sampler is not None:
            self.sampler.__exit__(*exc)


# NVML clock-event ("throttle") reason bits.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the GPU ran slower than its normal loaded state: thermal or hardware slowdowns.
# `sw_power_cap` is excluded: a GPU at its power limit under heavy matrix work sits there in both arms
# of an interleaved A/B/A alike; it is still counted and reported.
INVALIDATING = 0x8 | 0x20 | 0x40 | 0x80


def summarize_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Peaks and flags over a request's NVML samples (empty when there was no sampler)."""
    if not samples:
        return {}
    reasons = {name: sum(1 for s in samples if s["throttle_reasons"] & bit) for bit, name in THROTTLE_REASONS.items()}
    return {
        "count": len(samples),
        "peak_used_bytes": max(s["used_bytes"] for s in samples),
        "max_temperature_c": max(s["temperature_c"] for s in samples),
        "min_sm_clock_mhz": min(s["sm_clock_mhz"] for s in samples),
        "max_sm_clock_mhz": max(s["sm_clock_mhz"] for s in samples),
        "throttle_reason_samples": {name: n for name, n in reasons.items() if n},
        "throttled_samples": sum(1 for s in samples if s["throttle_reasons"] & INVALIDATING),
        "max_processes": max(s["processes"] for s in samples),
    }
