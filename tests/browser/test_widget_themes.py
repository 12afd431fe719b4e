"""The calibration panel and the fan-out progress widget read in JupyterLab's dark theme and its light one.

One notebook cell shows, with realistic content and no model run: three `CalibrationPanel`s (a calibrated result with
its finished steps, a quality-confirmed one, and one with no setting plus a failure in its error box, so every status
colour and the error box are on screen, each with its Pareto plot and setting) and two `FanoutProgress` views (a run
under way with a running, an idle, a lost and a starting worker and a failed cell; a finished run with its static
summary). The page opens in JupyterLab Dark (set through the settings API before the page loads); every visible text of
both widgets must reach its WCAG contrast (4.5, 3 for large text) against the background it is drawn on, and again
after switching to JupyterLab Light through the Settings menu. The measurement and the theme switch are
test_dashboard_layout.py's (`CONTRAST`, `use_theme`); the server is conftest.py's, the Chromium launch test_lab.py's
(skipped the same way when /usr/bin/chromium or playwright is missing).
"""

import json
import time

from test_dashboard_layout import assert_readable, use_theme
from test_lab import ARGS, CHROMIUM, put, run_all, sync_api

SETUP = """\
from workbench import Session
from workbench.accelerations.base import Knob
from workbench.evidence import calibrate as cal
from workbench.evidence.fanout_progress import Event, Progress, WorkerState
from workbench.evidence.harness import default_budget
from workbench.widgets import CalibrationPanel, FanoutProgress

session = Session.open("demo-av-mini", device="cpu")
points = [cal.Point(v, s, 1 / x, x) for v, s, x in ((0.0, 0.0, 1.0), (0.05, 0.2, 1.4), (0.1, 0.55, 1.8), (0.2, 1.6, 2.3))]
setting = {"cross_kv_cache": {}, "easycache": {"threshold": 0.1}}


def panel(status, reason, steps=()):
    shown = CalibrationPanel(session, [], [])
    for n, text in enumerate(steps, 1):
        shown._step(f"step {n}: {text}")
    shown.steps.layout.display = None if steps else "none"
    budget = default_budget(session)
    knob = Knob("threshold", 0.0, 0.2)
    result = cal.Calibration(
        "easycache", knob, {"cross_kv_cache": {}}, {}, budget, 0.8, points, 0.1, 0.2, setting, status, reason
    )
    shown.show(result)
    return shown


steps = ("0 with cross_kv_cache, easycache: spends 0 of the budget", "0.1: spends 0.55 of the budget")
display(panel("calibrated", "the knee 0.1 spends 0.55 of the budget; confirmed on 1 test request", steps))
display(panel("quality_confirmed", "inside the budget on the test requests; CPU seconds rank nothing"))
failed = panel("no_setting", "even the least aggressive value left the budget")
failed.error.show("calibrate", ValueError("plugins: choose at least one plugin to calibrate"))
display(failed)

workers = [WorkerState(i) for i in range(4)]
running = Progress(total=40, workers=workers, skipped=5)
view = FanoutProgress(show_static=False)
view(Event("start", running))
for w, state in zip(workers, ("running", "idle", "lost", "starting")):
    w.host, w.device, w.state = f"host-{w.index}", "NVIDIA H200 (141 GiB)", state
    view(Event("worker_ready", running, worker=w.index, detail=w.host))
workers[0].cell, workers[0].done, workers[1].done, workers[1].failed = "easycache threshold=0.1 · prompt 3", 4, 3, 1
running.done, running.running, running.failed, running.retried = 7, 1, 1, 1
view(Event("cell_failed", running, "k1", "easycache threshold=0.2 · prompt 1", 1, "ValueError: frames: 8 <not 4n+1>"))
display(view)

ended = Progress(total=4, workers=[WorkerState(0, host="host-a", device="cpu", state="idle")], skipped=1)
finished = FanoutProgress()  # shows its static summary under the cell when the run ends
finished(Event("start", ended))
ended.done, ended.failed = 2, 1
finished(Event("cell_failed", ended, "k2", "teacache rel_l1_thresh=0.3", 0, "RuntimeError: out of memory"))
finished(Event("end", ended))
display(finished)
"""
NOTEBOOK = {
    "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": SETUP}],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}
WIDGETS = ".vflash-calibration, .vflash-fanout, .vflash-fanout-summary"
# Texts that must be among those measured: each status colour, the steps, the error box, the budget's labels and
# values, each worker state, the failures, the counts and the finished run's static summary.
SHOWN = (
    "calibrated", "quality_confirmed", "no_setting", "step 2: 0.1", "calibrate failed", "ValueError", "latent rel-L2",
    "0.03", "threshold", "running", "idle", "lost", "starting", "failed:", "12 of 40 done", "RuntimeError",
    "fanned-out run",
)  # fmt: skip
THEME = "lab/api/settings/@jupyterlab/apputils-extension:themes"


def test_calibration_panel_and_fanout_read_in_the_dark_and_the_light_theme(lab, tmp_path):
    base, token = lab[:2]
    put(base, token, "api/contents/widget_themes.ipynb", {"type": "notebook", "content": NOTEBOOK})
    put(base, token, THEME, {"raw": json.dumps({"theme": "JupyterLab Dark"})})  # the page opens dark
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            run_all(page, base, token, "widget_themes.ipynb")
            start = time.monotonic()
            try:
                page.wait_for_selector(".vflash-fanout-summary", timeout=120_000)  # the last output of the cell
                page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
                page.wait_for_function(  # every widget view drawn, with its Pareto plot loaded
                    "() => document.querySelectorAll('.vflash-calibration').length === 3"
                    " && document.querySelectorAll('.vflash-fanout').length === 2"
                    " && [...document.querySelectorAll('.vflash-calibration img')].every((img) => img.naturalWidth)",
                    timeout=60_000,
                )
                assert page.evaluate("document.body.dataset.jpThemeName") == "JupyterLab Dark"
            except (sync_api.TimeoutError, AssertionError):
                page.screenshot(path=str(tmp_path / "failed.png"))
                raise
            print(f"notebook ran in {time.monotonic() - start:.1f} s")
            for theme, layout_color0 in (("dark", "#111"), ("light", "white")):
                if theme == "light":
                    use_theme(page, "JupyterLab Light", layout_color0)
                try:
                    assert_readable(page, theme, SHOWN, root=WIDGETS)
                finally:
                    for name in ("calibration", "fanout"):
                        widget = page.locator(f".vflash-{name}").first
                        widget.scroll_into_view_if_needed()
                        widget.screenshot(path=str(tmp_path / f"{name}-{theme}.png"))
        finally:
            browser.close()
            # the theme is the server's setting: the other browser tests (and the README's screenshots) see Light
            put(base, token, THEME, {"raw": json.dumps({"theme": "JupyterLab Light"})})
