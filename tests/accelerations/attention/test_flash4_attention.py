"""flash4_attention: refusals, and the registry swap and its undo driven by a stand-in for `flash_attn.cute` on CPU
(the FA4 kernels themselves run only on a GPU: `python -m benchmarks run fp8-attention forward-wan`)."""

import types

import pytest
import torch
import torch.nn.functional as F

from workbench import Request, Session
from workbench.accelerations import REGISTRY, fingerprint
from workbench.accelerations.attention.flash4_attention import _Installed, attention_fn, unusable
from workbench.accelerations.base import Receipt
from workbench.models import wan


def _stand_in(calls: list) -> types.SimpleNamespace:
    """FA4's interface on (B, S, H, D) tensors, computed by torch's math SDPA."""

    def flash_attn_func(q, k, v, softmax_scale=None):
        calls.append(tuple(q.shape))
        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), scale=softmax_scale)
        return out.transpose(1, 2), None

    return types.SimpleNamespace(flash_attn_func=flash_attn_func)


def test_flash4_attention_refuses_cpu():
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(RuntimeError, match="flash4_attention: needs a device of type"):
        session.accelerate({"flash4_attention": {}})


@pytest.mark.parametrize(
    "extra, reason",
    [({"attn_mask": torch.ones(1, 1, 4, 4, dtype=torch.bool)}, "mask"), ({"is_causal": True}, "is_causal"),
     ({"dropout_p": 0.1}, "dropout"),
     ({"attn_mask": torch.ones(1, 1, 4, 4, dtype=torch.bool), "is_causal": True, "_parallel_config": object()},
      r"^flash4_attention: a call with an attention mask, is_causal=True, a context-parallel config \(FA4")],
)  # fmt: skip
def test_flash4_attention_raises_on_calls_it_does_not_take(extra, reason):
    run = attention_fn(_stand_in([]), Receipt(("flash4_calls",)))
    q = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=reason):
        run(query=q, key=q, value=q, **extra)
    with pytest.raises(RuntimeError, match="dtypes"):
        run(query=q.float(), key=q.float(), value=q.float())


def test_flash4_attention_routes_every_call_and_uninstalls_exactly():
    session = Session.open("tiny-wan", device="cpu", dtype=torch.bfloat16)
    request = Request("a red circle moves left", seed=5, steps=2, frames=9, height=32, width=32)
    stock = session.generate(request, progress=False)
    denoisers = session.model.denoisers()
    before = [fingerprint(d) for d in denoisers]
    calls: list = []
    handle = _Installed(REGISTRY["flash4_attention"], {}, denoisers, _stand_in(calls), torch.device("cpu"))
    try:
        with torch.no_grad():
            routed = session.generate(request, progress=False)
    finally:
        handle.uninstall()
    assert [fingerprint(d) for d in denoisers] == before
    blocks = session.model.pipeline.transformer.config.num_layers
    assert len(calls) == 2 * blocks * request.steps * 2  # attn1 + attn2, per step, both CFG branches
    assert handle.receipt.counters["flash4_calls"] == len(calls)
    rel = float((routed.latents.float() - stock.latents.float()).norm() / stock.latents.float().norm())
    assert rel < 2e-2, rel  # math SDPA stand-in vs the default kernel: bf16 reduction order only
    assert torch.equal(session.generate(request, progress=False).latents, stock.latents)


def test_flash4_attention_says_why_it_is_unusable_here():
    assert "CUDA" in unusable(torch.device("cpu"))
    if not torch.cuda.is_available():
        assert "CUDA" in unusable(torch.device("cuda"))


@pytest.mark.gpu
def test_flash4_attention_runs_the_installed_kernels_on_cuda_close_to_stock():
    """The real FA4 kernels on tiny-wan-d128 (one head of 128) in bf16: every attention call takes them, the latents
    stay within accumulation-order distance of stock SDPA's, and removing the plugin gives stock's bit for bit.
    Skipped where FA4 cannot run (`unusable`: another GPU, or `flash_attn.cute` not installed)."""
    reason = unusable(torch.device("cuda"))
    if reason is not None:
        pytest.skip(f"flash4_attention: {reason}")
    model = wan.tiny_d128()
    model.pipeline.to(dtype=torch.bfloat16)
    session = Session.open(model, device="cuda")
    request = Request("a red circle moves left", seed=5, steps=2, frames=9, height=128, width=192)
    stock = session.generate(request, progress=False)
    session.accelerate({"flash4_attention": {}})
    routed = session.generate(request, progress=False)
    session.accelerate({})
    blocks = model.pipeline.transformer.config.num_layers
    assert routed.receipts["flash4_attention"]["flash4_calls"] == 2 * blocks * request.steps * 2  # attn1+attn2, CFG
    rel = float((routed.latents.float() - stock.latents.float()).norm() / stock.latents.float().norm())
    assert rel < 2e-2, rel  # FA4 and cuDNN/flash SDPA differ in bf16 accumulation order only
    assert torch.equal(session.generate(request, progress=False).latents, stock.latents)
