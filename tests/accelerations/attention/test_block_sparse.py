"""block_sparse (contract: approximate) on a tiny Wan of head dim 128 under the Triton CPU interpreter (and once on
the torch reference path a CPU takes without it).

`wan.tiny_d128` has one head of 128 (the production head dim, which the kernel takes as it is) instead of tiny-wan's
two of 16 (zero-padded to 32; one test runs them). 128x192
frames give 8x12 tokens per latent frame; 9 frames give 3 latent frames: 288 tokens, 5 blocks of 64.
"""

import math

import pytest
import torch
from diffusers.models.attention_dispatch import _AttentionBackendRegistry

from benchmarks.workloads import captured_qkv
from workbench import Request, Session
from workbench.accelerations import REGISTRY, fingerprint
from workbench.accelerations.attention import block_sparse
from workbench.accelerations.attention.sparse_routing import Call, Router, Settings
from workbench.accelerations.base import Receipt
from workbench.kernels.block_sparse_attention import block_sparse_attention, reference
from workbench.models import wan

SIZE = {"frames": 9, "height": 128, "width": 192, "steps": 2, "guidance": 1.0}  # guidance 1: no CFG pass


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def session():
    return Session(wan.tiny_d128(), torch.device("cpu"), torch.float32, 0.0)


def _run(session, config, seed: int):
    session.accelerate(config)
    try:
        result = session.generate(Request("a red circle moves left", seed=seed, **SIZE), progress=False)
        report = session._handles[0].report() if config else None
    finally:
        session.accelerate({})
    return result, report


def test_block_sparse_all_exact_close_to_dense_and_uninstall_restores(interpreter, session, seed):
    before = [fingerprint(d) for d in session.model.denoisers()]
    dense, _ = _run(session, {}, seed)
    sparse, report = _run(session, {"block_sparse": {"tau": -1e9}}, seed)
    assert [fingerprint(d) for d in session.model.denoisers()] == before, "uninstall did not restore the model"
    assert report["sparse_calls"] == 4 and report["notes"]["mean_density"] == 1.0, report
    assert report["notes"]["prefix_rows"] == 0 and report.get("protected_rows", 0) == 0, report  # Wan: video only
    assert not sparse.exact and dense.exact
    err = (sparse.latents.float() - dense.latents.float()).abs().max().item()
    assert err < 1e-5, f"all-exact block_sparse differs from dense by {err}"  # fp32 rounding only


def test_block_sparse_large_tau_is_sparse(interpreter, session, seed):
    _, report = _run(session, {"block_sparse": {"tau": 1e9, "protect_prefix": 10}}, seed)
    assert report["executed"] and report["sparse_calls"] == 4 and report.get("dense_calls", 0) == 0, report
    assert report["notes"]["mean_density"] < 1.0, report
    assert report["protected_rows"] == 4 * 10, report


def test_block_sparse_dense_steps_and_blocks_count_dense(interpreter, session, seed):
    _, report = _run(session, {"block_sparse": {"tau": 1.0, "dense_steps": 1, "dense_blocks": 1}}, seed)
    # 2 steps x 2 blocks: step 0 dense (2 calls), step 1 block 0 dense, step 1 block 1 sparse
    assert report["sparse_calls"] == 1 and report["dense_calls"] == 3, report
    assert report["dense_step_calls"] == 2 and report["dense_block_calls"] == 1, report


def test_block_sparse_pads_small_heads_and_refuses_wider_than_the_kernel(interpreter, session, monkeypatch, seed):
    """tiny-wan's heads of 16 run zero-padded to the kernel's 32: every block exact equals the dense output up to
    fp32 rounding. A head wider than the kernels take is refused at install, naming the block; nothing installed."""
    tiny = Session.open("tiny-wan", device="cpu")
    dense, _ = _run(tiny, {}, seed)
    sparse, report = _run(tiny, {"block_sparse": {"tau": -1e9}}, seed)
    assert report["sparse_calls"] == 4 and report["notes"]["mean_density"] == 1.0, report
    err = (sparse.latents.float() - dense.latents.float()).abs().max().item()
    assert err < 1e-5, f"padded all-exact block_sparse differs from dense by {err}"
    monkeypatch.setattr(block_sparse, "MAX_HEAD_DIM", 64)
    with pytest.raises(RuntimeError, match="block_sparse: the kernel supports head dims up to 64; block 0 has 128"):
        session.accelerate({"block_sparse": {}})
    assert session.accelerations == {}


def test_block_sparse_cpu_without_interpreter_takes_the_reference_as_the_kernel_would(monkeypatch, session, seed):
    """On a CPU outside the interpreter the calls take the kernel's torch reference: the same sparse request (some
    blocks folded) as the kernel under the interpreter, up to fp32 rounding, with the same density; each receipt
    names its path."""
    config = {"block_sparse": {"tau": 1.0}}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel, kernel_report = _run(session, config, seed)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch_ref, ref_report = _run(session, config, seed)
    assert (kernel_report["notes"]["path"], ref_report["notes"]["path"]) == ("triton kernel", "torch reference")
    assert ref_report["sparse_calls"] == 4 and ref_report["notes"]["mean_density"] < 1.0, ref_report
    assert ref_report["notes"]["mean_density"] == pytest.approx(kernel_report["notes"]["mean_density"], abs=1e-6)
    assert not torch_ref.exact
    err = (torch_ref.latents.float() - kernel.latents.float()).abs().max().item()
    assert err < 1e-5, f"the reference path differs from the kernel by {err}"


def test_block_sparse_bad_option_raises(session):
    with pytest.raises(ValueError, match="block_sparse.sink_tokens"):
        session.accelerate({"block_sparse": {"sink_tokens": -1}})
    with pytest.raises(ValueError, match="block_sparse.dense_steps"):
        session.accelerate({"block_sparse": {"dense_steps": 1.5}})
    with pytest.raises(ValueError, match="both modify attention_processor.routed"):  # one router per model
        session.accelerate({"block_sparse": {}, "fp8_attention": {}})
    assert REGISTRY["block_sparse"].contract == "approximate"


def test_block_sparse_uninstall_restores_processors_and_dispatcher(interpreter, session):
    modules = [block.attn1 for block in session.model.pipeline.transformer.blocks]
    processors = [m.processor for m in modules]
    backends = dict(_AttentionBackendRegistry._backends)
    session.accelerate({"block_sparse": {}})
    assert all(type(m.processor).__name__ == "_Routed" for m in modules)
    assert _AttentionBackendRegistry._backends != backends  # the resolved backend is served by the shim
    session.accelerate({})
    assert [m.processor for m in modules] == processors
    assert _AttentionBackendRegistry._backends == backends


def test_block_sparse_protected_rows_are_dense_attention(interpreter, seed):
    """Router.run: rows [0, protect) are the backend's dense attention, the rest the kernel's output."""
    torch.manual_seed(seed)
    q, k, v = (torch.randn(1, 200, 2, 128) for _ in range(3))  # dispatcher layout (B, T, H, D)
    backend = _AttentionBackendRegistry._backends[_AttentionBackendRegistry._active_backend]
    receipt = Receipt(("sparse_calls",))
    model = wan.tiny_d128()
    from workbench.accelerations.attention.sparse_kernels import block_sparse_attend as attend

    router = Router("block_sparse", model, receipt, attend, None)
    call = Call(router, Settings(tau=1e9, sink_tokens=0, protect_prefix=70), 0, prefix=0)
    call.kwargs, call.backend_fn = {"query": q, "key": k, "value": v, "attn_mask": None, "scale": None}, backend
    out = router.run(call)
    dense = torch.softmax(q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2) / math.sqrt(128), -1)
    dense = (dense @ v.transpose(1, 2)).transpose(1, 2)
    sparse = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 1e9, 0).transpose(1, 2)
    assert (out[:, :70] - dense[:, :70]).abs().max() < 1e-5
    assert (out[:, 70:] - sparse[:, 70:]).abs().max() < 1e-4
    assert (out[:, 70:] - dense[:, 70:]).abs().max() > 1e-3  # the unprotected rows really are sparse
    assert receipt.counters["protected_rows"] == 70 and receipt.counters["sparse_calls"] == 1


@pytest.mark.parametrize(
    "extra, problems",
    [({"attn_mask": torch.ones(1, 1, 8, 8, dtype=torch.bool)}, "an attention mask"),
     ({"is_causal": True, "dropout_p": 0.1}, "dropout_p=0.1, is_causal=True"),
     ({"_parallel_config": object(), "key": torch.zeros(1, 4, 2, 128)},
      r"a context-parallel config, q \(1, 8, 2, 128\) / k \(1, 4, 2, 128\) / v \(1, 8, 2, 128\)")],
)  # fmt: skip
def test_block_sparse_routed_call_it_does_not_take_raises(extra, problems):
    """Router.run refuses a routed call the kernel does not take, naming every reason, before any kernel runs."""
    q = torch.zeros(1, 8, 2, 128)  # dispatcher layout (B, T, H, D)
    router = Router("block_sparse", wan.tiny_d128(), Receipt(("sparse_calls",)), None, None)
    call = Call(router, Settings(tau=0.0, sink_tokens=0), 0, prefix=0)
    call.kwargs = {"query": q, "key": q, "value": q, "attn_mask": None, "scale": None, **extra}
    with pytest.raises(
        RuntimeError, match=rf"^block_sparse: routed self-attention has {problems}; the kernel runs none$"
    ):
        router.run(call)


def test_block_sparse_quality_on_captured_qkv(interpreter, session):
    """Relative L2 vs dense on q/k/v captured from the model's own attn1 (not random tensors), at a few tau.

    Random weights make these activations "real-looking" only in shape and statistics; the asserts are the
    properties that must hold (all exact is dense, density falls with tau, folded blocks move the output)."""
    records = captured_qkv(session, Request("a red circle moves left", seed=5, **SIZE))
    assert [(r["step"], r["block"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    rows = []
    for record in records:
        q, k, v = (record[x].transpose(1, 2) for x in "qkv")  # (B, H, T, D)
        dense = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(128), -1) @ v
        for tau in (float("-inf"), 0.0, 1.0, float("inf")):
            out, density = block_sparse_attention(q, k, v, tau, 0, return_density=True)
            rel = ((out - dense).norm() / dense.norm()).item()
            rows.append((record["step"], record["block"], tau, float(density), rel))
    for step, block in {(r[0], r[1]) for r in rows}:
        mine = [r for r in rows if (r[0], r[1]) == (step, block)]
        assert mine[0][3] == 1.0 and mine[0][4] < 1e-5, mine  # all exact: dense up to fp32 rounding
        assert all(a[3] >= b[3] for a, b in zip(mine, mine[1:], strict=False)), mine  # density falls with tau
        assert mine[-1][3] < 1.0 and mine[-1][4] > mine[0][4], mine  # folded blocks move the output


def test_block_sparse_call_that_misses_the_kernel_raises(interpreter, session):
    """A backend changed after install leaves the routed call on an unshimmed backend: refused, not run dense."""
    transformer = session.model.pipeline.transformer
    active = _AttentionBackendRegistry._active_backend
    session.accelerate({"block_sparse": {}})
    try:
        transformer.set_attention_backend("_native_math")
        with pytest.raises(RuntimeError, match="did not reach the sparse kernel"):
            session.generate(Request("a red circle moves left", seed=3, **SIZE), progress=False)
    finally:
        session.accelerate({})
        transformer.reset_attention_backend()
        _AttentionBackendRegistry._active_backend = active


def test_block_sparse_low_precision_stays_close_to_exact_blocks_and_says_so(interpreter, session, monkeypatch, seed):
    """precision="int8": the same routing, the exact blocks through fp8_attention's quantized tile; the receipt names
    the precision, and against exact blocks at the same tau the latents move by the quantization only: by more than
    1e-7 relative L2 (about fp32's epsilon: the int8 tiles ran) and by less than 3e-3, over an order under the
    quantized tile's own error per call (a few 1e-2, the bounds of tests/kernels/test_fp8_attention.py), which
    reaches the latents only through attention's share of each block's residual update; a bad precision and a GPU
    without FP8 are refused."""
    exact, _ = _run(session, {"block_sparse": {"tau": 0.5}}, seed)
    low, report = _run(session, {"block_sparse": {"tau": 0.5, "precision": "int8"}}, seed)
    assert report["sparse_calls"] == 4 and report["notes"]["precision"] == "int8, pv fp8", report
    assert not low.exact
    err = ((low.latents - exact.latents).norm() / exact.latents.norm()).item()
    assert 1e-7 < err < 3e-3, f"int8 exact blocks move the latents by {err} (relative L2; allowed: 1e-7 to 3e-3)"
    with pytest.raises(ValueError, match="block_sparse.precision"):
        session.accelerate({"block_sparse": {"precision": "fp4"}})
    from workbench.kernels import _runtime

    monkeypatch.setattr(_runtime, "capability", lambda device: 86)
    with pytest.raises(RuntimeError, match=r"block_sparse: FP8 \(e4m3\) needs compute capability 8.9"):
        session.accelerate({"block_sparse": {"precision": "int8"}})
    assert session.accelerations == {}
