"""The one timing module: both clocks on the CPU, refusals, and A/B/A pairing with the evidence package's CI."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from workbench.evidence.stats import paired_ratio_ci
from workbench.evidence.timing import aba_rounds, kernel_times, profile_summary, time_call


def test_time_call_cpu_times_every_call_and_excludes_warmup():
    calls = []
    timing = time_call(lambda: calls.append(1), "cpu", repeats=4, warmup=2)
    assert len(calls) == 2 + 4 + 4  # warm-up, synchronised, queued
    assert timing.clock == "perf_counter" and len(timing.synchronised_s) == 4 and timing.warmup == 2
    assert timing.queued_s is not None and timing.queued_s >= 0 and timing.median_s >= 0
    assert set(timing.to_dict()) >= {"clock", "synchronised_s", "queued_s", "median_s"}


def test_time_call_without_queued_clock_makes_only_the_timed_calls():
    calls = []
    timing = time_call(lambda: calls.append(1), torch.device("cpu"), repeats=3, warmup=0, queued=False)
    assert len(calls) == 3 and timing.queued_s is None


def test_time_call_bad_arguments_raise():
    with pytest.raises(ValueError, match="repeats"):
        time_call(lambda: None, "cpu", repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        time_call(lambda: None, "cpu", warmup=-1)
    with pytest.raises(RuntimeError, match="CUDA-graph replay needs a CUDA device"):
        time_call(lambda: None, "cpu", graph=True)


def test_kernel_times_sums_each_op_by_name():
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def work():
        for _ in range(3):
            a @ b
        a.add(b)

    table = kernel_times(work, "cpu")
    rows = {row["name"]: row for row in table["top"]}
    assert table["activity"] == "cpu" and rows["aten::mm"]["calls"] == 3 and rows["aten::add"]["calls"] == 1
    assert all(row["ms"] > 0 for row in rows.values()) and len(rows) < 15  # every name fits the default top
    assert table["total_ms"] == pytest.approx(sum(row["ms"] for row in rows.values())) and table["other_ms"] == 0
    with pytest.raises(ValueError, match="top"):
        kernel_times(work, "cpu", top=0)


def _event(key: str, count: int, cpu_us: float, device_us: float = 0.0, on_cpu: bool = True) -> SimpleNamespace:
    """A stand-in for one of torch.profiler's `key_averages()` rows."""
    device = torch.autograd.DeviceType.CPU if on_cpu else torch.autograd.DeviceType.CUDA
    return SimpleNamespace(
        key=key, count=count, self_cpu_time_total=cpu_us, self_device_time_total=device_us, device_type=device
    )


def test_profile_summary_ranks_by_self_time_and_sums_the_rest():
    """Longest first, cut at `top`, the rest in other_ms; names without self time and the caller's own left out,
    names cut at 120 characters; on CUDA the kernels' device time, the operators (CPU rows) left out."""
    long_name = "k" * 130
    events = [
        _event("aten::add", 1, 50.0),
        _event("aten::mm", 3, 9000.0),
        _event("aten::matmul", 3, 0.0),
        _event("mine", 1, 99000.0),
        _event(long_name, 2, 700.0),
    ]
    table = profile_summary(SimpleNamespace(key_averages=lambda: events), cuda=False, top=2, skip=("mine",))
    assert table["activity"] == "cpu" and table["total_ms"] == pytest.approx(9.75)
    assert table["top"] == [
        {"name": "aten::mm", "calls": 3, "ms": pytest.approx(9.0)},
        {"name": "k" * 120, "calls": 2, "ms": pytest.approx(0.7)},
    ]
    assert table["other_ms"] == pytest.approx(0.05)
    events = [_event("aten::mm", 3, 9000.0), _event("gemm_kernel", 3, 0.0, 400.0, on_cpu=False)]
    table = profile_summary(SimpleNamespace(key_averages=lambda: events), cuda=True, top=5)
    assert table["activity"] == "cuda" and table["top"] == [{"name": "gemm_kernel", "calls": 3, "ms": 0.4}]
    assert table["total_ms"] == pytest.approx(0.4) and table["other_ms"] == 0


def test_aba_rounds_pair_each_candidate_with_its_neighbouring_baselines():
    baseline_times = itertools.count(1.0)  # 1, 2, 3, ...: drift the pairing must follow
    rounds = aba_rounds(("a", lambda: next(baseline_times)), {"b": lambda: 0.5, "c": lambda: 0.25}, rounds=3)
    # a=1; round 1: b, a=2, c, a=3; round 2: b, a=4, c, a=5; round 3: b, a=6, c, a=7
    assert rounds.seconds["a"] == [1, 2, 3, 4, 5, 6, 7]
    assert rounds.paired_baseline["b"] == [1.5, 3.5, 5.5] and rounds.paired_baseline["c"] == [2.5, 4.5, 6.5]
    ratios = rounds.ratios()
    assert set(ratios) == {"a/b", "a/c"}
    assert ratios["a/b"] == paired_ratio_ci([1.5, 3.5, 5.5], [0.5, 0.5, 0.5])
    assert rounds.medians()["b"] == 0.5


def test_aba_rounds_stop_ends_after_a_whole_round_and_never_after_the_last():
    asked = []

    def stop(rounds) -> bool:
        asked.append(len(rounds.seconds["b"]))
        return len(rounds.seconds["b"]) == 2

    rounds = aba_rounds(("a", lambda: 1.0), {"b": lambda: 0.5}, rounds=5, stop=stop)
    assert asked == [1, 2] and rounds.seconds["b"] == [0.5, 0.5] and len(rounds.seconds["a"]) == 3
    asked.clear()
    aba_rounds(("a", lambda: 1.0), {"b": lambda: 0.5}, rounds=1, stop=stop)
    assert asked == []  # the last round is never followed by the question


def test_aba_rounds_drop_a_failing_candidate_and_keep_the_others():
    def broken() -> float:
        raise RuntimeError("arm cannot run")

    rounds = aba_rounds(("a", lambda: 1.0), {"bad": broken, "good": lambda: 0.5}, rounds=3)
    assert "arm cannot run" in rounds.errors["bad"] and rounds.seconds["bad"] == []
    assert set(rounds.ratios()) == {"a/good"} and rounds.ratios()["a/good"].median == 2.0


def test_aba_rounds_bad_arguments_raise():
    with pytest.raises(ValueError, match="rounds"):
        aba_rounds(("a", lambda: 1.0), {"b": lambda: 1.0}, rounds=0)
    with pytest.raises(ValueError, match="baseline's name"):
        aba_rounds(("a", lambda: 1.0), {"a": lambda: 1.0}, rounds=3)
