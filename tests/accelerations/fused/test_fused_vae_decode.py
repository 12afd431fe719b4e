"""fused_vae_decode on the Wan VAE: with the default options (padded conv buffers) bit-equal to diffusers' decode, in a
whole request and on a wider VAE; channels_last and the Triton norm within stated bounds (contract reduction);
uninstall restores the VAE; what it cannot take is refused."""

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan

from workbench import Request
from workbench.accelerations import REGISTRY, fingerprint
from workbench.models import families, wan

SPEC = REGISTRY["fused_vae_decode"]
CPU = torch.device("cpu")
# relative L2 against the stock decode of the same latents, wide VAE, 3 latent frames (measured up to 1.4e-6 fp32,
# 4.2e-3 bf16: one bf16 ulp of a normed value in a block travels through the later convolutions)
REL_L2 = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _wide(seed: int, dtype: torch.dtype):
    """tiny-wan with a VAE of 8..16 channels (tiny-wan's has 3): the norms reduce over enough channels to differ."""
    model = wan.tiny(0)
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1)
    model.pipeline.register_modules(vae=vae.eval().to(dtype))
    return model


def _decode(model, options, z):
    handle = None if options is None else SPEC.prepare(model, options, CPU).activate()
    if handle is not None:
        handle.begin_request(0, 1)
    try:
        with torch.no_grad():
            return model.pipeline.vae.decode(z).sample, None if handle is None else handle.report()
    finally:
        if handle is not None:
            handle.uninstall()


def _latents(rng, dtype, frames=3, height=4, width=6):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    return torch.randn(1, 16, frames, height, width, generator=g).to(dtype)


def test_fused_vae_decode_bitwise_equal_in_a_request_and_uninstall_restores(sessions, rng):
    session = sessions("tiny-wan")
    request = Request("a red circle", seed=int(rng.integers(2**20)), frames=9, height=32, width=32, steps=1)
    stock = session.generate(request, progress=False)
    vae = session.model.pipeline.vae
    before = fingerprint(vae)
    session.accelerate({"fused_vae_decode": {}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(vae) == before and "_decode" not in vae.__dict__
    assert np.array_equal(result.frames, stock.frames), f"seed {request.seed}"
    receipt = result.receipts["fused_vae_decode"]
    assert receipt["executed"] and receipt["contract"] == "bitwise" and receipt["fallbacks"] == {}
    assert receipt["decodes"] == 1 and receipt["latent_frames"] == 3 and receipt["buffered_convs"] > 0
    assert "video_decode" in result.timings


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_vae_decode_levers_bitwise_or_within_bound_of_stock(monkeypatch, rng, dtype):
    """Wide VAE, 3 latent frames (the time upsamplers' first, second and steady chunks): buffer and stock cache are
    torch.equal to diffusers; channels_last (and in fp32 with the Triton norm, interpreted) within REL_L2, reported
    `reduction`."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model = _wide(int(rng.integers(2**20)), dtype)
    vae = model.pipeline.vae
    z = _latents(rng, dtype)
    before = fingerprint(vae)
    want, _ = _decode(model, None, z)
    for options in ({}, {"conv_cache": "stock"}):
        got, report = _decode(model, options, z)
        assert torch.equal(got, want), options
        assert report["contract"] == "bitwise"
    levers = [{"channels_last": True}]
    if dtype == torch.float32:  # the interpreter is slow; fp32 has the tighter bound
        levers.append({"channels_last": True, "norm": "triton", "conv_cache": "stock"})
    for options in levers:
        got, report = _decode(model, options, z)
        rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
        assert rel <= REL_L2[dtype], f"{options}: rel L2 {rel:.2e} > {REL_L2[dtype]}"
        assert report["contract"] == "reduction" and report["executed"]
        if options.get("norm") == "triton":
            assert report["norm_silu_kernel_calls"] == 3 * 21  # 10 residual blocks x 2 norms + the head, per frame
    assert fingerprint(vae) == before
    assert all(p.is_contiguous() for p in vae.parameters()), "channels_last left a weight relaid"


def test_fused_vae_decode_tiled_decode_falls_back_to_stock(rng):
    model = wan.tiny(0)
    vae = model.pipeline.vae
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=16,
                      tile_sample_stride_width=16)  # fmt: skip
    z = _latents(rng, torch.float32, frames=2, height=6, width=6)
    want, _ = _decode(model, None, z)
    got, report = _decode(model, {}, z)
    assert torch.equal(got, want)
    assert not report["executed"] and report["fallbacks"] == {"tiled decode: diffusers' own": 1}


def test_fused_vae_decode_refuses_what_it_cannot_take(monkeypatch):
    assert SPEC.refusal(families()["ltx2"]) and SPEC.refusal(families()["h3"])
    assert SPEC.refusal(families()["wan"]) is None
    model = wan.tiny(0)
    with pytest.raises(ValueError, match=r"fused_vae_decode.conv_cache: 'ring' is not allowed"):
        SPEC.prepare(model, {"conv_cache": "ring"}, CPU)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="norm='triton' Triton kernels on a CPU need TRITON_INTERPRET=1"):
        SPEC.prepare(model, {"norm": "triton"}, CPU)
    model.pipeline.vae.__dict__["_decode"] = lambda *args, **kwargs: None
    with pytest.raises(RuntimeError, match="_decode is already replaced"):
        SPEC.prepare(model, {}, CPU)
    del model.pipeline.vae.__dict__["_decode"]
    model.pipeline.vae.decoder.conv_in.register_forward_pre_hook(lambda module, args: None)
    with pytest.raises(RuntimeError, match="decoder module conv_in has hooks"):
        SPEC.prepare(model, {}, CPU)
    ti2v = wan.tiny(0)
    ti2v.pipeline.register_modules(vae=AutoencoderKLWan(base_dim=4, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                                        is_residual=True, patch_size=2))  # fmt: skip
    with pytest.raises(RuntimeError, match="Wan2.2-TI2V"):
        SPEC.prepare(ti2v, {}, CPU)
