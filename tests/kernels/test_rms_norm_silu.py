"""rms_norm_silu against diffusers' WanRMS_norm + SiLU and pixel_norm_silu against LTX-2's PerChannelRMSNorm + SiLU
(contract reduction): in bf16/fp16 every element within 4 eps * (|torch| + |terms|) (a normed value an ulp off can round
to two ulps off after the products; `terms` = |normed * scale * gamma| + |bias|, the size of what the affine sums, so an
output near zero by cancellation with the bias is held to the rounding of its terms), in fp32 within 16 eps; NCDHW, channels_last_3d and a strided output view, under the
Triton interpreter."""

import pytest
import torch

from workbench.kernels.rms_norm_silu import cost, pixel_norm_reference, pixel_norm_silu, reference, rms_norm_silu


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _ulps(got: torch.Tensor, want: torch.Tensor, terms: torch.Tensor | float = 0.0) -> torch.Tensor:
    """|got - want| in units of eps * (|want| + terms) (`terms`: the magnitude of what was summed into `want`)."""
    spacing = torch.finfo(want.dtype).eps * (want.float().abs() + terms).clamp_min(torch.finfo(want.dtype).tiny)
    return (got.float() - want.float()).abs() / spacing


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["ncdhw", "channels_last", "into_buffer"])
def test_rms_norm_silu_within_one_ulp_of_reference(rng, dtype, layout):
    g = rng
    c = 37 if layout == "ncdhw" else 96
    x = (torch.randn(2, c, 3, 5, 7, generator=g) * 3 + 0.2).to(dtype)
    gamma = (torch.randn(c, 1, 1, 1, generator=g) * 0.5 + 1).to(dtype)
    bias = (torch.randn(c, 1, 1, 1, generator=g) * 0.1).to(dtype) if dtype == torch.float16 else 0.0
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    out = None
    if layout == "into_buffer":  # the interior of a zero-bordered conv buffer, channels-last
        buffer = torch.zeros(2, c, 5, 7, 9, dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
        out = buffer[:, :, 2:, 1:-1, 1:-1]
    got = rms_norm_silu(x, gamma, bias, out=out)
    want = reference(x, gamma, bias)
    assert got.shape == want.shape and got.dtype == dtype
    bound = 16.0 if dtype == torch.float32 else 4.0
    normed = torch.nn.functional.normalize(x.float(), dim=1) * c**0.5
    terms = (normed * gamma.float()).abs() + (bias.float().abs() if isinstance(bias, torch.Tensor) else 0.0)
    assert _ulps(got, want, terms).max() <= bound, f"seed {g.initial_seed()}"
    if layout == "into_buffer":
        assert got.data_ptr() == out.data_ptr() and torch.equal(buffer[:, :, 2:, 1:-1, 1:-1], got)
        border = buffer.clone()
        border[:, :, 2:, 1:-1, 1:-1] = 0
        assert not border.any(), "wrote outside the view"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_pixel_norm_silu_within_ulps_of_reference(rng, dtype):
    """Every element within 4 eps * (|torch| + |x / rms|): an ulp or two of the normed value v (the mean summed in
    another order), through SiLU's slope (at most 1.1), whose relative condition grows with |v| for negative v.
    NCDHW into a new tensor and channels_last_3d into a buffer's interior; in bf16/fp32 a tenth of the positions at
    1e-5 of the scale, where the eps inside the root counts (fp16's squares would underflow to 0 / 0 there, as
    torch's do)."""
    g = rng
    for layout, c in (("ncdhw", 37), ("into_buffer", 128)):
        x = torch.randn(2, c, 3, 5, 7, generator=g) * 3 + 0.2
        if dtype != torch.float16:
            x[..., ::10] *= 1e-5
        x, out = x.to(dtype), None
        if layout == "into_buffer":
            x = x.contiguous(memory_format=torch.channels_last_3d)
            buffer = torch.zeros(2, c, 5, 7, 9, dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
            out = buffer[:, :, 2:, 1:-1, 1:-1]
        got = pixel_norm_silu(x, out=out)
        want = pixel_norm_reference(x).double()
        normed = x.double() / (x.double().pow(2).mean(1, keepdim=True) + 1e-8).sqrt()
        scale = torch.finfo(dtype).eps * (want.abs() + normed.abs())
        assert ((got.double() - want).abs() <= 4 * scale).all(), f"{layout} seed {g.initial_seed()}"
        if out is not None:
            assert got.data_ptr() == out.data_ptr()
            border = buffer.clone()
            border[:, :, 2:, 1:-1, 1:-1] = 0
            assert not border.any(), "wrote outside the view"


def test_rms_norm_silu_bad_input_raises():
    x = torch.randn(1, 4, 1, 2, 2)
    with pytest.raises(ValueError, match=r"x must be \(B, C, T, H, W\)"):
        rms_norm_silu(x[0], torch.ones(4))
    with pytest.raises(ValueError, match=r"gamma has shape \(3,\); expected \(4,\)"):
        rms_norm_silu(x, torch.ones(3))
    with pytest.raises(ValueError, match="out"):
        rms_norm_silu(x, torch.ones(4), out=torch.empty(1, 4, 1, 2, 3))
    with pytest.raises(ValueError, match="x has dtype torch.float64"):
        rms_norm_silu(x.double(), torch.ones(4))
    with pytest.raises(ValueError, match=r"pixel_norm_silu: eps is -1.0; allowed: a number >= 0"):
        pixel_norm_silu(x, eps=-1.0)
    with pytest.raises(ValueError, match=r"pixel_norm_silu: x has 4096 channels"):
        pixel_norm_silu(torch.randn(1, 4096, 1, 1, 1))
    assert cost((1, 96, 4, 480, 832)) == (2 * 96 * 4 * 480 * 832 * 2, 12 * 96 * 4 * 480 * 832)
