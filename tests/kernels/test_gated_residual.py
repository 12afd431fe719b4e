import pytest
import torch

from workbench.kernels.gated_residual import (
    cost,
    gated_residual,
    gated_residual_in_dtype,
    reference,
    reference_in_dtype,
)

SHAPES = [(1, 1, 1), (2, 9, 35), (3, 17, 129), (2, 150, 70)]  # the last: several row programs under the interpreter too
DTYPES = [torch.bfloat16, torch.float32, torch.float16]


def _inputs(rng, shape, x_dtype, y_dtype, per_token):
    b, t, c = shape
    x = (torch.randn(b, c, t, generator=rng) * 3 + 0.1).to(x_dtype).transpose(1, 2)  # non-contiguous
    y = (torch.randn(b, t, c, generator=rng) + 0.1).to(y_dtype)
    if per_token:
        gate = (torch.randn(b, t, 6, c, generator=rng) + 0.01)[:, :, 2]
    else:
        gate = (torch.randn(b, 6, c, generator=rng) + 0.01).chunk(6, dim=1)[2]
    return x, y, gate


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("y_kind", ["same", "float32"])
@pytest.mark.parametrize("per_token", [False, True])
def test_gated_residual_matches_reference_bitwise(rng, shape, x_dtype, y_kind, per_token):
    y_dtype = x_dtype if y_kind == "same" else torch.float32
    x, y, gate = _inputs(rng, shape, x_dtype, y_dtype, per_token)
    got = gated_residual(x, y, gate)
    want = reference(x, y, gate)
    assert got.dtype == x_dtype and got.shape == want.shape
    assert torch.equal(got, want), f"seed {rng.initial_seed()}: {(got != want).sum()} elements differ"


def test_gated_residual_ff_form_is_the_same_value(rng):
    # Wan's FFN residual writes `ff_output.float() * gate`; the kernel takes `ff_output` itself
    x, y, gate = _inputs(rng, (2, 11, 40), torch.bfloat16, torch.bfloat16, per_token=False)
    ff_form = (x.float() + y.float() * gate).type_as(x)
    assert torch.equal(gated_residual(x, y, gate), ff_form), f"seed {rng.initial_seed()}"


def test_gated_residual_is_not_a_fused_multiply_add(rng):
    x, y, gate = _inputs(rng, (2, 16, 64), torch.float32, torch.float32, per_token=False)
    fma = (x.double() + y.double() * gate.double()).float()
    want = reference(x, y, gate)
    assert not torch.equal(fma, want), f"seed {rng.initial_seed()}: inputs do not separate FMA from mul+add"
    assert torch.equal(gated_residual(x, y, gate), want), f"seed {rng.initial_seed()}"


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda x, y, g: (x.double(), y, g), r"gated_residual: x has dtype torch.float64"),
        (lambda x, y, g: (x, y.int(), g), r"gated_residual: y has dtype torch.int32"),
        (lambda x, y, g: (x, y, g.bfloat16()), r"gated_residual: gate has dtype torch.bfloat16"),
        (lambda x, y, g: (x, y[:, :2], g), r"gated_residual: y has shape \(2, 2, 5\)"),
        (lambda x, y, g: (x[0], y[0], g), r"gated_residual: x must be \(B, T, C\)"),
        (lambda x, y, g: (x, y, g[:, :, :4]), r"gated_residual: gate has shape \(2, 1, 4\)"),
    ],
)
def test_gated_residual_bad_input_raises(rng, args, message):
    x = torch.randn(2, 3, 5, generator=rng)
    y = torch.randn(2, 3, 5, generator=rng)
    g = torch.randn(2, 1, 5, generator=rng)
    with pytest.raises(ValueError, match=message):
        gated_residual(*args(x, y, g))


def _in_dtype_inputs(rng, shape, dtype, mode):
    b, t, c = shape
    x = (torch.randn(b, c, t, generator=rng) * 3 + 0.1).to(dtype).transpose(1, 2)  # non-contiguous
    y = (torch.randn(b, t, c, generator=rng) + 0.1).to(dtype)
    index = None
    if mode == "index":  # an H3-like (R, 6 * C) table read per token
        gate = (torch.randn(5, 6 * c, generator=rng) + 0.01).to(dtype).chunk(6, dim=-1)[2]
        index = torch.randint(0, 5, (t,), generator=rng, dtype=torch.int32)
    else:  # an LTX-2-like (B, T', 6, C) table
        per = t if mode == "per_token" else 1
        gate = (torch.randn(b, per, 6, c, generator=rng) + 0.01).to(dtype).unbind(dim=2)[2]
    return x, y, gate, index


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["broadcast", "per_token", "index"])
def test_gated_residual_in_dtype_matches_reference_bitwise(rng, shape, dtype, mode):
    x, y, gate, index = _in_dtype_inputs(rng, shape, dtype, mode)
    got = gated_residual_in_dtype(x, y, gate, index)
    want = reference_in_dtype(x, y, gate, index)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want), f"seed {rng.initial_seed()}: {(got != want).sum()} elements differ"
    # H3 writes `gate * y`: IEEE products commute, so the same kernel serves both spellings
    if index is None:
        assert torch.equal(got, x + gate * y), f"seed {rng.initial_seed()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gated_residual_in_dtype_rounds_the_product(rng, dtype):
    x, y, gate, _ = _in_dtype_inputs(rng, (2, 33, 96), dtype, "per_token")
    once = gated_residual(x, y, gate.float())  # fp32 product, one rounding at the end (the Wan form)
    want = reference_in_dtype(x, y, gate)
    assert not torch.equal(once, want), f"seed {rng.initial_seed()}: inputs do not separate the two orders"
    assert torch.equal(gated_residual_in_dtype(x, y, gate), want), f"seed {rng.initial_seed()}"


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda x, g, i: (x, x.float(), g, None), r"gated_residual_in_dtype: y has dtype torch.float32"),
        (lambda x, g, i: (x, x, g.float(), i), r"gated_residual_in_dtype: gate has dtype torch.float32"),
        (lambda x, g, i: (x, x, g[:, :2], i), r"gated_residual_in_dtype: gate has shape \(4, 2\); with an index"),
        (lambda x, g, i: (x, x, g, i[None]), r"gated_residual_in_dtype: index has shape \(1, 3\)"),
    ],
)
def test_gated_residual_in_dtype_bad_input_raises(rng, args, message):
    x = torch.randn(2, 3, 5, generator=rng).bfloat16()
    table = torch.randn(4, 5, generator=rng).bfloat16()
    index = torch.randint(0, 4, (3,), generator=rng)
    with pytest.raises(ValueError, match=message):
        gated_residual_in_dtype(*args(x, table, index))


def test_gated_residual_cost_is_sensible():
    bytes_moved, flops = cost((2, 75600, 5120), torch.bfloat16)
    elements = 2 * 75600 * 5120
    assert bytes_moved == elements * 6 + 2 * 5120 * 4 and flops == 2 * elements
    assert cost((1, 4, 8), torch.bfloat16, torch.float32)[0] > cost((1, 4, 8), torch.bfloat16)[0] > 0
