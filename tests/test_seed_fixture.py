"""The tests' `seed` (conftest.py): drawn fresh per run whatever torch's global state, shown with a failure of a test
that used it, and replayed by WORKBENCH_TEST_SEED. Checked on a stand-in test run by pytest in a subprocess."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

STAND_IN = """import torch


def test_fails_with_its_seed(seed, rng):
    torch.manual_seed(0)  # what opening a tiny model does; the run's seed owes nothing to it
    print(f"got {seed} {rng.integers(2**31)}")
    assert False
"""


def _run(folder: Path, replay: str | None) -> tuple[int, int, str]:
    """The stand-in's failure under `replay` (None: a fresh seed): the seed it got, the seed its failure reports,
    and its rng's first draw."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "WORKBENCH_TEST_SEED")}
    env |= {"WORKBENCH_TEST_SEED": replay} if replay is not None else {}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_stand_in.py"]
    out = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300).stdout
    got = re.search(r"^got (\d+) (\d+)$", out, re.M)
    reported = re.search(r"-+ seed -+\nWORKBENCH_TEST_SEED=(\d+) replays this run's inputs", out)
    assert got and reported and "1 failed" in out, out
    return int(got[1]), int(reported[1]), got[2]


def test_seed_is_fresh_per_run_reported_on_failure_and_replayed(tmp_path, seed):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_stand_in.py").write_text(STAND_IN)
    fresh, reported, draw = _run(tmp_path, None)
    assert fresh == reported != seed  # this run's own seed is another draw (equal with probability 2^-31)
    assert _run(tmp_path, str(fresh)) == (fresh, fresh, draw)
