"""The one results envelope: how a measurement was made, and what it measured.

Every scenario's result is one JSON object with these keys (`FIELDS`), written atomically as
`<out>/<scenario>.json` (the latest result per scenario; git keeps the history):
- `format`: `FORMAT`; `what`: one line (a smoke run's says so: `SMOKE_WHAT`); `scenario`: its name; `command`: the
  command line that made it, after those of the scenario's `SETTINGS` (environment variables) that were set;
- `commit`, `dirty`: the git revision (`workbench.environment.git_revision`: WORKBENCH_COMMIT when set, `dirty`
  then None); `date`: UTC ISO time;
- `device`: the device's description (GPU name, capability, CUDA); `versions`: torch, triton, diffusers, cuda, ...;
- `smoke`: True for a `--smoke` run (tiny shapes on the CPU: its numbers say nothing about speed; its notes say so,
  `SMOKE_NOTE` where the scenario's own do not);
- `shape`, `arms` ({arm: {median_s, seconds, ...}}), `ratios` ({"A/B": RatioCI dict (median, low, high, ...)}),
  `notes` (list of sentences: what was skipped and why, what a number means).
The JSON is strict (`workbench.io.json_bytes`): a non-finite number is written as null, numpy and torch scalars
as numbers, dtypes, devices and paths as strings.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench import environment
from workbench.evidence.resume import Paused, partial_path
from workbench.io import json_bytes, write_atomic

FORMAT = "workbench-benchmark/1"
FIELDS = (
    "format", "what", "scenario", "command", "commit", "dirty", "date", "device", "versions", "smoke",
    "shape", "arms", "ratios", "notes",
)  # fmt: skip
SMOKE_WHAT = "Smoke run at tiny shapes on the CPU of the scenario that measures: {what}"
SMOKE_NOTE = "Smoke: tiny shapes on the CPU (Triton kernels interpreted); the numbers say nothing about speed."


@dataclass(frozen=True)
class Context:
    """How to run a scenario: `smoke` (tiny, CPU), A/B/A `rounds` (>= 3 for a CI95), the device to measure on; for a
    scenario that runs in chunks, the results folder `out` (its partial state lives there) and `max_seconds`, the
    time this run may take (None: no limit)."""

    smoke: bool
    rounds: int
    device: torch.device
    out: Path | None = None
    max_seconds: float | None = None


class Unfinished(Exception):
    """A scenario stopped cleanly at `max_seconds` with its partial state under `out`: the same command continues it.
    No envelope is written for it."""


@contextlib.contextmanager
def journal_parts(folder: Path | None) -> Iterator[None]:
    """Around the `Journal` steps of a scenario run in parts (partial record in `folder`): a pause becomes
    `Unfinished` naming the partial record; once every part is done the partial record is removed (the envelope holds
    every part), and `folder` too unless something else lives there."""
    try:
        yield
    except Paused as paused:
        reason = f"{paused.partial.reason}. Partial record: {paused.partial.path}; the same command continues it"
        raise Unfinished(reason) from None
    if folder is not None and partial_path(folder).exists():
        partial_path(folder).unlink()
        with contextlib.suppress(OSError):
            folder.rmdir()


@dataclass
class Measurement:
    """What a scenario returns: the measured part of the envelope."""

    what: str
    shape: dict[str, Any]
    arms: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def envelope(
    scenario: str, measurement: Measurement, device: torch.device, smoke: bool, settings: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The full record of `measurement` made by this process on `device`; `settings`: the environment variables the
    scenario reads (its `SETTINGS`), those set prefixing the record's command. A `smoke` record's `what` is
    `SMOKE_WHAT` of the measurement's (which names the production shapes), and its notes end with `SMOKE_NOTE` unless
    one already says that the numbers say nothing about speed."""
    described = environment.describe(device)
    versions = {name: described["versions"].get(name) for name in ("python", "torch", "triton", "diffusers")}
    versions["cuda"] = torch.version.cuda
    notes = list(measurement.notes)
    if smoke and not any("say nothing about speed" in note for note in notes):
        notes.append(SMOKE_NOTE)
    return {
        "format": FORMAT,
        "what": SMOKE_WHAT.format(what=measurement.what) if smoke else measurement.what,
        "scenario": scenario,
        "command": command_line(settings),
        "commit": described["git"]["commit"],
        "dirty": described["git"]["dirty"],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": described["device"],
        "versions": versions,
        "smoke": smoke,
        "shape": measurement.shape,
        "arms": measurement.arms,
        "ratios": measurement.ratios,
        "notes": notes,
    }


def command_line(settings: tuple[str, ...] = ()) -> str:
    """This process's command line, as typed (`python -m benchmarks ...` for the harness's entry point), after the
    variables of `settings` that are set (`RING_CAPS=48GiB python -m benchmarks run ring ...`), so that it repeats
    the run."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).parts[-2:] == ("benchmarks", "__main__.py"):
        argv = ["python", "-m", "benchmarks", *argv[1:]]
    else:
        argv = [Path(sys.executable).name, *argv]
    assigned = [f"{name}={shlex.quote(os.environ[name])}" for name in settings if name in os.environ]
    return " ".join([*assigned, shlex.join(argv)])


def write(record: dict[str, Any], out: Path) -> Path:
    """`record` as strict JSON in `<out>/<scenario>.json`, written to a temporary name in `out` and renamed when
    complete."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['scenario']}.json"
    write_atomic(path, json_bytes(record))
    return path
