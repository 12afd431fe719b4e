"""block_sparse_attention (contract: approximate) under the Triton CPU interpreter: the kernel equals its
torch reference of the same routing; the routing itself behaves as documented.

bf16 bound: the interpreter runs the dots in fp32 (see INTERPRETER_BF16 in the kernel), so kernel and
reference differ by the bf16 output rounding (the interpreter's cast truncates: <= 2 ulp of |out| < 1,
i.e. 2**-7 = 0.0078); 0.02 absolute leaves room. The bf16 GPU path is unverified here.
"""

import math
from dataclasses import replace

import pytest
import torch

from workbench.kernels.block_sparse_attention import (
    BLOCK,
    CANDIDATES,
    DEFAULT,
    PREVIOUS,
    TMA,
    Launch,
    _block_means,
    _fused_means,
    attend,
    block_sparse_attention,
    cost,
    plan,
    reference,
    routing,
)

D = 128


def _qkv(rng, t, dtype=torch.float32, heads=2, batch=1, noncontiguous=False):
    shape = (batch, t, heads, D) if noncontiguous else (batch, heads, t, D)
    q, k, v = (torch.randn(shape, generator=rng).to(dtype) for _ in range(3))
    if noncontiguous:  # (B, T, H, D) storage seen as (B, H, T, D), as diffusers' dispatcher layout gives it
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    return q, k, v


def _dense(q, k, v):
    return torch.softmax(q.float() @ k.float().transpose(-1, -2) / math.sqrt(D), -1) @ v.float()


@pytest.mark.parametrize("t,tau,noncontiguous", [(200, 0.0, False), (257, 0.5, True), (130, 1.0, False)])
def test_block_sparse_attention_matches_reference_fp32(rng, t, tau, noncontiguous):
    q, k, v = _qkv(rng, t, noncontiguous=noncontiguous)
    got, density = block_sparse_attention(q, k, v, tau, 0, return_density=True)
    want = reference(q, k, v, tau, 0)
    assert got.shape == q.shape and got.is_contiguous() and got.dtype == torch.float32
    err = (got - want).abs().max().item()
    assert err < 1e-4, f"seed {rng.initial_seed()}: max error {err} at density {density}"


def test_block_sparse_attention_matches_reference_bf16(rng):
    q, k, v = _qkv(rng, 230, torch.bfloat16)
    got = block_sparse_attention(q, k, v, 0.3, 70)
    want = reference(q, k, v, 0.3, 70)
    assert got.dtype == torch.bfloat16
    err = (got.float() - want.float()).abs().max().item()
    assert err < 0.02, f"seed {rng.initial_seed()}: max error {err}"


def test_block_sparse_attention_all_exact_equals_dense(rng):
    q, k, v = _qkv(rng, 300)
    for tau in (float("-inf"), -1e9):
        mask, density = routing(q, k, tau, 0)
        assert mask.all() and density == 1.0
        err = (block_sparse_attention(q, k, v, tau, 0) - _dense(q, k, v)).abs().max().item()
        assert err < 1e-4, f"seed {rng.initial_seed()}: tau {tau}: max error {err}"


def test_block_sparse_routing_large_tau_keeps_band_and_sinks(rng):
    q, k, _ = _qkv(rng, 300)  # 5 blocks, the last of 44 tokens
    mask, density = routing(q, k, 1e9, 65)  # sink range [0, 65) overlaps key blocks 0 and 1
    nb = 5
    i, j = torch.arange(nb)[:, None], torch.arange(nb)[None, :]
    want = ((i - j).abs() <= 1) | (j <= 1)
    assert mask.shape == (1, 2, nb, nb)
    assert torch.equal(mask, want.expand_as(mask)), f"seed {rng.initial_seed()}"
    assert density == pytest.approx(want.float().mean().item())


def test_block_sparse_routing_sinks_always_exact(rng):
    q, k, _ = _qkv(rng, 280)
    for tau in (0.0, 2.0, float("inf")):
        mask, _ = routing(q, k, tau, 1)
        assert mask[..., 0].all(), f"seed {rng.initial_seed()}: tau {tau}"
        mask, _ = routing(q, k, tau, 0)
        if tau == float("inf"):
            assert not mask[..., 2:, 0].any()  # no sinks and far from the diagonal: folded


def test_block_sparse_density_decreases_with_tau(rng):
    q, k, _ = _qkv(rng, 300, heads=2, batch=2)
    densities = [routing(q, k, tau, 0)[1] for tau in (-1e9, -1.0, 0.0, 0.5, 1.0, 1e9)]
    assert all(a >= b for a, b in zip(densities, densities[1:], strict=False)), densities
    assert densities[0] == 1.0 and densities[-1] < densities[0]


def test_block_sparse_partial_last_block_mean_uses_true_length(rng):
    t = 3 * BLOCK + 3  # four key blocks, the last of 3 tokens
    q, k, v = _qkv(rng, t)
    mask, _ = routing(q, k, float("inf"), 0)
    assert not mask[0, 0, 0, 3]  # query block 0 sees the partial block 3 folded
    got = block_sparse_attention(q, k, v, float("inf"), 0)
    # By hand for query row 0: exact keys of blocks 0..1, plus pseudo-keys of blocks 2 (64) and 3 (3).
    scale = D**-0.5
    q0 = q[0, 0, 0]
    exact = k[0, 0, : 2 * BLOCK] @ q0 * scale
    means_k = [k[0, 0, 2 * BLOCK : 3 * BLOCK].mean(0), k[0, 0, 3 * BLOCK :].mean(0)]
    means_v = [v[0, 0, 2 * BLOCK : 3 * BLOCK].mean(0), v[0, 0, 3 * BLOCK :].mean(0)]
    pseudo = torch.stack([m @ q0 * scale for m in means_k]) + torch.tensor([64.0, 3.0]).log()
    probs = torch.softmax(torch.cat([exact, pseudo]), 0)
    want = probs[: 2 * BLOCK] @ v[0, 0, : 2 * BLOCK] + probs[2 * BLOCK :] @ torch.stack(means_v)
    err = (got[0, 0, 0] - want).abs().max().item()
    assert err < 1e-5, f"seed {rng.initial_seed()}: max error {err}"


@pytest.mark.parametrize("d", [64, 96, 16])
def test_block_sparse_attention_head_dim_not_128_raises(rng, d):
    q = torch.randn(1, 2, 70, d, generator=rng)
    with pytest.raises(ValueError, match="head dim"):
        block_sparse_attention(q, q, q, 0.0, 0)
    with pytest.raises(ValueError, match="head dim"):
        reference(q, q, q, 0.0, 0)


def test_block_sparse_attention_bad_input_raises(rng):
    q, k, v = _qkv(rng, 70)
    with pytest.raises(ValueError, match="dtype"):
        block_sparse_attention(q.half(), k.half(), v.half(), 0.0, 0)
    with pytest.raises(ValueError, match="sink_tokens"):
        block_sparse_attention(q, k, v, 0.0, -1)
    with pytest.raises(ValueError, match="tau"):
        block_sparse_attention(q, k, v, float("nan"), 0)
    with pytest.raises(ValueError, match="do not match"):
        block_sparse_attention(q, k[:, :1], v[:, :1], 0.0, 0)


def test_block_sparse_attention_cpu_without_interpreter_raises(rng, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = _qkv(rng, 70)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        block_sparse_attention(q, k, v, 0.0, 0)


def test_block_sparse_cost_scales_with_density():
    low, high = cost((1, 12, 32760, 128), 0.2), cost((1, 12, 32760, 128), 0.4)
    assert low[0] < high[0] and low[1] < high[1]
    dense_flops = 4 * 12 * 32760**2 * 128
    assert cost((1, 12, 32760, 128), 1.0)[1] == pytest.approx(dense_flops, rel=0.01)


def test_block_sparse_attention_matches_reference_many_key_blocks(rng):
    """More than 64 key blocks: the folded pass runs over several chunks of mean keys, some skipped."""
    t = 66 * BLOCK + 10  # 67 key blocks: two chunks of mean keys
    q, k, v = _qkv(rng, t, heads=1)
    got, density = block_sparse_attention(q, k, v, 1.0, 2 * BLOCK, return_density=True)
    want = reference(q, k, v, 1.0, 2 * BLOCK)
    assert 0.0 < float(density) < 1.0 and float(density) == routing(q, k, 1.0, 2 * BLOCK)[1]
    err = (got - want).abs().max().item()
    assert err < 1e-4, f"seed {rng.initial_seed()}: max error {err} at density {float(density)}"


@pytest.mark.parametrize("name", ["previous", "g2_w8_s3"])
def test_block_sparse_attention_launch_matches_reference(rng, name):
    """Every launch computes the same maths: the d9ed842 launch (heads-outer grid, argsort lists) and two query
    blocks per program (union list, per-row masks), on an odd number of query blocks and non-contiguous q/k/v."""
    q, k, v = _qkv(rng, 5 * BLOCK - 7, noncontiguous=True)  # five query blocks: the last group holds one
    got = block_sparse_attention(q, k, v, 0.5, 70, launch=CANDIDATES[name])
    want = reference(q, k, v, 0.5, 70)
    err = (got - want).abs().max().item()
    assert err < 1e-4, f"seed {rng.initial_seed()}: {name}: max error {err}"


@pytest.mark.parametrize("group", [1, 2])
def test_block_sparse_compaction_matches_argsort(rng, group):
    """The Triton compaction kernel writes the same exact-block lists and counts as the torch argsort path."""
    q, k, v = _qkv(rng, 8 * BLOCK + 5, heads=2, batch=2)  # nine query blocks: an odd count
    triton_plan = plan(q, k, v, 0.3, 0, launch=Launch(group=group))
    torch_plan = plan(q, k, v, 0.3, 0, launch=Launch(group=group, triton_compaction=False))
    assert torch.equal(triton_plan.count, torch_plan.count), f"seed {rng.initial_seed()}"
    n = triton_plan.count
    ranks = torch.arange(triton_plan.idx.shape[-1])
    listed = ranks < n[..., None]  # only the first count entries are defined
    assert torch.equal(triton_plan.idx[listed], torch_plan.idx[listed]), f"seed {rng.initial_seed()}"
    union = triton_plan.mask
    if group == 2:
        union = torch.cat([union, torch.zeros_like(union[:, :, :1])], 2).unflatten(2, (-1, 2)).any(3)
    assert torch.equal(n, union.sum(-1, dtype=torch.int32))
    assert triton_plan.computed_density() >= float(triton_plan.density) - 1e-6


def test_block_sparse_attention_plan_then_attend_equals_one_call(rng):
    q, k, v = _qkv(rng, 150)
    route = plan(q, k, v, 0.2, 0, launch=PREVIOUS)
    assert torch.equal(attend(q, k, v, route, PREVIOUS), block_sparse_attention(q, k, v, 0.2, 0, launch=PREVIOUS))
    with pytest.raises(ValueError, match="group"):
        attend(q, k, v, route, Launch(group=2))
    with pytest.raises(ValueError, match="group"):
        Launch(group=3)


# Fused routing launches (Launch.fused_means / fused_route): their fp32 sums and dots run in another order than
# torch's, so their means differ by rounding and a block whose score ties its row's threshold within rounding
# could route differently. The mask tests therefore use fixed seeds: equality is checked on these inputs, it is
# not promised in general.
FUSED = {
    "fused_means": CANDIDATES["g1_w4_s3_fused_means"],
    "fused_route": Launch(fused_route=True),  # on torch's means (strided: the .contiguous() path)
    "fused_means_and_route": CANDIDATES["g1_w4_s3_fused_routing"],
    "threshold_rows": Launch(threshold_rows=True),  # torch's means and score matmul, one kernel for the rest
    "default_threshold_rows": CANDIDATES["g1_w4_s3_fused_means_tma_split_means_rows"],
}


def _seeded_qkv(seed, tq, tk=None, dtype=torch.float32, heads=2, batch=1):
    """q (B, H, tq, D) and k, v (B, H, tk, D) from a fixed seed, as transposed views of (B, T, H, D) storage."""
    rng = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn((batch, t, heads, D), generator=rng).to(dtype).transpose(1, 2) for t in (tq, tk or tq, tk or tq)
    )


def _same_lists(got, want):
    """idx/count equal where defined (the first count entries of each row)."""
    listed = torch.arange(got.idx.shape[-1]) < got.count[..., None]
    return torch.equal(got.count, want.count) and torch.equal(got.idx[listed], want.idx[listed])


@pytest.mark.parametrize(
    "tq,tk,batch,dtype",
    [(5 * BLOCK - 7, None, 2, torch.float32), (130, 257, 1, torch.bfloat16), (257, 130, 2, torch.bfloat16)],
    ids=["fp32", "bf16-tq<tk", "bf16-tq>tk"],
)
def test_block_sparse_fused_means_within_fp32_sum_rounding(rng, tq, tk, batch, dtype):
    """One launch gives torch's block means up to fp32 sum order, at odd lengths (last blocks of 57, 1 and 2
    tokens), Tq != Tk and transposed views. Bound: two fp32 sums of n <= 64 terms, in any orders, differ by at
    most (n - 1) * eps * sum|x| (eps/2 per addition each, to first order), so the means by (n - 1) * eps *
    mean|x| plus half an ulp per division: within BLOCK * eps * mean|x| per element."""
    q, k, v = _qkv(rng, tq, dtype, batch=batch, noncontiguous=True)
    if tk is not None:
        _, k, v = _qkv(rng, tk, dtype, batch=batch, noncontiguous=True)
    q_mean, k_mean, k_mean_dot, v_mean, log_len = _fused_means(q, k, v, torch.float32)
    assert k_mean_dot is k_mean and v_mean.dtype == torch.float32
    eps = torch.finfo(torch.float32).eps
    for name, got, x in (("q", q_mean, q), ("k", k_mean, k), ("v", v_mean, v)):
        want = _block_means(x, BLOCK)[0]
        bound = BLOCK * eps * _block_means(x.abs(), BLOCK)[0]
        assert got.shape == want.shape and got.is_contiguous()
        assert ((got - want).abs() <= bound).all(), f"seed {rng.initial_seed()}: {name} means"
    # math.log rounded once to fp32; torch's fp32 log agrees for these lengths (on CPU not for 7, 47, 49)
    assert torch.equal(log_len, _block_means(k, BLOCK)[1].log()), f"seed {rng.initial_seed()}"


def test_block_sparse_fused_means_bf16_copies_for_the_kernel(rng):
    """With a bf16 dot dtype the k/v means come back rounded to bf16 for the attention kernel, the fp32 k means
    for the routing: within one bf16 ulp (2**-7 relative) of the fp32 means (the interpreter's cast truncates;
    the GPU's rounds to nearest even, as torch's .to(bfloat16) does)."""
    q, k, v = _qkv(rng, 200, torch.bfloat16, batch=2, noncontiguous=True)
    _, k_mean, k_mean_dot, v_mean_dot, _ = _fused_means(q, k, v, torch.bfloat16)
    _, _, _, v_mean, _ = _fused_means(q, k, v, torch.float32)
    assert k_mean.dtype == torch.float32 and k_mean_dot.dtype == v_mean_dot.dtype == torch.bfloat16
    for got, want in ((k_mean_dot, k_mean), (v_mean_dot, v_mean)):
        assert ((got.float() - want).abs() <= want.abs() * 2**-7).all(), f"seed {rng.initial_seed()}"


@pytest.mark.parametrize(
    "seed,tq,tk,batch,heads,tau,sinks",
    [
        (1, 5 * BLOCK - 7, None, 2, 2, 0.5, 70),  # odd length, B=2, sinks
        (2, 130, 257, 2, 2, 0.0, 0),  # Tq != Tk, key blocks of 1 token
        (3, 257, 130, 1, 2, -0.5, 1),
        (4, 300, None, 2, 2, float("-inf"), 0),
        (5, 300, None, 1, 2, float("inf"), 130),
        (6, 17 * BLOCK + 5, 66 * BLOCK + 10, 1, 1, 1.0, 2 * BLOCK),  # 2 routing programs, chunks of key blocks
    ],
)
def test_block_sparse_fused_routing_equals_torch_routing(seed, tq, tk, batch, heads, tau, sinks):
    """Each fused launch's plan has the torch routing's mask, index lists, counts and density (exactly, on these
    seeded inputs), and k means within 1e-6 of the largest (relative)."""
    q, k, v = _seeded_qkv(seed, tq, tk, heads=heads, batch=batch)
    want = plan(q, k, v, tau, sinks)
    assert torch.equal(want.mask, routing(q, k, tau, sinks)[0])
    for name, launch in FUSED.items():
        got = plan(q, k, v, tau, sinks, launch=launch)
        assert torch.equal(got.mask, want.mask), f"{name}: seed {seed}"
        assert _same_lists(got, want), f"{name}: seed {seed}"
        assert torch.equal(got.density, want.density), f"{name}: seed {seed}: {got.density} != {want.density}"
        assert got.computed_density() == want.computed_density()
        rel = ((got.k_mean - want.k_mean).abs().max() / want.k_mean.abs().max()).item()
        assert rel <= 1e-6, f"{name}: seed {seed}: k means differ by {rel} (relative to the largest)"


@pytest.mark.parametrize("name", ["g1_w4_s3_fused_means", "g1_w4_s3_fused_routing"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.02)], ids=["fp32", "bf16"])
def test_block_sparse_fused_launch_matches_default(name, dtype, tol):
    """The whole call with a fused candidate equals the DEFAULT launch's within the fp32/bf16 tolerances (same
    masks on this seeded input, means that differ by fp32 rounding), and the reference likewise. Odd length,
    B=2, sinks, transposed views."""
    q, k, v = _seeded_qkv(7, 5 * BLOCK - 7, dtype=dtype, heads=1, batch=2)
    launch = CANDIDATES[name]
    assert torch.equal(plan(q, k, v, 0.5, 70, launch=launch).mask, plan(q, k, v, 0.5, 70).mask)
    got = block_sparse_attention(q, k, v, 0.5, 70, launch=launch)
    assert got.dtype == dtype and got.shape == q.shape
    for other, want in (
        ("DEFAULT", block_sparse_attention(q, k, v, 0.5, 70)),
        ("reference", reference(q, k, v, 0.5, 70)),
    ):
        err = (got.float() - want.float()).abs().max().item()
        assert err < tol, f"{name} vs {other}: max error {err}"


def test_block_sparse_fused_launch_bit_equal_on_exact_sums():
    """Where the fused means are bit-equal to torch's and the masks are equal, the output is bit-equal to the
    DEFAULT launch's: the attention kernel then reads identical plans. Inputs in multiples of 1/8 make every
    block sum exact in fp32 whatever the order (so the means are bit-equal); the last block of 57 tokens
    divides by 57 with IEEE rounding in both."""
    rng = torch.Generator().manual_seed(8)
    t = 5 * BLOCK - 7
    q, k, v = ((torch.randint(-16, 17, (1, t, 2, D), generator=rng) / 8).transpose(1, 2) for _ in range(3))
    base = CANDIDATES["g1_w4_s3"]  # the torch routing and pointer loads
    want_plan = plan(q, k, v, 0.5, 70, launch=base)
    want = attend(q, k, v, want_plan, base)
    for name in ("g1_w4_s3_fused_means", "g1_w4_s3_fused_routing", "g1_w4_s3_fused_means_tma"):
        got_plan = plan(q, k, v, 0.5, 70, launch=CANDIDATES[name])
        for field in ("k_mean", "v_mean", "log_len", "mask"):
            assert torch.equal(getattr(got_plan, field), getattr(want_plan, field)), f"{name}: {field}"
        assert _same_lists(got_plan, want_plan), name
        assert torch.equal(attend(q, k, v, got_plan, CANDIDATES[name]), want), name


def test_block_sparse_fused_candidates_are_default_plus_flags():
    """The sweep's fused candidates differ from DEFAULT only in the new flags; fused_route needs group 1."""
    base = CANDIDATES["g1_w4_s3"]
    assert base == Launch() and CANDIDATES["previous"] == PREVIOUS
    assert CANDIDATES["g1_w4_s3_fused_means"] == replace(base, fused_means=True)
    assert CANDIDATES["g1_w4_s3_fused_routing"] == replace(base, fused_means=True, fused_route=True)
    assert DEFAULT == CANDIDATES["g1_w4_s3_fused_means_tma_split_means"]
    with pytest.raises(ValueError, match="fused_route"):
        Launch(group=2, fused_route=True)
    with pytest.raises(ValueError, match="threshold_rows needs group 1 and not fused_route"):
        Launch(threshold_rows=True, fused_route=True)


# Exact-loop tuning candidates (Launch.unroll / wide / dot_acc / k_transposed / tma / tl.range options): the same
# maths in another schedule. Their plans come from the torch routing (the kernel reads any group-1 plan), so each
# equals the reference exactly up to fp32 rounding; the tl.range options are ignored by the interpreter (they
# only change how the GPU compiler pipelines, unrolls or warp-specializes the loop), so here they check the loop.
TUNED = [name for name, launch in CANDIDATES.items() if launch.tuned]


@pytest.mark.parametrize("name", TUNED)
def test_block_sparse_tuned_kernel_matches_reference(rng, name):
    """Seven query blocks (the last of 57 rows), transposed views; sink block 0 and the band only (tau = inf), so
    the lists are [0, 1], [0, 1, 2], [0..3], [0, 2, 3, 4], [0, 3, 4, 5], [0, 4, 5, 6], [0, 5, 6]: even and odd
    lengths (unroll=2's odd tail masks its second tile), gaps, several iterations, and folded blocks besides."""
    q, k, v = _qkv(rng, 7 * BLOCK - 7, heads=1, noncontiguous=True)
    torch_routing = CANDIDATES["g1_w4_s3"]  # the reference's routing
    route = plan(q, k, v, float("inf"), 1, launch=torch_routing)
    assert route.count.flatten().tolist() == [2, 3, 4, 4, 4, 4, 3]
    got = attend(q, k, v, route, CANDIDATES[name])
    want = reference(q, k, v, float("inf"), 1)
    err = (got - want).abs().max().item()
    assert err < 1e-4, f"seed {rng.initial_seed()}: {name}: max error {err} (counts {route.count.flatten().tolist()})"


def test_block_sparse_tuned_kernel_bf16_and_whole_call(rng):
    """A tuned candidate through the whole call (its fused routing) in bf16 agrees with DEFAULT within the bf16
    bound; an all-exact routing (every list full: even length 5 + odd) matches dense in fp32."""
    launch = CANDIDATES["g1_w4_s3_fused_routing_unroll2_dotacc"]
    q, k, v = _qkv(rng, 5 * BLOCK - 7, torch.bfloat16, heads=1)
    err = (block_sparse_attention(q, k, v, 0.5, 0, launch=launch).float() - reference(q, k, v, 0.5, 0).float()).abs()
    assert err.max().item() < 0.02, f"seed {rng.initial_seed()}: max error {err.max().item()}"
    q, k, v = _qkv(rng, 5 * BLOCK - 7, heads=1)
    got = block_sparse_attention(q, k, v, float("-inf"), 0, launch=CANDIDATES["g1_w4_s3_fused_routing_wide_dotacc"])
    err = (got - _dense(q, k, v)).abs().max().item()
    assert err < 1e-4, f"seed {rng.initial_seed()}: all exact, wide pairs: max error {err}"


def test_block_sparse_tuned_candidates_are_fused_routing_plus_flags():
    """Each tuning candidate is a fused-routing (or fused-means) launch plus its flags; PREVIOUS carries none, DEFAULT
    only TMA (the 2026-11-30 sweep's fastest)."""
    base = CANDIDATES["g1_w4_s3_fused_routing"]
    assert DEFAULT.tuned and not PREVIOUS.tuned and not base.tuned and len(TUNED) >= 8
    assert CANDIDATES["g1_w4_s3_fused_routing_unroll2"] == replace(base, unroll=2)
    assert CANDIDATES["g1_w4_s3_fused_routing_dotacc"] == replace(base, dot_acc=True)
    for name in TUNED:
        launch = CANDIDATES[name]
        assert launch.fused_means and launch.group == 1, name
    assert CANDIDATES["g1_w4_s3_fused_means_tma"] == replace(CANDIDATES["g1_w4_s3_fused_means"], tma=True)


@pytest.mark.parametrize(
    "flags,match",
    [
        ({"unroll": 3}, "unroll"),
        ({"group": 2, "dot_acc": True}, "group 1"),
        ({"wide": True}, "wide"),
        ({"unroll": 2, "k_transposed": True}, "k_transposed"),
        ({"unroll": 2, "tma": True}, "tma"),
        ({"exact_stages": 0}, "exact_stages"),
        ({"loop_unroll_factor": 1}, "loop_unroll_factor"),
    ],
)
def test_block_sparse_tuned_launch_bad_option_raises(flags, match):
    with pytest.raises(ValueError, match=match):
        Launch(**flags)


def test_block_sparse_tma_kernel_bad_strides_raises(rng):
    """Launch.tma reads K/V through TMA descriptors: a last stride other than 1 is refused, not read wrongly."""
    q, k, v = _qkv(rng, 2 * BLOCK)
    route = plan(q, k, v, 0.5, 0)
    k_strided = torch.randn(1, 2, 2 * BLOCK, 2 * D, generator=rng)[..., ::2]
    with pytest.raises(ValueError, match="tma"):
        attend(q, k_strided, v, route, CANDIDATES["g1_w4_s3_fused_routing_tma"])


# Launch.means_split (the means launch one tile per program): the same sums and divisions per tile, so its means
# are bitwise those of the launch without it. Its candidate is tuned (TMA), so the parametrized
# test_block_sparse_tuned_kernel_matches_reference above checks it against the reference as well.


@pytest.mark.parametrize(
    "tq,tk,dtype",
    [(130, 257, torch.float32), (257, 70, torch.bfloat16)],
    ids=["fp32-tq<tk", "bf16-tq>tk"],
)
def test_block_sparse_split_means_bitwise_equal_unsplit(rng, tq, tk, dtype):
    """One program per tile gives the one-program-per-block launch's outputs bit for bit (same fp32 reduce, same
    IEEE division), at partial last blocks (2, 1 and 6 tokens), Tq != Tk, B = 2 and transposed views; with a bf16 dot
    dtype the rounded k/v copies and the fp32 k means are separate tensors, both compared."""
    q, _, _ = _qkv(rng, tq, dtype, batch=2, noncontiguous=True)
    _, k, v = _qkv(rng, tk, dtype, batch=2, noncontiguous=True)
    dot_dtype = torch.float32 if dtype == torch.float32 else torch.bfloat16
    want = _fused_means(q, k, v, dot_dtype)  # kept alive: the split launch's fresh outputs cannot reuse its memory
    got = _fused_means(q, k, v, dot_dtype, per_tensor=True)
    names = ("q_mean", "k_mean", "k_mean_dot", "v_mean_dot", "log_len")
    for name, a, b in zip(names, got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), f"seed {rng.initial_seed()}: {name}"


def test_block_sparse_split_means_call_bitwise_equal_unsplit(rng):
    """The whole DEFAULT call (split means) equals the same launch with one program per block, bit for bit, and so
    matches the reference within the fp32 tolerance; odd length, B = 2, sinks, transposed views."""
    q, k, v = _qkv(rng, 5 * BLOCK - 7, heads=1, batch=2, noncontiguous=True)
    got = block_sparse_attention(q, k, v, 0.5, 70)
    assert torch.equal(got, block_sparse_attention(q, k, v, 0.5, 70, launch=TMA)), f"seed {rng.initial_seed()}"
    err = (got - reference(q, k, v, 0.5, 70)).abs().max().item()
    assert err < 1e-4, f"seed {rng.initial_seed()}: max error {err}"


def test_block_sparse_split_means_needs_fused_means():
    assert DEFAULT == replace(TMA, means_split=True) and not TMA.means_split
    with pytest.raises(ValueError, match="means_split needs fused_means=True"):
        Launch(means_split=True)
