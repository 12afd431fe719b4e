"""Regional compilation on CPU: close to dense, counted, and uninstalled exactly."""

import time

import pytest

from workbench import Request, Session
from workbench.accelerations import fingerprint

SIZE = {"frames": 9, "height": 32, "width": 32, "steps": 2}


def test_bad_mode_is_value_error():
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(ValueError, match=r"regional_compile.mode: 'fast' is not allowed"):
        session.accelerate({"regional_compile": {"mode": "fast"}})
    with pytest.raises(ValueError, match=r"regional_compile.fullgraph: expected bool"):
        session.accelerate({"regional_compile": {"fullgraph": 1}})


def test_regional_compile_close_to_dense_and_restores_model(seed):
    session = Session.open("tiny-wan", device="cpu")
    denoisers = session.model.denoisers()
    before = [fingerprint(d) for d in denoisers]
    request = Request("a red circle moves left", seed=seed, **SIZE)
    dense = session.generate(request, progress=False)
    session.accelerate({"regional_compile": {}})
    try:
        assert any(getattr(m, "_compiled_call_impl", None) is not None for m in denoisers[0].modules())
        start = time.perf_counter()
        first = session.generate(request, progress=False)
        compile_seconds = time.perf_counter() - start
        second = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert [fingerprint(d) for d in denoisers] == before, "uninstall did not restore the model exactly"
    receipt = first.receipts["regional_compile"]
    assert receipt["executed"] and receipt["compiled_calls"] > 0 and receipt["compiled_blocks"] > 0
    assert receipt["graphs_compiled"] > 0 and receipt["notes"]["includes_compile"] is True
    again = second.receipts["regional_compile"]
    assert again["compiled_calls"] == receipt["compiled_calls"] and again["notes"]["includes_compile"] is False
    for result in (first, second):
        rel = (result.latents - dense.latents).norm() / dense.latents.norm()
        assert rel < 1e-5, f"rel-L2 {rel} (first request with compile took {compile_seconds:.1f} s)"
