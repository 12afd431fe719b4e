"""rms_norm_silu against diffusers' WanRMS_norm + SiLU (contract reduction): in bf16/fp16 every element within 4 eps
* |torch| (a normed value an ulp off can round to two ulps off after the products), in fp32 within 16 eps * |torch|; NCDHW,
channels_last_3d and a strided output view, under the Triton interpreter."""

import pytest
import torch

from workbench.kernels.rms_norm_silu import cost, reference, rms_norm_silu


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of eps * |want| (at least one ulp of `want` in its dtype, at most two)."""
    spacing = torch.finfo(want.dtype).eps * want.float().abs().clamp_min(torch.finfo(want.dtype).tiny)
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
    assert _ulps(got, want).max() <= bound, f"seed {g.initial_seed()}"
    if layout == "into_buffer":
        assert got.data_ptr() == out.data_ptr() and torch.equal(buffer[:, :, 2:, 1:-1, 1:-1], got)
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
    assert cost((1, 96, 4, 480, 832)) == (2 * 96 * 4 * 480 * 832 * 2, 12 * 96 * 4 * 480 * 832)
