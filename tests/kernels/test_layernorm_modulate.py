"""layernorm_modulate (contract: reduction): the fp32 LayerNorm's row statistics are summed in another order than
torch's, so the kernel is compared with a float64 ground truth of the chain, next to torch's own op sequence; the
residual sum and everything after the statistics are torch's (checked bit for bit where the statistics are exact)."""

import pytest
import torch

from workbench.kernels.layernorm_modulate import (
    MAX_C,
    add_layernorm_modulate,
    add_reference,
    cost,
    layernorm_modulate,
    reference,
)

SHAPES = [(1, 1, 24), (3, 7, 33), (1, 19, 1536), (2, 151, 70)]  # the last: several programs
DTYPES = [torch.bfloat16, torch.float32, torch.float16]
# norm1, norm2, norm3 of Wan (norm3 also with Wan2.2 TI2V's per-token scale/shift), and a residual add before an
# affine norm
ULP32 = torch.finfo(torch.float32).eps  # 2^-23
FORMS = ["modulate", "affine", "residual_modulate", "residual_modulate_per_token", "residual_affine"]


def _inputs(rng, shape, dtype, form):
    """x a non-contiguous view with a different mean per row; the residual a strided slice; scale/shift strided
    chunks of a Wan-like (B, 6, C) or (B, T, 6, C) table; weight/bias fp32 as FP32LayerNorm keeps them."""
    b, t, c = shape
    x = (torch.randn(b, c, t, generator=rng) * 3 + 4 * torch.randn(b, 1, t, generator=rng)).to(dtype).transpose(1, 2)
    norm = {}
    if form.endswith("affine"):
        norm["weight"] = 1 + 0.3 * torch.randn(c, generator=rng)
        norm["bias"] = 0.2 * torch.randn(c, generator=rng)
    else:
        table = torch.randn(b, t if form.endswith("per_token") else 1, 6, c, generator=rng) * 0.5 + 0.01
        norm["shift"], norm["scale"] = table[:, :, 3], table[:, :, 4]
    residual = (torch.randn(b, t, 2 * c, generator=rng) * 2 + 0.1).to(dtype)[..., c:] if "residual" in form else None
    return x, residual, norm


def _errors(got: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - truth
    return diff.abs().max().item(), (diff.norm() / truth.norm()).item()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
def test_layernorm_modulate_kernel_error_bound_against_float64(rng, shape, dtype, form):
    """Contract `reduction`: error vs the float64 chain at most 2x torch's own, plus 2 fp32 ulps (of the output
    scale for max-abs; relative for L2: it matters only where torch's own fp32 error is zero by luck, one short
    row); the residual sum is torch's `x + r` bit for bit, and the ground truth starts from that (rounded) sum."""
    x, residual, norm = _inputs(rng, shape, dtype, form)
    eps = 1e-6
    if residual is None:
        got = layernorm_modulate(x, eps, **norm)
        want = reference(x, eps, **norm)
        start = x
    else:
        summed, got = add_layernorm_modulate(x, residual, eps, **norm)
        want_sum, want = add_reference(x, residual, eps, **norm)
        assert summed.dtype == dtype and summed.is_contiguous()
        assert torch.equal(summed, want_sum), f"seed {rng.initial_seed()}: {(summed != want_sum).sum()} sums differ"
        start = summed
    truth = reference(start.double(), eps, **{k: v.double() for k, v in norm.items()}, out_dtype=torch.float64)
    assert got.dtype == dtype and got.shape == x.shape and got.is_contiguous()
    (k_max, k_rel), (t_max, t_rel) = _errors(got, truth), _errors(want, truth)
    message = (
        f"seed {rng.initial_seed()}: kernel max {k_max:.3e} rel {k_rel:.3e}; torch max {t_max:.3e} rel {t_rel:.3e}"
    )
    assert k_max <= 2 * t_max + 2 * ULP32 * truth.abs().max().item(), message
    assert k_rel <= 2 * t_rel + 2 * ULP32, message
    if dtype != torch.float32:  # an ulp of rstd rarely moves a bf16/fp16 result: mostly bit-equal to torch
        assert (got == want).float().mean().item() > 0.5, message


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layernorm_modulate_kernel_is_torchs_op_sequence_after_exact_statistics(rng, dtype):
    # rows of +-2^k in equal numbers: mean 0, var 4^k and (eps 0) rstd 2^-k are exact in both, so every
    # difference would come from the ops after the statistics (affine, modulation, one rounding; no FMA)
    b, t, c = 2, 8, 48  # no padded rows: their 0 / 0 under eps 0 would only warn
    signs = torch.randint(0, 2, (b, t, c // 2), generator=rng) * 2 - 1.0
    powers = 2.0 ** torch.randint(-3, 4, (b, t, 1), generator=rng)
    x = (torch.cat([signs, -signs], dim=-1) * powers).to(dtype)
    weight = 1 + 0.3 * torch.randn(c, generator=rng)
    bias = 0.2 * torch.randn(c, generator=rng)
    scale, shift = (torch.randn(b, 2, c, generator=rng) * 0.7).chunk(2, dim=1)
    for norm in ({"weight": weight, "bias": bias}, {"scale": scale, "shift": shift}):
        got = layernorm_modulate(x, 0.0, **norm)
        assert torch.equal(got, reference(x, 0.0, **norm)), f"seed {rng.initial_seed()}: {sorted(norm)}"
    got = layernorm_modulate(x, 0.0, weight, bias, scale, shift, torch.float32)
    want = reference(x, 0.0, weight, bias, scale, shift, torch.float32)
    affine = (x.double() / powers.double() * weight.double() + bias.double()).float()  # exact, then one rounding
    fma = (affine.double() * (1 + scale).double() + shift.double()).float()  # product and sum rounded once
    assert not torch.equal(fma, want), f"seed {rng.initial_seed()}: no FMA separation"
    assert torch.equal(got, want), f"seed {rng.initial_seed()}: {(got != want).sum()} elements differ"


def test_layernorm_modulate_kernel_out_dtype_and_empty(rng):
    x = torch.randn(2, 5, 24, generator=rng).bfloat16()
    scale, shift = torch.randn(2, 2, 24, generator=rng).chunk(2, dim=1)
    got = layernorm_modulate(x, 1e-6, scale=scale, shift=shift, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    truth = reference(x.double(), 1e-6, scale=scale.double(), shift=shift.double())
    want = reference(x, 1e-6, scale=scale, shift=shift, out_dtype=torch.float32)
    assert _errors(got, truth)[0] <= 2 * _errors(want, truth)[0] + 2 * ULP32 * truth.abs().max().item()
    empty = torch.randn(2, 0, 24).bfloat16()
    summed, out = add_layernorm_modulate(empty, empty, 1e-6)
    assert summed.shape == out.shape == (2, 0, 24)


def _good(rng):
    x = torch.randn(2, 3, 5, generator=rng).bfloat16()
    s = torch.randn(2, 1, 5, generator=rng)
    return {"x": x, "residual": x.clone(), "eps": 1e-6, "weight": torch.ones(5), "scale": s, "shift": s.clone()}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"x": torch.ones(2, 3, 5, dtype=torch.float64)}, r"add_layernorm_modulate: x has dtype torch.float64"),
        ({"x": torch.ones(3, 5).bfloat16()}, r"add_layernorm_modulate: x must be \(B, T, C\), got shape \(3, 5\)"),
        ({"x": torch.ones(1, 1, MAX_C + 1).bfloat16()}, rf"add_layernorm_modulate: x has C={MAX_C + 1} channels"),
        ({"residual": torch.ones(2, 3, 5)}, r"add_layernorm_modulate: residual has dtype torch.float32"),
        ({"residual": torch.ones(2, 3, 4).bfloat16()}, r"add_layernorm_modulate: residual has shape \(2, 3, 4\)"),
        ({"weight": torch.ones(4)}, r"add_layernorm_modulate: weight has shape \(4,\); expected \(5,\)"),
        ({"bias": torch.ones(5).int()}, r"add_layernorm_modulate: bias has dtype torch.int32"),
        ({"scale": None}, r"add_layernorm_modulate: scale and shift go together; got only shift"),
        ({"scale": torch.ones(2, 1, 5).bfloat16()}, r"add_layernorm_modulate: scale has dtype torch.bfloat16"),
        ({"shift": torch.ones(1, 1, 5)}, r"add_layernorm_modulate: shift has shape \(1, 1, 5\); expected"),
        ({"eps": -1.0}, r"add_layernorm_modulate: eps must be a number >= 0, got -1.0"),
        ({"eps": "1e-6"}, r"add_layernorm_modulate: eps must be a number >= 0, got '1e-6'"),
        ({"out_dtype": torch.int8}, r"add_layernorm_modulate: out_dtype torch.int8"),
    ],
)
def test_layernorm_modulate_kernel_bad_input_raises(rng, change, message):
    args = {**_good(rng), **change}  # x is checked before the residual
    with pytest.raises(ValueError, match=message):
        add_layernorm_modulate(**args)


def test_layernorm_modulate_kernel_on_cpu_without_interpreter_is_runtime_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        layernorm_modulate(torch.ones(1, 2, 3), 1e-6)


def test_layernorm_modulate_kernel_cost_is_sensible():
    shape, elements = (1, 32760, 1536), 32760 * 1536
    assert cost(shape, torch.bfloat16) == (elements * 4 + 2 * 1536 * 4, 9 * elements)
    assert cost(shape, torch.bfloat16, residual=True) == (elements * 8 + 2 * 1536 * 4, 10 * elements)
    assert cost(shape, torch.bfloat16, affine=True, modulate=False) == (elements * 4 + 2 * 1536 * 4, 8 * elements)
    assert cost(shape, torch.float32)[0] > cost(shape, torch.bfloat16)[0]
    assert cost(shape, per_token=True)[0] == elements * 4 + 2 * elements * 4
