"""The A/B/A harness on CPU with the tiny Wan: each verdict a CPU run can honestly reach."""

import dataclasses
import json

import numpy as np
import pytest

from workbench import Request, Session
from workbench.accelerations import REGISTRY
from workbench.cli import main
from workbench.evidence.calibrate import calibrate, stack
from workbench.evidence.harness import check_rounds, qualify
from workbench.evidence.sweep import search, sweep

REQUEST = Request("a red circle moves left", seed=42, steps=4, height=32, width=32)
SMALLEST = Request("a red circle moves left", seed=42, frames=1, steps=2, height=16, width=16)  # size does not matter


@pytest.fixture(scope="module")
def session():
    return Session.open("tiny-wan", device="cpu")


@pytest.fixture
def callers(session):
    """The accelerations a caller installed before calling the harness (taken off again after the test)."""
    try:
        yield session.accelerate({"fused_qkv": {}})
    finally:
        session.accelerate({})


def test_exact_plugin_in_budget_but_cpu_gives_no_speed_claim(session, callers):
    record, pilots = qualify(session, [REQUEST], {}, {"cross_kv_cache": {}}, rounds=3, progress=False)
    case = record["cases"][0]
    assert record["verdict"] == case["verdict"] == "no_speed_claim"
    assert "CUDA" in case["reason"]
    assert case["quality"]["exact"] and case["quality"]["within_budget"]
    assert case["timed_outputs_match_pilot"] == {"baseline": True, "candidate": True}
    assert len(case["baseline_seconds"]) == 4 and len(case["candidate_seconds"]) == 3  # A B A B A B A
    assert case["receipts"]["cross_kv_cache"]["hits"] > 0
    assert session.accelerations == callers  # the harness leaves the session as it was


def test_lossy_plugin_outside_budget_is_rejected(session):
    candidate = {"easycache": {"threshold": 10.0, "warmup": 1, "final_dense": 1}}
    record, _ = qualify(session, [REQUEST], {}, candidate, rounds=3, progress=False)
    case = record["cases"][0]
    assert case["verdict"] == "rejected_quality" and not case["quality"]["within_budget"]
    assert case["exact"] is False and case["receipts"]["easycache"]["reused"] > 0


def test_configured_but_never_executed_plugin_is_not_executed(session):
    record, _ = qualify(session, [SMALLEST], {}, {"easycache": {"threshold": 0.0}}, rounds=3, progress=False)
    assert record["verdict"] == "not_executed"
    # one idle member voids a set's claim, and the reason names it
    stacked = {"cross_kv_cache": {}, "easycache": {"threshold": 0.0}}
    record, _ = qualify(session, [SMALLEST], {}, stacked, rounds=3, progress=False)
    assert record["verdict"] == "not_executed" and "['easycache'] did no work" in record["cases"][0]["reason"]


def test_too_few_or_too_many_rounds_refused_and_a_numpy_integer_taken_as_an_int(session):
    for rounds in (2, 101, True):
        with pytest.raises(ValueError, match=rf"rounds: {rounds}; allowed: an int of interleaved rounds in \[3, 100\]"):
            qualify(session, [REQUEST], {}, {"cross_kv_cache": {}}, rounds=rounds, progress=False)
    assert type(check_rounds(np.int64(3))) is int and check_rounds(np.int64(3)) == 3  # a record holds a plain int


EVIDENCE = {  # each evidence function, on `requests`, with its other arguments good
    "qualify": lambda session, requests, **kw: qualify(session, requests, {}, {"cross_kv_cache": {}}, **kw),
    "sweep": lambda session, requests, **kw: sweep(session, requests, "easycache", "threshold", [0.1], **kw),
    "search": lambda session, requests, **kw: search(session, requests, [{"cross_kv_cache": {}}], **kw),
    "calibrate": lambda session, requests, **kw: calibrate(session, requests, None, "easycache", **kw),
    "stack": lambda session, requests, **kw: stack(session, requests, None, ["easycache"], **kw),
}


@pytest.mark.parametrize("name", list(EVIDENCE))
def test_a_bad_budget_progress_or_request_list_is_refused_before_any_run(session, monkeypatch, name):
    """One check of the arguments every evidence function shares: a dict for a Budget (it failed deep in the quality
    comparison after a whole case ran), a truthy non-bool for `progress` (as `Session.generate` refuses it), a single
    Request for the list of them."""

    def ran(*args, **kwargs):
        raise AssertionError("a request ran before the arguments were checked")

    monkeypatch.setattr(Session, "generate", ran)
    call = EVIDENCE[name]
    budget = r"^budget: expected a workbench.quality.Budget \(or None for the model's default\), got dict"
    with pytest.raises(ValueError, match=budget):
        call(session, [REQUEST], budget={"psnr_db": 30}, progress=False)
    with pytest.raises(ValueError, match=r"^progress: expected a bool, got str 'no'; allowed: True, False$"):
        call(session, [REQUEST], progress="no")
    where = "calibration" if name in ("calibrate", "stack") else "requests"
    with pytest.raises(ValueError, match=rf"^{where}: expected a list of workbench.Request, got Request \(a single"):
        call(session, REQUEST, progress=False)


def test_an_interrupted_qualification_puts_the_callers_accelerations_back(session, callers):
    """Ctrl-C during the candidate's pilot (here from a subscriber) leaves no candidate installed: a cache left on
    would make the caller's later requests silently approximate."""

    def interrupt(event):
        if "easycache" in session.accelerations:
            raise KeyboardInterrupt

    unsubscribe = session.subscribe(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            qualify(session, [REQUEST], {}, {"easycache": {"threshold": 0.1}}, progress=False)
    finally:
        unsubscribe()
    assert session.accelerations == callers


def test_a_request_the_model_cannot_take_is_refused_before_any_run(session, monkeypatch):
    """Every request and both arms are checked against the model and device before the first run: a later case with
    frames the VAE refuses costs no generation of the earlier ones (2 x rounds + 3 runs each), and the error names
    the case; an arm the device cannot run is named before any run."""

    def ran(*args, **kwargs):
        raise AssertionError("a request ran before every request was checked")

    monkeypatch.setattr(Session, "generate", ran)
    odd = Request("a blue square", seed=43, frames=10, steps=4, height=32, width=32)  # Wan takes 4n + 1 frames
    with pytest.raises(ValueError, match=r"^requests\[1\]: frames: 10 is not accepted by the wan VAE"):
        qualify(session, [REQUEST, odd], {}, {"cross_kv_cache": {}}, rounds=3, progress=False)
    # an arm this machine cannot run (`Spec.unusable`: a Triton plugin on a CPU without the interpreter, a GPU too
    # old), named before the first run too, whichever arm it is; it was found only when the candidate was installed
    monkeypatch.setitem(REGISTRY, "fused_qkv", dataclasses.replace(REGISTRY["fused_qkv"], unusable=lambda d: "no"))
    for arms in (({}, {"fused_qkv": {}}), ({"fused_qkv": {}}, {"cross_kv_cache": {}})):
        with pytest.raises(RuntimeError, match="^fused_qkv: no$"):
            qualify(session, [REQUEST], *arms, rounds=3, progress=False)


def test_cli_qualify_writes_record_and_offline_report(tmp_path, capsys):
    out = tmp_path / "q"
    code = main(
        [
            "qualify",
            "--model",
            "tiny-wan",
            "--suite",
            "data_manifests/tiny-smoke.json",
            "--candidate",
            '{"cross_kv_cache": {}}',
            "--rounds",
            "3",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "verdict: no_speed_claim" in capsys.readouterr().out
    record = json.loads((out / "qualification.json").read_text())
    assert len(record["cases"]) == 2 and record["suite"]["name"] == "tiny-smoke"
    assert record["git"]["commit"] is None or len(record["git"]["commit"]) == 40
    report = (out / "qualification.html").read_text()
    assert report.count("data:video/mp4;base64,") == 4 and "<script" not in report


def test_cli_qualify_bad_json_is_an_error(tmp_path, capsys):
    code = main(
        [
            "qualify",
            "--model",
            "tiny-wan",
            "--suite",
            "data_manifests/tiny-smoke.json",
            "--candidate",
            "{easycache",
            "--out",
            str(tmp_path / "q"),
        ]
    )
    assert code == 2 and "--candidate: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_report_from_record_alone_says_videos_are_missing(session):
    from workbench.evidence.report import render

    record, _ = qualify(session, [REQUEST], {}, {"cross_kv_cache": {}}, rounds=3, progress=False)
    page = render(record, None)
    assert "Videos not embedded" in page and "data:video" not in page and "no_speed_claim" in page


def test_kernel_benchmark_refuses_a_full_run_off_cuda_and_kernels_on_a_cpu_without_the_interpreter(monkeypatch):
    from workbench.kernel_bench import benchmark

    with pytest.raises(RuntimeError, match="need a CUDA device, got cpu; pass smoke=True"):
        benchmark("cpu", rounds=3)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        benchmark("cpu", rounds=3, smoke=True)


def test_kernel_bench_compare_checks_then_times_each_kernel_aba_against_the_given_ceilings(monkeypatch):
    from workbench import kernel_bench
    from workbench.telemetry import summarize_samples

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cases = kernel_bench.cases(batch=1, tokens=5, channels=64, heads=2, device="cpu", seed=3)[:2]
    # made-up ceilings (1 GB/s copy, 1 GFLOP/s): the rooflines and fractions are at the ceilings given
    given = kernel_bench.Ceilings("given", copy_bytes=10**9, copy_s=1.0, gemm_flops=10**9, gemm_s=1.0)
    result = kernel_bench.compare(cases, "cpu", given, rounds=3, clock={"repeats": 1, "warmup": 0, "queued": False})
    assert list(result.arms) == ["adaln_modulate", "gated_residual"] and result.passed
    for name, arm in result.arms.items():
        assert arm["bitwise_equal"] and arm["within"]
        assert arm["roofline_s"] == max(arm["bytes_moved"], arm["flops"]) / 1e9
        assert arm["fraction_of_roofline"] == arm["roofline_s"] / arm["median_s"]
        ratio = result.ratios[f"{name} reference/{name}"]
        assert ratio["n_pairs"] == 3 and ratio["low"] <= ratio["median"] <= ratio["high"]
    page = result.html()
    assert page.count(">equal</td>") == 2 and "given: copy " in page and "Smoke run" not in page
    assert "during the run" not in page  # nothing sampled: nothing claimed
    sample = {"used_bytes": 1, "temperature_c": 61, "sm_clock_mhz": 1755, "throttle_reasons": 0x20, "processes": 1}
    result.device_state = summarize_samples([sample, {**sample, "sm_clock_mhz": 1980, "throttle_reasons": 0}])
    assert "SM clock 1755-1980 MHz, up to 61 C, 1 of 2 samples slowed by heat or hardware" in result.html()


def test_kernel_bench_table_states_each_ceiling_in_a_unit_it_can_be_read_in_and_shows_launch_times_where_measured():
    """A CPU's (or a smoke run's) ceilings are far below a GPU's: at a GPU's fixed TB/s and TFLOP/s they read as zero.
    The host launch column is shown when a kernel's launch was timed (CUDA), not as a column of blanks."""
    import torch

    from workbench import kernel_bench

    x = torch.randn(4)
    case = kernel_bench.Case("same", lambda: x * 1, lambda: x, 16, 0, exact=True)
    cpu_like = kernel_bench.Ceilings("cpu", copy_bytes=131072, copy_s=0.0079, gemm_flops=524288, gemm_s=0.0077)
    clock = {"repeats": 1, "warmup": 0, "queued": False}
    result = kernel_bench.compare([case], "cpu", cpu_like, rounds=3, clock=clock, smoke=True)
    page = result.html()
    assert "cpu: copy 16.6 MB/s (read + write), bf16 GEMM 68.1 MFLOP/s, measured in this run" in page
    assert "host launch" not in page and "roofline_s" not in page and "Of roofline: the least time" in page
    result.arms["same"]["host_launch_s"] = 4.8e-5
    result.ceilings = kernel_bench.Ceilings("NVIDIA H100", copy_bytes=2980, copy_s=1e-9, gemm_flops=766, gemm_s=1e-12)
    page = result.html()
    assert "NVIDIA H100: copy 2.98 TB/s (read + write), bf16 GEMM 766 TFLOP/s" in page
    assert '<th style="text-align:right">host launch ms</th>' in page
    assert '<td style="text-align:right">0.048</td></tr>' in page
    # headings align as their columns (kernel and check left, times right) and the caption from the left edge: a
    # browser centres a caption and nbconvert's page right-aligns an unstyled heading
    assert '<th style="text-align:left">kernel</th><th style="text-align:left">check</th>' in page
    assert '<td style="text-align:left">same</td><td style="text-align:left">equal</td>' in page
    assert '<caption style="text-align:left">Smoke run (tiny shapes' in page and "nothing.<br>NVIDIA H100: " in page


def test_kernel_bench_leaves_a_kernel_outside_its_contract_untimed_and_says_so():
    import torch

    from workbench import kernel_bench

    x = torch.randn(4)
    wrong = kernel_bench.Case("wrong", lambda: x + 1, lambda: x, 16, 0, exact=True)
    right = kernel_bench.Case("right", lambda: x * 1, lambda: x, 16, 0, exact=True)
    ceilings = kernel_bench.Ceilings("given", copy_bytes=1, copy_s=1.0, gemm_flops=1, gemm_s=1.0)
    clock = {"repeats": 1, "warmup": 0, "queued": False}
    result = kernel_bench.compare([wrong, right], "cpu", ceilings, rounds=3, clock=clock, smoke=True)
    assert not result.passed and "median_s" not in result.arms["wrong"] and "median_s" in result.arms["right"]
    assert result.notes[0].startswith("wrong: output outside its contract's bound; not timed")
    assert "outside its contract" in result.html() and "Smoke run" in result.html()


def test_measure_ceilings_are_the_rates_of_the_copy_and_gemm_it_timed(monkeypatch):
    """On tiny sizes on the CPU: the copy moves 2 x its bytes (read + write), the GEMM 2*n^3 flops, each rate over the
    median `time_call` gave; the roofline is at those rates. No speed is asserted."""
    import math

    import torch

    from workbench import kernel_bench

    time_call = kernel_bench.time_call
    timed = []  # (what one call returns: shape, dtype) and the median time_call gave for it

    def recorded(fn, *args, **kwargs):
        timing = time_call(fn, *args, **kwargs)
        out = fn()
        timed.append(((tuple(out.shape), out.dtype), timing.median_s))
        return timing

    monkeypatch.setattr(kernel_bench, "time_call", recorded)
    ceilings = kernel_bench.measure_ceilings("cpu", copy_bytes=4096, gemm_size=16, repeats=3, warmup=1)
    (copied, copy_s), (product, gemm_s) = timed
    assert copied == ((4096,), torch.uint8) and product == ((16, 16), torch.bfloat16)
    assert ceilings.device == "cpu" and ceilings.copy_bytes == 2 * 4096 and ceilings.gemm_flops == 2 * 16**3
    assert ceilings.copy_bytes_per_s == 2 * 4096 / copy_s and ceilings.bf16_flops_per_s == 2 * 16**3 / gemm_s
    assert all(math.isfinite(rate) and rate > 0 for rate in (ceilings.copy_bytes_per_s, ceilings.bf16_flops_per_s))
    assert ceilings.roofline_seconds(2 * 4096, 0) == pytest.approx(copy_s)
    assert ceilings.roofline_seconds(0, 2 * 16**3) == pytest.approx(gemm_s)
    assert ceilings.to_dict()["copy_bytes_per_s"] == ceilings.copy_bytes_per_s
    assert ceilings.to_dict()["bf16_flops"] == ceilings.bf16_flops_per_s


def test_the_default_budget_holds_a_model_with_sound_to_the_audio_limits_and_overrides_keep_the_rest(sessions):
    from workbench.cli.evidence import _budget
    from workbench.evidence.harness import default_budget
    from workbench.quality import Budget
    from workbench.quality.budget import AUDIO_LIMITS

    assert default_budget(sessions("tiny-wan")) == Budget()
    with_sound = default_budget(sessions("tiny-ltx2"))
    assert with_sound == Budget().with_audio() and with_sound.audio_snr_db == AUDIO_LIMITS["audio_snr_db"]
    given = _budget(with_sound, {"psnr_db": 30.0, "lsd_db": None})  # --budget '{"psnr_db": 30, "lsd_db": null}'
    assert (given.psnr_db, given.lsd_db, given.audio_snr_db, given.latent_rel_l2) == (30.0, None, 20.0, 0.03)
