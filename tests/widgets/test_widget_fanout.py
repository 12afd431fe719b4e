"""FanoutProgress follows a fanned-out run's events: a stream built step by step as `Fanout.run` builds it, and a
real `Fanout` run (real workers, sessions, cells and store) with Ray's transport replaced by an in-process stand-in
(starting Ray costs about a minute here)."""

import html
import itertools
import socket
import threading
from types import SimpleNamespace

import pytest

from workbench import Request
from workbench.evidence import fanout as fanout_module
from workbench.evidence import fanout_jobs
from workbench.evidence.fanout import Fanout, Store
from workbench.evidence.fanout_progress import Event, Progress, WorkerState
from workbench.widgets import FanoutProgress

H200 = "NVIDIA H200 (141 GiB)"


def test_fanout_progress_follows_the_event_stream_and_leaves_a_static_summary():
    view = FanoutProgress(show_static=False)
    assert "waiting for a run" in view.static().data  # before any run its copy says so, not nothing
    workers = [WorkerState(0), WorkerState(1)]
    p = Progress(total=4, workers=workers, skipped=1)  # mutated as Fanout.run mutates it, one event per change
    view(Event("start", p))
    for w, host in zip(workers, ("host-a", "host-b"), strict=True):
        w.host, w.device, w.state = host, H200, "idle"
        view(Event("worker_ready", p, worker=w.index, detail=f"{host}: {H200}"))
    for w, label in zip(workers, ("easycache threshold=0.1 <seed 1>", "easycache threshold=0.2"), strict=True):
        w.state, w.cell = "running", label
        p.running += 1
        view(Event("cell_started", p, f"k{w.index}", label, w.index))
    assert "1 of 4 done (1 from the store), 2 running, 0 failed" in view.summary.value
    assert "ETA after the first cell ends" in view.summary.value
    assert "host-b" in view.workers.value and html.escape("threshold=0.1 <seed 1>") in view.workers.value
    assert view.workers.value.count("running") == 2 and view.bar.value == 1 and view.bar.max == 4
    p.running -= 1
    workers[0].state, workers[0].cell = "idle", ""
    p.done += 1
    workers[0].done += 1
    view(Event("cell_finished", p, "k0", "easycache threshold=0.1 <seed 1>", 0))
    assert view.bar.value == 2 and "ETA after" not in view.summary.value and "ETA " in view.summary.value

    def rest():  # on another thread, as a driver run off the main thread sends them
        reason = "worker 1 (host-b) died: killed"
        p.running -= 1
        view(Event("worker_lost", p, "k1", "easycache threshold=0.2", 1, reason))
        workers[1].state, workers[1].cell = "lost", ""
        p.retried += 1
        view(Event("cell_retried", p, "k1", "easycache threshold=0.2", 1, reason))
        workers[0].state, workers[0].cell = "running", "easycache threshold=0.2"
        p.running += 1
        view(Event("cell_started", p, "k1", "easycache threshold=0.2", 0))
        p.running -= 1
        workers[0].state, workers[0].cell = "idle", ""
        p.failed += 1
        workers[0].failed += 1
        view(Event("cell_failed", p, "k1", "easycache threshold=0.2", 0, "ValueError: frames: 8 <not 4n+1>"))
        view(Event("end", p))

    driver = threading.Thread(target=rest)
    driver.start()
    driver.join()
    assert view.events == 11 and view.errors.value == ""
    assert view.bar.value == 3 and view.bar.bar_style == "danger"
    assert "2 of 4 done (1 from the store), 0 running, 1 failed, 1 retried" in view.summary.value
    assert "ETA" not in view.summary.value and "lost" in view.workers.value  # worker 1 still restarting
    failure = html.escape("ValueError: frames: 8 <not 4n+1>")
    assert failure in view.failed.value
    summary = view.static().data
    assert summary == view.html and failure in summary and "host-a" in summary and H200 in summary
    assert "<script" not in summary  # static: survives an offline export


def test_fanout_progress_drawing_failure_stays_in_the_widget():
    view = FanoutProgress(show_static=False)
    view(Event("start", progress=None))  # nothing to draw from: the error shows here, the driver goes on
    assert "fanout progress failed" in view.errors.value


class _InProcessRay:
    """The part of Ray's API `Fanout` uses, in this process: an actor is its object, a call's result is computed
    when it is fetched (`get`, once), and calls finish in the order they were made (`wait` returns the oldest), as
    on one executor: both workers open before either finishes a cell."""

    exceptions = SimpleNamespace(
        RayActorError=type("RayActorError", (Exception,), {}), RayTaskError=type("RayTaskError", (Exception,), {})
    )

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return {"CPU": 2.0}

    def remote(self, cls):
        return SimpleNamespace(options=lambda **_: SimpleNamespace(remote=lambda *args: _Actor(cls(*args))))

    def wait(self, refs, num_returns=1):
        oldest = sorted(refs, key=lambda ref: ref.order)
        return oldest[:num_returns], oldest[num_returns:]

    def get(self, ref):
        return ref()

    def kill(self, actor):
        pass


class _Call:
    made = itertools.count()

    def __init__(self, method, args):
        self.order, self.method, self.args = next(self.made), method, args

    def __call__(self):  # run once, however often it is fetched
        if not hasattr(self, "result"):
            self.result = self.method(*self.args)
        return self.result


class _Actor:
    def __init__(self, body):
        self._body = body

    def __getattr__(self, name):
        method = getattr(self._body, name)
        return SimpleNamespace(remote=lambda *args: _Call(method, args))


def test_fanout_progress_driven_by_a_real_fanout_run(monkeypatch, tmp_path):
    monkeypatch.setattr(fanout_module, "_ray", _InProcessRay)
    tiny = {"frames": 5, "height": 16, "width": 16, "steps": 2}
    requests = [("ok", Request("a red circle", **tiny)), ("bad", Request("a blue square", **{**tiny, "frames": 8}))]
    store = Store(tmp_path)
    with Fanout("tiny-wan", workers=2, device="cpu") as pool:
        view = FanoutProgress(pool, show_static=False)
        seen = []  # (event, the worker lines the view showed after it): subscribed after the view, so called after
        pool.subscribe(lambda event: seen.append((event.kind, event.label, view.workers.value)))
        with pytest.raises(RuntimeError, match="bad"):
            fanout_jobs.batch(pool, store, requests, {})
        identity = pool.identities[0]
    kinds = [kind for kind, _, _ in seen]
    # the first worker is ready before the run starts: batch checks its accelerations there first (Fanout.validate)
    assert kinds[:2] == ["worker_ready", "start"] and kinds[-1] == "end" and view.events == len(seen)
    assert sorted(kinds[2:-1]) == ["cell_failed", "cell_finished", *["cell_started"] * 2, "worker_ready"]
    for kind, label, lines in seen:
        if kind == "cell_started":
            assert html.escape(label) in lines and "running" in lines
    failed = next(entry for entry in store.entries().values() if entry["status"] == "failed")
    assert html.escape(failed["error"]) in view.failed.value and "frames" in failed["error"]
    assert view.bar.value == view.bar.max == 2 and view.bar.bar_style == "danger"
    assert "1 of 2 done, 0 running, 1 failed" in view.summary.value
    for shown in (identity["host"], html.escape(identity["label"])):
        assert shown in view.workers.value and shown in view.html
    assert identity["host"] == socket.gethostname()
