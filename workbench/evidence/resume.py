"""The partial record of a calibration (`calibrate.calibrate` / `calibrate.stack` with `resume=`): a search resumable
at the granularity of one step, across processes, sessions and machines. A qualification, sweep or search
(`harness.qualify`, `sweep.sweep`, `sweep.search` with `resume=`) keeps one alike, one step per finished case (a
sweep's or search's: per configuration and case), in its own file (`partial_path(folder, name)`): see `harness`.
A qualification also keeps each finished case's pilot outputs beside its partial record (`Journal.keep`, in
`outputs_folder(path)`), so the report of a resumed run shows the videos of the cases an earlier process finished.

A step is one evaluated knob value (a `Point`: its worst quality against the dense references on the calibration
requests, and its speed-up against them) or one test request's confirmation (its A/B/A `qualify` record). After
every new step the whole partial record (`PARTIAL` in the folder) is rewritten atomically, so a run killed at any
moment loses at most the step in flight.

Resuming replays. The search is a deterministic function of the points it has seen, so a resumed run asks for the
same steps in the same order: each step already recorded is answered from the record (its key, the exact
accelerations config and knob value, or the test request, must be the one asked for; anything else means the
record belongs to another run, a ValueError), and the first step not recorded is run. The final result is then an
uninterrupted run's, except for timing fields. The run's arguments (plugins, options, base, budget, margin,
max_evals, rounds, the requests, model, dtype, device) are stored; a resume with other arguments is refused.

The dense references are recomputed in every process, not stored: at the Wan2.1-1.3B shape one request's frames are
~100 MB, too much to carry from one device call to the next, and every process runs the dense requests anyway, as
the baseline of its own speed-ups. Their digests (sha256 of latents, frames and audio) are stored by the first
process and checked by every later one: a resumed run whose dense output differs bit for bit (another model,
weights, device or kernels) raises RuntimeError rather than judge new points against other references.

Speed: seconds measured in different processes are never compared. A point's `speedup` is its seconds against the
dense references' seconds measured in the same process (`Point.session` names the process); the search and the
stack compare only speed-ups.

Time: with `max_seconds`, a new step starts only while the seconds spent since the call began plus the step's
expected seconds (the longest step of its kind in this call, or before one: the dense references' seconds for a
point, `2 * rounds + 3` dense requests for a confirmation; the longest case so far for a qualification's case) stay
within `max_seconds`; otherwise the call stops at that step boundary and returns a `Partial`. Every call runs at
least one new step, so repeating it always finishes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench import environment
from workbench.evidence.harness import SUITE_ORDER
from workbench.evidence.records import read_record, record_bytes, write_record
from workbench.io import write_atomic
from workbench.result import Result

PARTIAL = "calibrate.partial.json"  # a calibration's; `partial_path(folder, name)` names the others


@dataclass
class Partial:
    """A calibration, qualification, sweep or search stopped at a step boundary (`max_seconds`): nothing is decided
    yet. `path` is its partial record; the same call with `resume=` its folder continues it. `remaining`: `next`
    (the step it stopped before), `done` (steps recorded) and `at_most` (steps still to run, at most)."""

    kind: str
    path: Path
    reason: str
    remaining: dict[str, Any] = field(default_factory=dict)
    status: str = "partial"


class Paused(Exception):
    """Raised at a step boundary when the time is up; the calibration catches it and returns `partial`."""

    def __init__(self, partial: Partial):
        super().__init__(partial.reason)
        self.partial = partial


def partial_path(folder: str | Path, name: str = "calibrate") -> Path:
    """The partial record of the run `name` (the command: calibrate, qualify, sweep or search) in `folder`:
    `<name>.partial.json` (`PARTIAL` for a calibration), one file per command, so runs of two commands sharing a
    folder never read each other's."""
    return Path(folder) / f"{name}.partial.json"


def outputs_folder(path: str | Path) -> Path:
    """Where the journal with the partial record `path` keeps its steps' outputs (`Journal.keep`):
    `qualify.partial.json` -> `qualify.partial.pilots/`, one `<step>.npz` a step. Removed with the partial record."""
    return Path(path).with_suffix(".pilots")


def remove_partial(path: str | Path) -> None:
    """Remove the partial record `path` and its outputs folder, if there (the final record holds the run whole)."""
    shutil.rmtree(outputs_folder(path), ignore_errors=True)
    Path(path).unlink(missing_ok=True)


def read_partial(path: str | Path) -> dict[str, Any]:
    """The partial record at `path`, checked for the form a `Journal` replays: `run` an object, `references` a list or
    null, `steps` a list of objects with `kind`, `key` and `value`. ValueError naming the path and the field."""
    record = read_record(path)
    where = f"resume: {path}"
    if not isinstance(record.get("run"), dict):
        raise ValueError(f"{where}: 'run' must be an object (the run's arguments), got {record.get('run')!r}")
    if not isinstance(record.get("references", []), list | None):
        raise ValueError(f"{where}: 'references' must be a list or null, got {record['references']!r}")
    steps = record.get("steps")
    if not isinstance(steps, list):
        raise ValueError(f"{where}: 'steps' must be a list, got {steps!r}")
    for number, step in enumerate(steps):
        if not isinstance(step, dict) or not {"kind", "key", "value"} <= set(step):
            raise ValueError(f"{where}: steps[{number}] must be an object with 'kind', 'key' and 'value', got {step!r}")
    return record


def check_run(path: str | Path, record: dict[str, Any], run: dict[str, Any], fields: bool = False) -> None:
    """Refuse to resume the partial `record` (read from `path`) with the run `run`: ValueError naming every field
    whose value differs, with the recorded and the given value (`margin: 0.8 recorded, 0.5 now`). `fields`: compare
    only the fields `run` gives (a check before the model loads, when what depends on the model is not known yet)."""
    run = _plain(run)
    keys = set(run) if fields else {*run, *record["run"]}
    differ = sorted(k for k in keys if run.get(k) != record["run"].get(k))
    if differ:
        shown = "; ".join(f"{k}: {record['run'].get(k)!r} recorded, {run.get(k)!r} now" for k in differ)
        raise ValueError(f"resume: {path} was made by another run ({shown})")


def run_key(kind: str, session: Any, budget: Any, arguments: dict[str, Any]) -> dict[str, Any]:
    """What a partial record must agree on to be resumed (`Journal`'s `run`): `kind`, the `arguments` (the
    requests among them), the budget (`Budget`), and `session`'s model (its name and weights' key), dtype and
    device (a CUDA device by its name)."""
    from workbench.accelerations.attention.attention_policy import model_key

    device = environment.device_info(session.device)
    return {"kind": kind, **arguments, "budget": budget.to_dict()} | {
        "model": session.model.name,
        "model_key": model_key(session.model),
        "dtype": str(session.dtype).removeprefix("torch."),
        "device": device["type"] if device["type"] != "cuda" else f"cuda: {device['name']}",
    }


def case_journal(
    folder: str | Path | None,
    kind: str,
    session: Any,
    budget: Any,
    requests: list[Any],
    arguments: dict[str, Any],
    identity: dict[str, Any] | None,
    configs: int = 1,
    max_seconds: float | None = None,
    started: float | None = None,
) -> Journal | None:
    """None without a `folder` (not resumable; ValueError with `max_seconds`); else the journal of a resumable
    qualification, sweep or search (`kind`: "qualification", "sweep", "search"): one step per finished
    (configuration, request) case, `configs` configurations of `requests`, in the partial record
    `partial_path(folder, name)` of its command (qualify, sweep, search), stopping at a case boundary past
    `max_seconds` (counted from `started`). Its run is `run_key` of `arguments`, the requests and `identity` (the
    CLI's: the suite). A qualification's journal keeps its cases' pilots (`Journal.keep`)."""
    if folder is None and max_seconds is None:
        return None  # a limit without a folder: the Journal refuses it
    arguments = arguments | {"requests": [r.to_dict() for r in requests], **(identity or {})}
    name = "qualify" if kind == "qualification" else kind
    run, at_most = run_key(kind, session, budget, arguments), configs * len(requests)
    keep = kind == "qualification"
    return Journal(folder, kind, run, at_most, max_seconds, started, name=name, keep_outputs=keep)


class Journal:
    """The steps of one run, replayed from the partial record `partial_path(folder, name)` and extended there
    (`folder` None: kept in memory only, nothing written, no time limit). `run` identifies the run (its arguments:
    JSON; `run_key`); `at_most` is how many steps the whole run takes at most. `max_seconds` counts from `started`
    (a `time.perf_counter()` reading; default: now), so a caller that loaded a model first can give its own start
    and the limit its user gave, which the reason of a stop then quotes. `keep_outputs`: the outputs of each new
    step can be saved with it (`keep`, `kept`); a run started afresh clears what an earlier run left there.

    ValueError for a bad `max_seconds` or `started`, a limit without a folder, or a partial record of another kind
    or another run (`check_run`: each field that differs, with its recorded and its given value)."""

    def __init__(
        self,
        folder: str | Path | None,
        kind: str,
        run: dict[str, Any],
        at_most: int,
        max_seconds: float | None,
        started: float | None = None,
        name: str = "calibrate",
        keep_outputs: bool = False,
    ):
        if max_seconds is not None and (
            isinstance(max_seconds, bool) or not isinstance(max_seconds, int | float) or not max_seconds >= 0
        ):
            raise ValueError(f"max_seconds: {max_seconds!r}; allowed: a number of seconds >= 0, or None")
        now = time.perf_counter()
        if started is not None and (
            isinstance(started, bool) or not isinstance(started, int | float) or not started <= now
        ):
            raise ValueError(f"started: {started!r}; allowed: a time.perf_counter() reading not in the future, or None")
        if max_seconds is not None and folder is None:
            raise ValueError("max_seconds: needs resume= (the folder the partial record is written to)")
        self.path = None if folder is None else partial_path(folder, name)
        self.outputs = None if self.path is None or not keep_outputs else outputs_folder(self.path)
        self.kind, self.run, self.at_most, self.max_seconds = kind, _plain(run), at_most, max_seconds
        self.steps: list[dict[str, Any]] = []
        self.references: list[dict[str, str]] | None = None
        self.session = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self.commit = environment.git_revision()["commit"]
        self.start, self.cursor, self.new, self.longest = now if started is None else started, 0, 0, {}
        if self.path is not None and self.path.exists():
            record = read_partial(self.path)
            if record.get("kind") != kind or record.get("status") != "partial":
                raise ValueError(f"resume: {self.path} is a {record.get('kind')!r} record, not a partial {kind!r} one")
            check_run(self.path, record, self.run)
            self.steps, self.references = record["steps"], record.get("references")
        elif self.outputs is not None:
            shutil.rmtree(self.outputs, ignore_errors=True)  # an earlier run's, killed before its first step

    def check_references(self, references: list[Result], seeds: list[int]) -> None:
        """Store the dense references' digests, or check them against the stored ones (RuntimeError if any
        differs: the recorded points were judged against other outputs)."""
        digests = [{"seed": seed, **digest(result)} for seed, result in zip(seeds, references, strict=True)]
        if self.references is None:
            self.references = digests
            self._write("in progress: no step recorded yet")
            return
        for stored, now in zip(self.references, digests, strict=True):
            if stored != now:
                parts = [k for k in now if stored.get(k) != now[k]]
                raise RuntimeError(
                    f"resume: the dense output of calibration seed {now['seed']} differs from the one the recorded "
                    f"points were judged against ({', '.join(parts)} sha256 differ); another model, weights, device "
                    f"or kernels made it. Resume where the record was made, or start a new record in another folder"
                )

    def step(self, kind: str, key: dict[str, Any], run: Callable[[], dict[str, Any]], expected: float) -> dict:
        """The value of step `key`: the recorded one when the run has reached that far before (replay), else
        `run()`, recorded at once. Raises `Paused` before a new step that would end past `max_seconds`."""
        key = _plain(key)
        if self.cursor < len(self.steps):
            recorded = self.steps[self.cursor]
            if recorded["key"] != key:
                raise ValueError(
                    f"resume: step {self.cursor} of {self.path} is {recorded['key']!r}, this run asks for {key!r}; "
                    "the record was made by other code or arguments"
                )
            self.cursor += 1
            return recorded["value"]
        if self.max_seconds is not None and self.new > 0:
            elapsed, expected = time.perf_counter() - self.start, self.longest.get(kind, expected)
            if elapsed + expected > self.max_seconds:
                raise Paused(self._pause(kind, key, elapsed, expected))
        start = time.perf_counter()
        value = _plain(run())
        seconds = time.perf_counter() - start
        self.longest[kind] = max(self.longest.get(kind, 0.0), seconds)
        self.steps.append(
            {
                "kind": kind,
                "key": key,
                "value": value,
                "session": self.session,
                "commit": self.commit,
                "seconds": seconds,
            }
        )
        self.cursor, self.new = self.cursor + 1, self.new + 1
        self._write(f"in progress: {len(self.steps)} step(s) recorded")
        return value

    def keep(self, results: list[Result] | tuple[Result, ...]) -> None:
        """Save `results` as the outputs of the step now running (the next one recorded): each one's frames, audio,
        sample rate and fps, losslessly, in `outputs/<step>.npz`, written whole or not at all. A no-op without
        `keep_outputs`."""
        if self.outputs is None:
            return
        arrays = {}
        for n, result in enumerate(results):
            arrays[f"{n}_frames"] = result.frames
            arrays[f"{n}_rates"] = np.array([result.fps, result.sample_rate or 0], dtype=np.int64)
            if result.audio is not None:
                arrays[f"{n}_audio"] = result.audio
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        self.outputs.mkdir(parents=True, exist_ok=True)
        write_atomic(self.outputs / f"{len(self.steps)}.npz", buffer.getvalue())

    def kept(self, step: int) -> tuple[Result, ...] | None:
        """The outputs `keep` saved with step number `step` (frames, audio, sample rate, fps; no timings, latents or
        receipts), or None: not kept, or unreadable."""
        path = None if self.outputs is None else self.outputs / f"{step}.npz"
        if path is None or not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as arrays:
                results, n = [], 0
                while f"{n}_frames" in arrays:
                    fps, rate = (int(x) for x in arrays[f"{n}_rates"])
                    audio = arrays[f"{n}_audio"] if f"{n}_audio" in arrays else None
                    results.append(Result(arrays[f"{n}_frames"], audio, rate or None, fps, None, {}, {}))
                    n += 1
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            return None
        return tuple(results) or None

    def _pause(self, kind: str, key: dict[str, Any], elapsed: float, expected: float) -> Partial:
        remaining = {"next": describe(kind, key), "done": len(self.steps), "at_most": self.at_most - len(self.steps)}
        reason = (
            f"stopped at a step boundary: {elapsed:.0f} s spent of max_seconds={self.max_seconds:g}, and the next "
            f"step ({remaining['next']}) is expected to take about {expected:.0f} s; "
            f"{len(self.steps)} step(s) recorded, at most {remaining['at_most']} to go"
        )
        self._write(reason, remaining)
        return Partial(self.kind, self.path, reason, remaining)

    def _write(self, reason: str, remaining: dict[str, Any] | None = None) -> None:
        if self.path is None:
            return
        remaining = remaining or {"done": len(self.steps), "at_most": self.at_most - len(self.steps)}
        write_record(self.path, {
            "kind": self.kind, "status": "partial", "reason": reason, "remaining": remaining, "run": self.run,
            "references": self.references, "steps": self.steps,
        })  # fmt: skip


def digest(result: Result) -> dict[str, str]:
    """sha256 of a result's latents (dtype, shape and bytes), frames and audio: equal only for bit-equal outputs."""

    def sha(array: np.ndarray | None) -> str:
        if array is None:
            return "none"
        array = np.ascontiguousarray(array)
        return hashlib.sha256(f"{array.dtype}{array.shape}".encode() + array.tobytes()).hexdigest()

    latents = result.latents
    if isinstance(latents, torch.Tensor):
        latents = latents.detach().cpu().contiguous().view(torch.uint8).numpy() if latents.numel() else None
        latents_dtype = str(result.latents.dtype)
    else:
        latents_dtype = "none"
    return {"latents": f"{latents_dtype}:{sha(latents)}", "frames": sha(result.frames), "audio": sha(result.audio)}


def merge_cases(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One qualification record from per-request `qualify` records of one configuration (in request order): the
    cases in order, the verdict the weakest case's, the rest the first record's (as `qualify` of all at once)."""
    cases = [case for record in records for case in record["cases"]]
    return {**records[0], "verdict": min((c["verdict"] for c in cases), key=SUITE_ORDER.index), "cases": cases}


def parts_line(steps: list[dict[str, Any]], name: Callable[[dict[str, Any]], str]) -> str:
    """The steps of a run in parts, in words: "3 part(s) over 2 process(es): plan 338 s (commit 0f45a4d), ..." with
    each step's `name(step)`, seconds and, when recorded, the commit that ran it (parts may come from several)."""
    shown = [
        f"{name(s)} {s['seconds']:.0f} s" + (f" (commit {s['commit'][:7]})" if s.get("commit") else "") for s in steps
    ]
    return f"{len(steps)} part(s) over {len({s['session'] for s in steps})} process(es): {', '.join(shown)}."


def describe(kind: str, key: dict[str, Any]) -> str:
    """A step's key in words: "point easycache.threshold=0.25 over {...}", "confirmation on seed 42" or "the case of
    seed 7 under {...}"; another user's step (a benchmark's part) as its kind and key."""
    if kind == "case":  # a qualification's, a sweep's or a search's
        return f"the case of seed {key['request']['seed']} under {json.dumps(key['candidate'], sort_keys=True)}"
    if kind not in ("confirmation", "point"):
        return f"{kind} {json.dumps(key, sort_keys=True)}"
    if kind == "confirmation":
        return f"confirmation of {json.dumps(key['config'], sort_keys=True)} on seed {key['request']['seed']}"
    value = key["value"]
    shown = "the base alone" if value is None else f"value {value:g}"
    return f"point {shown}: {json.dumps(key['config'], sort_keys=True)}"


def _plain(value: dict[str, Any]) -> dict[str, Any]:
    """`value` as strict JSON reads it back (non-finite numbers become null): recorded and fresh steps compare and
    replay alike."""
    return json.loads(record_bytes(value))
