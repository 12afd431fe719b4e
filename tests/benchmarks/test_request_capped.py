"""request-capped runs one part per arm across device calls; its settings are checked before anything is built."""

import json
import re

import pytest

from benchmarks.__main__ import main
from benchmarks.scenarios import request_capped


def test_request_capped_stops_after_a_part_and_the_same_command_finishes_it(tmp_path, capsys, monkeypatch):
    """`--max-seconds 0`: the plan part runs, the next is not started, no envelope; the same command replays it and
    runs model_cpu_offload: one envelope over two processes, whose capped arms give the resident output bit for bit
    (the plan dismantled after each visit, diffusers' hooks removed: the resident visits between them agree too)."""
    command = ["run", "request-capped", "--smoke", "--out", str(tmp_path)]
    monkeypatch.setenv("WORKBENCH_COMMIT", "aaaaaaa0")  # each part records the commit that ran it
    assert main([*command, "--max-seconds", "0"]) == 0
    assert "unfinished request-capped: stopped at a step boundary" in capsys.readouterr().out
    partial = json.loads((tmp_path / "request-capped" / "calibrate.partial.json").read_text())
    assert [step["kind"] for step in partial["steps"]] == ["plan"] and not (tmp_path / "request-capped.json").exists()
    monkeypatch.setenv("WORKBENCH_COMMIT", "bbbbbbb1")
    assert main(command) == 0
    record = json.loads((tmp_path / "request-capped.json").read_text())
    assert set(record["ratios"]) == {"resident/plan", "resident/model_cpu_offload"}
    for name, row in record["arms"].items():
        assert row["ran"] and row["latents_equal_resident"] and row["frames_equal_resident"], name
    assert record["arms"]["plan"]["plan"]["offloaded"] and record["arms"]["plan"]["receipts"]["memory_residency"]
    parts = "2 part(s) over 2 process(es): plan {} s (commit aaaaaaa), model_cpu_offload {} s (commit bbbbbbb)."
    assert any(re.sub(r"\d+ s", "{} s", note).startswith(parts) for note in record["notes"]), record["notes"]
    assert not (tmp_path / "request-capped").exists()


@pytest.mark.parametrize(
    "variable, value",
    [
        ("REQUEST_CAPPED_STEPS", "0"),
        ("REQUEST_CAPPED_ARMS", "plan,nope"),
        ("REQUEST_CAPPED_ARMS", "plan,plan"),
        ("REQUEST_CAPPED_MODEL", "wan2.2-5b"),
        ("REQUEST_CAPPED_CAP", "lots"),
    ],
)
def test_request_capped_bad_setting_raises_naming_the_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=rf"{variable}: '{value}'; allowed"):
        request_capped.settings(smoke=False)


def test_request_capped_takes_wan22_a14b_under_another_cap(monkeypatch):
    monkeypatch.setenv("REQUEST_CAPPED_MODEL", "wan2.2-a14b")
    monkeypatch.setenv("REQUEST_CAPPED_CAP", "48GiB")
    assert request_capped.settings(smoke=False) == (6, request_capped.ARMS, "wan2.2-a14b", "48GiB")
    assert request_capped.MODELS["wan2.2-a14b"] is request_capped.wan.random_a14b
