"""The Gluon kernels of `Launch(gluon=True)` (fp8_attention and block_sparse_attend's low-precision path): compiled
for sm_90 without a GPU (the structure of the key loop, registers and shared memory), refused where they cannot run,
and on an H200 equal to the reference."""

import re

import pytest
import torch

from workbench.kernels import fp8_attention_sm90
from workbench.kernels.attention_quantize import QUANT_BLOCK, quantize
from workbench.kernels.fp8_attention import Launch, attend, fp8_attention, reference
from workbench.kernels.targets import TARGETS, _ptxas_usage


def _build(kernel, signature: dict, constants: dict, num_warps: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    source = GluonASTSource(kernel, signature, {(list(signature).index(k),): v for k, v in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def _events(ptx: str) -> str:
    """The PTX's tensor-core dots (M), waits leaving one group in flight (1) or none (0) and exponentials (E)."""
    return "".join(
        "1" if "wait_group.sync.aligned 1" in line else "0" if "wait_group.sync.aligned 0" in line
        else "M" if "wgmma.mma_async" in line else "E" if "ex2.approx" in line else ""
        for line in ptx.splitlines()
    )  # fmt: skip


def _assert_overlaps_and_fits(kernel) -> None:
    """Both dots issued, then the one wait that leaves the P.V in flight, directly followed by the exponentials; no
    register spills (ptxas); shared memory for two blocks on an SM."""
    ptx = kernel.asm["ptx"]
    events = _events(ptx)
    assert re.search(r"MM1E", events) and events.count("1") == 1, events
    registers, spills = _ptxas_usage(ptx, TARGETS["sm_90"])
    assert spills == 0 and registers <= 255, (registers, spills)
    assert 2 * kernel.metadata.shared <= TARGETS["sm_90"].shared_bytes


def _compile(qk: str, pv: str, d: int, launch: Launch):
    q = "*i8" if qk == "int8" else "*fp8e4nv"
    v = "*fp8e4nv" if pv == "fp8" else "*bf16"
    pointers = dict(q_ptr=q, qs_ptr="*fp32", k_ptr=q, ks_ptr="*fp32", v_ptr=v, vs_ptr="*fp32", out_ptr="*bf16")
    scalars = dict(H="i32", TQ="i32", TK="i32", TQP="i32", TKP="i32", qk_scale="fp32")
    scalars |= dict.fromkeys(("v_sb", "v_sh", "v_st", "o_sb", "o_sh", "o_st"), "i64")
    constants = dict(BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, D=d, QUANT=QUANT_BLOCK, STAGES=launch.num_stages)
    constants |= dict(QK_INT8=qk == "int8", PV_FP8=pv == "fp8", num_warps=launch.num_warps)
    return _build(fp8_attention_sm90._fp8_attention_sm90, {**pointers, **scalars}, constants, launch.num_warps)


M64, M128 = Launch(64, 64, 4, 3, gluon=True), Launch(128, 64, 8, 3, gluon=True)


@pytest.mark.parametrize(
    ("qk", "pv", "d", "launch"),
    [("int8", "fp8", 128, M64), ("int8", "bf16", 128, M64), ("e4m3", "fp8", 64, M64), ("int8", "fp8", 128, M128)],
)
def test_key_loop_overlaps_softmax_with_the_pv_dot(monkeypatch, qk, pv, d, launch):
    """In the key loop's PTX the logits and P.V dots are issued together and the wait leaves one group in flight
    (`wait_group 1`) while the exponentials run; no register spills; the shared memory fits sm_90 twice (two blocks
    on an SM)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernel = _compile(qk, pv, d, launch)
    _assert_overlaps_and_fits(kernel)


def test_gluon_launch_is_checked_and_refused_off_sm90(rng):
    with pytest.raises(ValueError, match=r"block_m 128 must be 16 x num_warps \(64\)"):
        Launch(block_m=128, gluon=True)
    q, k, v = (torch.randn(1, 1, 128, 64, generator=rng) for _ in range(3))
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match="runs compiled on sm_90 only"):
        attend(quantize(q, k, v, "fp8"), out, 128, 0.125, Launch(block_n=64, gluon=True))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU"
)
@pytest.mark.parametrize(("qk", "pv"), [("int8", "fp8"), ("e4m3", "fp8"), ("int8", "bf16")])
@pytest.mark.parametrize("launch", [M64, M128, Launch(64, 128, 4, 2, gluon=True)])
@pytest.mark.parametrize("tokens", [1000, 64])
def test_gluon_kernel_matches_reference_on_h200(monkeypatch, qk, pv, launch, tokens):
    """Odd lengths (one masked tile; a single tile) in the dispatcher's layout, both Q.K^T precisions: the Gluon
    kernel equals the reference of its block_n as closely as the Triton kernel does, and the Triton kernel at the
    same block_n up to fp32 rounding."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, tokens, 4, 128, generator=g, device="cuda").bfloat16().transpose(1, 2) for _ in range(3))
    block_n = launch.block_n
    out = fp8_attention(q, k, v, pv=pv, qk=qk, launch=launch)
    expected = reference(q, k, v, pv=pv, block_n=block_n, qk=qk)
    assert (out.float() - expected.float()).norm() / expected.float().norm() < 1e-2
    triton_out = fp8_attention(q, k, v, pv=pv, qk=qk, launch=Launch(block_n=block_n, num_stages=2))
    assert (out.float() - triton_out.float()).norm() / triton_out.float().norm() < 1e-2


def test_fp8_attention_scenario_switch_for_the_gluon_launches(monkeypatch):
    """FP8_ATTENTION_GLUON=0 keeps a benchmark run off the Gluon kernel (e.g. until its GPU test has passed there)."""
    from benchmarks.scenarios import fp8_attention as scenario

    monkeypatch.delenv("FP8_ATTENTION_GLUON", raising=False)
    assert scenario.gluon_wanted()
    monkeypatch.setenv("FP8_ATTENTION_GLUON", "0")
    assert not scenario.gluon_wanted()
    monkeypatch.setenv("FP8_ATTENTION_GLUON", "yes")
    with pytest.raises(ValueError, match=r"FP8_ATTENTION_GLUON: 'yes'; allowed: '1'"):
        scenario.gluon_wanted()


@pytest.mark.parametrize(("qk", "pv"), [("int8", "fp8"), ("int8", "bf16")])
def test_block_sparse_exact_pass_overlaps_and_fits(monkeypatch, qk, pv):
    """block_sparse_attend's Gluon kernel: its exact-block loop has the same overlap (two dots, `wait_group 1`,
    exponentials), no register spills (the folded pass reads its mean keys and values by TMA, not through
    registers), and shared memory for two blocks on an SM."""
    from workbench.kernels import block_sparse_attend_sm90

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q8 = "*i8" if qk == "int8" else "*fp8e4nv"
    pointers = dict(q_ptr="*bf16", km_ptr="*bf16", vm_ptr="*bf16", loglen_ptr="*fp32", mask_ptr="*u8",
                    idx_ptr="*i32", count_ptr="*i32", out_ptr="*bf16", q8_ptr=q8, qs_ptr="*fp32", k8_ptr=q8,
                    ks_ptr="*fp32", v_ptr="*fp8e4nv" if pv == "fp8" else "*bf16", vs_ptr="*fp32")  # fmt: skip
    scalars = dict.fromkeys(("H", "TQ", "TK", "KB", "QB"), "i32") | {"qk_scale": "fp32", "TQP": "i32", "TKP": "i32"}
    scalars |= dict.fromkeys(("q_sb", "q_sh", "q_st", "v_sb", "v_sh", "v_st"), "i64")
    constants = dict(BLOCK=64, D=128, QUANT=QUANT_BLOCK, STAGES=3, QK_INT8=qk == "int8", PV_FP8=pv == "fp8")
    kernel = _build(
        block_sparse_attend_sm90._block_sparse_sm90, {**pointers, **scalars}, {**constants, "num_warps": 4}, 4
    )
    _assert_overlaps_and_fits(kernel)


def test_block_sparse_gluon_launch_is_checked_and_refused_off_sm90(rng):
    from workbench.kernels import block_sparse_attend as bsa
    from workbench.kernels.block_sparse_attention import plan

    with pytest.raises(ValueError, match=r"Launch\(gluon=True\) takes num_warps 4, rows 64"):
        bsa.Launch(num_warps=8, num_stages=2, rows=32, gluon=True)
    q, k, v = (torch.randn(1, 1, 128, 64, generator=rng) for _ in range(3))
    with pytest.raises(
        RuntimeError, match=r"here: the exact path \(no `quantized`\), q torch.float32 .*capability None"
    ):
        bsa.attend(q, k, v, plan(q, k, v, 0.5, 64, 0.125), bsa.Launch(gluon=True))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU"
)
@pytest.mark.parametrize(("precision", "pv"), [("int8", "fp8"), ("int8", "bf16"), ("e4m3", "fp8")])
@pytest.mark.parametrize("d", [128, 48])
def test_block_sparse_gluon_matches_the_triton_kernel_on_h200(monkeypatch, precision, pv, d):
    """The Gluon low-precision path on bf16 dispatcher views of an odd length: equal to the Triton kernel's up to fp32
    rounding and bf16 output, and to the reference within the Triton path's own bound."""
    from workbench.kernels.block_sparse_attend import Launch as SparseLaunch
    from workbench.kernels.block_sparse_attention import block_sparse_attention
    from workbench.kernels.block_sparse_attention import reference as sparse_reference

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 1000, 4, d, generator=g, device="cuda").bfloat16().transpose(1, 2) for _ in range(3))
    k = k + 1.0
    options = dict(precision=precision, pv=pv)
    got = block_sparse_attention(q, k, v, 0.5, 64, launch=SparseLaunch(gluon=True), **options)
    triton_out = block_sparse_attention(q, k, v, 0.5, 64, **options).float()
    assert (got.float() - triton_out).norm() / triton_out.norm() < 1e-2
    expected = sparse_reference(q, k, v, 0.5, 64, **options).float()
    assert (got.float() - expected).norm() / expected.norm() < 2e-2
