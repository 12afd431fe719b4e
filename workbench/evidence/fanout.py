"""Cells fanned out over Ray workers into one record store (the `ray` extra).

A *cell* is one unit of work that one worker runs start to finish in its own process: one request's A/B/A
qualification of one configuration, one calibration search, one generated request (`workbench.evidence.fanout_jobs`
says what each kind runs). Every speed ratio is computed inside a cell, so inside one process on one device; the
driver never compares seconds measured by different workers. Each cell's record names the worker (host, process,
device) it ran on.

Workers are Ray actors, one per GPU (`num_gpus=1`) or, on CPU, one per CPU slot (`num_cpus=1`). Each opens one
resident `Session` of the run's model once and serves many cells. `memory` places the model on each worker's device
under a cap (the session's memory plan: components offloaded, denoiser blocks streamed), so a model larger than a
card runs on it: a cap for every worker ("48GiB", a card's name), or "device", each worker's own GPU's memory (a
cluster of mixed cards). The plan is part of the worker's identity in every record. The driver hands each worker
one cell at a time, collects what it returns (the record, and the output files of a generated request) and writes
it into the `Store` itself, so workers need no shared file system.

Failures: a cell that raises is recorded as failed with its error, and the run goes on. A worker that dies
mid-cell (killed, preempted, out of memory) is replaced by a fresh one, and its cell goes back to the front of the
queue, for whichever worker is free first, at most `retries` more times; after that it is recorded as failed with
the reason. A re-run with the same store skips the finished cells and runs the failed ones again, and a finished
one whose output files were since replaced or deleted (`Store.intact`). A cell's key holds the code that runs it
(the driver's git revision and package versions) and the kind of device (`Fanout.session_key`): a cell finished by
other code, or on CPU for a GPU run, is other work, run again (the store keeps both): a store entry of other code
is never taken for this run's.

Progress: `Fanout.subscribe(callback)` receives an `Event` for each change (a run starts or ends, a worker is
ready or lost, a cell starts, finishes, fails or is retried); each event carries the live `Progress` (counts,
per-worker state, ETA). `TqdmView` is the command line's subscriber; a notebook widget subscribes the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.environment import device_info, device_label, git_revision, versions
from workbench.evidence.fanout_progress import Event, Progress, TqdmView, WorkerState
from workbench.evidence.store import Store
from workbench.memory_plan import MemoryBudget
from workbench.quality import Budget
from workbench.quality.budget import default_for
from workbench.request import Request

__all__ = [
    "RETRIES",
    "Cell",
    "Event",
    "Fanout",
    "Progress",
    "Store",
    "TqdmView",
    "Worker",
    "WorkerState",
    "fingerprint",
]

RETRIES = 2  # re-runs of a cell whose worker died under it, before it is recorded as failed
CONNECT_SECONDS = 10.0  # how long a given --ray host:port has to accept a connection before it is refused


@dataclass(frozen=True)
class Cell:
    """One unit of work: `kind` (what `fanout_jobs.execute` runs), `args` (its arguments: Requests, configs,
    budgets; sent to the worker as they are), `label` (what a person reads in progress lines and errors) and
    `name` (the folder its output files go to, for kinds that return files)."""

    kind: str
    args: dict[str, Any]
    label: str
    name: str = ""

    def key(self, session: dict[str, Any]) -> str:
        """SHA-256 of the session it needs (`Fanout.session_key`: model, dtype, seed, device type, code) and what
        it runs: the same work by the same code has the same key in every run, so a store knows what is already
        done."""
        text = json.dumps({"session": session, "kind": self.kind, "args": fingerprint(self.args)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(value: Any) -> Any:
    """A JSON-able form of cell arguments that changes whenever they do: a Request by its fields (keyframe images
    by SHA-256 of their pixels), other dataclasses (Budget) by their fields, arrays by SHA-256."""
    if isinstance(value, Request):
        out = value.to_dict()
        for name in ("image", "last_image"):
            if (image := getattr(value, name)) is not None:
                out[name] = fingerprint(np.asarray(image))
        return out
    if isinstance(value, np.ndarray):
        return {
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "sha256": hashlib.sha256(value.tobytes()).hexdigest(),
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return fingerprint(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): fingerprint(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [fingerprint(v) for v in value]
    return value


class Worker:
    """A Ray actor's body: one resident Session of `model` serving cells (see the module docstring)."""

    def __init__(self, model: str, device: str, dtype: str | None, seed: int, memory: str | int | None = None):
        self._open_args = (model, device, dtype, seed, memory)
        self.session: Any = None

    def open(self) -> dict[str, Any]:
        """Load the model once (under `memory`: a cap, or "device" for this worker's whole GPU); returns this
        worker's identity (host, pid, device, memory plan)."""
        import torch

        from workbench.session import Session

        model, device, dtype, seed, memory = self._open_args
        if memory == "device":
            memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        self.session = Session.open(model, device=device, dtype=dtype, seed=seed, memory=memory)
        return self.identity()

    def identity(self) -> dict[str, Any]:
        info, plan = device_info(self.session.device), self.session.memory_plan
        return {"host": socket.gethostname(), "pid": os.getpid(), "device": info, "label": device_label(info)} | {
            "memory_plan": None if plan is None else plan.to_dict(),
            "audio": self.session.family.has_audio,
        }

    def validate(
        self, configs: list[dict[str, Any]], rounds: int | None = None, requests: list[Request] | None = None
    ) -> None:
        """`Fanout.validate` on this worker's session."""
        from workbench.evidence.harness import validate

        validate(self.session, configs, rounds, requests)

    def run(self, cell: Cell) -> dict[str, Any]:
        """Run `cell`: {"status": "finished", "record", "files", "seconds"} or, when it raised, {"status": "failed",
        "error", "traceback", "seconds"}, with "replace": True when the session could not be put back to the stock
        model afterwards (the driver then replaces this worker); the record names this worker (`record["worker"]`)."""
        from workbench.evidence.fanout_jobs import execute

        start = time.perf_counter()
        try:
            record, files = execute(self.session, cell)
        except Exception as error:  # a failing cell is recorded, not raised: the run goes on
            failed = {
                "status": "failed",
                "error": f"{type(error).__name__}: {error}",
                "traceback": "".join(traceback.format_exception(error, limit=-4)),
            }
            try:
                self.session.accelerate({})  # the next cell starts from the stock model
            except Exception as stuck:  # an unusable session serves no more cells
                failed |= {"error": f"{failed['error']}; then the session was left unusable: {stuck}", "replace": True}
            return failed | {"seconds": time.perf_counter() - start}
        record["worker"] = self.identity()
        return {"status": "finished", "record": record, "files": files, "seconds": time.perf_counter() - start}


class Fanout:
    """A pool of Ray workers holding one resident Session of `model` each, and the driver that runs cells on them.

    `address`: a Ray cluster to join ("auto" finds the local one); None starts a local instance (with `workers`
    CPUs for a CPU run), unless this process already called `ray.init`. `workers`: how many (default: one per
    GPU of the cluster, or 1 on CPU); more than the cluster's GPUs (CPUs) is a ValueError. `device`: "auto" (GPU
    workers when the cluster has GPUs), "cuda" or "cpu". `memory`: None (the model resident on each worker), a cap
    for every worker, or "device" (each GPU worker's own memory; see the module docstring); a capped run's cells are
    other cells than a resident run's (the session key holds the cap). `retries`: see the module docstring. A bad
    `dtype`, `address` (malformed) or option is a ValueError before any worker starts; an exception a worker raises
    (loading, `validate`) is raised here as the worker raised it, not as Ray's wrapper. Use it as a context manager
    (or call `close`): the workers are killed, and a local instance it started is shut down.

    `session_key`: what every cell's key holds besides the cell (`Cell.key`): model, dtype, seed, the workers'
    device type ("cuda" or "cpu"), the cap, and `code`, the driver's git revision and package versions
    (`workbench.environment`; the workers of a local instance run the driver's code).
    """

    def __init__(
        self,
        model: str,
        *,
        address: str | None = None,
        workers: int | None = None,
        device: str = "auto",
        dtype: str | None = None,
        seed: int = 0,
        retries: int = RETRIES,
        memory: str | int | None = None,
    ):
        if device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device: {device!r}; allowed with Ray: auto, cuda, cpu (each worker gets its own GPU)")
        if memory is not None and memory != "device":
            MemoryBudget.of(memory)  # a bad cap is a ValueError before any worker starts
        for name, value, least in (("workers", workers, 1), ("retries", retries, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ValueError(f"{name}: {value!r}; allowed: an integer >= {least}")
        if dtype is not None:
            import torch

            from workbench.session import _dtype

            _dtype(dtype, torch.device("cpu"))  # a bad name is refused here, as `Session.open` refuses it
        ray = _ray()
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if address is not None:
                options["address"] = address
            elif device == "cpu":
                options["num_cpus"] = workers or 1
            allowed = "'auto', a cluster's host:port or ray://host:port"
            if address is not None:
                _check_answers(address, allowed)
            try:
                ray.init(**options)
            except ValueError as error:  # Ray's words name no parameter: "Invalid address format: x"
                if address is None:
                    raise
                raise ValueError(f"address: {address!r}: {_first_line(error)}; allowed: {allowed}") from error
        try:
            on_gpu, count = _placement(ray.cluster_resources(), device, workers)
        except (ValueError, RuntimeError):
            if self._started_ray:
                ray.shutdown()
            raise
        if memory == "device" and not on_gpu:
            if self._started_ray:
                ray.shutdown()
            raise ValueError("memory: 'device' (each worker's GPU memory) needs GPU workers; give a cap, or None")
        self.model, self.retries = model, retries
        self.session_key = {"model": str(model), "dtype": dtype, "seed": seed, "device": "cuda" if on_gpu else "cpu"}
        if memory is not None:
            self.session_key["memory"] = memory
        self.session_key["code"] = {"git": git_revision(), "versions": versions()}
        self._remote = (
            ray.remote(Worker).options(num_gpus=1, num_cpus=1) if on_gpu else ray.remote(Worker).options(num_cpus=1)
        )
        self._open_args = (str(model), "cuda" if on_gpu else "cpu", dtype, seed, memory)
        self.workers = [WorkerState(i) for i in range(count)]
        self.actors: list[Any] = [None] * count
        self.identities: list[dict[str, Any] | None] = [None] * count
        self._opening: dict[Any, int] = {}  # open() call -> worker index
        self._listeners: list[Callable[[Event], None]] = []

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call `callback(event)` on the driver for every `Event` of every run, until the function this returns is
        called. An exception the callback raises stops the run (the store keeps what finished)."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    def validate(
        self, configs: list[dict[str, Any]], rounds: int | None = None, requests: list[Request] | None = None
    ) -> None:
        """`workbench.evidence.harness.validate` on a worker's session (without `rounds` and `requests`, the
        configurations alone): a configuration the model or device cannot take is refused
        (ValueError / RuntimeError, as the worker raised it) before any cell runs."""
        self._first_worker()
        _get(self.actors[0].validate.remote(configs, rounds, requests))

    def default_budget(self) -> Budget:
        """`harness.default_budget` of the workers' model (the audio limits for one that makes sound, as a worker's
        session reports it)."""
        self._first_worker()
        return default_for(has_audio=self.identities[0]["audio"])

    def _first_worker(self) -> None:
        """Start the workers, and wait until the first has loaded the model."""
        ray = _ray()
        self._start_all()
        while self.identities[0] is None:
            self._await_open(ray.wait(list(self._opening), num_returns=1)[0][0], Progress(0, self.workers))

    def pending(self, cells: list[Cell], store: Store) -> list[Cell]:
        """The cells `run` would run: those not finished in `store`."""
        return [cell for cell in cells if not _finished(store.get(cell.key(self.session_key)), store)]

    def run(self, cells: list[Cell], store: Store) -> dict[str, dict[str, Any]]:
        """Run every cell not finished in `store`; returns cell key -> store entry (finished or failed) in the
        order of `cells`. ValueError when two cells are the same work (one key)."""
        ray = _ray()
        keys = [cell.key(self.session_key) for cell in cells]
        if len(set(keys)) != len(keys):
            raise ValueError("cells: two cells are the same work (same kind and arguments); each must be unique")
        progress = Progress(len(cells), self.workers)
        entries, queue = {}, deque()
        for cell, key in zip(cells, keys, strict=True):
            entry = store.get(key)
            if _finished(entry, store):
                entries[key] = entry
                progress.skipped += 1
            else:
                queue.append((cell, key))
        self._emit(Event("start", progress))
        if queue:
            self._start_all()
        attempts: dict[str, int] = {}
        running: dict[Any, tuple[int, Cell, str, float]] = {}  # run() call -> (worker, cell, key, submitted)
        while queue or running:
            for index, state in enumerate(self.workers):
                if queue and state.state == "idle":
                    cell, key = queue.popleft()
                    running[self.actors[index].run.remote(cell)] = (index, cell, key, time.perf_counter())
                    state.state, state.cell = "running", cell.label
                    progress.running += 1
                    self._emit(Event("cell_started", progress, key, cell.label, index))
            ready = ray.wait([*running, *self._opening], num_returns=1)[0][0]
            if ready in self._opening:
                self._await_open(ready, progress)
                continue
            index, cell, key, submitted = running.pop(ready)
            identity, died = self.identities[index], False
            progress.running -= 1
            attempts[key] = attempts.get(key, 0) + 1
            try:
                out = ray.get(ready)
            except ray.exceptions.RayActorError as error:  # the worker died under the cell
                reason = f"worker {index} ({self.workers[index].host}) died: {_first_line(error)}"
                self._emit(Event("worker_lost", progress, key, cell.label, index, reason))
                self._restart(index)
                if attempts[key] <= self.retries:
                    queue.appendleft((cell, key))
                    progress.retried += 1
                    self._emit(Event("cell_retried", progress, key, cell.label, index, reason))
                    continue
                out = {
                    "status": "failed",
                    "error": f"{reason}; gave up after {attempts[key]} attempts",
                    "seconds": None,
                }
                died = True
            except ray.exceptions.RayTaskError as error:  # the worker's cell guard itself failed
                cause = _cause(error)
                out = {
                    "status": "failed",
                    "error": f"{type(cause).__name__}: {cause}",
                    "seconds": None,
                    "replace": True,
                }
            if not died:
                self.workers[index].state, self.workers[index].cell = "idle", ""
                if out.get("replace"):  # its session may be in any state: a fresh worker takes its place
                    self._emit(Event("worker_lost", progress, key, cell.label, index, "replaced: " + out["error"]))
                    self._restart(index)
            entry = {
                "key": key,
                "kind": cell.kind,
                "label": cell.label,
                "status": out["status"],
                "attempts": attempts[key],
                "seconds": out["seconds"],
                "wall_seconds": time.perf_counter() - submitted,
                "worker": identity,
                "error": out.get("error"),
                "traceback": out.get("traceback"),
                "record": out.get("record"),
                "outputs": None,
            }
            entries[key] = entry = store.put(entry, out.get("files"), cell.name)
            finished = out["status"] == "finished"
            progress.done += finished
            progress.failed += not finished
            if not died:
                self.workers[index].done += finished
                self.workers[index].failed += not finished
            kind = "cell_finished" if finished else "cell_failed"
            self._emit(Event(kind, progress, key, cell.label, index, entry["error"] or ""))
        self._emit(Event("end", progress))
        return {key: entries[key] for key in keys}

    def close(self) -> None:
        """Kill the workers; shut down the Ray instance this pool started (not one it joined)."""
        ray = _ray()
        for actor in self.actors:
            if actor is not None:
                ray.kill(actor)
        self.actors = [None] * len(self.actors)
        self._opening.clear()
        if self._started_ray:
            ray.shutdown()

    def __enter__(self) -> Fanout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_all(self) -> None:
        for index, actor in enumerate(self.actors):
            if actor is None:
                self._restart(index)

    def _restart(self, index: int) -> None:
        if self.actors[index] is not None:
            _ray().kill(self.actors[index])
        actor = self._remote.remote(*self._open_args)
        self.actors[index], self.identities[index] = actor, None
        self._opening[actor.open.remote()] = index
        self.workers[index].state = "starting" if self.workers[index].state == "starting" else "lost"
        self.workers[index].cell = ""

    def _await_open(self, ref: Any, progress: Progress) -> None:
        ray = _ray()
        index = self._opening.pop(ref)
        try:
            identity = _get(ref)
        except ray.exceptions.RayActorError as error:
            raise RuntimeError(f"worker {index} died while loading {self.model}: {_first_line(error)}") from error
        self.identities[index] = identity
        state = self.workers[index]
        state.host, state.device, state.state = identity["host"], identity["label"], "idle"
        self._emit(Event("worker_ready", progress, worker=index, detail=f"{state.host}: {state.device}"))

    def _emit(self, event: Event) -> None:
        for callback in self._listeners:
            callback(event)


def _placement(resources: dict[str, float], device: str, workers: int | None) -> tuple[bool, int]:
    """(GPU workers?, how many) on a cluster with `resources`; refuses more workers than GPUs (CPUs)."""
    gpus = int(resources.get("GPU", 0))
    if device == "cuda" and not gpus:
        raise RuntimeError("device: 'cuda' requested but the Ray cluster has no GPU")
    on_gpu = device == "cuda" or (device == "auto" and gpus > 0)
    count = workers or (gpus if on_gpu else 1)
    capacity = gpus if on_gpu else int(resources.get("CPU", 0))
    if count > capacity:
        raise ValueError(
            f"workers: {count} needs {count} {'GPUs' if on_gpu else 'CPUs'}; the Ray cluster has {capacity}"
        )
    return on_gpu, count


def _check_answers(address: str, allowed: str) -> None:
    """Refuse a `host:port` (or `ray://host:port`) address where nothing accepts a connection within
    `CONNECT_SECONDS`: `ray.init` would retry such an address for minutes, printing a warning every few seconds.
    Other addresses ("auto", a malformed one) are left to Ray, which answers them at once."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ValueError(
            f"address: {address!r}: nothing answers at {host}:{port} within {CONNECT_SECONDS:g} s ({reason}); "
            f"allowed: {allowed}"
        ) from error


def _ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise RuntimeError("--ray: the ray package is not installed; pip install 'vflash-workbench[ray]'") from error
    return ray


def _get(ref: Any) -> Any:
    """`ray.get(ref)`; an exception the worker raised is raised as itself (`_cause`)."""
    ray = _ray()
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        raise _cause(error) from error


def _cause(error: BaseException) -> BaseException:
    """The exception a worker raised, out of the RayTaskError Ray wraps it in (whose text is the worker's whole
    traceback, colour codes included); `error` itself when it holds none."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _finished(entry: dict[str, Any] | None, store: Store) -> bool:
    """Whether `entry` is a finished cell whose output files are still its own (`Store.intact`)."""
    return entry is not None and entry["status"] == "finished" and store.intact(entry)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
