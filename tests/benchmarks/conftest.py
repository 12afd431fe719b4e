import os

import pytest


@pytest.fixture(autouse=True)
def triton_interpret_restored():
    """A smoke run sets TRITON_INTERPRET=1 in this process's environment (benchmarks.__main__.run_scenario, as the
    CLI's own process needs); put back what was there, so the tests after these do not run under the interpreter
    by accident (Triton plugins would then install on CPU: the exact-fast profile, calibrate's CLI)."""
    before = os.environ.get("TRITON_INTERPRET")
    yield
    if before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = before
