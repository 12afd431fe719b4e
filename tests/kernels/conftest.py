"""Kernel tests run on CPU tensors under the Triton interpreter.

The kernels are decorated lazily at first launch (workbench.kernels._runtime.LazyKernel), so setting
TRITON_INTERPRET here, per test, is enough even when another test imported the kernel modules first.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def rng(seed: int) -> torch.Generator:
    """A generator of its own per test on the run's seed (tests/conftest.py's `seed`: fresh per run, replayed by
    WORKBENCH_TEST_SEED); tests put `rng.initial_seed()` in every assertion message."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def fp8_p_equal():
    """Checks a kernel whose P.V runs on one-byte P (e4m3 or int8) against its reference, which rounds the same
    values the same way: per (head, query) row, relative error below 1e-5 (fp32 summation order), except at most two
    rows. A P within one exp2 ulp of a rounding boundary (the interpreter's exp2 and torch's differ in the last bit)
    rounds to the neighbouring value in one of them and moves its row by up to one step of that P (an e4m3 step is
    12.5 %); it is rare (about one test in ten at these sizes has one) and no other row moves."""

    def check(got: torch.Tensor, want: torch.Tensor, message: str) -> None:
        got, want = got.float().flatten(0, -2), want.float().flatten(0, -2)
        rows = (got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)
        off = rows > 1e-5
        assert int(off.sum()) <= 2 and float(rows.max()) < 0.2, f"{message}: {int(off.sum())} rows off, {rows.max()}"

    return check
