"""docs/measurements.md is generated from the results files, current and earlier format alike."""

import json

import pytest

from benchmarks.__main__ import main, run_scenario
from benchmarks.docs import generate

EARLIER = {
    "what": "sparse-attention-h200",
    "device": {"type": "cuda", "name": "NVIDIA H200"},
    "torch": "2.11.0",
    "commit": "e523ab7aaaa",
    "date": "2026-11-30",
    "shape": {},
    "arms": {"cudnn": {"median_ms": 10.0}},
    "ratios": {"structured": {"block_sparse@0.20": 2.5}, "forward": {"median": 1.2, "low": 1.1, "high": 1.3}},
    "notes": "",
}


def test_docs_table_every_scenario_and_mark_the_earlier_format(tmp_path):
    results = tmp_path / "results"
    run_scenario("relayout", results, smoke=True, rounds=3)
    (results / "2026-11-30-sparse-attention-h200-run11.json").write_text(json.dumps(EARLIER))
    page = generate(results, tmp_path / "docs" / "measurements.md").read_text()
    current = json.loads((results / "relayout.json").read_text())
    assert "## relayout (smoke run: no speed claim)" in page
    assert current["commit"] is None or current["commit"][:10] in page
    for name, ratio in current["ratios"].items():
        assert f"| {name} | {ratio['median']:.3f}x | [{ratio['low']:.3f}, {ratio['high']:.3f}] | 3 |" in page
    assert "| pack_qkv |" in page and current["date"] in page
    assert "### sparse-attention-h200 (earlier format)" in page and "NVIDIA H200" in page
    assert "| structured.block_sparse@0.20 | 2.5 |" in page and "| forward | 1.200x [1.100, 1.300] |" in page
    assert "do not edit by hand" in page


def test_docs_command_writes_the_page_and_refuses_a_non_object(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "x.json").write_text(json.dumps(EARLIER))
    assert main(["docs", "--results", str(results), "--out", str(tmp_path / "m.md")]) == 0
    assert "(earlier format)" in (tmp_path / "m.md").read_text()
    (results / "y.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        generate(results, tmp_path / "m.md")
