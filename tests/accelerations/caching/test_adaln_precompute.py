"""adaln_precompute: the timestep path of Wan's condition embedder computed once per timestep value per
request; bitwise equal to dense, with hits (CFG's second branch) and misses counted."""

import numpy as np
import pytest
import torch

from workbench import Request
from workbench.accelerations import fingerprint

SIZE = {"frames": 9, "height": 32, "width": 32}
STEPS = 3


def _same(a, b):
    return np.array_equal(a.frames, b.frames) and torch.equal(a.latents, b.latents)


@pytest.mark.parametrize("model", ["tiny-wan", "tiny-wan22"])
def test_adaln_precompute_bitwise_equal_dense(sessions, model, seed):
    session = sessions(model)
    request = Request("a red circle moves left", seed=seed, steps=STEPS, **SIZE)
    dense = session.generate(request, progress=False)
    before = [fingerprint(d) for d in session.model.denoisers()]
    session.accelerate({"adaln_precompute": {}})
    try:
        first = session.generate(request, progress=False)
        again = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert [fingerprint(d) for d in session.model.denoisers()] == before, "uninstall did not restore the model"
    assert _same(first, dense) and _same(again, dense), f"seed {seed}"
    receipt = first.receipts["adaln_precompute"]
    # per step: the conditional branch misses on timesteps_proj, time_embedder and time_proj; CFG's
    # unconditional branch hits all three
    assert receipt["executed"] and receipt["misses"] == 3 * STEPS and receipt["hits"] == 3 * STEPS
    assert receipt["fallbacks"] == {} and first.exact
    assert again.receipts["adaln_precompute"] == receipt, "state leaked across requests"


def test_adaln_precompute_refuses_ltx2(sessions):
    with pytest.raises(RuntimeError, match="adaln_precompute: supports families"):
        sessions("tiny-ltx2").accelerate({"adaln_precompute": {}})
