"""The JupyterLab server the browser tests share (test_lab.py: the A/B players, test_dashboard_layout.py: the
dashboard); the modules skip themselves when Chromium or playwright is missing, unless WORKBENCH_REQUIRE_BROWSER=1
(.ci/run sets it once Chromium is installed): then a module that skips fails with the skip's reason instead."""

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REQUIRE = "WORKBENCH_REQUIRE_BROWSER"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    """Under WORKBENCH_REQUIRE_BROWSER=1 a browser test module that skips (no Chromium, no playwright) is a failure
    naming the skip's reason: a run that must check the browser cannot pass without it."""
    report = yield
    if report.skipped and os.environ.get(REQUIRE) == "1":
        reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE}=1, but {collector.nodeid} skipped: {reason.removeprefix('Skipped: ')}"
    return report


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="package")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 with a token, kernel = this interpreter, progress bars off, rooted at an empty
    folder (tests put their notebooks in through the contents API); one server for the browser tests,
    stopped after the last: (base URL, token, a temporary folder)."""
    tmp_path = tmp_path_factory.mktemp("lab")
    root = tmp_path / "root"
    root.mkdir()
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
    news = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))  # no pop-up over the screenshot
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
        yield base, token, tmp_path
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
