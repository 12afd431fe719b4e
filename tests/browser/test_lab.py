"""One real-browser check: 10_explore.ipynb in JupyterLab, driven by headless Debian Chromium.

Needs /usr/bin/chromium (`apt-get install chromium`) and the `playwright` Python package; without
either it is skipped with the reason (never a fake pass). `playwright install` cannot download a
browser here, so the system Chromium is launched by path.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is missing: pip install playwright"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on 127.0.0.1 with a token, rooted at a copy of notebooks/, kernel = this interpreter."""
    root = tmp_path / "root"
    shutil.copytree(NOTEBOOKS, root)
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    env = {
        **os.environ,
        "JUPYTER_PATH": str(tmp_path / "jupyter"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "TQDM_DISABLE": "1",
    }
    # Render every cell: JupyterLab 4 otherwise virtualises cells outside the viewport out of the DOM.
    tracker = tmp_path / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    port, token = free_port(), secrets.token_hex(16)
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        "--allow-root",
        "--LabApp.extension_manager=readonly",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
        f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
    ]
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.3)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_explore_notebook_in_jupyterlab_syncs_ab_videos(lab, tmp_path):
    base, token = lab
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/10_explore.ipynb?reset&token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
            select = page.locator(".jp-Dialog button", has_text="Select")  # "Select Kernel", when Lab asks
            try:
                select.wait_for(timeout=5_000)
                select.click()
            except sync_api.TimeoutError:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell").first.click()  # the notebook has focus: its commands apply
            page.locator(".lm-MenuBar-item", has_text="Run").first.click()
            page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
            # The last cell prints the contract once the A/B comparison exists.
            try:
                page.wait_for_selector("text=cross_kv_cache: bitwise", timeout=90_000)
            except sync_api.TimeoutError:
                page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
                raise

            panel = page.locator(".vflash-acceleration-panel").first
            row = panel.locator(".vflash-acceleration-row", has_text="attention_backend").first
            checkbox = row.locator("input[type=checkbox]").first
            assert not checkbox.is_checked()
            checkbox.check()
            assert checkbox.is_checked()
            panel.locator("button", has_text="apply").click()
            try:
                panel.locator(".widget-html", has_text="installed:").filter(has_text="attention_backend").wait_for(
                    timeout=30_000
                )
            except sync_api.TimeoutError:
                page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
                raise AssertionError(
                    f"apply did not install attention_backend; the panel says: {panel.inner_text()}"
                ) from None

            # Move the A/B frame scrubber (the ABPlayer's slider) with the keyboard.
            videos = page.locator("video")
            assert videos.count() >= 2
            slider = page.locator(".widget-slider", has_text="frame").first.locator(".noUi-handle").first
            slider.focus()
            for _ in range(4):
                slider.press("ArrowRight")
            page.wait_for_function(
                """() => {
                    const times = [...document.querySelectorAll('video')].map((v) => v.currentTime);
                    return times.length >= 2 && times[0] > 0 && times.every((t) => Math.abs(t - times[0]) < 1e-3);
                }""",
                timeout=30_000,
            )
            times = page.evaluate("() => [...document.querySelectorAll('video')].map((v) => v.currentTime)")
            assert len(times) >= 2 and times[0] > 0 and all(t == pytest.approx(times[0], abs=1e-3) for t in times)
            page.screenshot(path=str(tmp_path / "lab.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "lab.png").stat().st_size > 0
