"""gelu_epilogue: refuses where it cannot compute the model's tanh GELU; its forward's plumbing on CPU; its
bound against the stock feed-forward on a GPU."""

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.activations import GELU

from workbench import Request, Session
from workbench.accelerations.base import Receipt
from workbench.accelerations.fused.gelu_epilogue import epilogue_forward, gelu_modules


def _gelu(seed: int, dtype: torch.dtype = torch.float32) -> GELU:
    torch.manual_seed(seed)
    return GELU(24, 40, approximate="tanh").to(dtype)


def test_gelu_epilogue_refuses_cpu():
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(RuntimeError, match="gelu_epilogue: needs a device of type"):
        session.accelerate({"gelu_epilogue": {}})


def test_gelu_epilogue_finds_the_tanh_gelu_projections():
    session = Session.open("tiny-wan", device="cpu")
    modules = gelu_modules(session.model)
    blocks = session.model.pipeline.transformer.config.num_layers
    assert len(modules) == blocks and all(m.approximate == "tanh" for m in modules)


def test_gelu_epilogue_forward_plumbing_on_cpu(seed):
    # On a CPU torch's _addmm_activation applies the erf GELU, so this checks the reshape, the weight orientation
    # and the bias against `gelu(proj(x))` with erf; the tanh numerics are the GPU test's.
    module = _gelu(seed)
    x = torch.randn(2, 7, 24).transpose(0, 1)  # (7, 2, 24), non-contiguous
    receipt = Receipt(("epilogue_calls",))
    with torch.no_grad():
        got = epilogue_forward(module, receipt)(x)
        want = F.gelu(module.proj(x))
    assert got.shape == (7, 2, 40)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=f"seed {seed}")
    assert receipt.counters["epilogue_calls"] == 1


def test_gelu_epilogue_falls_back_in_grad_mode_and_on_dtype_mismatch():
    module = _gelu(0)
    receipt = Receipt(("epilogue_calls",))
    forward = epilogue_forward(module, receipt)
    x = torch.randn(3, 24, requires_grad=True)
    assert torch.equal(forward(x), module(x))
    with torch.no_grad(), pytest.raises(RuntimeError):  # the stock module's own dtype error, not a silent cast
        forward(torch.randn(3, 24, dtype=torch.float64))
    assert receipt.counters["epilogue_calls"] == 0
    assert sum(receipt.fallbacks.values()) == 2


@pytest.mark.gpu
def test_gelu_epilogue_close_to_stock_on_gpu():
    session = Session.open("tiny-wan", device="cuda", dtype=torch.bfloat16)
    request = Request("a red circle moves left", seed=3, steps=2, frames=9, height=32, width=32)
    stock = session.generate(request, progress=False)
    session.accelerate({"gelu_epilogue": {}})
    try:
        fused = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fused.receipts["gelu_epilogue"]["epilogue_calls"] > 0
    rel = float((fused.latents.float() - stock.latents.float()).norm() / stock.latents.float().norm())
    assert rel < 2e-2, rel
