"""attention_quantize: the Triton quantizer equals its torch reference bit for bit (int8 and e4m3 values, scales,
the key mean and v's transposed e4m3 or int8 copy) under the Triton CPU interpreter, and compiled at its shipped launch
on a GPU (gpu marker), on odd lengths and strided views."""

import pytest
import torch

from workbench.kernels.attention_quantize import (
    FP8,
    P_TOP,
    QUANT_BLOCK,
    _reciprocal,
    _v_scale,
    cost,
    quantize,
    quantize_reference,
    v_in_key_order,
    v_slot,
)

D = 128


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.dtype == FP8 else x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_bitwise_equal_reference(rng, dtype):
    """q a (B, T, H, D) dispatcher view of odd length, k a strided slice with a common offset (smoothing matters)
    and values spanning e4m3's subnormals, v with per-channel gains; every (qk, pv) pair."""
    _check_bitwise_equal_reference(rng, dtype, torch.device("cpu"))
    assert cost((1, 12, 32760, D)) == cost((1, 12, 32760, D), "int8") == 12 * 32760 * D * (3 * 2 + 3)


@pytest.mark.gpu
def test_quantize_compiled_bitwise_equal_reference_on_gpu(monkeypatch, rng):
    """The same on a GPU: the compiled kernel at its shipped launch (QUANT_WARPS), bf16."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _check_bitwise_equal_reference(rng, torch.bfloat16, torch.device("cuda"))


def _check_bitwise_equal_reference(rng, dtype: torch.dtype, device: torch.device) -> None:
    seed = rng.initial_seed()
    q = torch.randn(2, 203, 2, D, generator=rng).to(device, dtype).transpose(1, 2)  # (2, 2, 203, D), token stride 2*D
    k = (torch.randn(2, 2, 2 * 171, D, generator=rng) + 3.0 * torch.randn(2, 2, 1, D, generator=rng))[:, :, ::2]
    k = k.to(device, dtype)  # (2, 2, 171, D), every other token of the draw
    v = (torch.randn(2, 2, 171, D, generator=rng) * torch.rand(D, generator=rng).exp2()).to(device, dtype)
    for qk in ("int8", "e4m3"):
        for pv in ("fp8", "bf16", "int8"):
            got, want = quantize(q, k, v, pv, qk=qk), quantize_reference(q, k, v, pv, qk=qk)
            assert got.q8.dtype == want.q8.dtype == (torch.int8 if qk == "int8" else FP8)
            assert got.q8.shape == (2, 2, 2 * QUANT_BLOCK, D) and got.k8.shape == (2, 2, 2 * QUANT_BLOCK, D)
            for name in ("q8", "q_scale", "k8", "k_scale", "v", "v_scale", "k_mean"):
                a, b = getattr(got, name), getattr(want, name)
                if b is None:
                    assert a is None, (qk, pv, name)
                    continue
                assert a.shape == b.shape and a.dtype == b.dtype, (qk, pv, name, a.shape, b.shape)
                differ = (_bits(a) != _bits(b)).sum().item()
                assert differ == 0, f"seed {seed}, {qk}/{pv}: {name} differs in {differ} of {a.numel()}"
            assert (got.k8[:, :, 171:] == 0).all() and (got.q8[:, :, 203:] == 0).all(), f"seed {seed}: padding"
            if pv != "bf16":  # in token order: v's per-channel one-byte values, then zero padding
                keys = v_in_key_order(got.v, 2 * QUANT_BLOCK)
                assert (keys[..., 171:].view(torch.uint8) == 0).all(), f"seed {seed}: v padding"
                scale = _v_scale(v.float().abs().amax(2), pv)[:, :, None]
                values = (v.float() * _reciprocal(scale)).clamp(-P_TOP[pv], P_TOP[pv])
                values = values.round().to(torch.int8) if pv == "int8" else values.to(FP8)
                assert torch.equal(_bits(keys[..., :171]), _bits(values.transpose(-1, -2))), f"seed {seed}: v order"
                assert (keys[..., :171].float() != 0).float().mean() > 0.9, f"seed {seed}: v8 mostly zero"


def test_v_slot_permutes_each_group_of_32():
    """v_slot maps each group of 32 keys onto itself, one key a slot: keys 16g + 8h + 2t + e to 16g + 4t + 2h + e."""
    keys = torch.arange(256)
    slots = v_slot(keys)
    assert torch.equal(slots // 32, keys // 32) and torch.equal(slots.sort().values, keys)
    assert v_slot(torch.tensor([8, 2, 9, 31])).tolist() == [2, 4, 3, 31]
