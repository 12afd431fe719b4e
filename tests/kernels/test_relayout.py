import pytest
import torch

from workbench.kernels.relayout import (
    DEFAULT,
    Launch,
    cost,
    merge_heads,
    merge_heads_reference,
    pack_qkv,
    pack_qkv_reference,
    split_result,
    split_result_reference,
)

# (B, T_local, H, D, world_size)
SHAPES = [(1, 7, 4, 8, 2), (2, 13, 8, 32, 4), (2, 25, 6, 16, 2)]
DTYPES = [torch.bfloat16, torch.float32, torch.float16]


def _fused_qkv(rng, b, t, h, d, dtype):
    """q, k, v as views of one fused (B, T, 3, H, D) projection, as the model produces them."""
    fused = torch.randn(b, t, 3, h, d, generator=rng).to(dtype)
    return fused[:, :, 0], fused[:, :, 1], fused[:, :, 2]


def _equal(got, want, rng):
    assert got.shape == want.shape and got.dtype == want.dtype, f"{got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    assert got.is_contiguous()
    assert torch.equal(got, want), f"seed {rng.initial_seed()}: {(got != want).sum()} elements differ"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_qkv_matches_reference_on_fused_views(rng, shape, dtype):
    b, t, h, d, w = shape
    q, k, v = _fused_qkv(rng, b, t, h, d, dtype)
    assert not q.is_contiguous()
    got = pack_qkv(q, k, v, w)
    _equal(got, pack_qkv_reference(q, k, v, w), rng)
    assert got.shape == (w, b, t, 3, h // w, d)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pack_qkv_mixed_layouts(rng, dtype):
    b, t, h, d, w = 2, 9, 8, 16, 4
    q = torch.randn(b, h, t, d, generator=rng).to(dtype).transpose(1, 2)  # (B, T, H, D) from BHTD
    k = torch.randn(b, t, h, d, generator=rng).to(dtype)  # contiguous
    v = torch.randn(d, h, t, b, generator=rng).to(dtype).permute(3, 2, 1, 0)  # every stride reversed
    _equal(pack_qkv(q, k, v, w), pack_qkv_reference(q, k, v, w), rng)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_result_matches_reference(rng, shape, dtype):
    b, t_local, h, d, w = shape
    out = torch.randn(b, h // w, t_local * w, d, generator=rng).to(dtype).transpose(1, 2)  # (B, T_full, H/W, D)
    _equal(split_result(out, w), split_result_reference(out, w), rng)
    contiguous = out.contiguous()
    _equal(split_result(contiguous, w), split_result_reference(contiguous, w), rng)


def test_split_result_batch_one_is_a_view_equal_to_reference(rng):
    w = 2
    out = torch.randn(1, 6 * w, 3, 16, generator=rng).bfloat16()  # contiguous (1, T_full, H/W, D)
    got = split_result(out, w)
    assert got.data_ptr() == out.data_ptr()  # rank-major already: nothing to copy
    _equal(got, split_result_reference(out, w), rng)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_heads_matches_reference(rng, shape, dtype):
    b, t, h, d, w = shape
    received = torch.randn(w, b, t, h // w, d, generator=rng).to(dtype)
    _equal(merge_heads(received, w), merge_heads_reference(received, w), rng)
    strided = torch.randn(b, d, w, t, h // w, generator=rng).to(dtype).permute(2, 0, 3, 4, 1)
    _equal(merge_heads(strided, w), merge_heads_reference(strided, w), rng)


@pytest.mark.parametrize("w", [2, 4])
def test_round_trip_through_simulated_all_to_all(rng, w):
    """Ranks pack QKV, swap slots (all-to-all), attend (identity on q here), split, swap back, merge:
    every rank gets its own q back."""
    b, t_local, h, d = 2, 5, 8, 8
    qkv = [_fused_qkv(rng, b, t_local, h, d, torch.bfloat16) for _ in range(w)]
    packed = [pack_qkv(q, k, v, w) for q, k, v in qkv]
    # rank r receives slot r from every source rank, in source order = sequence order
    received = [torch.stack([packed[src][r] for src in range(w)]) for r in range(w)]  # (W, B, T_l, 3, H/W, D)
    q_full = [torch.cat(list(received[r][:, :, :, 0]), dim=1) for r in range(w)]  # (B, T_full, H/W, D)
    for r in range(w):
        assert torch.equal(q_full[r], torch.cat([q[:, :, r * h // w : (r + 1) * h // w] for q, _, _ in qkv], dim=1))
    split = [split_result(q_full[r], w) for r in range(w)]
    back = [torch.stack([split[src][r] for src in range(w)]) for r in range(w)]  # (W, B, T_l, H/W, D)
    for r in range(w):
        _equal(merge_heads(back[r], w), qkv[r][0].contiguous(), rng)


def test_received_pack_is_a_fused_projection_view_when_batch_is_one(rng):
    """With B == 1 the all-to-all's output (W, 1, T_l, 3, H/W, D) read as (1, W*T_l, 3, H/W, D) holds every
    rank's tokens in order: q/k/v of the full sequence are views, no unpack copy is needed."""
    w, t_local, h, d = 2, 5, 4, 8
    qkv = [_fused_qkv(rng, 1, t_local, h, d, torch.float32) for _ in range(w)]
    packed = [pack_qkv(q, k, v, w) for q, k, v in qkv]
    for r in range(w):
        received = torch.stack([packed[src][r] for src in range(w)])  # what all_to_all_single returns
        full = received.view(1, w * t_local, 3, h // w, d)
        for slot in range(3):
            want = torch.cat([ops[slot][:, :, r * h // w : (r + 1) * h // w] for ops in qkv], dim=1)
            assert torch.equal(full[:, :, slot], want), f"seed {rng.initial_seed()}"


# (B, T_local, H, D, world_size): odd sequence, head dim not a power of two (masked columns), head dim over
# one column block (two column blocks, the second partial), three heads per rank
ODD_SHAPES = [(1, 11, 6, 12, 2), (2, 5, 6, 160, 2), (1, 9, 9, 8, 3)]
SMALL_TILES = Launch(tile=16)  # several row blocks per (rank, batch), the last one partial


def _all_three(rng, shape, dtype, launch):
    b, t, h, d, w = shape
    q, k, v = _fused_qkv(rng, b, t, h, d, dtype)
    _equal(pack_qkv(q, k, v, w, launch), pack_qkv_reference(q, k, v, w), rng)
    separate = [y.contiguous() for y in (q, k, v)]  # equal strides, three allocations: the fused launch
    _equal(pack_qkv(*separate, w, launch), pack_qkv_reference(*separate, w), rng)
    mixed = (q, separate[1], v)  # strides differ: one launch per operand
    _equal(pack_qkv(*mixed, w, launch), pack_qkv_reference(*mixed, w), rng)
    out = torch.randn(b, h // w, t * w, d, generator=rng).to(dtype).transpose(1, 2)
    _equal(split_result(out, w, launch), split_result_reference(out, w), rng)
    received = torch.randn(w, b, t, h // w, d, generator=rng).to(dtype)
    _equal(merge_heads(received, w, launch), merge_heads_reference(received, w), rng)
    strided = received.transpose(2, 3).contiguous().transpose(2, 3)  # (W, B, T, H/W, D) with heads outside tokens
    _equal(merge_heads(strided, w, launch), merge_heads_reference(strided, w), rng)


@pytest.mark.parametrize(
    "launch", [DEFAULT, Launch(tile=4096), Launch(tile=16384, num_warps=8)], ids=["default", "t4096", "t16384_w8"]
)
def test_every_launch_matches_reference(rng, launch):
    """Whatever the tiling, the reference's bits: the launch is not the result."""
    _all_three(rng, (2, 13, 8, 32, 4), torch.bfloat16, launch)


@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("launch", [DEFAULT, SMALL_TILES], ids=["default", "small_tiles"])
def test_odd_sizes_match_reference(rng, shape, launch):
    _all_three(rng, shape, torch.float16, launch)


def test_int64_offsets_match_reference(rng, monkeypatch):
    """The int64 path (taken on its own when an offset reaches 2**31) forced on small tensors."""
    from workbench.kernels import relayout

    monkeypatch.setattr(relayout, "_INT32_LIMIT", 0)
    _all_three(rng, (1, 7, 4, 24, 2), torch.float32, Launch(tile=32))


def test_int64_offsets_chosen_when_an_offset_reaches_the_limit(rng, monkeypatch):
    """The launcher switches to int64 offsets once the largest offset a lane forms (padding included) reaches
    the limit: checked with the limit lowered to small tensors' reach, results still the reference's."""
    from workbench.kernels import relayout

    seen = []
    real = relayout._TILED

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(kwargs["WIDE"])
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(relayout, "_TILED", Recording())
    received = torch.randn(2, 1, 5, 2, 8, generator=rng)  # 160 elements, largest offset 159
    for limit, wide in ((160, False), (159, True)):  # SMALL_TILES: 2-row tiles, no padded rows here
        monkeypatch.setattr(relayout, "_INT32_LIMIT", limit)
        _equal(merge_heads(received, 2, SMALL_TILES), merge_heads_reference(received, 2), rng)
        assert seen[-1] is wide, f"limit {limit}: WIDE={seen[-1]}"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tile": 3000}, r"relayout: Launch.tile: 3000; expected a power of two"),
        ({"tile": 0}, r"relayout: Launch.tile: 0; expected a power of two"),
        ({"num_warps": 3}, r"relayout: Launch.num_warps: 3; allowed"),
    ],
)
def test_bad_launch_raises(fields, message):
    with pytest.raises(ValueError, match=message):
        Launch(**fields)


def test_launch_must_be_a_launch(rng):
    q, k, v = _fused_qkv(rng, 1, 4, 4, 8, torch.bfloat16)
    with pytest.raises(ValueError, match=r"relayout: launch must be a relayout.Launch, got dict"):
        pack_qkv(q, k, v, 2, {"tile": 16})


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: pack_qkv(q, k, v, 3), r"pack_qkv: H \(q.shape\[2\]\)=4 is not divisible by world_size=3"),
        (lambda q, k, v: pack_qkv(q, k[:, :3], v, 2), r"pack_qkv: k has shape \(1, 3, 4, 8\)"),
        (lambda q, k, v: pack_qkv(q, k, v.float(), 2), r"pack_qkv: v has dtype torch.float32"),
        (lambda q, k, v: pack_qkv(q, k, v.int(), 2), r"pack_qkv: v has dtype torch.int32"),
        (lambda q, k, v: pack_qkv(q[0], k[0], v[0], 2), r"pack_qkv: q must be \(B, T_local, H, D\)"),
        (lambda q, k, v: pack_qkv(q, k, v, 0), r"pack_qkv: world_size must be a positive int, got 0"),
        (lambda q, k, v: split_result(q, 2), r"split_result: T_full \(out.shape\[1\]\)=7 is not divisible"),
        (lambda q, k, v: split_result(q[0], 2), r"split_result: out must be \(B, T_full, H/W, D\)"),
        (lambda q, k, v: merge_heads(q, 2), r"merge_heads: received must be \(W, B, T_local, H/W, D\)"),
        (lambda q, k, v: merge_heads(q[None].expand(3, -1, -1, -1, -1), 2), r"received.shape\[0\]=3 must equal"),
    ],
)
def test_bad_input_raises(rng, call, message):
    q, k, v = _fused_qkv(rng, 1, 7, 4, 8, torch.bfloat16)
    with pytest.raises(ValueError, match=message):
        call(q, k, v)


def test_cost():
    assert cost("pack_qkv", (1, 7, 4, 8)) == (2 * 3 * 7 * 4 * 8 * 2, 0)
    assert cost("split_result", (2, 10, 2, 8), torch.float32) == (2 * 2 * 10 * 2 * 8 * 4, 0)
    assert cost("merge_heads", (2, 1, 5, 2, 8)) == (2 * 2 * 5 * 2 * 8 * 2, 0)
    with pytest.raises(ValueError, match="cost: op must be one of"):
        cost("stack", (1,))
