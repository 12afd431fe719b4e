"""mag_cache (diffusers MagCache): calibration is dense and records ratios, skipping is counted, exact restore."""

import numpy as np
import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import REGISTRY, fingerprint
from workbench.accelerations.install import check_options

SIZE = {"frames": 9, "height": 32, "width": 32}
STEPS = 6


@pytest.fixture(scope="module", params=["tiny-wan", "tiny-wan22"])
def session_and_dense(request, seed):
    session = Session.open(request.param, device="cpu")
    dense = session.generate(Request("a red circle moves left", seed=seed, steps=STEPS, **SIZE), progress=False)
    return session, dense, seed


def _run(session, seed, options, steps=STEPS):
    before = [fingerprint(d) for d in session.model.denoisers()]
    session.accelerate({"mag_cache": options})
    try:
        return session.generate(Request("a red circle moves left", seed=seed, steps=steps, **SIZE), progress=False)
    finally:
        session.accelerate({})
        assert [fingerprint(d) for d in session.model.denoisers()] == before, "uninstall did not restore the model"


def _same(a, b):
    return np.array_equal(a.frames, b.frames) and torch.equal(a.latents, b.latents)


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, r"mag_cache.mag_ratios: required unless calibrate=True"),
        ({"mag_ratios": [1.0, -1.0]}, r"mag_cache.mag_ratios: expected a non-empty list of positive numbers"),
        ({"mag_ratios": "1,1"}, r"mag_cache.mag_ratios: expected list/NoneType, got str"),
        ({"mag_ratios": [1.0, "x"]}, r"mag_cache.mag_ratios\[1\]: expected float, got str 'x'"),
        ({"mag_ratios": [1.0, float("inf")]}, r"mag_cache.mag_ratios\[1\]: inf is not allowed"),
        ({"mag_ratios": [True]}, r"mag_cache.mag_ratios\[0\]: expected float, got bool"),
        ({"calibrate": True, "threshold": -1.0}, r"mag_cache.threshold: -1.0 is below the minimum"),
        ({"calibrate": True, "retention_ratio": 2.0}, r"mag_cache.retention_ratio: 2.0 is above the maximum"),
    ],
)
def test_mag_cache_bad_option_raises_before_any_model_loads(options, message):
    with pytest.raises(ValueError, match=message):
        check_options(REGISTRY, {"mag_cache": options})  # what Session.open and the CLI run before loading


def test_plugin_options_checked_together_and_item_by_item_before_any_model_loads():
    chosen = check_options(REGISTRY, {"mag_cache": {"mag_ratios": [np.float32(1.5), 2]}})
    assert chosen[0][1]["mag_ratios"] == [1.5, 2.0]  # numpy scalars and ints taken as the floats they are
    bad = {
        "selective_fp8": ({"include": [1]}, r"selective_fp8.include\[0\]: expected str, got int"),
        "pyramid_attention_broadcast": (
            {"timestep_low": 900, "timestep_high": 100},
            r"pyramid_attention_broadcast.timestep_low: 900 is not below timestep_high 100",
        ),
    }
    for name, (options, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            check_options(REGISTRY, {name: options})


def test_mag_cache_ratio_count_must_match_steps():
    session = Session.open("tiny-wan", device="cpu")
    before = fingerprint(session.model.pipeline.transformer)
    session.accelerate({"mag_cache": {"mag_ratios": [1.0] * 5}})
    try:
        with pytest.raises(ValueError, match=r"mag_cache.mag_ratios: 5 ratios given but the request has 4 steps"):
            session.generate(Request("p", steps=4, **SIZE), progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(session.model.pipeline.transformer) == before


def test_mag_cache_refuses_ltx2():
    session = Session.open("tiny-ltx2", device="cpu")
    with pytest.raises(
        RuntimeError, match=r"mag_cache: diffusers does not support block class LTX2VideoTransformerBlock"
    ):
        session.accelerate({"mag_cache": {"calibrate": True}})


def test_mag_cache_calibration_equals_dense_and_records_ratios(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"calibrate": True})
    assert _same(result, dense), f"seed {seed}"
    receipt = result.receipts["mag_cache"]
    assert receipt["executed"] is False and receipt["blocks_skipped"] == 0 and result.exact
    ratios = receipt["notes"]["mag_ratios"]
    assert ratios and all(r[0] == 1.0 and all(x > 0 for x in r) for r in ratios.values())
    if len(session.model.denoisers()) == 1:
        assert {len(r) for r in ratios.values()} == {STEPS}


def test_mag_cache_skips_with_ratios_and_zero_skip_budget_is_dense(session_and_dense):
    session, dense, seed = session_and_dense
    ratios = [1.0] * STEPS
    result = _run(session, seed, {"mag_ratios": ratios, "threshold": 10.0, "retention_ratio": 0.2})
    receipt = result.receipts["mag_cache"]
    assert receipt["executed"] and receipt["blocks_skipped"] > 0 and receipt["blocks_executed"] > 0
    assert result.exact is False and not torch.equal(result.latents, dense.latents), f"seed {seed}"
    still = _run(session, seed, {"mag_ratios": ratios, "threshold": 10.0, "max_skip_steps": 0})
    assert still.receipts["mag_cache"]["blocks_skipped"] == 0 and _same(still, dense) and still.exact
