"""fused_block_ops on Wan: blocks with the Triton modulation, gated-residual and rotary kernels equal stock
diffusers bit for bit under the Triton CPU interpreter (contract: rounding; on a GPU unverified until measured
there). LTX-2 and MiniMax-H3 are in test_fused_block_ops_av.py."""

import numpy as np
import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed, WanTransformerBlock

from workbench import Request, Session
from workbench.accelerations import fingerprint
from workbench.accelerations.base import Receipt
from workbench.accelerations.fused.blocks import fused_blocks
from workbench.models.fused.wan import forward_for

DIM, HEADS, FFN = 32, 2, 64
KEEP_FP32 = ("scale_shift_table", "norm1", "norm2", "norm3")  # WanTransformer3DModel._keep_in_fp32_modules
SIZE = {"frames": 9, "height": 32, "width": 32}


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _block(dtype, seed):
    torch.manual_seed(seed)
    block = WanTransformerBlock(DIM, FFN, HEADS, cross_attn_norm=True).eval()
    with torch.no_grad():
        block.scale_shift_table.normal_()  # random init everywhere, not the near-zero default
        for name, tensor in block.named_parameters():
            keep = set(name.split(".")) & set(KEEP_FP32)
            tensor.data = tensor.data.to(torch.float32 if keep else dtype)
    return block


def _inputs(dtype, seed, batch, frames, height, width, per_token):
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(batch, 16, frames, height, width, generator=g)
    rotary = WanRotaryPosEmbed(DIM // HEADS, (1, 2, 2), 32)(latent)
    tokens = frames * (height // 2) * (width // 2)
    hidden = torch.randn(batch, tokens, DIM, generator=g).to(dtype)
    text = torch.randn(batch, 7, DIM, generator=g).to(dtype)
    temb_shape = (batch, tokens, 6, DIM) if per_token else (batch, 6, DIM)
    temb = torch.randn(*temb_shape, generator=g).to(dtype)
    return hidden, text, temb, rotary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 2, 2, False), (2, 3, 4, 6, False), (1, 2, 6, 4, True)])
@pytest.mark.parametrize("rope", ["auto", "off"])
def test_fused_block_ops_rounding_equal_stock(interpreter, rng, dtype, shape, rope):
    seed = int(rng.integers(2**31))
    block = _block(dtype, seed)
    inputs = _inputs(dtype, seed, *shape)
    receipt = Receipt(("adaln_modulate_calls",))
    fused = forward_for(block, receipt, {"rope": rope})
    with torch.no_grad():
        want = block(*inputs)
        got = fused(*inputs)
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got, want), f"seed {seed}: {(got != want).sum()} of {got.numel()} elements differ"
    assert receipt.counters["adaln_modulate_calls"] == 2 and receipt.counters["gated_residual_calls"] == 2
    assert receipt.counters["rope_calls"] == (2 if rope == "auto" else 0) and receipt.fallbacks == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_block_ops_rope_kernel_is_not_a_no_op(interpreter, rng, dtype):
    # the rotary step changes q and k: a fused attn1 that skipped it (or applied it twice) would differ
    seed = int(rng.integers(2**31))
    block = _block(dtype, seed)
    hidden, text, temb, (cos, sin) = _inputs(dtype, seed, 1, 2, 4, 4, False)
    receipt = Receipt(("rope_calls",))
    fused = forward_for(block, receipt, {"rope": "auto"})
    with torch.no_grad():
        got = fused(hidden, text, temb, (cos, sin))
        assert torch.equal(got, block(hidden, text, temb, (cos, sin))), f"seed {seed}"
        assert not torch.equal(got, block(hidden, text, temb, (cos, -sin))), f"seed {seed}"
    assert receipt.counters["rope_calls"] == 2


def test_fused_block_ops_rope_leaves_a_wrapped_processor_alone(interpreter, rng):
    # another plugin's processor on attn1 (block_sparse wraps it): the rotary step stays its own, counted
    seed = int(rng.integers(2**31))
    block = _block(torch.float32, seed)
    inputs = _inputs(torch.float32, seed, 1, 2, 4, 4, False)
    calls = []
    original = block.attn1.processor

    def wrapped(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    with torch.no_grad():
        want = block(*inputs)
        block.attn1.processor = wrapped
        receipt = Receipt(("rope_calls",))
        got = forward_for(block, receipt, {"rope": "auto"})(*inputs)
    assert torch.equal(got, want), f"seed {seed}"
    assert calls == [1] and receipt.counters["rope_calls"] == 0
    assert receipt.fallbacks == {"rope: attn1 processor is function, not a stock WanAttnProcessor": 1}


def test_fused_block_ops_unsupported_call_falls_back_with_reason(interpreter):
    block = _block(torch.float64, 0).double()
    hidden, text, temb, rotary = _inputs(torch.float64, 0, 1, 1, 2, 2, False)
    receipt = Receipt(("adaln_modulate_calls",))
    with torch.no_grad():
        got = forward_for(block, receipt, {"rope": "auto"})(hidden, text, temb, rotary)
        assert torch.equal(got, block(hidden, text, temb, rotary))
    assert receipt.fallbacks == {"hidden_states dtype torch.float64": 1} and not receipt.executed


def test_fused_block_ops_grad_mode_falls_back_with_reason(interpreter):
    block = _block(torch.float32, 1)
    inputs = _inputs(torch.float32, 1, 1, 1, 2, 2, False)
    receipt = Receipt(("adaln_modulate_calls",))
    got = forward_for(block, receipt, {"rope": "auto"})(*inputs)  # grad mode on, parameters require grad
    assert torch.equal(got, block(*inputs)) and got.requires_grad
    assert receipt.fallbacks == {"autograd: the kernels have no backward": 1}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_block_ops_full_request_equal_dense(interpreter, rng, dtype):
    session = Session.open("tiny-wan", device="cpu", dtype=dtype)
    seed = int(rng.integers(2**20))
    request = Request("a red circle moves left", seed=seed, steps=3, **SIZE)
    dense = session.generate(request, progress=False)
    before = fingerprint(session.model.pipeline.transformer)
    session.accelerate({"fused_block_ops": {}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(session.model.pipeline.transformer) == before, "uninstall did not restore the model"
    assert torch.equal(result.latents, dense.latents), f"seed {seed}"
    assert np.array_equal(result.frames, dense.frames), f"seed {seed}"
    receipt = result.receipts["fused_block_ops"]
    assert receipt["executed"] and receipt["fallbacks"] == {} and result.exact
    # tiny-wan: 2 blocks x 3 steps x 2 CFG branches, two modulations, two gated residuals, rotary on q and k each
    assert receipt["blocks_fused"] == 12 and receipt["adaln_modulate_calls"] == 24 and receipt["rope_calls"] == 24


def test_fused_block_ops_on_cpu_without_interpreter_is_runtime_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    session = Session.open("tiny-wan", device="cpu")
    before = fingerprint(session.model.pipeline.transformer)
    with pytest.raises(RuntimeError, match="fused_block_ops: .*TRITON_INTERPRET=1"):
        session.accelerate({"fused_block_ops": {}})
    assert fingerprint(session.model.pipeline.transformer) == before
    # the prepare-time check gives the same reason as `Spec.unusable` (`blocks.triton_unusable`), naming the plugin
    with pytest.raises(RuntimeError, match=r"^fused_block_ops: Triton kernels on a CPU need TRITON_INTERPRET=1$"):
        fused_blocks("fused_block_ops", session.model, torch.device("cpu"))


@pytest.mark.parametrize("model", ["tiny-ltx2", "tiny-h3"])
def test_fused_block_ops_rope_on_without_a_rotary_kernel_is_runtime_error(interpreter, sessions, model):
    with pytest.raises(RuntimeError, match=r"fused_block_ops.rope='on': .* have no rotary kernel wired"):
        sessions(model).accelerate({"fused_block_ops": {"rope": "on"}})


def test_fused_block_ops_bad_option_raises():
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(
        ValueError, match=r"fused_block_ops.rope: True is not allowed|fused_block_ops.rope: expected str"
    ):
        session.accelerate({"fused_block_ops": {"rope": True}})
    with pytest.raises(
        ValueError, match=r"fused_block_ops.rope: 'yes' is not allowed; allowed: \['auto', 'on', 'off'\]"
    ):
        session.accelerate({"fused_block_ops": {"rope": "yes"}})
