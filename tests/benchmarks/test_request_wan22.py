"""request-wan22 runs in parts across device calls: a stop between parts keeps the record, the same command finishes."""

import json

import pytest

from benchmarks.__main__ import main
from benchmarks.scenarios import request_wan22


def test_request_wan22_stops_after_a_part_and_the_same_command_finishes_it(tmp_path, capsys, monkeypatch):
    """`--max-seconds 0`: the speed part runs, the cache part is not started, no envelope, exit 0; the same command
    replays the speed part and runs the cache part: an envelope with both, made over two runs, record removed.
    (exact-fast is left empty here: its Triton kernels in the interpreter would only add time; the scenario's smoke
    in test_harness_cli runs them.)"""
    monkeypatch.setattr(request_wan22, "exact_fast", lambda family, device, notes, model=None: {})
    command = ["run", "request-wan22", "--smoke", "--out", str(tmp_path)]
    assert main([*command, "--max-seconds", "0"]) == 0
    assert "unfinished request-wan22: stopped at a step boundary" in capsys.readouterr().out
    partial = json.loads((tmp_path / "request-wan22" / "calibrate.partial.json").read_text())
    assert [step["kind"] for step in partial["steps"]] == ["speed"] and not (tmp_path / "request-wan22.json").exists()
    assert main(command) == 0
    record = json.loads((tmp_path / "request-wan22.json").read_text())
    assert record["arms"]["stock"]["seconds"] == partial["steps"][0]["value"]["arms"]["stock"]["seconds"]
    assert {"easycache=0.3 per-expert", "easycache=0.3 boundary-unaware"} <= set(record["arms"])
    assert any("3 part(s) over 2 process(es)" in note for note in record["notes"]), record["notes"]
    unaware = record["arms"]["easycache=0.3 boundary-unaware"]["decisions"]
    assert set(unaware) == {"transformer", "transformer_2"}  # the cache part runs both experts
    assert not (tmp_path / "request-wan22").exists()


def test_request_wan22_cache_parts_alone_run_one_mode_per_part_over_processes(tmp_path, capsys, monkeypatch):
    """`WAN22_PARTS=cache`: no speed part; each mode is its own part with the dense request of its own process (made
    once per process), so a stop after the first part leaves the second for the next run; the two processes' dense
    outputs are checked equal and the decisions of the two modes are compared in the record."""
    monkeypatch.setenv("WAN22_PARTS", "cache")
    command = ["run", "request-wan22", "--smoke", "--out", str(tmp_path)]
    assert main([*command, "--max-seconds", "0"]) == 0
    partial = json.loads((tmp_path / "request-wan22" / "calibrate.partial.json").read_text())
    assert [(s["kind"], s["key"]["mode"]) for s in partial["steps"]] == [("cache", "per-expert")]
    assert main(command) == 0
    record = json.loads((tmp_path / "request-wan22.json").read_text())
    assert set(record["arms"]) == {"easycache=0.3 per-expert", "easycache=0.3 boundary-unaware"}
    assert record["ratios"] == {} and record["command"].startswith("WAN22_PARTS=cache ")
    notes = "\n".join(record["notes"])
    assert "gave the same latents, frames and audio" in notes and "2 part(s) over 2 process(es)" in notes
    assert "easycache=0.3: " in notes and "only one of the modes ran" not in notes
    for row in record["arms"].values():
        assert row["dense_s"] > 0 and 0 <= row["reused_fraction"] <= 1


@pytest.mark.parametrize(
    "variable, value",
    [
        ("WAN22_STEPS", "0"),
        ("WAN22_CACHE_STEPS", "twelve"),
        ("WAN22_THRESHOLDS", "0.3,x"),
        ("WAN22_THRESHOLDS", "-1"),
        ("WAN22_PARTS", "speed,ray"),
        ("WAN22_PARTS", "cache,cache"),
    ],
)
def test_request_wan22_bad_setting_raises_naming_the_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=rf"{variable}: '{value}'; allowed"):
        request_wan22.settings(smoke=False)
        request_wan22.chosen_parts()
