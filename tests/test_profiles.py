import dataclasses

import numpy as np
import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import REGISTRY, available
from workbench.models import families
from workbench.profiles import FAMILIES, profile, profile_plan

SIZE = {"frames": 9, "height": 32, "width": 32}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("interpret", [False, True])
def test_exact_fast_holds_no_approximate_plugin(monkeypatch, family, device, interpret):
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    config = profile("exact-fast", family, device)
    specs = available()
    for plugin in config:
        assert specs[plugin].contract in ("bitwise", "rounding", "reduction"), plugin
        assert specs[plugin].families is None or family in specs[plugin].families, plugin
    assert "regional_compile" not in config
    assert profile("stock", family, device) == {}


def test_exact_fast_configs_per_family_and_device(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    # as if FlashAttention-4 were installed on a Hopper GPU
    monkeypatch.setitem(REGISTRY, "flash4_attention", dataclasses.replace(REGISTRY["flash4_attention"], unusable=None))
    exact = {"adaln_precompute": {}, "cross_kv_cache": {}, "fused_vae_decode": {}}
    cuda_only = {"gelu_epilogue": {}, "flash4_attention": {}}
    assert profile("exact-fast", "wan", "cuda") == {"fused_block_norms": {}, **exact, **cuda_only}
    assert profile("exact-fast", "wan", torch.device("cpu")) == exact
    assert profile("exact-fast", "ltx2", "cuda") == profile("exact-fast", "ltx2", "cpu") == {"cross_kv_cache": {}}
    assert profile("exact-fast", "h3", "cuda:0") == {"fused_block_norms": {}, "flash4_attention": {}}
    assert profile("exact-fast", "h3", "cpu") == {}
    for family in FAMILIES:  # forcing cuDNN measured slower than diffusers' default on the H200
        assert "attention_backend" not in profile("exact-fast", family, "cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert profile("exact-fast", "wan", "cpu") == {"fused_block_norms": {}, **exact}


def test_exact_fast_says_what_it_leaves_out(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    missing = dataclasses.replace(
        REGISTRY["flash4_attention"], unusable=lambda device: "`flash_attn.cute` is not installed"
    )
    monkeypatch.setitem(REGISTRY, "flash4_attention", missing)
    config, left_out = profile_plan("exact-fast", "wan", "cuda")
    assert "flash4_attention" not in config
    assert left_out == {"flash4_attention": "`flash_attn.cute` is not installed"}
    _, left_out = profile_plan("exact-fast", "h3", "cpu")
    assert left_out["fused_block_norms"] == "Triton kernels on a CPU need TRITON_INTERPRET=1"
    assert left_out["flash4_attention"] == "runs on ['cuda'], not cpu"


def test_exact_fast_given_the_model_leaves_out_the_decode_its_vae_cannot_take():
    """Given the loaded model, a plugin whose `model_problem` names a reason is left out, and says why: a Wan
    pipeline whose VAE is configured as Wan2.2-TI2V's gets exact-fast without fused_vae_decode; tiny-wan keeps it."""
    from workbench.models import resolve

    model = resolve("tiny-wan")
    assert "fused_vae_decode" in profile("exact-fast", "wan", "cpu", model)
    model.pipeline.vae.register_to_config(is_residual=True)  # as Wan2.2-TI2V's VAE is configured
    config, left_out = profile_plan("exact-fast", "wan", "cpu", model)
    assert "fused_vae_decode" not in config and "Wan2.2-TI2V" in left_out["fused_vae_decode"]


def test_exact_fast_refuses_a_plugin_that_became_approximate(monkeypatch):
    monkeypatch.setitem(
        REGISTRY, "cross_kv_cache", dataclasses.replace(REGISTRY["cross_kv_cache"], contract="approximate")
    )
    with pytest.raises(RuntimeError, match=r"plugin 'cross_kv_cache' has contract 'approximate'"):
        profile("exact-fast", "wan", "cpu")


def test_exact_fast_refuses_a_plugin_its_family_does_not_take(monkeypatch):
    monkeypatch.setitem(families()["wan"].unsupported, "cross_kv_cache", "withdrawn")
    with pytest.raises(RuntimeError, match=r"plugin 'cross_kv_cache' serves \('ltx2',\), not 'wan'"):
        profile("exact-fast", "wan", "cpu")  # a family's list names only plugins that serve it


@pytest.mark.parametrize(
    "name, family, message",
    [
        ("fastest", "wan", r"unknown profile 'fastest'; allowed: \['stock', 'exact-fast'\]"),
        ("exact-fast", "sd3", r"unknown family 'sd3'; allowed: \['wan', 'ltx2', 'h3'\]"),
        ("stock", "WAN", r"unknown family 'WAN'"),
    ],
)
def test_unknown_profile_or_family_raises(name, family, message):
    with pytest.raises(ValueError, match=message):
        profile(name, family, "cpu")


@pytest.mark.parametrize("device", ["tpu", None, 3.5])
def test_a_device_torch_cannot_name_is_refused_by_field(device):
    with pytest.raises(ValueError, match=r"device: .*; allowed: 'cpu', 'cuda' or 'cuda:N'"):
        profile("exact-fast", "wan", device)


@pytest.mark.parametrize("interpret", [False, True])
def test_exact_fast_on_tiny_wan_cpu_equals_stock(monkeypatch, interpret, seed):
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    session = Session.open("tiny-wan", device="cpu")
    request = Request("a red circle moves left", seed=seed, steps=3, **SIZE)
    stock = session.generate(request, progress=False)
    config = profile("exact-fast", "wan", "cpu")
    assert ("fused_block_norms" in config) == interpret
    installed = session.accelerate(config)
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert set(installed) == set(config)
    if interpret:  # fused_block_norms is a `reduction`: its bound on a whole fp32 tiny-wan request
        rel = float((result.latents - stock.latents).norm() / stock.latents.norm())
        assert rel < 1e-5, f"seed {seed}: relative L2 {rel}"
    else:  # the bitwise plugins alone
        assert torch.equal(result.latents, stock.latents), f"seed {seed}"
        assert np.array_equal(result.frames, stock.frames), f"seed {seed}"


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "on", "Yes", "y", "0", "false", "Off", "no", "n", ""])
def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch, value):
    import triton

    from workbench.kernels._runtime import interpreting

    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreting() == bool(triton.knobs.runtime.interpret) == (value.lower() in ("1", "true", "on", "yes", "y"))
    config, left_out = profile_plan("exact-fast", "wan", "cpu")
    assert ("fused_block_norms" in config) == interpreting()
    assert ("fused_block_norms" in left_out) != interpreting()


@pytest.mark.parametrize("value", ["2", " 1", "interpret", "01"])
def test_triton_interpret_value_triton_ignores_is_refused(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    with pytest.raises(ValueError, match=r"^TRITON_INTERPRET: .* allowed: one of \['1', 'true'"):
        profile_plan("exact-fast", "wan", "cpu")


def test_card_plan_says_what_exact_fast_installs_on_the_seeds_cards():
    from workbench.profiles import card_plan

    for card in ("sm_86", "sm_89"):
        config, left_out = card_plan("exact-fast", "wan", card)
        assert "flash4_attention" not in config and "fused_block_norms" in config and "gelu_epilogue" in config
        assert left_out == {"flash4_attention": f"runs on sm_90/sm_100, not {card}"}
    config, left_out = card_plan("exact-fast", "h3", "sm_90")
    assert set(config) == {"fused_block_norms", "flash4_attention"} and left_out == {}
    assert card_plan("stock", "ltx2", "sm_89") == ({}, {})
    with pytest.raises(ValueError, match=r"card: unknown 'sm_75'; allowed: \['sm_80', 'sm_86', 'sm_89', 'sm_90'\]"):
        card_plan("exact-fast", "wan", "sm_75")
