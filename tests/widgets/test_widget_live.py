import base64
import gc
import re
import threading
import time
import weakref
from types import SimpleNamespace

import ipywidgets
import pytest

from workbench import Request, RequestStopped
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
    # the memory too, in the same redraws: the host RSS the events carried so far, as a line
    assert (
        live.running_memory.value.startswith("<svg")
        and ">host RSS (process resident memory): " in live.running_memory.value
    )
    assert "<polyline points=" in live.running_memory.value
    assert live.running.layout.display == live.running_memory.layout.display == "none"  # the final figures take over
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


# What the denoiser's third forward does (tiny-wan runs two a step, with guidance), and the status the request ends with.
ENDINGS = {
    "done": (None, r"request done: [\d.]+ s total, 2 steps"),
    "stopped": ("stop", r"request stopped after [\d.]+ s, 1 step"),
    "interrupted": (KeyboardInterrupt(), r"request interrupted after [\d.]+ s, 1 step"),
    "failed": (
        RuntimeError("device fell over"),
        r"request failed after [\d.]+ s, 1 step: RuntimeError: device fell over",
    ),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_each_ending_titles_the_timeline_and_heads_the_static_copy(sessions, monkeypatch, ending):
    """A request that runs to its end, that `Session.stop()` stops, that a kernel interrupt (KeyboardInterrupt) ends or
    that raises mid-denoise: the status, the final timeline's title and the static copy (what a saved notebook and an
    HTML export keep) say which, after how long and how many steps. A stage cut off is not hatched as still running,
    and a line at the cut names the ending. After a cut-off request nothing redraws, and the next request's events are
    its own."""
    action, status = ENDINGS[ending]
    session = sessions("tiny-wan")
    drawn = []
    monkeypatch.setattr(live_module, "figure_png", lambda figure, *a, **k: drawn.append(figure) or figure_png(figure, *a, **k))  # fmt: skip
    live = LiveStagePlot(max_updates_per_second=50).attach(session)
    transformer = session.model.pipeline.transformer
    forward, calls = type(transformer).forward, []

    def third_forward_ends(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3 and action == "stop":
            session.stop()
        elif len(calls) == 3 and action is not None:
            raise action
        return forward(self, *args, **kwargs)

    request = Request("a red circle", seed=0, frames=9, height=32, width=32, steps=2)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(type(transformer), "forward", third_forward_ends)
            if action is None:
                session.generate(request, progress=False)
            else:
                with pytest.raises(RequestStopped if action == "stop" else type(action)):
                    session.generate(request, progress=False)
        assert re.fullmatch(status, live.status.value), live.status.value
        timeline = drawn[0].axes[0]
        assert timeline.get_title() == live.status.value  # it said "running: ..." for all but "done"
        assert "//" not in [bar.get_hatch() for bar in timeline.collections]
        assert [text.get_text() for text in timeline.texts] == ([] if action is None else [ending])
        copy = live.static().data  # the status line first, then the figures
        assert copy.startswith(f'<div class="vflash-live-static"><p>{live.status.value}</p><figure')
        assert live.running.layout.display == "none" and live.png["timeline"].startswith(PNG)
        if action is not None:
            updates = live.updates
            time.sleep(0.2)
            assert live.updates == updates  # nothing runs any more: the open stage stopped growing
            result = session.generate(request, progress=False)
            assert live.events == result.events and live.status.value.startswith("request done")
    finally:
        live.detach()


def test_detach_unsubscribes_and_stops_the_renderer():
    subscribers = []
    session = SimpleNamespace(
        model=SimpleNamespace(name="fake"),
        # as Session.subscribe's: unsubscribing a callback the session no longer holds does nothing
        subscribe=lambda callback: (
            subscribers.append(callback) or (lambda: subscribers.count(callback) and subscribers.remove(callback))
        ),
    )
    live = LiveStagePlot().attach(session)
    renderer = live._renderer
    assert subscribers == [live._on_event] and renderer.is_alive()
    live.detach()
    assert subscribers == [] and not renderer.is_alive()
    assert "(detached)" in live.status.value
    # a plot closed as a bare widget (no detach) that its session lets go of: the renderer holds it only by a weakref,
    # so the plot is collected and the renderer ends (it held the plot, and ran, for the life of the kernel)
    renderer = live.attach(session)._renderer
    subscribers.clear()
    ipywidgets.Widget.close(live)
    plot = weakref.ref(live)
    del live
    gc.collect()
    renderer.join(5)
    assert plot() is None and not renderer.is_alive()


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
