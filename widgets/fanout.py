"""Live progress of a fanned-out run (`workbench.evidence.fanout.Fanout`) in JupyterLab, then a static summary.

    cells [██████░░░░] 12 of 40 done (5 from the store), 2 running, 1 failed, 1 retried · 1 min 3 s · ETA 3 min 10 s
    worker 0  host-a  NVIDIA H200 (141 GiB)  running  easycache threshold=0.1 · prompt 3   4 done  0 failed
    worker 1  host-b  NVIDIA H200 (141 GiB)  idle                                          3 done  1 failed
    failed: <cell label>: <its error>

The same `Event`s as the command line's `TqdmView` (`fanout.subscribe(FanoutProgress())`, or
`FanoutProgress(fanout)`), so the counts are the run's own `Progress`, never recounted here.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets
from IPython import get_ipython
from IPython.display import HTML, display

from workbench.evidence.fanout_progress import Event, Progress

from ._common import ACCENT_COLOR, ALERT_COLOR, MUTED_COLOR, ErrorBox, StaticCopy

_STATE_COLORS = {
    "running": ACCENT_COLOR,
    "lost": ALERT_COLOR,
    "starting": MUTED_COLOR,
    "idle": MUTED_COLOR,
}
_CELL = "padding:1px 12px 1px 0;text-align:left;vertical-align:top;font-weight:normal"
_WRAP = "overflow-wrap:anywhere;white-space:normal"
_FAILED_SHOWN = 10  # failures listed by name; more are counted


class FanoutProgress(StaticCopy, ipywidgets.VBox):
    """Cells done / running / failed of the total, elapsed time and ETA, one line per worker (host, device, state,
    the cell it runs, its counts), and the failed cells with their errors, updated on every event of a run.

    Events arrive on the driver's thread (the one calling `Fanout.run`, which may be a background thread). Each
    event is drawn in the callback itself, under a lock: a few lines of HTML take microseconds (no renderer thread is
    needed, unlike `LiveStagePlot`'s figures), and the driver changes `Progress` only between events, so the state
    read is consistent. Setting widget values from that thread is safe, as `LiveStagePlot` does. A drawing failure
    shows in the widget's error box and never reaches the driver (where it would stop the run).

    When the run ends, `html` holds a static summary (inline styles, no JS) and, unless `show_static=False`, it is
    displayed under the running cell if the run ended on the kernel's main thread: it survives an offline HTML export
    that blanks every widget. Otherwise `display(view.static())` shows it. Either way it becomes the static copy of the
    view's own displays (`StaticCopy.refresh_static`).
    """

    def __init__(self, fanout: Any = None, show_static: bool = True):
        self.bar = ipywidgets.IntProgress(
            value=0, min=0, max=1, description="cells", bar_style="info", layout={"width": "300px"}
        )
        self.summary = ipywidgets.HTML("waiting for a run", layout={"flex": "1 1 0", "min_width": "0"})
        self.workers = ipywidgets.HTML()
        self.failed = ipywidgets.HTML()
        self.errors = ErrorBox()
        row = ipywidgets.HBox([self.bar, self.summary], layout={"align_items": "center", "flex_flow": "row wrap"})
        super().__init__([row, self.workers, self.failed, self.errors])
        self.add_class("vflash-fanout")
        self.show_static = show_static
        self.failures: list[tuple[str, str]] = []  # (cell label, error) of this run's failed cells, in order
        self.html = ""  # the last finished run's static summary
        self.events = 0  # events drawn so far
        self._lock = threading.Lock()
        self._unsubscribe: Callable[[], None] | None = None
        if fanout is not None:
            self.attach(fanout)

    def attach(self, fanout: Any) -> FanoutProgress:
        """Follow every later run of `fanout` (detaching from any earlier one); returns self."""
        self.detach()
        self._unsubscribe = fanout.subscribe(self)
        return self

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def static(self) -> HTML:
        """The last finished run's summary as a static HTML output (for `display(view.static())`); before a run
        has ended, the counts as they stand."""
        return HTML(
            self.html or f'<div class="vflash-fanout-summary" style="font-size:13px">{self.summary.value}</div>'
        )

    def __call__(self, event: Event) -> None:
        """A `Fanout.subscribe` callback: draw `event`'s state of the run."""
        with self._lock, self.errors.catching("fanout progress"):
            progress = event.progress
            if event.kind == "start":
                self.failures = []
                self.errors.clear()
            elif event.kind == "cell_failed":
                self.failures.append((event.label, event.detail))
            ended = event.kind == "end"
            self.bar.max = max(progress.total, 1)
            self.bar.value = progress.total - progress.remaining
            self.bar.bar_style = ("danger" if progress.failed else "success") if ended else "info"
            self.summary.value = _counts(progress, ended)
            self.workers.value = _workers(progress)
            self.failed.value = _failures(self.failures)
            self.events += 1
            if ended:
                self.html = (
                    f'<div class="vflash-fanout-summary" style="font-size:13px"><b>fanned-out run</b>: '
                    f"{self.summary.value}{self.workers.value}{self.failed.value}</div>"
                )
                if (
                    self.show_static
                    and get_ipython() is not None
                    and threading.current_thread() is threading.main_thread()
                ):
                    display(self.static())
                self.refresh_static()


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 1 else "<1 s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    return f"{minutes // 60} h {minutes % 60} min"


def _counts(p: Progress, ended: bool) -> str:
    done = f"{p.skipped + p.done} of {p.total} done" + (f" ({p.skipped} from the store)" if p.skipped else "")
    parts = [done, f"{p.running} running", f"{p.failed} failed"] + ([f"{p.retried} retried"] if p.retried else [])
    text = ", ".join(parts) + f" · {_duration(time.monotonic() - p.started)}"
    if not ended:
        eta = p.eta()
        text += " · ETA " + ("after the first cell ends" if eta is None else _duration(eta))
    return html.escape(text)


def _workers(p: Progress) -> str:
    rows = []
    for w in p.workers:
        color = _STATE_COLORS.get(w.state, MUTED_COLOR)
        cells = (
            f"worker {w.index}",
            html.escape(w.host or "–"),
            html.escape(w.device or "–"),
            f'<span style="color:{color}">{html.escape(w.state)}</span>',
            f'<span style="{_WRAP}">{html.escape(w.cell)}</span>',
            f"{w.done} done",
            f"{w.failed} failed",
        )
        rows.append("<tr>" + "".join(f'<td style="{_CELL}">{c}</td>' for c in cells) + "</tr>")
    return f'<table class="vflash-fanout-workers" style="font-size:12px">{"".join(rows)}</table>'


def _failures(failures: list[tuple[str, str]]) -> str:
    if not failures:
        return ""
    items = "".join(
        f"<li><b>{html.escape(label)}</b>: {html.escape(error)}</li>" for label, error in failures[:_FAILED_SHOWN]
    )
    more = f"<li>and {len(failures) - _FAILED_SHOWN} more</li>" if len(failures) > _FAILED_SHOWN else ""
    return (
        f'<div style="font-size:12px;color:{ALERT_COLOR};{_WRAP}">failed:<ul style="margin:0">{items}{more}</ul></div>'
    )
