"""Which accelerations run on MiniMax-H3's blocks, against stock, on the tiny model."""

import numpy as np
import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import fingerprint


@pytest.fixture(scope="module")
def h3(seed):
    session = Session.open("tiny-h3", device="cpu")
    request = Request("a red circle moves left, low hum", seed=seed, steps=8)
    return session, request, session.generate(request, progress=False)


def _run(session, request, config):
    before = fingerprint(session.model.pipeline.transformer)
    session.accelerate(config)
    try:
        return session.generate(request, progress=False)
    finally:
        session.accelerate({})
        assert fingerprint(session.model.pipeline.transformer) == before


def _same(a, b):
    return np.array_equal(a.frames, b.frames) and np.array_equal(a.audio, b.audio) and torch.equal(a.latents, b.latents)


def test_easycache_threshold_zero_equals_dense_on_h3(h3):
    session, request, dense = h3
    result = _run(session, request, {"easycache": {"threshold": 0.0}})
    assert _same(result, dense), f"seed {request.seed}"


def test_easycache_reuses_on_h3_and_keeps_the_last_call_dense(h3):
    session, request, dense = h3
    result = _run(session, request, {"easycache": {"threshold": 10.0}})
    decisions = result.receipts["easycache"]["notes"]["decisions"]["cond"]
    assert len(decisions) == 7 and decisions.startswith("CC") and decisions.endswith("C") and "R" in decisions
    assert result.exact is False


def test_first_block_cache_on_h3_blocks(h3):
    session, request, dense = h3
    assert _same(_run(session, request, {"first_block_cache": {"threshold": 0.0}}), dense)
    result = _run(session, request, {"first_block_cache": {"threshold": 10.0}})
    assert result.receipts["first_block_cache"]["blocks_skipped"] > 0 and result.exact is False


def test_attention_backend_on_h3_counts_calls(h3):
    session, request, dense = h3
    result = _run(session, request, {"attention_backend": {"backend": "_native_math"}})
    assert result.receipts["attention_backend"]["attention_calls"] > 0
    assert (result.latents - dense.latents).norm() / dense.latents.norm() < 1e-4


def test_pab_refused_on_h3_with_reason(h3):
    session, _, _ = h3
    with pytest.raises(RuntimeError, match="exposes no current_timestep"):
        session.accelerate({"pyramid_attention_broadcast": {}})
