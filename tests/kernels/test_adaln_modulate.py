import pytest
import torch

from workbench.kernels.adaln_modulate import (
    adaln_modulate,
    adaln_modulate_in_dtype,
    cost,
    reference,
    reference_in_dtype,
)

SHAPES = [(1, 1, 1), (2, 7, 33), (3, 19, 130), (2, 150, 70)]  # the last: several row programs under the interpreter too
DTYPES = [torch.bfloat16, torch.float32, torch.float16]


def _inputs(rng, shape, per_token, noncontiguous):
    b, t, c = shape
    n = torch.randn(b, t, c, generator=rng) * 2 + 0.1
    if noncontiguous:  # the norm output as a strided view
        n = (torch.randn(b, c, t, generator=rng) * 2 + 0.1).transpose(1, 2)
    # Wan passes chunks of its (B, 6, C) or (B, T, 6, C) table: strided views
    if per_token:
        table = torch.randn(b, t, 6, c, generator=rng) * 0.5 + 0.01
        shift, scale = table[:, :, 0], table[:, :, 1]
    else:
        table = torch.randn(b, 6, c, generator=rng) * 0.5 + 0.01
        shift, scale = table.chunk(6, dim=1)[:2]
    return n, scale, shift


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_token", [False, True])
def test_adaln_modulate_matches_reference_bitwise(rng, shape, dtype, per_token):
    n, scale, shift = _inputs(rng, shape, per_token, noncontiguous=shape[1] > 1)
    got = adaln_modulate(n, scale, shift, dtype)
    want = reference(n, scale, shift, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want), f"seed {rng.initial_seed()}: {(got != want).sum()} elements differ"


def test_adaln_modulate_is_not_a_fused_multiply_add(rng):
    # the inputs are such that one FMA would round differently from torch's mul-then-add in fp32
    n, scale, shift = _inputs(rng, (2, 16, 64), per_token=False, noncontiguous=False)
    fma = (n.double() * (1 + scale).double() + shift.double()).float()
    want = reference(n, scale, shift, torch.float32)
    assert not torch.equal(fma, want), f"seed {rng.initial_seed()}: inputs do not separate FMA from mul+add"
    assert torch.equal(adaln_modulate(n, scale, shift, torch.float32), want), f"seed {rng.initial_seed()}"


def test_adaln_modulate_bf16_rounds_to_nearest_even_at_ties():
    # exact ties between two bf16 values, both parities, and values that carry into the exponent (NaN bit
    # patterns are outside the contract: torch.equal never equates NaNs, and torch's CPU paths differ)
    n = torch.tensor([[[1.00390625, 1.01171875, 1.99609375, -1.00390625, 255.5]]])
    zero = torch.zeros(1, 1, 5)
    got = adaln_modulate(n, zero, zero, torch.bfloat16)
    want = reference(n, zero, zero, torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda n, s: (n.double(), s, s, torch.bfloat16), r"adaln_modulate: n has dtype torch.float64"),
        (lambda n, s: (n, s.bfloat16(), s, torch.bfloat16), r"adaln_modulate: scale has dtype torch.bfloat16"),
        (lambda n, s: (n, s, s, torch.int8), r"adaln_modulate: out_dtype torch.int8"),
        (lambda n, s: (n[0], s, s, torch.float32), r"adaln_modulate: n must be \(B, T, C\)"),
        (lambda n, s: (n, s[:, :, :3], s, torch.float32), r"adaln_modulate: scale has shape \(2, 1, 3\)"),
        (lambda n, s: (n, s, s[:1], torch.float32), r"adaln_modulate: shift has shape \(1, 1, 5\)"),
    ],
)
def test_adaln_modulate_bad_input_raises(rng, args, message):
    n = torch.randn(2, 3, 5, generator=rng)
    s = torch.randn(2, 1, 5, generator=rng)
    with pytest.raises(ValueError, match=message):
        adaln_modulate(*args(n, s))


def test_adaln_modulate_on_cpu_without_interpreter_is_runtime_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    n = torch.ones(1, 2, 3)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        adaln_modulate(n, n[:, :1], n[:, :1], torch.float32)


def _in_dtype_inputs(rng, shape, dtype, mode):
    """Same-dtype operands: n a strided view; scale/shift strided chunks of an LTX-2-like (B, T', 6, C) table,
    or rows of an H3-like (R, 6 * C) table read through a random per-token index."""
    b, t, c = shape
    n = (torch.randn(b, c, t, generator=rng) * 2 + 0.1).to(dtype).transpose(1, 2)
    index = None
    if mode == "index":
        rows = 7
        table = (torch.randn(rows, 6 * c, generator=rng) * 0.5 + 0.01).to(dtype)
        shift, scale = table.chunk(6, dim=-1)[:2]
        index = torch.randint(0, rows, (t,), generator=rng)
    else:
        per = t if mode == "per_token" else 1
        table = (torch.randn(b, per, 6, c, generator=rng) * 0.5 + 0.01).to(dtype)
        shift, scale = table.unbind(dim=2)[:2]
    return n, scale, shift, index


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["broadcast", "per_token", "index"])
def test_adaln_modulate_in_dtype_matches_reference_bitwise(rng, shape, dtype, mode):
    n, scale, shift, index = _in_dtype_inputs(rng, shape, dtype, mode)
    got = adaln_modulate_in_dtype(n, scale, shift, index)
    want = reference_in_dtype(n, scale, shift, index)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want), f"seed {rng.initial_seed()}: {(got != want).sum()} elements differ"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adaln_modulate_in_dtype_rounds_every_op(rng, dtype):
    # one rounding at the end (the Wan form on upcast operands) differs from torch's same-dtype sequence
    n, scale, shift, _ = _in_dtype_inputs(rng, (2, 33, 96), dtype, "per_token")
    once = adaln_modulate(n.float(), scale.float(), shift.float(), dtype)
    want = reference_in_dtype(n, scale, shift)
    assert not torch.equal(once, want), f"seed {rng.initial_seed()}: inputs do not separate the two orders"
    assert torch.equal(adaln_modulate_in_dtype(n, scale, shift), want), f"seed {rng.initial_seed()}"


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda n, s, i: (n, s.float(), s, None), r"adaln_modulate_in_dtype: scale has dtype torch.float32"),
        (lambda n, s, i: (n.double(), s, s, None), r"adaln_modulate_in_dtype: n has dtype torch.float64"),
        (lambda n, s, i: (n, s, s, None), r"adaln_modulate_in_dtype: scale has shape \(4, 5\); expected \(2, 1, 5\)"),
        (lambda n, s, i: (n, s[:, :3], s, i), r"adaln_modulate_in_dtype: scale has shape \(4, 3\); with an index"),
        (lambda n, s, i: (n, s, s, i.float()), r"adaln_modulate_in_dtype: index has dtype torch.float32"),
        (lambda n, s, i: (n, s, s, i[:2]), r"adaln_modulate_in_dtype: index has shape \(2,\); expected \(3,\)"),
    ],
)
def test_adaln_modulate_in_dtype_bad_input_raises(rng, args, message):
    n = torch.randn(2, 3, 5, generator=rng).bfloat16()
    table = torch.randn(4, 5, generator=rng).bfloat16()
    index = torch.randint(0, 4, (3,), generator=rng)
    with pytest.raises(ValueError, match=message):
        adaln_modulate_in_dtype(*args(n, table, index))


def test_adaln_modulate_cost_is_sensible():
    bytes_moved, flops = cost((2, 75600, 5120), torch.bfloat16)
    elements = 2 * 75600 * 5120
    assert elements * 6 <= bytes_moved <= elements * 6 + 4 * 2 * 5120 * 4 and flops == 3 * elements
    assert cost((1, 8, 16), torch.float32)[0] > cost((1, 8, 16), torch.bfloat16)[0] > 0
    assert cost((2, 75600, 5120), torch.bfloat16, in_dtype=True)[0] == elements * 4 + 4 * 5120 * 2
