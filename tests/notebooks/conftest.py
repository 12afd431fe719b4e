"""The notebook runs as background subprocesses, started when the session starts.

A test of this package that needs a run says so with `@pytest.mark.notebook_run(name)`; its module's
`make_run(name, folder)` says what the run is (its command and working folder; its files go in `folder`).
Each run is its own process with its own fresh kernel, and the test process only waits on them, so they need
not wait for their tests: once collection is done, the runs the selected tests need start one at a time beside
the rest of the suite (which keeps the other core busy), in the order their tests come. Once a notebook test
waits, the test process is idle, and up to `LANES` runs go at once (a thread starts the next as one ends).
A test waits for its own run (`Runs.wait`) and checks what it left. Runs still going when the session ends
(say `-x` stopped it) are killed. While runs go, the suite's own torch threads leave their core alone (`ThreadCap`).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

LANES = max(1, min(2, len(os.sched_getaffinity(0))))  # runs at once while the notebook tests wait on them
RUNS = pytest.StashKey[tuple]()


def pytest_configure(config):
    config.addinivalue_line("markers", "notebook_run(name): the test waits for that run of its module's make_run")


def python3_kernel_of_this_interpreter(root: Path) -> Path:
    """A `python3` kernelspec that starts this very interpreter, found first through JUPYTER_PATH.

    `kernel_name="python3"` otherwise resolves to whichever spec comes first on the machine (a user's
    ~/.local one may point at another Python without the workbench). JUPYTER_PATH has the highest
    priority, and the spec lives in a temporary folder, so nothing is installed anywhere.
    """
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    kernel = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (this interpreter)",
        "language": "python",
    }
    (spec / "kernel.json").write_text(json.dumps(kernel))
    return root


@dataclass
class Run:
    """One run as a subprocess: `command` in `cwd`; its files in `folder` (log.txt: its stdout and stderr)."""

    command: list[str]
    cwd: Path
    folder: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    log: object = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        self.log = (self.folder / "log.txt").open("w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(self.command, cwd=self.cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def done(self) -> bool:
        if self.process is None or self.process.poll() is None:
            return False
        self.log.close()
        return True

    def output(self) -> str:
        return (self.folder / "log.txt").read_text()


class Runs:
    """The session's runs, started in `order`, `lanes` at a time by a thread; `wait(name)` waits for one."""

    def __init__(self, runs: dict[str, Run], order: list[str], env: dict[str, str], timeout: float = 900) -> None:
        self.runs, self.pending, self.env, self.timeout = runs, list(order), env, timeout
        self.lanes, self.lock, self.stopped = 1, threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._keep_lanes_full, name="notebook-runs", daemon=True)
        self.thread.start()

    def _keep_lanes_full(self) -> None:
        while not self.stopped.wait(0.1):
            with self.lock:
                running = [run for run in self.runs.values() if run.process is not None and not run.done()]
                while self.pending and len(running) < self.lanes:
                    run = self.runs[self.pending.pop(0)]
                    run.start(self.env)
                    running.append(run)
                if not self.pending:
                    return

    def wait(self, name: str) -> tuple[Path, int]:
        """Wait for run `name` (next to start, if it had not); (its folder, its exit status)."""
        run = self.runs[name]
        with self.lock:
            self.lanes = LANES  # the test process only waits from now on
            if name in self.pending:
                self.pending.remove(name)
                self.pending.insert(0, name)
        while not (run.process is not None and run.process.poll() is not None):
            if run.process is not None and time.monotonic() - run.started > self.timeout:
                run.process.kill()
                pytest.fail(f"{name}: still running after {self.timeout} s:\n{run.output()[-4000:]}")
            time.sleep(0.1)
        run.done()
        return run.folder, run.process.returncode

    def busy(self) -> bool:
        """Whether a run is still to start or going."""
        with self.lock:
            return bool(self.pending) or any(run.process is not None and run.process.poll() is None
                                             for run in self.runs.values())  # fmt: skip

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        for run in self.runs.values():
            if run.process is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait()
            if run.log is not None:
                run.log.close()


def pytest_collection_finish(session):
    """Start the runs the selected tests need (none for --collect-only)."""
    if session.config.option.collectonly:
        return
    order, modules = [], {}
    for item in session.items:
        for mark in item.iter_markers("notebook_run"):
            name = mark.args[0]
            if name not in modules:
                order.append(name)
                modules[name] = item.module
    if not order:
        return
    root = Path(tempfile.mkdtemp(prefix="workbench-notebook-runs-"))
    kernels = python3_kernel_of_this_interpreter(root / "jupyter")
    env = {**os.environ, "JUPYTER_PATH": str(kernels), "TQDM_DISABLE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")  # a run shares the machine with the suite or another run: one thread
    made = {}
    for name in order:
        (root / name).mkdir()
        command, cwd = modules[name].make_run(name, root / name)
        made[name] = Run(command, cwd, root / name)
    runs = Runs(made, order, env)
    session.config.stash[RUNS] = (runs, root)
    session.config.pluginmanager.register(ThreadCap(runs), "notebook-runs-thread-cap")


class ThreadCap:
    """While a run holds a core, the tests of this process get torch intra-op threads for the other cores only; once
    the runs are done, all of them again (set before each test, from the main thread, where torch's pool is). Two
    threads on the one free core of a 2-core machine spin-wait for the core the run holds: the suite's torch-heavy
    tests ran 2-6x slower beside the runs."""

    def __init__(self, runs: Runs) -> None:
        self.runs, self.threads = runs, torch.get_num_threads()

    def pytest_runtest_setup(self, item) -> None:
        torch.set_num_threads(max(1, self.threads - 1) if self.runs.busy() else self.threads)


def pytest_sessionfinish(session):
    runs, root = session.config.stash.get(RUNS, (None, None))
    if runs is not None:
        runs.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def runs(request) -> Runs:
    """The session's runs (`pytest_collection_finish` started them)."""
    return request.config.stash[RUNS][0]
