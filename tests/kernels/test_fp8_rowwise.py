"""fp8_rowwise: the row-wise FP8 quantization kernel equals its torch recipe bit for bit (scales and e4m3 bytes)
under the Triton CPU interpreter; the FP8 GEMM itself runs only on a GPU (gpu-marked test)."""

import pytest
import torch

from workbench.kernels.fp8_rowwise import BLOCK_K, FP8, fp8_linear, quantize_rows, reference


@pytest.mark.parametrize("shape", [(5, 16), (3, 48), (2, BLOCK_K + 32), (1, 2 * BLOCK_K)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_rowwise_quantize_rows_equals_reference_bitwise(rng, shape, dtype):
    m, k = shape
    # a wider buffer seen through its first k columns (row stride > k), rows of very different magnitudes
    x = (torch.randn(m, k + 16, generator=rng) * torch.logspace(-3, 3, m)[:, None]).to(dtype)[:, :k]
    x[0, :] = 0.0  # an all-zero row: the EPS scale, zeros out
    q, scale = quantize_rows(x)
    want_q, want_scale = reference(x)
    assert q.dtype == FP8 and q.shape == (m, k) and q.is_contiguous() and scale.shape == (m, 1)
    assert torch.equal(scale, want_scale), f"seed {rng.initial_seed()}"
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), f"seed {rng.initial_seed()}"
    # each row's largest magnitude maps to +-448 (up to the scale's own rounding)
    peak = q[1:].float().abs().amax(dim=1)
    assert torch.all((peak >= 416) & (peak <= 448)), peak


def test_fp8_rowwise_refuses_bad_inputs(rng):
    x = torch.randn(4, 32, generator=rng)
    with pytest.raises(ValueError, match=r"quantize_rows: x must be \(M, K\) with unit last stride and K a multiple"):
        quantize_rows(x[:, :24])
    with pytest.raises(ValueError, match=r"unit last stride"):
        quantize_rows(x.t())
    with pytest.raises(ValueError, match=r"quantize_rows: x has dtype torch.float16"):
        quantize_rows(x.half())


def _linear_close_to_bf16(device, g):
    x = torch.randn(3, 77, 256, device=device, generator=g).bfloat16()
    weight = (torch.randn(512, 256, device=device, generator=g) / 16).bfloat16()
    bias = torch.randn(512, device=device, generator=g).bfloat16()
    want = torch.nn.functional.linear(x, weight, bias).float()
    q, s = quantize_rows(weight)
    got = fp8_linear(x, q, s, bias)
    assert got.shape == (3, 77, 512) and got.dtype == torch.bfloat16
    assert float((got.float() - want).norm() / want.norm()) < 0.05


def test_fp8_rowwise_linear_close_to_bf16_on_cpu(rng):
    _linear_close_to_bf16("cpu", rng)  # torch's CPU _scaled_mm; the kernel under the interpreter


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs CUDA sm >= 8.9"
)
def test_fp8_rowwise_linear_close_to_bf16_on_gpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")  # compiled: the e4m3 cast in the kernel (tests/kernels/conftest.py sets it)
    _linear_close_to_bf16("cuda", torch.Generator(device="cuda").manual_seed(0))
