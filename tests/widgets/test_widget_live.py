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
