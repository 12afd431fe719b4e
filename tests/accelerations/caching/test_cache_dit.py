"""cache_dit (DBCache): threshold 0 is dense bit for bit, caching is counted, exact restore, refusals."""

import numpy as np
import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import fingerprint

pytest.importorskip("cache_dit", reason="cache_dit needs the cache-dit extra")

SIZE = {"frames": 9, "height": 32, "width": 32}
STEPS = 6


@pytest.fixture(scope="module", params=["tiny-wan", "tiny-wan22"])
def session_and_dense(request, seed):
    session = Session.open(request.param, device="cpu")
    dense = session.generate(Request("a red circle moves left", seed=seed, steps=STEPS, **SIZE), progress=False)
    return session, dense, seed


def _run(session, seed, options, steps=STEPS):
    pipeline_call = type(session.model.pipeline).__call__
    before = [fingerprint(d) for d in session.model.denoisers()]
    session.accelerate({"cache_dit": options})
    try:
        return session.generate(Request("a red circle moves left", seed=seed, steps=steps, **SIZE), progress=False)
    finally:
        session.accelerate({})
        assert [fingerprint(d) for d in session.model.denoisers()] == before, "uninstall did not restore the model"
        assert type(session.model.pipeline).__call__ is pipeline_call


def _same(a, b):
    return np.array_equal(a.frames, b.frames) and torch.equal(a.latents, b.latents)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"Fn_compute_blocks": 0}, r"cache_dit.Fn_compute_blocks: 0 is below the minimum"),
        ({"Fn_compute_blocks": 2, "Bn_compute_blocks": 1}, r"cache_dit.Fn_compute_blocks: .* exceeds the 2 blocks"),
        ({"residual_diff_threshold": "low"}, r"cache_dit.residual_diff_threshold: expected float"),
    ],
)
def test_cache_dit_bad_option_raises(options, message):
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(ValueError, match=message):
        session.accelerate({"cache_dit": options})


def test_cache_dit_too_many_warmup_steps_for_request_raises():
    session = Session.open("tiny-wan", device="cpu")
    session.accelerate({"cache_dit": {"max_warmup_steps": 4}})
    try:
        with pytest.raises(ValueError, match=r"cache_dit.max_warmup_steps: 4 warm-up steps .* 3-step request"):
            session.generate(Request("p", steps=3, **SIZE), progress=False)
    finally:
        session.accelerate({})


def test_cache_dit_refuses_ltx2_and_missing_package(monkeypatch):
    session = Session.open("tiny-ltx2", device="cpu")
    with pytest.raises(RuntimeError, match=r"cache_dit: supports families \('wan',\), not 'ltx2'"):
        session.accelerate({"cache_dit": {}})
    monkeypatch.setitem(__import__("sys").modules, "cache_dit", None)
    wan = Session.open("tiny-wan", device="cpu")
    with pytest.raises(RuntimeError, match=r"vflash-workbench\[cache-dit\]"):
        wan.accelerate({"cache_dit": {}})


def test_cache_dit_threshold_zero_equals_dense(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"residual_diff_threshold": 0.0})
    receipt = result.receipts["cache_dit"]
    assert receipt["executed"] is False and receipt["cached_steps"] == 0 and receipt["executed_steps"] > 0
    assert _same(result, dense) and result.exact, f"seed {seed}"


def test_cache_dit_caches_and_marks_inexact(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"residual_diff_threshold": 10.0})
    receipt = result.receipts["cache_dit"]
    assert receipt["executed"] and receipt["cached_steps"] > 0, receipt
    assert result.exact is False and not torch.equal(result.latents, dense.latents), f"seed {seed}"
    # a request with another step count re-enables the cache with that count, and restores on uninstall
    again = _run(session, seed, {"residual_diff_threshold": 10.0}, steps=4)
    assert again.receipts["cache_dit"]["cached_steps"] > 0
