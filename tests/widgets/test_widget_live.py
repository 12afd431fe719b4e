import base64
import re
import threading
import time
from types import SimpleNamespace

import pytest

from workbench import Request
from workbench.plots import figure_png
from workbench.telemetry import Event
from workbench.widgets import LiveStagePlot
from workbench.widgets import live as live_module

PNG = b"\x89PNG\r\n\x1a\n"


def test_live_stage_plot_follows_a_real_request_and_leaves_pngs(sessions, monkeypatch):
    """Live redraws are SVG strings from the renderer thread; matplotlib runs only on the request thread, once the
    request's total is measured (a rasterization on the renderer would hold the GIL the request needs)."""
    session = sessions("tiny-ltx2")
    rasterized_on = []
    monkeypatch.setattr(live_module, "figure_png", lambda *a, **k: rasterized_on.append(threading.current_thread())
                        or figure_png(*a, **k))  # fmt: skip
    live = LiveStagePlot(max_updates_per_second=5).attach(session)
    assert live.timeline.layout.display == live.memory.layout.display == "none"  # no broken-image icon before
    try:
        start = time.perf_counter()
        result = session.generate(
            Request("a red circle moves left, low hum", seed=0, frames=9, steps=2), progress=False
        )
        elapsed = time.perf_counter() - start
    finally:
        live.detach()
    assert live.events == result.events  # every event, in order, from the request thread
    assert all(event.data["rss_bytes"] > 0 for event in live.events)  # the CPU's memory: host RSS at every event
    assert [e.kind for e in live.events].count("step") == 2 and live.events[-1].kind == "request_end"
    assert 1 <= live.updates <= 5 * elapsed + 1  # it drew while running, within the throttle
    assert live.running.value.startswith("<svg") and ">denoise</text>" in live.running.value
    assert live.running.layout.display == "none"  # the live view gives way to the final figures
    assert rasterized_on == [threading.main_thread()] * 2  # the final timeline and memory figures, nothing live
    assert live.timeline.value == live.png["timeline"] and live.png["timeline"].startswith(PNG)
    assert live.memory.value == live.png["memory"] and live.png["memory"].startswith(PNG)
    assert live.timeline.layout.display == live.memory.layout.display == ""  # shown once they hold a figure
    figures = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', live.static().data)
    assert [(alt, base64.b64decode(data)) for alt, data in figures] == [
        ("stage timeline of the last request", live.png["timeline"]),
        ("memory of the last request", live.png["memory"]),
    ]
    assert "request done" in live.status.value and not live.errors.value
    assert result.metadata["subscriber_errors"] == []


def test_a_failed_request_ends_its_timeline_and_the_next_request_starts_a_new_one(sessions, monkeypatch):
    """A request that raises mid-denoise sends request_failed: the plot stops running, shows the cut-off timeline and
    says why, and the next request's events are its own."""
    session = sessions("tiny-wan")
    live = LiveStagePlot(max_updates_per_second=50).attach(session)
    transformer = session.model.pipeline.transformer
    forward, calls = type(transformer).forward, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device fell over")
        return forward(self, *args, **kwargs)

    request = Request("a red circle", seed=0, frames=9, height=32, width=32, steps=2)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(type(transformer), "forward", failing)
            with pytest.raises(RuntimeError, match="device fell over"):
                session.generate(request, progress=False)
        assert live.events[-1].kind == "request_failed" and not live.events[-1].data["stopped"]
        assert live.events[-1].data["error"] == "RuntimeError: device fell over"
        assert live.status.value.startswith("request failed after") and "device fell over" in live.status.value
        assert live.running.layout.display == "none" and live.png["timeline"].startswith(PNG)
        updates = live.updates
        time.sleep(0.2)
        assert live.updates == updates  # nothing runs any more: the open stage stopped growing
        result = session.generate(request, progress=False)
    finally:
        live.detach()
    assert live.events == result.events and "request done" in live.status.value


def test_detach_unsubscribes_and_stops_the_renderer():
    subscribers = []
    session = SimpleNamespace(
        model=SimpleNamespace(name="fake"),
        subscribe=lambda callback: subscribers.append(callback) or (lambda: subscribers.remove(callback)),
    )
    live = LiveStagePlot().attach(session)
    renderer = live._renderer
    assert subscribers == [live._on_event] and renderer.is_alive()
    live.detach()
    assert subscribers == [] and not renderer.is_alive()
    assert "(detached)" in live.status.value


def test_a_drawing_failure_shows_in_the_widget_not_the_request():
    live = LiveStagePlot()
    live._on_event(Event("stage_start", 0.0, "denoise"))
    live._on_event(Event("request_end", "not a number", None, {"total": 1.0}))  # the plot cannot place it
    assert "final stage plot failed" in live.errors.value


def test_bad_update_rate_raises():
    with pytest.raises(ValueError, match="max_updates_per_second"):
        LiveStagePlot(max_updates_per_second=0)


def test_requests_on_other_threads_reach_the_plot():
    """A request run off the main thread still feeds the live view; the static PNG waits for `static()`."""
    live = LiveStagePlot(max_updates_per_second=50)
    events = [Event("stage_start", 0.0, "denoise"), Event("step", 0.01, "denoise", {"index": 0})]
    events += [
        Event("stage_end", 0.02, "denoise", {"seconds": 0.02}),
        Event("request_end", 0.03, None, {"total": 0.03}),
    ]
    worker = threading.Thread(target=lambda: [live._on_event(event) for event in events])
    worker.start()
    worker.join()
    assert live.events == events and live.png["timeline"].startswith(PNG)
