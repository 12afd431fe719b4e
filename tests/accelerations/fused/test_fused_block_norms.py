"""fused_block_norms on Wan and MiniMax-H3 (contract: reduction): the fused block's norms sum their row statistics in another order
than torch's, so it is compared with a float64 run of the stock block, next to the stock block's own error, under
the Triton CPU interpreter (on a GPU unverified until measured there)."""

import copy

import numpy as np
import pytest
import torch
from test_fused_block_ops import _block, _inputs

from workbench import Request, Session
from workbench.accelerations import fingerprint
from workbench.accelerations.base import Receipt
from workbench.accelerations.fused.fused_block_norms import SPEC
from workbench.models.fused.wan import norms_forward_for

SIZE = {"frames": 5, "height": 32, "width": 32}  # 2 latent frames: a small, quick request
ULP32 = torch.finfo(torch.float32).eps  # 2^-23
REQUEST_REL_L2 = {"float32": 1e-5, "bfloat16": 2e-2}  # whole tiny-wan request, fused vs stock latents


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _errors(got: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - truth
    return diff.abs().max().item(), (diff.norm() / truth.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 2, 2, False), (2, 3, 4, 6, False), (1, 2, 6, 4, True)])
def test_fused_block_norms_error_bound_against_float64(interpreter, rng, dtype, shape):
    """Bound: vs the stock block run in float64 on the same inputs and weights, the fused block's max-abs error is
    at most 2x the stock block's (in `dtype`) plus 4 fp32 ulps of the largest output, and its relative L2 error at
    most 2x the stock block's plus 1e-7."""
    seed = int(rng.integers(2**31))
    block = _block(dtype, seed)
    hidden, text, temb, (cos, sin) = _inputs(dtype, seed, *shape)
    receipt = Receipt(("layernorm_modulate_calls",))
    with torch.no_grad():
        want = block(hidden, text, temb, (cos, sin))
        got = norms_forward_for(block, receipt)(hidden, text, temb, (cos, sin))
        truth = copy.deepcopy(block).double()(
            hidden.double(), text.double(), temb.double(), (cos.double(), sin.double())
        )
    assert got.dtype == dtype and got.shape == want.shape
    (k_max, k_rel), (s_max, s_rel) = _errors(got, truth), _errors(want, truth)
    message = f"seed {seed}: fused max {k_max:.3e} rel {k_rel:.3e}; stock max {s_max:.3e} rel {s_rel:.3e}"
    assert k_max <= 2 * s_max + 4 * ULP32 * truth.abs().max().item(), message
    assert k_rel <= 2 * s_rel + 1e-7, message
    counts = {key: receipt.counters[key] for key in ("layernorm_modulate_calls", "qk_norm_rope_calls")}
    assert counts == {"layernorm_modulate_calls": 3, "qk_norm_rope_calls": 2}, counts
    assert receipt.counters["gated_residual_calls"] == 2 and receipt.counters["blocks_fused"] == 1
    assert receipt.fallbacks == {}


def test_fused_block_norms_identity_norm2_and_hooked_norm_q(interpreter, rng):
    # cross_attn_norm=False: norm2 is an Identity, x goes to attn2 as it is (two LayerNorm calls); a hook on
    # norm_q keeps torch's q/k RMSNorm (then the rotary kernel), counted under fallbacks
    seed = int(rng.integers(2**31))
    block = _block(torch.float32, seed)
    block.norm2 = torch.nn.Identity()
    inputs = _inputs(torch.float32, seed, 1, 2, 4, 4, False)
    calls = []
    block.attn1.norm_q.register_forward_hook(lambda *args: calls.append(1))
    receipt = Receipt(("layernorm_modulate_calls",))
    with torch.no_grad():
        want = block(*inputs)
        got = norms_forward_for(block, receipt)(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"seed {seed}")
    assert calls == [1, 1] and receipt.counters["layernorm_modulate_calls"] == 2
    assert receipt.counters["qk_norm_rope_calls"] == 0 and receipt.counters["rope_calls"] == 2
    (reason,) = receipt.fallbacks
    assert reason.startswith("qk_norm_rope: norm_q is RMSNorm (with hooks: True)"), reason


def test_fused_block_norms_unsupported_call_falls_back_with_reason(interpreter, rng):
    seed = int(rng.integers(2**31))
    block = _block(torch.float64, seed).double()
    inputs = _inputs(torch.float64, seed, 1, 1, 2, 2, False)
    receipt = Receipt(("layernorm_modulate_calls",))
    with torch.no_grad():
        assert torch.equal(norms_forward_for(block, receipt)(*inputs), block(*inputs))
    assert receipt.fallbacks == {"hidden_states dtype torch.float64": 1} and not receipt.executed
    grad_block = _block(torch.float32, seed)
    inputs = _inputs(torch.float32, seed, 1, 1, 2, 2, False)
    receipt = Receipt(("layernorm_modulate_calls",))
    got = norms_forward_for(grad_block, receipt)(*inputs)  # grad mode on, parameters require grad
    assert torch.equal(got, grad_block(*inputs)) and got.requires_grad
    assert receipt.fallbacks == {"autograd: the kernels have no backward": 1}


def _request_close_to_stock(model, dtype, request):
    """The request with fused_block_norms against stock: within REQUEST_REL_L2, uninstall restores the model (its
    fingerprint, and the next request bit-equal to stock), nothing fell back. Returns the receipt."""
    session = Session.open(model, device="cpu", dtype=dtype)
    dense = session.generate(request, progress=False)
    before = fingerprint(session.model.pipeline.transformer)
    session.accelerate({"fused_block_norms": {}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(session.model.pipeline.transformer) == before, "uninstall did not restore the model"
    assert all("forward" not in m.__dict__ for m in session.model.pipeline.transformer.modules())
    again = session.generate(request, progress=False)
    assert torch.equal(again.latents, dense.latents) and np.array_equal(again.frames, dense.frames), request.seed
    assert dense.audio is None or np.array_equal(again.audio, dense.audio), request.seed
    got, want = result.latents.double(), dense.latents.double()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel <= REQUEST_REL_L2[dtype], f"seed {request.seed}: latents rel L2 {rel:.3e} > {REQUEST_REL_L2[dtype]}"
    receipt = result.receipts["fused_block_norms"]
    assert receipt["executed"] and receipt["fallbacks"] == {} and result.exact
    return receipt


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_block_norms_full_request_close_to_stock_and_uninstall_restores(interpreter, rng, dtype):
    request = Request("a red circle moves left", seed=int(rng.integers(2**20)), steps=2, **SIZE)
    receipt = _request_close_to_stock("tiny-wan", dtype, request)
    # tiny-wan: 2 blocks x 2 steps x 2 CFG branches; norm1, norm2 (affine), norm3; q and k; two gated residuals
    assert receipt["blocks_fused"] == 8 and receipt["layernorm_modulate_calls"] == 24
    assert receipt["qk_norm_rope_calls"] == 16 and receipt["gated_residual_calls"] == 16


def test_fused_block_norms_refuses_together_with_fused_block_ops(interpreter, sessions):
    session = sessions("tiny-wan")
    before = fingerprint(session.model.pipeline.transformer)
    with pytest.raises(
        ValueError, match=r"'fused_block_(ops|norms)' and 'fused_block_(ops|norms)' both modify blocks.forward"
    ):
        session.accelerate({"fused_block_ops": {}, "fused_block_norms": {}})
    session.accelerate({"fused_block_ops": {}})  # installed first (as another session's plan would leave it)
    try:
        with pytest.raises(RuntimeError, match=r"fused_block_norms: blocks.0 already has its forward replaced"):
            SPEC.prepare(session.model, {}, torch.device("cpu"))
    finally:
        session.accelerate({})
    assert fingerprint(session.model.pipeline.transformer) == before


def test_fused_block_norms_on_cpu_without_interpreter_is_runtime_error(monkeypatch, sessions):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    session = sessions("tiny-wan")
    before = fingerprint(session.model.pipeline.transformer)
    with pytest.raises(RuntimeError, match="fused_block_norms: .*TRITON_INTERPRET=1"):
        session.accelerate({"fused_block_norms": {}})
    assert fingerprint(session.model.pipeline.transformer) == before


def test_fused_block_norms_refuses_other_families_and_options(interpreter, sessions):
    with pytest.raises(RuntimeError, match=r"fused_block_norms: supports families \('wan', 'h3'\), not 'ltx2'"):
        sessions("tiny-ltx2").accelerate({"fused_block_norms": {}})
    with pytest.raises(ValueError, match=r"fused_block_norms: unknown option\(s\) \['rope'\]; allowed: \[\]"):
        sessions("tiny-wan").accelerate({"fused_block_norms": {"rope": "on"}})


# ---------------------------------------------------------------- MiniMax-H3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_block_norms_h3_request_close_to_stock_and_uninstall_restores(interpreter, rng, dtype):
    request = Request("a red circle moves left, low hum", seed=int(rng.integers(2**20)), steps=3)
    receipt = _request_close_to_stock("tiny-h3", dtype, request)
    # tiny-h3: 2 blocks x 2 transformer calls (3 steps); q and k each; two modulations and two gated residuals
    assert receipt["blocks_fused"] == 4 and receipt["qk_norm_rope_calls"] == 8
    assert receipt["adaln_modulate_calls"] == 8 and receipt["gated_residual_calls"] == 8


def test_fused_block_norms_h3_stacks_with_block_sparse(interpreter, h3_d128, rng):
    # the block hands the rotary tables to the norms and calls attention without them: block_sparse's router,
    # which wraps the processor, still routes every call; all exact (tau -1e9), the pair stays near dense
    session = Session(h3_d128(32, 64), torch.device("cpu"), torch.float32, 0.0)
    request = Request("a red circle moves left, low hum", seed=int(rng.integers(2**20)))
    dense = session.generate(request, progress=False)
    session.accelerate({"fused_block_norms": {}, "block_sparse": {"tau": -1e9}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    sparse, fused = result.receipts["block_sparse"], result.receipts["fused_block_norms"]
    assert sparse["sparse_calls"] == 2 and sparse["notes"]["mean_density"] == 1.0, sparse
    assert fused["qk_norm_rope_calls"] == 4 and fused["fallbacks"] == {}, fused
    err = (result.latents - dense.latents).abs().max().item()
    assert err < 1e-5, f"seed {request.seed}: fused norms + all-exact block_sparse move H3's latents by {err}"


def test_fused_block_norms_h3_processor_skipping_the_norms_reruns_stock(interpreter, rng):
    # a processor that never calls norm_q / norm_k would lose the rotary: the call is redone the stock way
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AttnProcessor

    def skip_norms(attn, hidden_states, rotary_emb=None, attention_mask=None):
        return attn.to_out[0](attn.to_v(hidden_states)) + (0 if rotary_emb is None else rotary_emb[0].sum())

    session = Session.open("tiny-h3", device="cpu", dtype="float32")
    request = Request("a red circle moves left, low hum", seed=int(rng.integers(2**20)), steps=2)
    blocks = session.model.pipeline.transformer.transformer_blocks
    for block in blocks:
        block.attn.set_processor(skip_norms)
    try:
        stock = session.generate(request, progress=False)
        session.accelerate({"fused_block_norms": {}})
        try:
            result = session.generate(request, progress=False)
        finally:
            session.accelerate({})
    finally:
        for block in blocks:
            block.attn.set_processor(MiniMaxH3AttnProcessor())
    assert torch.equal(result.latents, stock.latents)
    reason = "attention processor did not call norm_q and norm_k once each"
    assert result.receipts["fused_block_norms"]["fallbacks"] == {reason: 2}
