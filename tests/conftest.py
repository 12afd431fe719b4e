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


SEED = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    """Draws the run's seed (the `seed` fixture) from the OS, so it owes nothing to torch's global generator, which
    every tiny model reseeds as it opens; WORKBENCH_TEST_SEED (an integer >= 0) replays a reported one."""
    replay = os.environ.get("WORKBENCH_TEST_SEED", "")
    if replay and not replay.isdecimal():
        raise pytest.UsageError(f"WORKBENCH_TEST_SEED: {replay!r}; allowed: an integer >= 0 (a seed a run reported)")
    config.stash[SEED] = int(replay) if replay else secrets.randbits(31)


def pytest_report_header(config: pytest.Config) -> str:
    return f"WORKBENCH_TEST_SEED={config.stash[SEED]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A failed test that used the run's seed (directly, through `rng` or through another fixture) reports it in a
    "seed" section of its failure."""
    report = yield
    if report.failed and "seed" in getattr(item, "fixturenames", ()):
        report.sections.append(("seed", f"WORKBENCH_TEST_SEED={item.config.stash[SEED]} replays this run's inputs"))
    return report


@pytest.fixture(scope="session")
def seed(pytestconfig: pytest.Config) -> int:
    """The run's seed: fresh every run, one for the whole run (module-scoped fixtures take it too), in [0, 2^31)."""
    return pytestconfig.stash[SEED]


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    """Random inputs from the run's seed (`seed`), a generator of its own per test."""
    return np.random.default_rng(seed)
