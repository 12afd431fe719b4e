"""context_parallel: option and capability errors in-process; the real thing in two gloo processes on CPU.

What the two-process test proves (tiny-wan, fp32, CPU, gloo, Ulysses degree 2, default native attention):
diffusers' context parallelism wired by this plugin splits the sequence, exchanges heads by all_to_all_single
(gloo supports it in this torch) and gathers the output, giving latents within the `reduction` contract of
what one process computes with the whole model; the workbench relayouts (Triton kernels under
TRITON_INTERPRET=1, and the torch references) give output bit-equal to diffusers' stock Ulysses; receipts
count one all-to-all each way per attention call for the workbench path (two more for diffusers'); uninstall
restores the denoiser's fingerprint. It proves nothing about NCCL, GPU kernels or speed (the benchmark does),
nor about ring attention: diffusers' ring needs an attention backend that returns the log-sum-exp, and the
only context-parallel backend that runs on a CPU (native SDPA) does not.
"""

import pytest
import torch
import torch.distributed as dist

from workbench import Request
from workbench.accelerations import REGISTRY, fingerprint
from workbench.distributed import run_arms
from workbench.kernels.relayout import ENV_VAR


@pytest.fixture
def wan(sessions):
    session = sessions("tiny-wan")
    session.accelerate({})
    yield session
    session.accelerate({})


@pytest.fixture
def one_process_group():
    """A real (one-process) gloo group in this test process, destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_context_parallel_is_registered_with_reduction_contract():
    spec = REGISTRY["context_parallel"]
    assert spec.contract == "reduction"
    assert {o.name: o.default for o in spec.options} == {"ulysses_degree": 2, "ring_degree": 1, "relayout": "direct"}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"relayout": "fast"}, r"context_parallel.relayout: 'fast' is not allowed; allowed: \['direct'"),
        ({"ulysses_degree": 0}, r"context_parallel.ulysses_degree: 0 is below the minimum 1"),
        ({"ulysses_degree": "2"}, r"context_parallel.ulysses_degree: expected int, got str"),
        ({"ulysses_degree": 1}, r"ulysses_degree=1 and ring_degree=1 split nothing"),
        ({"ulysses_degree": 2, "ring_degree": 2}, r"ulysses_degree=2 with ring_degree=2 \(unified attention\)"),
        ({"ulysses_degree": 1, "ring_degree": 2}, r"context_parallel.relayout='direct' applies to Ulysses only"),
    ],
)
def test_context_parallel_bad_option_raises(wan, options, message):
    before = fingerprint(wan.model.pipeline.transformer)
    with pytest.raises(ValueError, match=message):
        wan.accelerate({"context_parallel": options})
    assert fingerprint(wan.model.pipeline.transformer) == before and wan.accelerations == {}


def test_context_parallel_bad_relayout_switch_raises(wan, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "yes")
    with pytest.raises(ValueError, match=rf"{ENV_VAR}='yes' is not allowed"):
        wan.accelerate({"context_parallel": {}})


def test_context_parallel_direct_on_cpu_needs_the_interpreter(wan, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(RuntimeError, match=r"relayout='direct' on CPU needs the Triton interpreter"):
        wan.accelerate({"context_parallel": {}})


def test_context_parallel_without_process_group_is_runtime_error(wan):
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"needs an initialised torch.distributed process group; start"):
        wan.accelerate({"context_parallel": {"relayout": "diffusers"}})


def test_context_parallel_world_size_mismatch_is_runtime_error(wan, one_process_group):
    before = fingerprint(wan.model.pipeline.transformer)
    with pytest.raises(RuntimeError, match=r"ulysses_degree \* ring_degree = 2 but the process group has 1 processes"):
        wan.accelerate({"context_parallel": {"relayout": "reference"}})
    assert fingerprint(wan.model.pipeline.transformer) == before


def test_context_parallel_two_gloo_processes_within_contract_of_one_process(wan, rng):
    seed = int(rng.integers(0, 2**31 - 1))
    request = Request("a red circle moves left", seed=seed, frames=9, height=64, width=64, steps=2, guidance=5.0)
    arms = {
        "one_process": {},
        "diffusers": {"context_parallel": {"relayout": "diffusers"}},
        "direct": {"context_parallel": {"relayout": "direct"}},
        "reference": {"context_parallel": {"relayout": "reference"}},
    }
    results = run_arms(
        "tiny-wan", request, arms, gpus=2, device="cpu", env={"TRITON_INTERPRET": "1", ENV_VAR: "1"},
        check_restore=True, timeout=300,
    )  # fmt: skip
    one = results["one_process"]
    assert "context_parallel" not in one.receipts
    calls = wan.model.pipeline.transformer.config.num_layers * request.steps * 2  # self-attention calls, CFG: 2 passes
    for name in ("diffusers", "direct", "reference"):
        result = results[name]
        receipt = result.receipts["context_parallel"]
        assert receipt["executed"] and receipt["cp_attention_calls"] == calls, (name, receipt)
        assert receipt["notes"]["world_size"] == 2 and receipt["notes"]["rank"] == 0 and receipt["fallbacks"] == {}
        assert result.metadata["uninstall_restored"] is True, name
        rel = float((result.latents - one.latents).norm() / one.latents.norm())
        print(f"seed {seed}: {name} latent rel-L2 vs one process {rel:.3e}, bit-equal {rel == 0.0}")
        assert rel <= 1e-5, f"seed {seed}: {name} latent rel-L2 {rel} is outside the reduction contract"
    direct, reference, stock = (results[n].receipts["context_parallel"] for n in ("direct", "reference", "diffusers"))
    assert direct["direct_relayout_calls"] == 3 * calls and "reference_relayout_calls" not in direct
    assert reference["reference_relayout_calls"] == 3 * calls and "direct_relayout_calls" not in reference
    assert direct["all_to_all_calls"] == reference["all_to_all_calls"] == 2 * calls  # q/k/v together, then the output
    assert stock["all_to_all_calls"] == 4 * calls and "direct_relayout_calls" not in stock  # q, k, v, output
    for name in ("direct", "reference"):
        assert torch.equal(results[name].latents, results["diffusers"].latents), f"seed {seed}: {name}"
        assert (results[name].frames == results["diffusers"].frames).all(), f"seed {seed}: {name}"
