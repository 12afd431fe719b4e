"""`import workbench` on a clean install writes nothing to stderr and leaves torchao unimported; the CLI's parser
(`--help`, argument errors) loads no model library."""

import os
import subprocess
import sys

import pytest

# The torchao quantizer module of each library imports torchao whenever it is installed: these are the
# modules whose import must not bring torchao in (see workbench/_quiet_imports.py).
QUANTIZERS = ("diffusers.quantizers.torchao.torchao_quantizer", "transformers.quantizers.quantizer_torchao")


def run_clean(code: str) -> subprocess.CompletedProcess:
    """`python -c code` as on a fresh install: without the test suite's TORCHAO_FORCE_SKIP_LOADING_SO_FILES."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHAO_FORCE_SKIP_LOADING_SO_FILES"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_import_workbench_writes_nothing_to_stderr_skips_torchao_and_its_availability_checks_tell_the_truth():
    """One clean interpreter: `import workbench` and the CLI load neither diffusers nor transformers; importing the
    widgets and a model family (which do) leaves torchao out and says nothing; then the deferred checks of both
    libraries still see the installed torchao (asked after the first check, so they cannot hide an import)."""
    pytest.importorskip("torchao", reason="the noise this guards against comes from an installed torchao")
    code = (
        "import sys, workbench, workbench.cli\n"
        "print(sorted(m for m in ('diffusers', 'transformers') if m in sys.modules))\n"
        "import workbench.widgets, workbench.models.wan\n"
        f"print(sorted(m for m in {QUANTIZERS!r} if m in sys.modules))\n"
        "print('torchao' in sys.modules)\n"
        "from diffusers.utils import is_torchao_available as d\n"
        "import transformers.quantizers.quantizer_torchao as q\n"
        "from transformers.utils import is_torchao_available as t\n"
        "print(d(), t(), q.is_torchao_available is t)\n"
    )
    done = run_clean(code)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    light, loaded, torchao, checks = done.stdout.splitlines()
    assert light == "[]"
    assert loaded == str(sorted(QUANTIZERS))  # the quantizer registries did load (the deferral ran, not a skip)
    assert torchao == "False"
    assert checks.split() == ["True", "True", "True"]


@pytest.mark.parametrize("module", ["workbench.models.fused.wan", "workbench.profiles"])
def test_a_module_imports_first_in_a_fresh_interpreter(module):
    """`import workbench` loads nothing, so a module imported first meets its package's import cycles on its own
    (these two met one: the accelerations package loads the model families)."""
    done = run_clean(f"import {module}")
    assert done.returncode == 0, done.stderr
