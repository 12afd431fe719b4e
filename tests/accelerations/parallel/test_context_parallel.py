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

parallel_decode="bands" (two gloo processes, float outputs compared with torch.equal): the decode over two
ranks is bit-equal to diffusers' own `tiled_decode` in one process with the same bands (and the same on both
ranks); against the untiled decode it is only `approximate`, which the report's contract says. Uninstall puts
the VAE's own `_decode` back (its untiled output is bit-equal to before). In one process: the tile/blend code
with every tile on the one rank is bit-equal to diffusers' `tiled_decode` for 2 and 3 bands and odd sizes.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from workbench import Request
from workbench.accelerations import REGISTRY, fingerprint, install
from workbench.accelerations.base import Receipt
from workbench.accelerations.parallel.parallel_decode import band_tiling, owners, tiled_decode
from workbench.distributed import launch, run_arms


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
    assert {o.name: o.default for o in spec.options} == {
        "ulysses_degree": 2, "ring_degree": 1, "relayout": "direct", "parallel_decode": "off", "decode_overlap": 4,
    }  # fmt: skip
    # the VAE's decode is context_parallel's only with parallel_decode="bands": exact-fast's fused decode composes
    install.check_options(REGISTRY, {"context_parallel": {}, "fused_vae_decode": {}})
    with pytest.raises(ValueError, match="'fused_vae_decode' and 'context_parallel' both modify vae.decode"):
        install.check_options(REGISTRY, {"context_parallel": {"parallel_decode": "bands"}, "fused_vae_decode": {}})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"relayout": "fast"}, r"context_parallel.relayout: 'fast' is not allowed; allowed: \['direct'"),
        ({"ulysses_degree": 0}, r"context_parallel.ulysses_degree: 0 is below the minimum 1"),
        ({"ulysses_degree": "2"}, r"context_parallel.ulysses_degree: expected int, got str"),
        ({"ulysses_degree": 1}, r"ulysses_degree=1 and ring_degree=1 split nothing"),
        ({"ulysses_degree": 2, "ring_degree": 2}, r"ulysses_degree=2 with ring_degree=2 \(unified attention\)"),
        ({"ulysses_degree": 1, "ring_degree": 2}, r"context_parallel.relayout='direct' applies to Ulysses only"),
        ({"parallel_decode": "rows"}, r"context_parallel.parallel_decode: 'rows' is not allowed; allowed: \['off'"),
        ({"decode_overlap": 0}, r"context_parallel.decode_overlap: 0 is below the minimum 1"),
    ],
)
def test_context_parallel_bad_option_raises(wan, options, message):
    before = fingerprint(wan.model.pipeline.transformer)
    with pytest.raises(ValueError, match=message):
        wan.accelerate({"context_parallel": options})
    assert fingerprint(wan.model.pipeline.transformer) == before and wan.accelerations == {}


def test_context_parallel_direct_on_cpu_needs_the_interpreter(wan, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
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
        "bands": {"context_parallel": {"relayout": "reference", "parallel_decode": "bands", "decode_overlap": 2}},
    }
    results = run_arms(
        "tiny-wan", request, arms, gpus=2, device="cpu", env={"TRITON_INTERPRET": "1"},
        check_restore=True, timeout=300,
    )  # fmt: skip
    one = results["one_process"]
    assert "context_parallel" not in one.receipts
    calls = wan.model.pipeline.transformer.config.num_layers * request.steps * 2  # self-attention calls, CFG: 2 passes
    for name in ("diffusers", "direct", "reference", "bands"):
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
    bands = results["bands"].receipts["context_parallel"]  # the decode changed, the denoise did not
    assert torch.equal(results["bands"].latents, results["reference"].latents), f"seed {seed}"
    assert bands["contract"] == "approximate" and results["reference"].receipts["context_parallel"]["contract"] == (
        "reduction"
    )
    assert bands["parallel_decodes"] == 1 and bands["decode_tiles"] == 1 and bands["decode_tiles_received"] == 1
    assert bands["notes"]["decode_tiles_per_rank"] == [1, 1], bands
    assert "parallel_decodes" not in results["reference"].receipts["context_parallel"]


def test_context_parallel_h3_two_gloo_processes_within_contract_of_one_process(rng):
    """MiniMax-H3's packed joint sequence (text, video and audio rows in one attention) under Ulysses degree 2: a
    prompt of 20 tokens packs tiny-h3's default request into 20 + 74 video + 414 audio = 508 rows, which split evenly;
    video latents and audio within the reduction contract of one process."""
    seed = int(rng.integers(0, 2**31 - 1))
    request = Request("a red circle moves left!", seed=seed, steps=2)  # 20 non-space characters: 20 text rows
    arms = {"one_process": {}, "direct": {"context_parallel": {"relayout": "direct"}}}
    results = run_arms("tiny-h3", request, arms, gpus=2, device="cpu", env={"TRITON_INTERPRET": "1"},
                       check_restore=True, timeout=300)  # fmt: skip
    one, split = results["one_process"], results["direct"]
    receipt = split.receipts["context_parallel"]
    assert receipt["executed"] and receipt["cp_attention_calls"] > 0 and receipt["fallbacks"] == {}, receipt
    assert split.metadata["uninstall_restored"] is True
    rel = float((split.latents - one.latents).norm() / one.latents.norm())
    audio = float(np.linalg.norm(split.audio - one.audio) / np.linalg.norm(one.audio))
    assert rel <= 1e-5 and audio <= 1e-5, f"seed {seed}: latent rel-L2 {rel}, audio rel-L2 {audio}"
    # 19 tokens: 507 rows, refused on each rank before diffusers splits, and the ranks' own errors reach the caller
    with pytest.raises(RuntimeError, match=r"\[rank0\]: ValueError: context_parallel: .*rope's output 0 has 507 rows"):
        run_arms("tiny-h3", Request("a red circle moves left", steps=2), {"direct": arms["direct"]}, gpus=2,
                 device="cpu", env={"TRITON_INTERPRET": "1"}, timeout=300)  # fmt: skip


def test_context_parallel_refuses_a_sequence_its_ranks_cannot_split_evenly(sessions):
    """diffusers splits the cp_plan's inputs evenly and otherwise fails on a bare assertion mid-request: the plugin's
    pre-hooks name the module, the input, the count and the ranks first (tiny-h3's default request with a 19-token
    prompt packs 507 rows; the hooks are tried here in one process, as two ranks would see them)."""
    from workbench.accelerations.parallel.context_parallel import _split_checks

    h3 = sessions("tiny-h3")
    checks = _split_checks(h3.model.pipeline.transformer, 2)
    try:
        with pytest.raises(ValueError, match=(
            r"context_parallel: MiniMaxH3Transformer3DModel.rope's output 0 has 507 rows along "
            r"dim 0, not a multiple of the 2 ranks"
        )):  # fmt: skip
            h3.generate(Request("a red circle moves left", steps=2), progress=False)
    finally:
        for check in checks:
            check.remove()
    assert not h3.model.pipeline.transformer.transformer_blocks[0]._forward_pre_hooks


@pytest.mark.parametrize("bands, latent, overlap", [(2, (1, 16, 2, 9, 5), 2), (3, (1, 16, 3, 13, 6), 1)])
def test_parallel_decode_one_rank_bitwise_equal_diffusers_tiled_decode(
    wan, one_process_group, rng, bands, latent, overlap
):
    """The tile/blend code with every tile on the one rank is diffusers' tiled_decode, bit for bit."""
    seed = int(rng.integers(0, 2**31 - 1))
    vae = wan.model.pipeline.vae
    z = torch.randn(*latent, generator=torch.Generator().manual_seed(seed))
    tiling = band_tiling(vae, latent[3], latent[4], bands, overlap)
    receipt = Receipt(("parallel_decodes",))
    saved = {name: getattr(vae, name) for name in (*tiling.to_dict(), "use_tiling")}  # the shared session's VAE
    try:
        with torch.inference_mode():
            ours = tiled_decode(vae, z, tiling, receipt)
            vae.enable_tiling(**tiling.to_dict())
            stock = vae.decode(z).sample
    finally:
        for name, value in saved.items():
            setattr(vae, name, value)
    assert torch.equal(ours, stock), f"seed {seed}"
    assert receipt.counters["decode_tiles"] == bands and receipt.notes["decode_tiles_per_rank"] == [bands]


def test_parallel_decode_bands_too_short_is_runtime_error(wan):
    vae = wan.model.pipeline.vae
    with pytest.raises(
        RuntimeError, match=r"a latent frame of 8 rows cannot be cut into 2 bands with decode_overlap=4"
    ):
        band_tiling(vae, 8, 8, 2, 4)
    assert band_tiling(vae, 60, 104, 2, 4).to_dict() == {
        "tile_sample_min_height": 272, "tile_sample_min_width": 832,
        "tile_sample_stride_height": 240, "tile_sample_stride_width": 832,
    }  # fmt: skip
    assert owners(2, 2) == [0, 1] and owners(3, 2) == [0, 0, 1] and owners(1, 2) == [0]


def test_context_parallel_parallel_decode_needs_wan_vae(sessions):
    ltx2 = sessions("tiny-ltx2")
    ltx2.accelerate({})
    with pytest.raises(RuntimeError, match=r"parallel_decode: needs diffusers' AutoencoderKLWan"):
        ltx2.accelerate({"context_parallel": {"relayout": "reference", "parallel_decode": "bands"}})
    assert "_decode" not in ltx2.model.pipeline.vae.__dict__ and ltx2.accelerations == {}


def test_context_parallel_parallel_decode_two_gloo_processes_bitwise_equal_one_process_tiled(tmp_path, rng):
    seed = int(rng.integers(0, 2**31 - 1))
    out = tmp_path / "decode.json"
    root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = launch(
        2, "tests.accelerations.parallel.parallel_decode_worker", [str(out), str(seed)], env, timeout=300, capture=True
    )
    stages = [line for line in (done.stderr or "").splitlines() if line.startswith("parallel_decode_worker rank")]
    assert done.returncode == 0 and out.is_file(), f"seed {seed}, stages {stages}\n" + (done.stderr or "")[-3000:]
    record = json.loads(out.read_text())
    print(f"seed {seed}: max |bands - untiled| = {record['max_abs_vs_untiled']:.3e}, tiling {record['tiling']}")
    assert record["bitwise_equal_one_process_tiled"] is True, f"seed {seed}"
    assert record["ranks_bitwise_equal"] and record["return_dict_false_equal"], f"seed {seed}"
    assert record["shape"] == record["untiled_shape"] == [1, 3, 5, 88, 56]
    assert record["uninstall_restored"] is True
    for rank, report in enumerate(record["reports"]):
        assert report["contract"] == "approximate" and report["parallel_decodes"] == 2, (rank, report)
        assert report["decode_tiles"] == 2 and report["decode_tiles_received"] == 2, (rank, report)
        assert (
            report["notes"]["decode_tiles_per_rank"] == [1, 1] and report["notes"]["decode_tiling"] == record["tiling"]
        )
