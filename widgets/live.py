"""A live stage timeline that follows a Session's requests, then leaves static PNGs behind."""

from __future__ import annotations

import html
import threading
import time
import weakref
from collections.abc import Callable

import ipywidgets
from IPython import get_ipython
from IPython.display import HTML, display

from workbench import Session
from workbench.plots import (
    Outcome,
    figure_png,
    memory_plot,
    memory_svg,
    png_figure_html,
    request_outcome,
    stage_timeline,
    timeline_svg,
)
from workbench.telemetry import Event

from ._common import FIGURE_MARGIN_PX, ErrorBox, StaticCopy, figure_image, png_height


class LiveStagePlot(StaticCopy, ipywidgets.VBox):
    """Stage timeline and memory (per-stage device peaks on a GPU, host RSS over the request on the CPU) of each
    request of a session, live while it runs.

    The subscriber only records events: it runs on the request thread, inside the stages it measures,
    so drawing there would add the drawing time to the stage. While a request runs, a renderer thread
    redraws the timeline and the memory at most `max_updates_per_second` times a second (open stages grow with the
    wall clock) as inline SVGs (`plots.timeline_svg`, `plots.memory_svg`: string formatting, no matplotlib), so the
    GIL it takes from the request is microseconds a redraw; it sets widget values, which is safe from a background
    thread. The renderer holds the plot only while it draws: it ends on `detach()` and once nothing else holds the
    plot. When the request ends, the final matplotlib figures (`plots.stage_timeline`, `plots.memory_plot`) are drawn
    on the request thread (its total is already measured), kept in `png` and (unless `show_static=False`), if that
    thread is the kernel's main thread, displayed as static HTML (`static()`: the status line, then the figures)
    under the running cell, where they survive an offline HTML export that blanks every widget. Otherwise
    `display(live.static())` shows them. Either way they become the static copy of the plot's own displays
    (`StaticCopy.refresh_static`). The figures show at their drawn size (`figure_image`), not stretched to the width of
    the window; while the next request runs, their box keeps their height (at the drawn width), so what is below the
    plot stays where it is. A request that raises, that a kernel interrupt or `Session.stop()` ends finishes the same
    way: its timeline is cut off where it ended, and its title and the status say how (`plots.request_outcome`:
    "request failed after 0.410 s, 1 step: RuntimeError: ...", "request interrupted after ...", "request stopped
    after ...").
    """

    def __init__(self, max_updates_per_second: float = 2.0, show_static: bool = True):
        self.status = ipywidgets.HTML("not attached to a session")
        self.running = ipywidgets.HTML(layout=ipywidgets.Layout(display="none"))  # the live SVG timeline
        self.running_memory = ipywidgets.HTML(layout=ipywidgets.Layout(display="none"))  # and memory under it
        # Hidden until they hold a figure: an empty image shows the browser's broken-image icon.
        self.timeline = figure_image(display="none")
        self.memory = figure_image(display="none")
        for image in (self.timeline, self.memory):
            image.observe(_reveal, names="value")
        self.errors = ErrorBox()
        self.figures = ipywidgets.VBox([self.running, self.running_memory, self.timeline, self.memory])
        super().__init__([self.status, self.figures, self.errors])
        self._unsubscribe: Callable[[], None] | None = None
        self._renderer: threading.Thread | None = None
        self._end_renderer: weakref.finalize | None = None  # ends the renderer: on detach, or once the plot is gone
        if not max_updates_per_second > 0:
            raise ValueError(f"max_updates_per_second: expected > 0, got {max_updates_per_second!r}")
        self.interval = 1.0 / max_updates_per_second
        self.show_static = show_static
        self.events: list[Event] = []
        self.png: dict[str, bytes] = {}  # "timeline", "memory" of the last finished request
        self.updates = 0  # live redraws so far (the throttle's observable)
        self._lock = threading.Lock()
        self._running = False
        self._generation = 0  # bumps per request, so a slow live draw never overwrites a later state
        self._origin = 0.0  # perf_counter at request start, to extend open stages to "now"
        self._wake = threading.Event()

    def attach(self, session: Session) -> LiveStagePlot:
        """Follow `session`'s later requests (detaching from any earlier one); returns self."""
        self.detach()
        self._unsubscribe = session.subscribe(self._on_event)
        closing = threading.Event()  # this renderer's own: a later attach's renderer is not this one's business
        self._end_renderer = weakref.finalize(self, _end_renderer, closing, self._wake)
        args = (weakref.ref(self), self._wake, closing)
        self._renderer = threading.Thread(target=_render_loop, args=args, name="live-stage-plot", daemon=True)
        self._renderer.start()
        self.status.value = f"attached to {html.escape(session.model.name)}: waiting for a request"
        return self

    def detach(self) -> None:
        """Stop following the session and stop the renderer thread; the last figures stay."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        with self._lock:
            self._running = False  # a request that ends after the detach sends its last event elsewhere
        if self._renderer is not None:
            self._end_renderer()
            if self._renderer is not threading.current_thread():  # (a plot collected on it detaches there)
                self._renderer.join(timeout=5)
            self._renderer = None
            self.status.value += " (detached)"

    def close(self) -> None:
        self.detach()
        super().close()

    def static(self) -> HTML:
        """The status line (how the last request ended: done, stopped, interrupted or failed and why), then that
        request's figures, as self-contained HTML (PNG data URIs, each with its alt text and caption; none while no
        request has finished), for `display(live.static())`."""
        alts = {"timeline": "stage timeline of the last request", "memory": "memory of the last request"}
        names = [name for name in ("timeline", "memory") if name in self.png]
        body = "".join(png_figure_html(self.png[name], alts[name], style="margin:0") for name in names)
        return HTML(f'<div class="vflash-live-static"><p>{self.status.value}</p>{body}</div>')

    # -- request thread ---------------------------------------------------------------------------
    def _on_event(self, event: Event) -> None:
        with self._lock:
            if not self._running:  # first event of a new request
                self._running = True
                self._generation += 1
                self.events = []
                self._origin = time.perf_counter() - event.t
                if self.errors.value:
                    self.errors.clear()
            self.events.append(event)
            if event.kind not in ("request_end", "request_failed"):
                self._wake.set()
                return
            self._running = False
            self._generation += 1
            self._wake.clear()
            events = list(self.events)
        self._finish(events)

    def _finish(self, events: list[Event]) -> None:
        with self.errors.catching("final stage plot"):
            self.png = {"timeline": figure_png(stage_timeline(events)), "memory": figure_png(memory_plot(events))}
            self.running.layout.display = self.running_memory.layout.display = "none"
            self.timeline.value = self.png["timeline"]
            self.memory.value = self.png["memory"]
            # the next request's live timeline takes the figures' place without moving what is below the plot
            drawn = sum(png_height(image) + 2 * FIGURE_MARGIN_PX for image in self.png.values())
            self.figures.layout.min_height = f"{drawn}px"
            self.status.value = html.escape(f"request {request_outcome(events)}")
            if self.show_static and get_ipython() is not None and threading.current_thread() is threading.main_thread():
                display(self.static())
            self.refresh_static()

    # -- renderer thread --------------------------------------------------------------------------
    def _draw_live(self) -> bool:
        """One live redraw of the running request's timeline and memory at the wall clock; False (and nothing drawn)
        while no request runs."""
        with self._lock:
            if not self._running:
                self._wake.clear()
                return False
            generation, events = self._generation, list(self.events)
            now = time.perf_counter() - self._origin
        with self.errors.catching("live stage plot"):
            timeline, memory = timeline_svg(events, now=now), memory_svg(events, now=now)
            with self._lock:
                if generation == self._generation:  # the request has not ended meanwhile
                    self.running.value, self.running_memory.value = timeline, memory
                    if self.running.layout.display == "none":  # the last request's figures give way
                        self.timeline.value = self.memory.value = b""
                        self.running.layout.display = ""
                    self.running_memory.layout.display = "" if memory else "none"
                    self.status.value = str(Outcome("running", now, sum(e.kind == "step" for e in events)))
                    self.updates += 1
        return True


def _render_loop(plot: weakref.ref[LiveStagePlot], wake: threading.Event, closing: threading.Event) -> None:
    """The renderer thread: while a request runs, `_draw_live` every `interval` seconds. It holds the plot only while
    it draws, so a plot nothing else holds is collected (its finalizer sets `closing` and `wake`); it ends then, or on
    `detach` (which sets them too)."""
    while not closing.is_set():
        wake.wait()
        live = plot()
        if live is None or closing.is_set():
            return
        drew, interval = live._draw_live(), live.interval
        del live  # not held while waiting
        if drew:
            closing.wait(interval)


def _end_renderer(closing: threading.Event, wake: threading.Event) -> None:
    closing.set()
    wake.set()


def _reveal(change: dict) -> None:
    """Show an image once it holds a figure (and hide it again if it is emptied)."""
    change["owner"].layout.display = "" if change["new"] else "none"
