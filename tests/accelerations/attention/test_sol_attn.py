"""sol_attn (contract: approximate): refusals when NVIDIA's sol-attn package is missing or does not fit, and
the adapter's argument mapping against a stand-in module (the real package is not installed here and no GPU
runs in CI: a real Sol-Attn call is unverified; see the module docstring).
"""

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from workbench import Session
from workbench.accelerations import REGISTRY
from workbench.accelerations.attention import sol_package as plugin
from workbench.accelerations.attention.sparse_routing import Settings
from workbench.accelerations.base import Receipt
from workbench.models import wan


def _stand_in(backend="cute_sm90", calls=None):
    """A module with the documented entry points; `sol_attn` computes dense attention on BTHD tensors."""
    module = types.ModuleType("sol_attn")

    def sol_attn(q, k, v, *, scale=None, tau=1.0, thresh_type="diag", kv_splits=1, sink_tokens=0, sink_start=None):
        calls.append(dict(q=q, k=k, v=v, scale=scale, tau=tau, thresh_type=thresh_type, kv_splits=kv_splits,
                          sink_tokens=sink_tokens, sink_start=sink_start))  # fmt: skip
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
        return out.transpose(1, 2).contiguous()

    module.sol_attn = sol_attn
    module.get_sol_attn_backend = lambda device=None: backend
    return module


@pytest.fixture
def no_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "sol_attn", None)  # import raises ImportError, installed or not


def test_sol_attn_sparse_missing_package_raises_with_install_hint(no_package):
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(RuntimeError, match=r"`sol_attn` package is not importable.*\[sol\]"):
        session.accelerate({"sol_attn": {}})
    assert session.accelerations == {}


def test_sol_attn_sparse_package_without_entry_points_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "sol_attn", types.ModuleType("sol_attn"))
    with pytest.raises(RuntimeError, match=r"lacks \['sol_attn', 'get_sol_attn_backend'\]"):
        plugin.probe()


def test_sol_attn_sparse_cpu_session_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "sol_attn", _stand_in(calls=[]))
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(RuntimeError, match="runs on CUDA devices"):
        session.accelerate({"sol_attn": {}})


@pytest.mark.parametrize(
    "capability,package_backend,option,match",
    [
        ((9, 0), "triton", "cute", r"picks backend 'triton'.*required 'cute_sm90'.*CuTe DSL runtime missing"),
        ((8, 0), "triton", "cute", r"no CuTe kernel for sm_80"),
        ((9, 0), "cute_sm90", "triton", r"picks backend 'cute_sm90'.*required 'triton'"),
    ],
)
def test_sol_attn_sparse_backend_mismatch_raises(monkeypatch, capability, package_backend, option, match):
    monkeypatch.setitem(sys.modules, "sol_attn", _stand_in(package_backend, calls=[]))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    options = REGISTRY["sol_attn"].validate({"backend": option})
    with pytest.raises(RuntimeError, match=match):
        plugin.router_for(wan.tiny_d128(), torch.device("cuda"), options, None)


def test_sol_attn_sparse_adapter_passes_the_documented_arguments(monkeypatch):
    """Against the stand-in (dense inside): the routed model equals the stock model, and every call hands the
    package contiguous bf16 BTHD q/k/v of head dim 128, the options, kv_splits=1 and a prefix sink (start 0)."""
    calls = []
    monkeypatch.setitem(sys.modules, "sol_attn", _stand_in(calls=calls))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    model = wan.tiny_d128()
    transformer = model.pipeline.transformer.to(torch.bfloat16)
    options = REGISTRY["sol_attn"].validate({"tau": 0.5, "thresh_type": "exact"})
    settings = Settings.from_options(options, extra=("thresh_type",))
    router = plugin.router_for(model, torch.device("cuda"), options, lambda rows: settings)
    router.receipt = Receipt(("sparse_calls",))
    router.reset(1)  # the routed forward below is a one-step request
    torch.manual_seed(0)
    inputs = {
        "hidden_states": torch.randn(1, 16, 3, 16, 24, dtype=torch.bfloat16),  # 3 x 8 x 12 = 288 tokens
        "timestep": torch.tensor([500.0]),
        "encoder_hidden_states": torch.randn(1, 8, wan.TINY_TEXT_DIM, dtype=torch.bfloat16),
        "return_dict": False,
    }
    with torch.no_grad():
        stock = transformer(**inputs)[0]
        router.install()
        try:
            routed = transformer(**inputs)[0]
        finally:
            router.remove()
    assert len(calls) == 2 and router.receipt.counters["sparse_calls"] == 2  # attn1 of both blocks, not attn2
    for call in calls:
        q = call["q"]
        assert q.shape == (1, 288, 1, 128) and q.dtype == torch.bfloat16 and q.is_contiguous()
        assert call["k"].is_contiguous() and call["v"].is_contiguous()
        assert (call["tau"], call["thresh_type"], call["kv_splits"]) == (0.5, "exact", 1)
        assert (call["sink_start"], call["sink_tokens"]) == (0, 0)  # Wan's self-attention has no non-video rows
    assert torch.equal(routed, stock), (routed.float() - stock.float()).abs().max()


def test_sol_attn_sparse_bad_option_raises():
    session = Session.open("tiny-wan", device="cpu")
    with pytest.raises(ValueError, match="sol_attn.thresh_type"):
        session.accelerate({"sol_attn": {"thresh_type": "topk"}})
    with pytest.raises(ValueError, match="sol_attn.backend"):
        session.accelerate({"sol_attn": {"backend": "cudnn"}})
    with pytest.raises(ValueError, match="sol_attn.sink_tokens"):
        session.accelerate({"sol_attn": {"sink_tokens": "text"}})
    assert REGISTRY["sol_attn"].contract == "approximate"
