"""The dashboard as a person sees it: JupyterLab in headless Chromium at 1400x1100 with demo-av open.

Checks the layout, not the maths: no element is wider than its container, the page or the dashboard; the
controls (model, request form, acceleration panel, generate) fit one 1,100 px screen while every plugin is
off; the rows with many options wrap inside the panel when switched on; an expanded description reads as
lines of text, not a column of single words; apply with a required option left empty marks that field; a memory cap
too small is refused at its field, and a card preset's plan shows, both within the width; after two requests the
figures below the controls (the live plot's, the A/B audio's) show at their drawn size, not stretched to the width.
Every text of the dashboard, with a bad option value at its field, the error box and the A/B note on screen, then with
a memory cap's plan, reads (WCAG contrast) in JupyterLab's light theme and, switched by its menu, its dark one.
Writes the screenshot the README shows, docs/dashboard.png (`pytest tests/browser/test_dashboard_layout.py`
regenerates it).

Uses the JupyterLab server of conftest.py (shared with test_lab.py) and the Chromium launch of test_lab.py
(skipped the same way when /usr/bin/chromium or playwright is missing); the notebook goes in through the
server's contents API.
"""

import json
import re
import time
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
# session line showed once saw 12 rows on a loaded 2-core CI machine. Polled from Python (not wait_for_function), so
# a wait that runs out says how the rows came: each change of state with its time, the kernel's status, what the
# output area shows instead of a widget, and the page's console errors (a child view that failed is one).
SETTLED, POLL_S, WAIT_S = 5, 0.2, 60
STATE = """() => {
    const dash = document.querySelector('.vflash-dashboard');
    if (!dash) return null;
    const rows = dash.querySelectorAll('.vflash-acceleration-row');
    const lines = [...dash.querySelectorAll('.vflash-acceleration-row .vflash-line')];
    const drawn = lines.filter((line) => line.querySelector('input[type=checkbox]') && line.querySelector('.vflash-more'));
    const box = dash.getBoundingClientRect();
    const kernel = document.querySelector('.jp-Notebook-ExecutionIndicator');
    return {rows: rows.length, lines: lines.length, drawn: drawn.length,
            size: `${Math.round(box.width)}x${Math.round(box.height)}`,
            kernel: kernel && kernel.getAttribute('data-status'),
            outputs: [...document.querySelectorAll('.jp-OutputArea-output')]
                .map((el) => el.innerText.trim().slice(0, 80)).filter((text) => /loading widget|error/i.test(text))};
}"""


def collect_errors(page) -> list[str]:
    """The page's console errors and uncaught exceptions from now on (the list fills as they come)."""
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text[:300]))
    page.on("pageerror", lambda error: errors.append(f"page error: {str(error)[:300]}"))
    return errors


def wait_for_rows(page, expected: int, errors: list[str]) -> None:
    """Poll STATE until `expected` rows are drawn and the dashboard's size held SETTLED polls; AssertionError with
    the timeline of states (seconds since the wait began) and the console's `errors` when it does not."""
    start, timeline, same, last = time.monotonic(), [], 0, None
    while time.monotonic() - start < WAIT_S:
        state = page.evaluate(STATE)
        key = state and (state["rows"], state["lines"], state["drawn"], state["size"])
        same = same + 1 if key == last else 0
        if key != last:
            timeline.append((round(time.monotonic() - start, 1), state))
        last = key
        if state and state["drawn"] == state["lines"] == expected and same >= SETTLED:
            return
        time.sleep(POLL_S)
    raise AssertionError(
        f"{expected} plugin rows never settled in {WAIT_S} s; last seen {state}; timeline (s, state): {timeline[-20:]}; "
        f"console errors: {errors[-10:]}"
    )


MEASURE = """() => {
    const rect = (selector) => document.querySelector(selector).getBoundingClientRect();
    const controls = rect('.vflash-controls');
    const lines = [...document.querySelectorAll('.vflash-acceleration-row .vflash-line')]
        .map((el) => el.getBoundingClientRect().height);
    return {controls: [Math.round(controls.width), Math.round(controls.height)],
            panel: Math.round(rect('.vflash-acceleration-panel').height), lines};
}"""

# The figures on screen: where they are, their width shown and drawn (0 while the PNG is still loading).
FIGURES = """() => [...document.querySelectorAll('.vflash-dashboard img')]
    .filter((img) => img.getClientRects().length)
    .map((img) => [img.closest('.vflash-ab') ? 'A/B' : 'live', Math.round(img.getBoundingClientRect().width),
                   img.naturalWidth])"""

AB_TOPS_UNTIL = """async (done) => {
    const tops = [];
    const top = () => document.querySelector('.vflash-ab').getBoundingClientRect().top + window.scrollY;
    while (!document.querySelector('.vflash-generate').innerText.includes(done)) {
        tops.push(top());
        await new Promise((wake) => setTimeout(wake, 50));
    }
    await new Promise((wake) => setTimeout(wake, 500));  // the final figures replace the live view
    tops.push(top());
    return [Math.min(...tops), Math.max(...tops), tops.length];
}"""

# The dashboard takes the next action: its generate button is back on (it stays off until a request has shown all).
IDLE = "() => !document.querySelector('.vflash-generate button').disabled"


# Every visible text under the elements `root` (CSS selectors, comma-separated) selects: its colour and what
# it is drawn on (the backgrounds behind it composited, the page's white under them all), their WCAG 2 contrast ratio
# and the least it needs: 4.5, or 3 for large text. The contract badges (white on a saturated colour, the same in every
# theme) are held to 4.5 too, and so are the buttons' labels (a disabled button's are exempt, as WCAG exempts
# inactive controls). Also used by test_widget_themes.py.
CONTRAST = """(root) => {
    const rgba = (s) => { const m = s.match(/rgba?\\(([^)]+)\\)/);
        const p = m ? m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number) : [0, 0, 0, 0];
        return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
    const over = (top, below) => [0, 1, 2].map((i) => top[i] * top[3] + below[i] * (1 - top[3])).concat([1]);
    const lum = (c) => c.slice(0, 3).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
        .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
    const hex = (c) => '#' + c.slice(0, 3).map((v) => Math.round(v).toString(16).padStart(2, '0')).join('');
    const rows = [];
    for (const el of document.querySelectorAll(root.split(',').map((part) => `${part} *`).join(','))) {
        if (!el.getClientRects().length || el.closest('button:disabled')) continue;
        const style = getComputedStyle(el);
        const text = el.tagName === 'INPUT' ? (['text', 'number'].includes(el.type) ? el.value : '')
            : el.tagName === 'SELECT' ? el.value
            : [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent).join('').trim();
        if (!text || style.visibility !== 'visible') continue;
        const layers = [];
        for (let e = el; e; e = e.parentElement) {
            const c = rgba(getComputedStyle(e).backgroundColor);
            if (c[3] > 0) layers.push(c);
            if (c[3] >= 1) break;
        }
        const bg = layers.reverse().reduce((below, top) => over(top, below), [255, 255, 255, 1]);
        const fg = over(rgba(el instanceof SVGElement ? style.fill : style.color), bg);
        const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
        const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
        const large = size >= 24 || (size >= 18.66 && bold);
        const where = el.closest('[class*=vflash-]').className.match(/vflash-[a-z-]+/)[0];
        rows.push({where, text: text.slice(0, 50), fg: hex(fg), bg: hex(bg), ratio: (hi + 0.05) / (lo + 0.05),
                   need: large ? 3 : 4.5});
    }
    return rows;
}"""


def use_theme(page, name: str, layout_color0: str) -> None:
    """Switch JupyterLab's theme through its Settings menu and wait until its colours (`--jp-layout-color0`) apply."""
    page.locator(".lm-MenuBar-item", has_text="Settings").first.click()
    page.locator(".lm-Menu-item", has_text=re.compile(r"^Theme$")).first.hover()
    page.locator(".lm-Menu-item", has_text=re.compile(f"^{re.escape(name)}$")).first.click()
    page.wait_for_function(
        "([name, color]) => document.body.dataset.jpThemeName === name"
        " && getComputedStyle(document.body).getPropertyValue('--jp-layout-color0').trim() === color",
        arg=[name, layout_color0],
    )


def assert_readable(page, theme: str, expect: tuple[str, ...], root: str = ".vflash-dashboard") -> None:
    """Every text under `root` (the dashboard by default) has the contrast it needs; `expect`: texts that must be among
    those measured."""
    rows = page.evaluate(CONTRAST, root)
    poor = [f"{r['where']} {r['text']!r}: {r['fg']} on {r['bg']} {r['ratio']:.2f} < {r['need']}" for r in rows
            if r["ratio"] < r["need"]]  # fmt: skip
    print(f"{theme}: {len(rows)} texts, lowest {min(r['ratio'] for r in rows):.2f}")
    texts = " ".join(r["text"] for r in rows)
    assert all(part in texts for part in expect), [part for part in expect if part not in texts]
    assert poor == [], f"{theme} theme, {len(poor)} of {len(rows)} texts too faint: {poor[:15]}"


def test_dashboard_fits_1400_wide_and_one_screen_tall(lab, tmp_path):
    base, token = lab[:2]
    put(base, token, "api/contents/dashboard_layout.ipynb", {"type": "notebook", "content": NOTEBOOK})
    news = json.dumps({"fetchNews": "false"})  # no "get notified about Jupyter news?" toast over the screenshot
    put(base, token, "lab/api/settings/@jupyterlab/apputils-extension:notification", {"raw": news})
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            errors = collect_errors(page)
            run_all(page, base, token, "dashboard_layout.ipynb")
            plugins = len(available())
            try:
                # a kernel start, the imports and demo-av's load: slow on a busy 2-core machine
                page.wait_for_selector(".vflash-dashboard :text('demo-av on cpu')", timeout=180_000)
                wait_for_rows(page, plugins, errors)
            except (sync_api.TimeoutError, AssertionError):
                page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
                raise
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

            # Two requests of 2 steps (nothing installed: apply refused): the live plot's figures and the A/B audio's.
            steps = page.locator(".vflash-request .widget-text", has_text="steps").locator("input")
            steps.fill("2")
            steps.press("Enter")
            for n in (1, 2):
                page.locator(".vflash-generate button", has_text="generate").click()
                page.wait_for_function(
                    f"() => document.querySelector('.vflash-generate').innerText.includes('#{n} ')", timeout=120_000
                )
            loaded = f"() => {{ const f = ({FIGURES})(); return f.length >= 3 && f.every(([, , drawn]) => drawn); }}"
            page.wait_for_function(loaded, timeout=30_000)
            figures = page.evaluate(FIGURES)
            print(f"figures (where, width shown, width drawn): {figures}")
            assert all(shown <= drawn + 1 for _, shown, drawn in figures), figures

            # A third request: while it runs, the live timeline takes the figures' place and the A/B area below stays
            # where it is (its top is sampled every 50 ms until the request is done).
            page.locator(".vflash-generate button", has_text="generate").click()
            tops = page.evaluate(AB_TOPS_UNTIL, "#3 ")
            print(f"A/B top during and after request #3 (min, max, samples): {tops}")
            assert tops[2] >= 3 and tops[1] - tops[0] <= 8, tops
            page.wait_for_function(IDLE, timeout=30_000)  # the request's thread has shown all it updates

            # A long request, stopped from the browser once a step has run: the click reaches the kernel while the
            # request runs on the dashboard's thread; the status says where it stopped, the A/B pair stays.
            steps.fill("200")
            steps.press("Enter")
            page.locator(".vflash-generate button", has_text="generate").click()
            running = (
                r"() => /running: [\d.]+ s, [1-9]\d* steps/.test(document.querySelector('.vflash-dashboard').innerText)"
            )
            page.wait_for_function(running, timeout=60_000)
            page.locator(".vflash-generate button", has_text="stop").click()
            stopped = "() => document.querySelector('.vflash-generate').innerText.includes('of 200 steps done')"
            page.wait_for_function(stopped, timeout=60_000)
            status = page.locator(".vflash-generate").inner_text()
            assert re.search(r"stopped in denoise, [1-9]\d* of 200 steps done; the model stays loaded", status), status
            assert (
                "#3 " in page.locator(".vflash-ab").inner_text()
                and "request stopped after" in page.locator(".vflash-dashboard").inner_text()
            )
            page.wait_for_function(IDLE, timeout=30_000)
            steps.fill("2")
            steps.press("Enter")

            # Readable in the light and the dark theme: a bad value at its field (red message, red-tinted input),
            # the error box, the A/B note (the two stock results are identical), then a memory cap's plan.
            readable = time.monotonic()
            easycache = panel.locator(".vflash-acceleration-row", has_text="easycache").first
            threshold = easycache.locator(".vflash-option", has_text="threshold").first.locator("input")
            threshold.fill("-1")
            threshold.press("Enter")
            page.locator(".vflash-option.vflash-invalid", has_text="minimum").first.wait_for(timeout=10_000)
            shown = ("apply failed", "are identical", "minimum", "-1", "not here", "caches", "generate", "exact-fast")
            assert_readable(page, "light", shown)
            use_theme(page, "JupyterLab Dark", "#111")
            assert_readable(page, "dark", shown)
            cap = page.locator(".vflash-memory-cap input").first
            cap.fill("48GiB")
            cap.press("Enter")
            page.locator(".vflash-dashboard button", has_text="open").first.click()
            page.wait_for_selector(".vflash-memory-plan", timeout=60_000)
            page.screenshot(path=str(tmp_path / "dark.png"), full_page=True)
            assert_readable(page, "dark", ("memory plan under 48.00 GiB",))
            print(f"contrast checks: {time.monotonic() - readable:.1f} s")

        finally:
            browser.close()
            # the theme is the server's setting: the later tests (and their screenshots for the README) see Light
            light = json.dumps({"theme": "JupyterLab Light"})
            put(base, token, "lab/api/settings/@jupyterlab/apputils-extension:themes", {"raw": light})
    assert SCREENSHOT.stat().st_size > 0
