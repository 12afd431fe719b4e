"""TeaCache on tiny families (Wan, Wan2.2, LTX-2, MiniMax-H3): threshold 0 is dense bit for bit, reuse is
counted per branch, exact uninstall."""

import numpy as np
import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import fingerprint
from workbench.accelerations.caching.teacache import _Installed
from workbench.models.wan import FAMILY as WAN

SIZE = {"frames": 9, "height": 32, "width": 32}
SIZES = {"tiny-h3": {}}  # H3 takes 124+ frames at its own tiny canvas (the model's defaults)
PROMPT = "a red circle moves left"


@pytest.fixture(scope="module", params=["tiny-wan", "tiny-wan22", "tiny-ltx2", "tiny-h3"])
def session(request):
    return Session.open(request.param, device="cpu")


def _generate(session, seed, steps):
    size = SIZES.get(session.model.name, SIZE)
    return session.generate(Request(PROMPT, seed=seed, steps=steps, **size), progress=False)


def _run(session, seed, options, steps):
    before = [fingerprint(d) for d in session.model.denoisers()]
    session.accelerate({"teacache": options})
    try:
        return _generate(session, seed, steps)
    finally:
        session.accelerate({})
        assert [fingerprint(d) for d in session.model.denoisers()] == before, "uninstall did not restore the model"


def _same(a, b):
    same = np.array_equal(a.frames, b.frames) and torch.equal(a.latents, b.latents)
    return same and (a.audio is None or np.array_equal(a.audio, b.audio))


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, r"teacache.rel_l1_thresh: required"),
        ({"rel_l1_thresh": -0.1}, r"teacache.rel_l1_thresh: -0.1 is below the minimum"),
        ({"rel_l1_thresh": 0.1, "warmup": 0.5}, r"teacache.warmup: expected int"),
        ({"rel_l1_thresh": 0.1, "rescale": "flux"}, r"teacache.rescale: 'flux' is not allowed"),
    ],
)
def test_teacache_bad_option_raises(options, message):
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(ValueError, match=message):
        session.accelerate({"teacache": options})


def test_teacache_bitwise_equal_dense_at_threshold_zero(session, seed):
    dense = _generate(session, seed, 4)
    result = _run(session, seed, {"rel_l1_thresh": 0.0, "warmup": 0, "final_dense": 0}, 4)
    assert _same(result, dense), f"seed {seed}"
    receipt = result.receipts["teacache"]
    assert receipt["executed"] is False and receipt.get("reused", 0) == 0 and receipt["computed"] > 0
    assert result.exact


def test_teacache_reuses_per_branch_and_marks_inexact(session, seed):
    dense = _generate(session, seed, 6)
    result = _run(session, seed, {"rel_l1_thresh": 1e6, "warmup": 2, "final_dense": 1}, 6)
    receipt = result.receipts["teacache"]
    assert receipt["executed"] and receipt["reused"] > 0, f"seed {seed}: {receipt}"
    sequences = receipt["notes"]["decisions"]
    for branch, decisions in sequences.items():
        # warm-up and the final step always computed, per branch (Wan2.2: per expert and branch)
        assert decisions.startswith("CC") and decisions.endswith("C"), (branch, decisions)
    assert all("R" in sequences[key] for key in sequences if not key.startswith("transformer/")), sequences
    assert result.exact is False
    assert not torch.equal(result.latents, dense.latents), f"seed {seed}"


def test_teacache_on_h3_counts_its_single_branch_calls(sessions, seed):
    # guidance-distilled: one branch, N - 1 transformer calls for N steps
    result = _run(sessions("tiny-h3"), seed, {"rel_l1_thresh": 1e6, "warmup": 1, "final_dense": 1}, 6)
    receipt = result.receipts["teacache"]
    assert receipt["notes"]["decisions"] == {"cond": "CRRRC"}, f"seed {seed}: {receipt}"
    assert receipt["computed"] == 2 and receipt["reused"] == 3


@pytest.mark.parametrize("model", ["tiny-ltx2", "tiny-h3"])
def test_teacache_refuses_another_familys_rescale(sessions, model):
    with pytest.raises(ValueError, match=r"teacache.rescale: 'wan2.1-t2v-1.3b' was fitted on wan, not (ltx2|h3)"):
        sessions(model).accelerate({"teacache": {"rel_l1_thresh": 0.1, "rescale": "wan2.1-t2v-1.3b"}})


def test_teacache_state_does_not_leak_across_requests(seed):
    session = Session.open("tiny-wan", device="cpu")
    session.accelerate({"teacache": {"rel_l1_thresh": 0.2}})
    try:
        first = _generate(session, seed, 5)
        session.generate(Request("something else", seed=seed + 1, steps=5, **SIZE), progress=False)
        again = _generate(session, seed, 5)
    finally:
        session.accelerate({})
    assert _same(first, again), f"seed {seed}"
    assert first.receipts["teacache"] == again.receipts["teacache"]


def test_teacache_rescale_polynomial_highest_power_first_and_clamped():
    handle = _Installed.__new__(_Installed)
    coefficients = WAN.teacache.coefficients["wan2.1-t2v-1.3b"]
    handle.coefficients = coefficients
    x = 0.05
    expected = sum(c * x ** (len(coefficients) - 1 - i) for i, c in enumerate(coefficients))
    assert handle.rescale(x) == pytest.approx(expected)
    assert handle.rescale(0.0) == 0.0  # the published polynomial is negative at 0; clamped
    handle.coefficients = None
    assert handle.rescale(0.3) == 0.3
