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
def rng():
    """A generator seeded fresh per test; tests put `rng.initial_seed()` in every assertion message."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
