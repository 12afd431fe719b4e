"""GELU-tanh is not claimed bit-equal (tanh's last bits belong to the library): these tests bound the distance to
torch and how often it differs (the module's `excess` and `DIFFER_FRACTION`), for every launch in CANDIDATES, so a
change in either shows up. The interpreter has no libdevice, so both `tanh` options run the exp2 form here; their
GPU side is benchmarks/norm_kernels_gpu.py's check against CUDA's torch."""

import pytest
import torch

from workbench.kernels.gelu_tanh import (
    CANDIDATES,
    DIFFER_FRACTION,
    LaunchConfig,
    cost,
    excess,
    gelu_tanh,
    reference,
)

DTYPES = [torch.bfloat16, torch.float32, torch.float16]


def _randn(rng, shape, dtype):
    return (torch.randn(*shape, generator=rng) * 3 + 0.05).to(dtype)


def _check(rng, x, **launch):
    """gelu_tanh(x, **launch) within the contract against torch; returns it."""
    got = gelu_tanh(x, **launch)
    want = reference(x)
    assert got.dtype == x.dtype and got.shape == want.shape and got.is_contiguous()
    error, differ = excess(x, got, want), (got != want).float().mean().item()
    message = f"seed {rng.initial_seed()}, {launch}: error {error:.3f} x the bound, {differ:.3%} of elements differ"
    assert error <= 1, message
    assert x.numel() < 1000 or differ <= DIFFER_FRACTION[x.dtype], message
    return got


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CANDIDATES))
def test_gelu_tanh_kernel_every_candidate_matches_reference_within_bound(rng, name, dtype):
    """11,931 elements (a multiple of no block: several programs, the last one masked) contiguous and as a
    transposed view (the strided launch), with and without kappa_fma."""
    config = CANDIDATES[name]
    for x in (_randn(rng, (3, 41, 97), dtype), _randn(rng, (2, 97, 61), dtype).transpose(1, 2)):
        for kappa_fma in (False, True):
            got = _check(rng, x, kappa_fma=kappa_fma, config=config)
            # the interpreter runs one op sequence for every launch: the launch changes only which program
            # computes an element, so a difference here would be an indexing error
            assert torch.equal(got, gelu_tanh(x, kappa_fma=kappa_fma)), f"seed {rng.initial_seed()}: {name}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (4099,), (33, 65), (2, 13, 130)])
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("kappa_fma", [False, True])
def test_gelu_tanh_kernel_matches_reference_within_bound(rng, dtype, shape, contiguous, kappa_fma):
    """DEFAULT on 1-D to 3-D inputs; non-contiguous: a stride-2 slice (1-D) or the last two dims transposed."""
    if contiguous:
        x = _randn(rng, shape, dtype)
    elif len(shape) == 1:
        x = _randn(rng, (2 * shape[0],), dtype)[::2]
    else:
        x = _randn(rng, shape, dtype).transpose(-1, -2)
    _check(rng, x, kappa_fma=kappa_fma)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # x**3 of 1e20: the point of the test
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # -inf * 0, as torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tanh", ["libdevice", "exp2"])
def test_gelu_tanh_kernel_special_values_match_torch(dtype, tanh):
    """Signed zeros (gelu of a large negative x is -0.0, as torch's 0.5 * x * (1 + -1)), infinities, x**3
    overflowing, NaN: the same values as torch (a NaN's sign and payload are outside the contract)."""
    values = [0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 1e4, -1e4, 1e20, -1e20, 3e38, -3e38]
    x = torch.tensor(values + [float("inf"), float("-inf"), float("nan")]).to(dtype)
    got, want = gelu_tanh(x, config=LaunchConfig(tanh=tanh)), reference(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    numbers = ~want.isnan()
    assert torch.equal(got[numbers].signbit(), want[numbers].signbit()), (got, want)


def test_gelu_tanh_kernel_empty_input_gives_empty_output():
    got = gelu_tanh(torch.empty(0, 5, dtype=torch.bfloat16))
    assert got.shape == (0, 5) and got.dtype == torch.bfloat16


def test_gelu_tanh_kernel_bad_input_raises():
    with pytest.raises(ValueError, match="gelu_tanh: x has dtype torch.int64"):
        gelu_tanh(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"gelu_tanh: x must have 1 to 3 dimensions, got shape \(1, 1, 1, 2\)"):
        gelu_tanh(torch.ones(1, 1, 1, 2))
    with pytest.raises(ValueError, match="gelu_tanh: config must be a LaunchConfig or None, got dict"):
        gelu_tanh(torch.ones(3), config={"block": 1024})


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("block", 1000, "a power of two from 128 to 65536"),
        ("block", 64, "a power of two from 128 to 65536"),
        ("block", 4096.0, "a power of two from 128 to 65536"),
        ("num_warps", 3, "allowed: 1, 2, 4, 8, 16"),
        ("num_warps", True, "allowed: 1, 2, 4, 8, 16"),
        ("tanh", "approx", r"allowed: \['libdevice', 'exp2'\]"),
        ("flat", 1, "allowed: True, False"),
        ("index64", "no", "allowed: True, False"),
    ],
)
def test_gelu_tanh_kernel_bad_config_raises(field, value, allowed):
    with pytest.raises(ValueError, match=rf"LaunchConfig\.{field}: {value!r}; .*{allowed}"):
        LaunchConfig(**{field: value})


def test_gelu_tanh_kernel_cost_is_sensible():
    bytes_moved, flops = cost((2, 75600, 13824), torch.bfloat16)
    assert bytes_moved == 4 * 2 * 75600 * 13824 and flops > bytes_moved / 4 > 0
