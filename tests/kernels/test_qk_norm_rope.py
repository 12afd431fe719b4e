import types

import pytest
import torch
import triton.language as tl

from workbench.kernels.qk_norm_rope import (
    MAX_ROW_TILE,
    _index,
    cost,
    qk_norm_rope,
    reference,
    rope_only,
    rope_reference,
)
from workbench.models.fused.wan import qk_norm_reason

SHAPES = [(1, 151, 2, 16), (1, 127, 2, 128), (2, 33, 3, 6)]  # (B, T, H, D)
# several programs along rows and pairs, also under the interpreter's larger tiles
ROPE_SHAPES = [*SHAPES, (1, 300, 2, 128)]
X_DTYPES = [torch.bfloat16, torch.float32]
FREQ_DTYPES = [torch.float32, torch.float64]


def _freqs(rng, t, d, freqs_dtype, strided=False):
    """Tables shaped like WanRotaryPosEmbed's (1, T, 1, D): random angles, values repeated pairwise."""
    angles = (torch.rand(1, t, 1, d // 2, generator=rng, dtype=torch.float64) * 40).repeat_interleave(2, dim=-1)
    cos, sin = angles.cos().to(freqs_dtype), angles.sin().to(freqs_dtype)
    if strided:  # a non-contiguous view of the same values
        cos = torch.stack([cos, cos], dim=-1)[..., 0]
        sin = torch.stack([sin, sin], dim=-1)[..., 1]
    return cos, sin


def _x4(rng, shape, dtype):
    b, t, h, d = shape
    return (torch.randn(b, t, d, h, generator=rng) * 2 + 0.1).to(dtype).transpose(2, 3)  # non-contiguous


def _x3(rng, shape, dtype):
    b, t, h, d = shape
    return (torch.randn(b, h * d, t, generator=rng) * 3 + 0.2).to(dtype).transpose(1, 2)  # non-contiguous


@pytest.mark.parametrize("shape", ROPE_SHAPES)
@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("freqs_dtype", FREQ_DTYPES)
def test_rope_only_matches_reference_bitwise(rng, shape, x_dtype, freqs_dtype):
    x = _x4(rng, shape, x_dtype)
    cos, sin = _freqs(rng, shape[1], shape[3], freqs_dtype, strided=shape[3] == 16)
    got = rope_only(x, cos, sin)
    want = rope_reference(x, cos, sin)
    assert got.dtype == x_dtype and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want), f"seed {rng.initial_seed()}: {(got != want).sum()} elements differ"


def test_rope_only_uses_cos_at_even_and_sin_at_odd_indices(rng):
    # diffusers reads cos[..., 0::2] and sin[..., 1::2]; tables whose pairs differ catch a swapped index
    shape = (1, 21, 2, 8)
    x = _x4(rng, shape, torch.float32)
    cos = torch.randn(1, 21, 1, 8, generator=rng)
    sin = torch.randn(1, 21, 1, 8, generator=rng)
    assert torch.equal(rope_only(x, cos, sin), rope_reference(x, cos, sin)), f"seed {rng.initial_seed()}"


def test_rope_only_float64_tables_round_through_float32(rng):
    # float64 tables: the arithmetic runs in float64 and the bf16 cast goes through float32, as torch's does
    shape = (1, 199, 2, 64)
    x = _x4(rng, shape, torch.bfloat16)
    cos, sin = _freqs(rng, 199, 64, torch.float64)
    want = rope_reference(x, cos, sin)
    assert torch.equal(rope_only(x, cos, sin), want), f"seed {rng.initial_seed()}"


def _x_view(rng, shape, dtype, layout):
    """x (B, T, H, D) as the plugin may see it, never contiguous: `transposed` (H and D swapped in memory) or
    `fused` (the q slice of a fused (B, T, 3C) projection, unflattened to heads: row stride 3C)."""
    b, t, h, d = shape
    if layout == "transposed":
        return (torch.randn(b, t, d, h, generator=rng) * 2 + 0.1).to(dtype).transpose(2, 3)
    fused = (torch.randn(b, t, 3 * h * d, generator=rng) * 2 + 0.1).to(dtype)
    return fused[..., h * d : 2 * h * d].unflatten(2, (h, d))


def _random_tables(rng, shape, freqs_dtype, per_head):
    """Tables whose every entry differs (a swapped cos/sin or channel index shows): (1, T, 1, D) shared over
    batch and heads, or (B, T, H, D) with `per_head`."""
    b, t, h, d = shape
    size = (b, t, h, d) if per_head else (1, t, 1, d)
    angles = torch.rand(size, generator=rng, dtype=torch.float64) * 40 + 0.1
    return angles.cos().to(freqs_dtype), angles.sin().to(freqs_dtype)


# H = 5: a full group of ROPE_HEADS heads and a partial last one; H = 12: several full groups
@pytest.mark.parametrize("shape", [(2, 37, 3, 16), (1, 37, 12, 128), (2, 37, 3, 6), (2, 37, 5, 32)])
@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("freqs_dtype", FREQ_DTYPES)
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("layout", ["transposed", "fused"])
def test_rope_only_tiled_kernel_equals_reference(rng, shape, x_dtype, freqs_dtype, per_head, layout):
    x = _x_view(rng, shape, x_dtype, layout)
    cos, sin = _random_tables(rng, shape, freqs_dtype, per_head)
    got = rope_only(x, cos, sin)
    want = rope_reference(x, cos, sin)
    assert got.dtype == x_dtype and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want), f"seed {rng.initial_seed()}: {(got != want).sum()} elements differ"


def _errors(got: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - truth
    return diff.abs().max().item(), (diff.norm() / truth.norm()).item()


def _check_reduction_bound(rng, got, x, weight, eps, cos, sin, heads, what=""):
    """Contract `reduction`: error vs the float64 chain at most 2x torch's own (+1e-7 of the output scale)."""
    b, t, c = x.shape
    want = reference(x, weight, eps, cos, sin, heads)
    truth = reference(x.double(), weight.double(), eps, cos.double(), sin.double(), heads)
    assert got.dtype == x.dtype and got.shape == (b, t, heads, c // heads) and got.is_contiguous()
    (k_max, k_rel), (t_max, t_rel) = _errors(got, truth), _errors(want, truth)
    floor = 1e-7 * truth.abs().max().item()
    message = (
        f"seed {rng.initial_seed()} {what}: kernel max {k_max:.3e} rel {k_rel:.3e}; "
        f"torch max {t_max:.3e} rel {t_rel:.3e}"
    )
    assert k_max <= 2 * t_max + floor, message
    assert k_rel <= 2 * t_rel + 1e-7, message
    # the rotary step and the final rounding are torch's: most elements are bit-equal
    assert (got == want).float().mean().item() > 0.5, message


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("freqs_dtype", FREQ_DTYPES)
def test_qk_norm_rope_error_bound_against_float64(rng, shape, x_dtype, freqs_dtype):
    b, t, h, d = shape
    x = _x3(rng, shape, x_dtype)
    weight = (1 + 0.2 * torch.randn(h * d, generator=rng)).to(x_dtype)
    cos, sin = _freqs(rng, t, d, freqs_dtype)
    _check_reduction_bound(rng, qk_norm_rope(x, weight, 1e-6, cos, sin, h), x, weight, 1e-6, cos, sin, h)


def _x3_view(rng, shape, dtype, layout):
    """x (B, T, C) as q/k arrive, never contiguous: `transposed` (channels strided by T) or `fused` (the q slice
    of a fused (B, T, 3C) projection: row stride 3C)."""
    b, t, h, d = shape
    if layout == "transposed":
        return _x3(rng, shape, dtype)
    return (torch.randn(b, t, 3 * h * d, generator=rng) * 3 + 0.2).to(dtype)[..., h * d : 2 * h * d]


@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("freqs_dtype", FREQ_DTYPES)
def test_qk_norm_rope_strided_x_and_tables_meet_error_bound(rng, x_dtype, freqs_dtype):
    """The row kernel (the native bf16 cast runs the integer path here, module doc) on odd head dims and head
    counts (padded in the tile), strided x, shared and per-head tables."""
    cases = [  # (B, T, H, D), x layout, per-head tables
        ((2, 37, 3, 6), "transposed", False),
        ((2, 9, 5, 32), "fused", True),
    ]
    for shape, layout, per_head in cases:
        b, t, h, d = shape
        x = _x3_view(rng, shape, x_dtype, layout)
        weight = (1 + 0.2 * torch.randn(h * d, generator=rng)).to(x_dtype)
        cos, sin = _random_tables(rng, shape, freqs_dtype, per_head)
        got = qk_norm_rope(x, weight, 1e-6, cos, sin, h)
        _check_reduction_bound(rng, got, x, weight, 1e-6, cos, sin, h, f"{shape} {layout} per_head={per_head}")


def test_qk_norm_rope_kernel_index_is_int32_only_when_every_offset_fits():
    def index(shape, stride, block_r=1, heads=None, block_d=None):
        x = torch.empty_strided(shape, stride, device="meta")  # strides only, nothing allocated
        return _index((x,), block_r, heads or shape[2], block_d or shape[3])

    assert index((1, 37, 2, 8), (592, 16, 8, 1)) == tl.int32
    big = (1, 2**20, 16, 128)  # 2**31 elements: the last offset is 2**31 - 1
    assert index(big, (2**31, 2**11, 128, 1)) == tl.int32
    assert index(big, (2**31, 2**11, 128, 1), heads=32) == tl.int64  # padded heads reach past it
    assert index((2, 2**20, 16, 128), (2**31, 2**11, 128, 1)) == tl.int64
    # the padded last row tile reaches one batch past the end: a size-1 batch's stride counts then
    assert index((1, 37, 2, 8), (2**40, 16, 8, 1), block_r=16) == tl.int64
    assert index((1, 37, 2, 8), (2**40, 16, 8, 1), block_r=1) == tl.int32
    # broadcast (stride 0) tables add nothing
    assert index((2, 2**20, 16, 128), (0, 128, 0, 1)) == tl.int32


def test_qk_norm_rope_refuses_a_row_wider_than_the_row_tile_before_any_launch():
    # 17 heads pad to 32: 32 x 1024 = 2 * MAX_ROW_TILE padded elements per row (16 heads would fill it exactly)
    heads, d = 17, MAX_ROW_TILE // 16
    x = torch.zeros(1, 2, heads * d)
    cos = torch.zeros(1, 2, 1, d)
    message = rf"qk_norm_rope: x has 17 heads of {d} channels, padded .* 32 x {d} = {2 * MAX_ROW_TILE} elements .*"
    with pytest.raises(ValueError, match=message + rf"allowed: at most {MAX_ROW_TILE}"):
        qk_norm_rope(x, torch.ones(heads * d), 1e-6, cos, cos, heads)
    # the Wan fused block asks the same question first, so such a layer keeps diffusers' norm and rotary step
    norms = [torch.nn.RMSNorm(heads * d, eps=1e-6) for _ in range(2)]
    attn = types.SimpleNamespace(heads=heads, norm_q=norms[0], norm_k=norms[1])
    assert qk_norm_reason(attn, x, (cos, cos)).startswith(f"q/k of 17 heads of {d} channels, padded")


def test_qk_norm_rope_handles_a_full_wan_row_width(rng):
    # Wan2.1-1.3B hidden width (12 x 128) in one program (the row tile pads it to 16 heads), a handful of tokens
    shape = (1, 5, 12, 128)
    x = _x3(rng, shape, torch.bfloat16)
    weight = torch.randn(1536, generator=rng).to(torch.bfloat16)
    cos, sin = _freqs(rng, 5, 128, torch.float32)
    _check_reduction_bound(rng, qk_norm_rope(x, weight, 1e-6, cos, sin, 12), x, weight, 1e-6, cos, sin, 12)


def _good(rng):
    x = torch.randn(1, 3, 8, generator=rng)
    cos = torch.randn(1, 3, 1, 4, generator=rng)
    return x, torch.ones(8), 1e-6, cos, cos.clone(), 2


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: (a[0].double(), *a[1:]), r"qk_norm_rope: x has dtype torch.float64"),
        (lambda a: (a[0], a[1].bfloat16(), *a[2:]), r"qk_norm_rope: weight has dtype torch.bfloat16"),
        (lambda a: (a[0][0], *a[1:]), r"qk_norm_rope: x must be \(B, T, C\)"),
        (lambda a: (*a[:5], 3), r"qk_norm_rope: heads=3"),
        (lambda a: (*a[:5], 8), r"qk_norm_rope: heads=8"),
        (lambda a: (a[0], a[1][:4], *a[2:]), r"qk_norm_rope: weight has shape \(4,\)"),
        (lambda a: (*a[:2], -1.0, *a[3:]), r"qk_norm_rope: eps must be >= 0"),
        (lambda a: (*a[:3], a[3][:, :2], *a[4:]), r"qk_norm_rope: freqs_cos has shape \(1, 2, 1, 4\)"),
        (lambda a: (*a[:3], a[3].bfloat16(), *a[4:]), r"qk_norm_rope: freqs_cos has dtype torch.bfloat16"),
        (lambda a: (*a[:4], a[4].double(), a[5]), r"qk_norm_rope: freqs_cos is torch.float32 but freqs_sin"),
    ],
)
def test_qk_norm_rope_bad_input_raises(rng, change, message):
    with pytest.raises(ValueError, match=message):
        qk_norm_rope(*change(_good(rng)))


@pytest.mark.parametrize(
    "x_shape, freqs_shape, message",
    [
        ((1, 3, 2), (1, 3, 1, 2), r"rope_only: x must be \(B, T, H, D\)"),
        ((1, 3, 2, 5), (1, 3, 1, 5), r"rope_only: head dim D must be even, got 5"),
        ((2, 3, 2, 4), (3, 3, 1, 4), r"rope_only: freqs_cos has shape \(3, 3, 1, 4\)"),
    ],
)
def test_rope_only_bad_input_raises(rng, x_shape, freqs_shape, message):
    x = torch.randn(*x_shape, generator=rng)
    f = torch.randn(*freqs_shape, generator=rng)
    with pytest.raises(ValueError, match=message):
        rope_only(x, f, f)
    with pytest.raises(ValueError, match=r"rope_only: x has dtype torch.float16"):
        rope_only(torch.randn(1, 3, 2, 4).half(), f, f)


def test_qk_norm_rope_cost_is_sensible():
    shape = (1, 32760, 12, 128)
    elements = 32760 * 1536
    bytes_moved, flops = cost(shape, torch.bfloat16, torch.float32)
    assert bytes_moved == elements * 4 + 2 * 32760 * 128 * 4 + 1536 * 2 and flops == 7 * elements
    rope_bytes, rope_flops = cost(shape, torch.bfloat16, torch.float32, norm=False)
    assert rope_bytes == bytes_moved - 1536 * 2 and rope_flops == 3 * elements
    assert cost(shape, torch.float32, torch.float64)[0] > bytes_moved
