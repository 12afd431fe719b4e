"""WORKBENCH_REQUIRE_BROWSER (conftest.py): under it a browser test module that skips fails, naming the reason;
without it the module skips. Checked on a stand-in module run by pytest in a subprocess, so it needs no browser."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SKIPS = """import pytest

pytest.skip("/usr/bin/chromium is missing", allow_module_level=True)


def test_never_runs():
    pass
"""


@pytest.mark.parametrize(
    ("required", "exit_code", "shown"),
    [
        ("1", pytest.ExitCode.INTERRUPTED, "WORKBENCH_REQUIRE_BROWSER=1, but test_skips.py skipped: /usr/bin/chromium"),
        ("", pytest.ExitCode.NO_TESTS_COLLECTED, "SKIPPED [1] test_skips.py:3: /usr/bin/chromium is missing"),
    ],
)
def test_a_skipping_browser_module_fails_only_when_the_browser_is_required(tmp_path, required, exit_code, shown):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_skips.py").write_text(SKIPS)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"} | {"WORKBENCH_REQUIRE_BROWSER": required}
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_skips.py"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == exit_code and shown in run.stdout, run.stdout
