"""The several-GPU scenarios' settings: which world sizes and worker counts a machine runs, and bad values refused
naming the variable (their code paths run in the harness's smoke test)."""

import pytest

from benchmarks.scenarios import fanout_scaling, parallel_h3


def test_world_sizes_and_worker_counts_are_those_the_machine_holds(monkeypatch):
    assert parallel_h3.worlds(8) == [2, 4, 8] and parallel_h3.worlds(4) == [2, 4] and parallel_h3.worlds(1) == []
    assert fanout_scaling.worker_counts(8) == [1, 2, 4, 8] and fanout_scaling.worker_counts(2) == [1, 2]
    monkeypatch.setenv("PARALLEL_H3_WORLDS", "8")
    monkeypatch.setenv("FANOUT_SCALING_WORKERS", "8,1,1")
    assert parallel_h3.worlds(8) == [8] and fanout_scaling.worker_counts(8) == [1, 8]


@pytest.mark.parametrize("value", ["", "2,x", "1,2", "0"])
def test_bad_world_sizes_are_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("PARALLEL_H3_WORLDS", value)
    with pytest.raises(ValueError, match=r"^PARALLEL_H3_WORLDS: .*; allowed: a comma list of world sizes >= 2"):
        parallel_h3.worlds(8)
    monkeypatch.setenv("FANOUT_SCALING_WORKERS", value.replace("1,2", "-1"))
    with pytest.raises(ValueError, match=r"^FANOUT_SCALING_WORKERS: .*; allowed: a comma list of worker counts >= 1"):
        fanout_scaling.worker_counts(8)
