"""What a fanned-out run reports while it runs (`workbench.evidence.fanout`): events, the run's live counts and
per-worker state, and the command line's view of them (tqdm.auto). A notebook widget subscribes to the same events
(`Fanout.subscribe`)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WorkerState:
    """One worker as progress shows it: where it runs (host, device), its state ("starting", "idle", "running",
    "lost": died, a replacement is starting), the cell it runs and how many it finished or failed."""

    index: int
    host: str = ""
    device: str = ""
    state: str = "starting"
    cell: str = ""
    done: int = 0
    failed: int = 0


@dataclass
class Progress:
    """A run's counts: `total` cells, `skipped` (finished in the store before this run), `done`/`failed` in this
    run, `running`, `retried` (re-queued after their worker died), the workers, and `eta()`."""

    total: int
    workers: list[WorkerState]
    skipped: int = 0
    done: int = 0
    failed: int = 0
    running: int = 0
    retried: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def remaining(self) -> int:
        return self.total - self.skipped - self.done - self.failed

    def eta(self) -> float | None:
        """Seconds left at this run's rate so far (None before a cell has ended)."""
        ended = self.done + self.failed
        return self.remaining * (time.monotonic() - self.started) / ended if ended else None


@dataclass(frozen=True)
class Event:
    """One change in a run. `kind`: "start", "worker_ready", "worker_lost", "cell_started", "cell_finished",
    "cell_failed", "cell_retried" or "end"; `key`/`label` name the cell, `worker` the worker's index, `detail`
    an error or a reason. `progress` is the run's live state (read it in the callback; it keeps changing)."""

    kind: str
    progress: Progress
    key: str = ""
    label: str = ""
    worker: int | None = None
    detail: str = ""


class TqdmView:
    """The command line's progress (tqdm.auto): one bar of cells (done/running/failed, ETA) and one line per
    worker (host, device, the cell it runs, its counts), after a note on stderr of the cells a re-run found finished
    in the store. Subscribe it with `Fanout.subscribe(TqdmView())`."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._bars: list[Any] = []

    def __call__(self, event: Event) -> None:
        from tqdm.auto import tqdm

        p = event.progress
        if event.kind == "start":
            if self.enabled and p.skipped:  # a re-run into a store: say what it reuses, not only what it runs
                print(
                    f"note: {p.skipped} of {p.total} cells already finished in the store: reused, not run again",
                    file=sys.stderr,
                )
            off = not self.enabled or p.remaining == 0
            self._bars = [tqdm(total=p.total, initial=p.skipped, desc="cells", unit="cell", disable=off)]
            self._bars += [
                tqdm(desc=f"worker {w.index}", bar_format="{desc}", position=w.index + 1, disable=off)
                for w in p.workers
            ]
            return
        if not self._bars:
            return
        main, lines = self._bars[0], self._bars[1:]
        if event.kind in ("cell_finished", "cell_failed"):
            main.update(1)
        main.set_postfix(done=p.skipped + p.done, running=p.running, failed=p.failed, retried=p.retried, refresh=False)
        main.refresh()
        for worker, line in zip(p.workers, lines, strict=True):
            doing = f": {worker.cell}" if worker.cell else ""
            line.set_description_str(
                f"worker {worker.index} {worker.host} {worker.device} [{worker.state}{doing}] "
                f"done {worker.done} failed {worker.failed}"
            )
        if event.kind == "end":
            for bar in self._bars:
                bar.close()
            self._bars = []
