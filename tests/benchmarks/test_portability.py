"""The portability scenario considers every kernel of workbench.kernels: each launch table is run (both launches,
within the kernel's bound, timed A/B/A), each other kernel is listed, and a new table without an arm fails the run.
Its record renders in docs/measurements.md, as does the committed H200 record written before the card builds."""

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import docs
from benchmarks.__main__ import run_scenario
from benchmarks.scenarios import portability
from workbench.kernels.targets import kernel_modules

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_portability_runs_every_launch_table_and_lists_every_other_kernel(tmp_path):
    record = json.loads(run_scenario("portability", tmp_path / "new", smoke=True, rounds=3).read_text())
    arms = dict(record["arms"])
    considered = arms.pop("kernels_considered")
    names = {module.__name__.rsplit(".", 1)[-1] for module in kernel_modules()}
    assert set(considered["by_capability"]) | set(considered["one_launch_for_every_card"]) == names
    assert {"block_sparse_attend", "fp8_attention", "relayout"} <= set(considered["by_capability"])
    assert {"attention_quantize", "rms_norm_silu"} <= set(considered["one_launch_for_every_card"])
    assert {name for ran in considered["by_capability"].values() for name in ran} == set(arms)
    for name, row in arms.items():
        label = row["non_hopper_launch"].lower()
        assert row["within_tolerance"] and row["worst_error"] <= row["bound"], (name, row)
        assert set(row["max_abs_error_vs_reference"]) == {"default", label}, name
        assert f"{name} default/{name} {label}" in record["ratios"], name
        assert set(row["fraction_of_roofline"]) == {"default", label} and row["roofline_s"] > 0, name

    shutil.copy(RESULTS / "portability.json", tmp_path / "portability.json")  # the H200's committed record
    committed = json.loads((tmp_path / "portability.json").read_text())
    for folder, current in ((tmp_path, committed), (tmp_path / "new", record)):
        page = docs.page(folder)
        for ratio, value in current["ratios"].items():
            assert f"| {ratio} | {value['median']:.3f}x |" in page
        row = next(line for line in page.splitlines() if line.startswith("| fp8_attention[int8,fp8] | "))
        assert "| ADA |" in row and "| rel_l2 |" in row, row
        assert "kernels_considered" not in page and "rms_norm_silu" in page


def test_portability_refuses_a_launch_table_without_an_arm():
    with pytest.raises(RuntimeError, match=r"workbench.kernels.relayout picks its launch by compute capability"):
        portability.kernels_considered({"block_sparse_attend": ["a"], "fp8_attention": ["b"]})
