import os
import secrets

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs per test; the seed is printed (shown on failure) and WORKBENCH_TEST_SEED replays it."""
    seed = int(os.environ.get("WORKBENCH_TEST_SEED") or secrets.randbits(32))
    print(f"WORKBENCH_TEST_SEED={seed}")
    return np.random.default_rng(seed)
