"""The CuTe DSL FP8 attention kernel (kernels/fp8_attention_sm90.py): it compiles for sm_90a on a CPU (no GPU
needed: the test extra installs the DSL, nvidia-cutlass-dsl), and on an H200 it equals the Triton kernel on the same
quantized operands and is what `fp8_attention.attend` runs there by default for a one-byte P.V, pv="fp8" or "int8"
(gpu marker); its block-sparse build likewise for block_sparse_attention's exact blocks."""

import dataclasses

import pytest
import torch

from workbench.kernels import attention_quantize as aq
from workbench.kernels import block_sparse_attend
from workbench.kernels import fp8_attention as fa
from workbench.kernels import fp8_attention_sm90 as sm90
from workbench.kernels.block_sparse_attention import block_sparse_attention, plan

D = 128


@pytest.mark.parametrize(("qk", "pv"), [("e4m3", "fp8"), ("int8", "fp8"), ("int8", "int8")])
def test_fp8_attention_sm90_compiles_for_sm90a_without_a_gpu(rng, qk, pv):
    q, k, v = (torch.randn(1, 2, 300, D, generator=rng, dtype=torch.bfloat16) for _ in range(3))
    z = aq.quantize_reference(q, k, v, pv, qk=qk)
    before = len(sm90._COMPILED)
    sm90.attend(z, torch.empty_like(q), 300, D**-0.5)
    sm90.attend(z, torch.empty_like(q), 300, D**-0.5)  # the same build, from the cache
    assert len(sm90._COMPILED) == before + 1  # none launched on the CPU
    sm90.attend(z, torch.empty_like(q, dtype=torch.float32), 300, D**-0.5)  # an fp32 output: a build of its own
    assert len(sm90._COMPILED) == before + 2
    route = plan(q, k, v, 0.5, 64)  # the block-sparse build, on bf16 means as a GPU call makes them
    route = dataclasses.replace(route, k_mean=route.k_mean.bfloat16(), v_mean=route.v_mean.bfloat16())
    sm90.attend_sparse(z, q, route, 300, torch.empty_like(q))
    assert len(sm90._COMPILED) == before + 3


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _sm90_qkv(monkeypatch, rng, shape: tuple[int, int, int]) -> tuple[int, tuple[torch.Tensor, ...]]:
    """The GPU tests' setup: compiled Triton (no interpreter), an sm_90 device (else skip), and the rng's seed with
    bf16 q, k, v of (B, H, T) = `shape` and head dim D on it."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the kernel is built for sm_90a")
    seed = rng.initial_seed()
    return seed, tuple(torch.randn(*shape, D, generator=rng).cuda().bfloat16() for _ in range(3))


@pytest.mark.gpu
@pytest.mark.parametrize(("qk", "pv"), [("e4m3", "fp8"), ("int8", "fp8"), ("int8", "int8")])
@pytest.mark.parametrize("shape", [(1, 3, 300), (2, 2, 1061), (1, 2, 100)])  # 100 keys: one key tile, no loop
def test_fp8_attention_sm90_matches_the_triton_kernel_and_is_the_default_on_sm90(monkeypatch, rng, qk, pv, shape):
    """Same operands, same maths, up to fp32 summation order, the bf16 output's rounding and l, which the CuTe kernel
    sums from P as rounded to e4m3 or int8 (the Triton kernel sums it unrounded): relative L2 below 5e-3, the bound
    kernels/fp8_attention.py's error contract states between the two. l's difference is a sum over a row's keys of
    P's roundings, each at most 2^-4 of its P for e4m3 (int8 P rounds on a finer grid), which partly cancel: the bound
    sits an order under one rounding's worst case. `fa.fp8_attention` runs this kernel there, bit for bit."""
    seed, (q, k, v) = _sm90_qkv(monkeypatch, rng, shape)
    t = shape[2]
    z = aq.quantize(q, k, v, pv, qk=qk)
    want = torch.empty_like(q)
    fa.attend(z, want, t, D**-0.5, fa.launch_for(q.device, pv), kernel="triton")
    default = torch.empty_like(q)
    sm90.attend(z, default, t, D**-0.5)
    assert _rel(default, want) < 5e-3, f"seed {seed}: {_rel(default, want)}"
    assert fa.sm90_kernel(z, want)
    assert torch.equal(fa.fp8_attention(q, k, v, pv=pv, qk=qk), default)


@pytest.mark.gpu
@pytest.mark.parametrize(("qk", "pv"), [("int8", "fp8"), ("int8", "int8")])
def test_fp8_attention_sm90_stores_an_fp32_output_in_fp32(monkeypatch, rng, qk, pv):
    """An fp32 call on sm_90 takes the CuTe kernel too (`fa.sm90_kernel` does not look at the dtype), which stores
    fp32 values, not bf16-rounded ones, from a build of its own: a bf16 call of the same shape first must not serve it
    (the compile cache is keyed by dtype). Against the Triton kernel's fp32 output on the same operands: relative L2
    below 5e-3, as in bf16."""
    seed, (q, k, v) = _sm90_qkv(monkeypatch, rng, (1, 2, 300))
    fa.fp8_attention(q, k, v, pv=pv, qk=qk)  # the bf16 build of this shape, first
    q, k, v = (x.float() for x in (q, k, v))
    z = aq.quantize(q, k, v, pv, qk=qk)
    want = torch.empty_like(q)
    fa.attend(z, want, 300, D**-0.5, fa.launch_for(q.device, pv), kernel="triton")
    got = fa.fp8_attention(q, k, v, pv=pv, qk=qk)
    assert fa.sm90_kernel(z, got) and got.dtype == torch.float32
    assert _rel(got, want) < 5e-3, f"seed {seed}: {_rel(got, want)}"
    assert not torch.equal(got, got.bfloat16().float()), f"seed {seed}: the fp32 output holds bf16 values"


@pytest.mark.gpu
@pytest.mark.parametrize(("qk", "pv"), [("e4m3", "fp8"), ("int8", "fp8"), ("int8", "int8")])
@pytest.mark.parametrize(
    ("shape", "tau"),
    [((1, 3, 300), 0.5), ((2, 2, 1061), 0.0), ((1, 2, 1000), -float("inf")), ((1, 2, 1000), float("inf"))],
)
def test_fp8_attention_sm90_block_sparse_matches_the_triton_kernel(monkeypatch, rng, qk, pv, shape, tau):
    """`attend_sparse` (block_sparse_attention in low precision wholly in the CuTe kernel: exact blocks, then the
    folded pass in bf16) against block_sparse_attention through the Triton kernel (kernel="triton") on the same
    routing and operands: the same visits (pairs, an odd one out, the ragged last block alone), the same maths up to
    fp32 order and l (summed from P as rounded here); relative L2 below 5e-3, as the dense kernel. Shapes with an odd
    number of query blocks (5, 17: a warpgroup with none), ragged last key blocks, lists of one step (tau inf: the
    band and the sinks only, most blocks folded) to all blocks. block_sparse_attention runs this kernel by default
    for block_sparse_attend.SM90_PAIRS."""
    seed, (q, k, v) = _sm90_qkv(monkeypatch, rng, shape)
    t = shape[2]
    k = k + 1.0
    route = plan(q, k, v, tau, 64, stats=True)
    z = aq.quantize(q, k, v, pv, qk=qk, k_mean=route.key_mean, v_amax=route.v_amax)  # as block_sparse_attention
    route = dataclasses.replace(route, k_mean=(route.k_mean.float() - z.k_mean).to(route.k_mean.dtype))
    got = torch.empty_like(q)
    sm90.attend_sparse(z, q, route, t, got)
    want = block_sparse_attention(q, k, v, tau, 64, precision=qk, pv=pv, kernel="triton")
    assert _rel(got, want) < 5e-3, f"seed {seed}: {_rel(got, want)}"
    assert (qk, pv) in block_sparse_attend.SM90_PAIRS
    assert torch.equal(block_sparse_attention(q, k, v, tau, 64, precision=qk, pv=pv), got)
