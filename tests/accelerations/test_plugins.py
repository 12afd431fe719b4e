"""Each plugin against stock diffusers on tiny families: contracts, receipts, exact uninstall."""

import numpy as np
import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import fingerprint

STEPS = 4
SIZE = {"frames": 9, "height": 32, "width": 32}


@pytest.fixture(scope="module", params=["tiny-wan", "tiny-wan22", "tiny-ltx2"])
def session_and_dense(request, seed):
    session = Session.open(request.param, device="cpu")
    dense = session.generate(Request("a red circle moves left", seed=seed, steps=STEPS, **SIZE), progress=False)
    return session, dense, seed


def _run(session, seed, config, steps=STEPS):
    before = [fingerprint(d) for d in session.model.denoisers()]
    session.accelerate(config)
    try:
        return session.generate(Request("a red circle moves left", seed=seed, steps=steps, **SIZE), progress=False)
    finally:
        session.accelerate({})
        after = [fingerprint(d) for d in session.model.denoisers()]
        assert after == before, "uninstall did not restore the model exactly"


def _same(a, b):
    same = np.array_equal(a.frames, b.frames) and torch.equal(a.latents, b.latents)
    return same and (a.audio is None or np.array_equal(a.audio, b.audio))


def test_cross_kv_cache_bitwise_equal_dense(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"cross_kv_cache": {}})
    assert _same(result, dense), f"seed {seed}"
    receipt = result.receipts["cross_kv_cache"]
    assert receipt["executed"] and receipt["hits"] > 0 and receipt["misses"] > 0
    assert result.exact


def test_easycache_threshold_zero_equals_dense(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"easycache": {"threshold": 0.0}})
    assert _same(result, dense), f"seed {seed}"
    assert result.receipts["easycache"]["executed"] is False and result.exact


def test_easycache_reuses_and_marks_result_inexact(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"easycache": {"threshold": 10.0, "warmup": 2, "final_dense": 1}}, steps=8)
    receipt = result.receipts["easycache"]
    assert receipt["executed"] and receipt["reused"] > 0
    sequences = receipt["notes"]["decisions"]
    for decisions in sequences.values():
        # warm-up and the final step always computed, per branch (Wan2.2: per expert and branch)
        assert decisions.startswith("CC") and decisions.endswith("C")
    assert all("R" in sequences[key] for key in sequences if not key.startswith("transformer/")), sequences
    assert result.exact is False
    assert not torch.equal(result.latents, dense.latents)


def test_easycache_state_does_not_leak_across_requests(session_and_dense):
    session, _, seed = session_and_dense
    session.accelerate({"easycache": {"threshold": 0.3}})
    try:
        first = session.generate(Request("a red circle moves left", seed=seed, steps=STEPS, **SIZE), progress=False)
        session.generate(Request("something else entirely", seed=seed + 1, steps=STEPS, **SIZE), progress=False)
        again = session.generate(Request("a red circle moves left", seed=seed, steps=STEPS, **SIZE), progress=False)
    finally:
        session.accelerate({})
    assert _same(first, again)
    assert first.receipts["easycache"] == again.receipts["easycache"]


def test_attention_backend_reduction_close_and_counted(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"attention_backend": {"backend": "_native_math"}})
    receipt = result.receipts["attention_backend"]
    assert receipt["executed"] and receipt["attention_calls"] > 0
    rel = (result.latents - dense.latents).norm() / dense.latents.norm()
    assert rel < 1e-4, f"seed {seed}: rel-L2 {rel}"


def test_fused_qkv_reduction_close_and_counted(session_and_dense):
    session, dense, seed = session_and_dense
    if session.family.name != "wan":
        with pytest.raises(RuntimeError, match="fused_qkv: supports families"):
            session.accelerate({"fused_qkv": {}})
        return
    result = _run(session, seed, {"fused_qkv": {}})
    assert result.receipts["fused_qkv"]["fused_projection_calls"] > 0
    rel = (result.latents - dense.latents).norm() / dense.latents.norm()
    assert rel < 1e-4, f"seed {seed}: rel-L2 {rel}"


def test_pyramid_attention_broadcast_skips_attention(session_and_dense):
    session, _, seed = session_and_dense
    options = {"skip_range": 2, "timestep_low": 0, "timestep_high": 1000}
    result = _run(session, seed, {"pyramid_attention_broadcast": options})
    receipt = result.receipts["pyramid_attention_broadcast"]
    assert receipt["attention_skipped"] > 0 and receipt["executed"] and result.exact is False


def test_first_block_cache_runs_on_wan_and_refuses_ltx2(session_and_dense):
    session, _, seed = session_and_dense
    if session.family.name == "ltx2":
        with pytest.raises(RuntimeError, match="does not support block class LTX2VideoTransformerBlock"):
            session.accelerate({"first_block_cache": {}})
        return
    result = _run(session, seed, {"first_block_cache": {"threshold": 10.0}})
    receipt = result.receipts["first_block_cache"]
    assert receipt["blocks_skipped"] > 0 and receipt["blocks_executed"] > 0 and result.exact is False


@pytest.mark.parametrize("session_and_dense", ["tiny-wan", "tiny-wan22"], indirect=True)  # refused on LTX-2 (above)
def test_first_block_cache_threshold_zero_equals_dense(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"first_block_cache": {"threshold": 0.0}})
    assert result.receipts["first_block_cache"]["blocks_skipped"] == 0
    assert _same(result, dense) and result.exact


def test_taylorseer_forecasts_attention_and_feed_forward(session_and_dense):
    session, dense, seed = session_and_dense
    options = {"cache_interval": 2, "disable_cache_before_step": 1, "max_order": 1}
    result = _run(session, seed, {"taylorseer": options}, steps=6)
    receipt = result.receipts["taylorseer"]
    assert receipt["attention_skipped"] > 0 and receipt["blocks_skipped"] > 0, receipt
    assert receipt["executed"] and result.exact is False
    assert receipt["blocks_executed"] > 0


def test_taylorseer_never_forecasting_equals_dense(session_and_dense):
    session, dense, seed = session_and_dense
    result = _run(session, seed, {"taylorseer": {"disable_cache_before_step": STEPS + 1}})
    assert result.receipts["taylorseer"]["blocks_skipped"] == 0 and not result.receipts["taylorseer"]["executed"]
    assert _same(result, dense) and result.exact
