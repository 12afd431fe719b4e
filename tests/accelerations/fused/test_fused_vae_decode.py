"""fused_vae_decode on the Wan VAE and LTX-2's video VAE: with the default options (padded conv buffers) bit-equal to
diffusers' decode, in a whole request and on a wider VAE; channels_last and the Triton norm within stated bounds
(contract reduction); uninstall restores the VAE; what it cannot take is refused."""

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLLTX2Video, AutoencoderKLWan

from workbench import Request
from workbench.accelerations import REGISTRY, fingerprint
from workbench.accelerations.fused.fused_vae_decode import REL_L2_BOUND
from workbench.models import families, ltx2, wan

SPEC = REGISTRY["fused_vae_decode"]
CPU = torch.device("cpu")
# the plugin's stated bound: relative L2 against the stock decode of the same latents, per dtype (fp32: another
# summation order's rounding, compounded over the decoder's layers; bf16: one bf16 ulp of a normed value in a block
# travels through the convolutions)
REL_L2 = REL_L2_BOUND


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


# (model, request size, latent frames, buffered convs: None = some); tiny-ltx2's decoder buffers conv_in, a mid and an
# up resnet (2 each), the upsampler and conv_out
IN_A_REQUEST = [("tiny-wan", 32, 3, None), ("tiny-ltx2", 64, 5, 7)]


@pytest.mark.parametrize("name, size, latent_frames, buffered", IN_A_REQUEST)
def test_fused_vae_decode_bitwise_equal_in_a_request_and_uninstall_restores(
    sessions, rng, name, size, latent_frames, buffered
):
    session = sessions(name)
    request = Request("a red circle", seed=int(rng.integers(2**20)), frames=9, height=size, width=size, steps=1)
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
    assert receipt["decodes"] == 1 and receipt["latent_frames"] == latent_frames
    assert receipt["buffered_convs"] == buffered if buffered is not None else receipt["buffered_convs"] > 0
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
        assert report["contract"] == "bitwise" and "rel_l2_bound" not in report
    levers = [{"channels_last": True}]
    if dtype == torch.float32:  # the interpreter is slow; fp32 has the tighter bound
        levers.append({"channels_last": True, "norm": "triton", "conv_cache": "stock"})
    for options in levers:
        got, report = _decode(model, options, z)
        rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
        assert rel <= REL_L2[dtype], f"{options}: rel L2 {rel:.2e} > {REL_L2[dtype]}"
        assert report["contract"] == "reduction" and report["executed"] and report["rel_l2_bound"] == REL_L2[dtype]
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
    assert SPEC.refusal(families()["h3"])
    assert SPEC.refusal(families()["wan"]) is None and SPEC.refusal(families()["ltx2"]) is None
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


def _wide_ltx2(seed: int, dtype: torch.dtype, causal: bool, **config):
    """tiny-ltx2 with a video VAE of 16..64 decoder channels: the three upsampler strides (2, 2, 2), (2, 1, 1),
    (1, 2, 2), with and without residual, an up block whose channels change (its conv_in: LayerNorm + 1x1x1
    shortcut), patch size 2, reflect padding (the release's) unless `config` says otherwise."""
    model = ltx2.tiny(0)
    torch.manual_seed(seed)
    vae = AutoencoderKLLTX2Video(
        latent_channels=8, block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_block_out_channels=(16, 16, 64), decoder_layers_per_block=(1, 1, 1, 1),
        upsample_type=("spatiotemporal", "temporal", "spatial"), upsample_residual=(True, False, True),
        upsample_factor=(1, 1, 2), patch_size=2, decoder_causal=causal, **config,
    )  # fmt: skip
    model.pipeline.register_modules(vae=vae.eval().to(dtype))
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_vae_decode_ltx2_levers_bitwise_or_within_bound_of_stock(monkeypatch, rng, dtype):
    """Wide LTX-2 VAE, causal and not, 3 latent frames: buffer and stock convolutions torch.equal to diffusers;
    channels_last and the pixel-norm kernel (interpreted) within REL_L2, reported `reduction`; uninstall leaves
    the weights as they were, contiguous."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for causal in (False, True):
        model = _wide_ltx2(int(rng.integers(2**20)), dtype, causal)
        vae = model.pipeline.vae
        g = torch.Generator().manual_seed(int(rng.integers(2**31)))
        z = torch.randn(1, 8, 3, 4, 6, generator=g).to(dtype)
        before = fingerprint(vae)
        want, _ = _decode(model, None, z)
        for options in ({}, {"conv_cache": "stock"}):
            got, report = _decode(model, options, z)
            assert torch.equal(got, want), (causal, options)
            assert report["contract"] == "bitwise"
        levers = [{"channels_last": True}, {"norm": "triton", "channels_last": causal}]
        for options in levers:
            got, report = _decode(model, options, z)
            rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
            assert rel <= REL_L2[dtype], f"{causal} {options}: rel L2 {rel:.2e} > {REL_L2[dtype]}"
            assert report["contract"] == "reduction" and report["executed"]
            if options.get("norm") == "triton":
                assert report["norm_silu_kernel_calls"] == 11  # 5 resnets (conv_in one of them) x 2 + the head
        assert fingerprint(vae) == before
        assert all(p.is_contiguous() for p in vae.parameters()), "channels_last left a weight relaid"


def test_fused_vae_decode_ltx2_falls_back_or_refuses(rng):
    """A tiled decode runs diffusers' own (counted); a timestep-conditioned decoder, noise injection or a padding
    mode the path does not write are refused at prepare."""
    model = ltx2.tiny(0)
    vae = model.pipeline.vae  # spatial compression 2: latent tiles of 4 x 4, every 2
    vae.enable_tiling(tile_sample_min_height=8, tile_sample_min_width=8, tile_sample_stride_height=4,
                      tile_sample_stride_width=4)  # fmt: skip
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    z = torch.randn(1, 4, 2, 6, 6, generator=g)
    want, _ = _decode(model, None, z)
    got, report = _decode(model, {}, z)
    assert torch.equal(got, want)
    assert not report["executed"] and report["fallbacks"] == {"tiled decode: diffusers' own": 1}
    for config, match in (
        ({"timestep_conditioning": True}, "timestep-conditioned"),
        ({"decoder_inject_noise": (True, False, False, False)}, "injects noise"),
        ({"decoder_spatial_padding_mode": "replicate"}, "pads with 'replicate'"),
    ):
        with pytest.raises(RuntimeError, match=f"fused_vae_decode: .*{match}"):
            SPEC.prepare(_wide_ltx2(0, torch.float32, False, **config), {}, CPU)
