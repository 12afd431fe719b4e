import os

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # diffusers imports torchao when installed
os.environ.setdefault("TQDM_DISABLE", "1")

import secrets  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sessions():
    """One resident session per tiny model, shared by the tests that only read from them."""
    from workbench import Session

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = Session.open(name, device="cpu")
        return cache[name]

    return get


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs per test; the seed is printed (shown on failure) and WORKBENCH_TEST_SEED replays it."""
    seed = int(os.environ.get("WORKBENCH_TEST_SEED") or secrets.randbits(32))
    print(f"WORKBENCH_TEST_SEED={seed}")
    return np.random.default_rng(seed)
