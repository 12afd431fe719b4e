"""docs/measurements.md is generated from the results files: the harness's, GPU test runs, probes and earlier ones."""

import json
from pathlib import Path

import pytest

from benchmarks import docs
from benchmarks.__main__ import main, run_scenario
from benchmarks.envelope import FORMAT
from benchmarks.readme import blocks, render

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
MARKED = "".join(
    f"<!-- generated:{name} -->\nSTALE\n<!-- /generated:{name} -->\n"
    for name in ("plugins", "cards", "fits", "headline")
)


def test_docs_table_every_scenario_and_mark_the_earlier_format(tmp_path):
    results = tmp_path / "results"
    run_scenario("relayout", results, smoke=True, rounds=3)
    (results / "probes").mkdir()
    (results / "probes" / "2026-11-30-sparse-attention-h200-run11.json").write_text(json.dumps(EARLIER))
    (results / "gpu-tests").mkdir()
    runs = {"a": {"summary": "3 passed, 1 failed in 9.0s"}, "b": {"runs": [{"summary": "2 passed"}, {}]}}
    for name, run in runs.items():
        record = {"device": {"name": "NVIDIA H100"}, "commit": "0123456789abc", "date": "2026-12-01", **run}
        (results / "gpu-tests" / f"{name}.json").write_text(json.dumps(record))
    page = docs.page(results)
    shown = f"{tmp_path.name}/results"  # records are named from the results folder's parent, as in the repository
    folder = "gpu-tests"
    assert (
        f"| 2026-12-01 | NVIDIA H100 | `0123456789` | 3 passed, 1 failed in 9.0s | `{shown}/{folder}/a.json` |" in page
    )
    assert f"| 2 passed | `{shown}/{folder}/b.json` |" in page
    assert f"File: `{shown}/probes/2026-11-30-sparse-attention-h200-run11.json`" in page
    current = json.loads((results / "relayout.json").read_text())
    assert "## relayout (smoke run: no speed claim)" in page
    assert current["commit"] is None or current["commit"][:10] in page
    for name, ratio in current["ratios"].items():
        assert f"| {name} | {ratio['median']:.3f}x | [{ratio['low']:.3f}, {ratio['high']:.3f}] | 3 |" in page
    assert "| pack_qkv |" in page and current["date"] in page
    assert "### sparse-attention-h200 (earlier format)" in page and "NVIDIA H200" in page
    assert "| structured.block_sparse@0.20 | 2.5 |" in page and "| forward | 1.200x [1.100, 1.300] |" in page
    assert "do not edit by hand" in page
    older = current | {"date": "2026-01-01T00:00:00+00:00", "what": "the older relayout run"}
    (results / "a-relayout-older.json").write_text(json.dumps(older))  # sorts first by name
    page = docs.page(results)
    assert page.index(current["what"]) < page.index("the older relayout run")  # newest first within a scenario
    facts = {**{f"fact_{i}": i for i in range(8)}, "fraction_of_roofline": 0.9}  # more facts than the table shows
    (results / "crowded.json").write_text(json.dumps(current | {"scenario": "crowded", "arms": {"k": facts}}))
    page = docs.page(results)
    assert "| arm | median | fraction_of_roofline | fact_0 |" in page and "| k |  | 0.9 | 0 |" in page


def test_docs_command_writes_the_page_and_refuses_a_non_object(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "x.json").write_text(json.dumps(EARLIER))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{MARKED}end\n")
    assert main(["docs", "--results", str(results), "--out", str(tmp_path / "m.md"), "--readme", str(readme)]) == 0
    assert "(earlier format)" in (tmp_path / "m.md").read_text()
    written = readme.read_text()
    assert "| `block_sparse` | attention | approximate |" in written and "`easycache`" in written
    assert "(`rtx4090-48gb`) | 48 GiB | sm_89 | yes |" in written
    assert "STALE" not in written and written.startswith("intro\n") and written.endswith("end\n")
    (results / "y.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        docs.page(results)


@pytest.mark.parametrize(
    ("case", "flag", "said"),
    [
        ("results missing", "--results", "missing: not a folder"),
        ("results a file", "--results", "x.json: not a folder"),
        ("results empty", "--results", "empty: holds no results records"),
        ("results empty name", "--results", "must name a path, got ''"),
        ("truncated record", "--results", "cut.json: not valid JSON"),
        ("record without its fields", "--results", "zz.json: a workbench-benchmark/1 record must hold every field"),
        ("readme without markers", "--readme", "the markers of the generated block 'plugins' are missing"),
        ("readme missing", "--readme", "gone.md: No such file or directory"),
        ("out a folder", "--out", "exists and is not a regular file"),
    ],
)
def test_docs_command_refuses_a_bad_input_with_one_line_and_writes_nothing(tmp_path, capsys, case, flag, said):
    """A `--results` that is missing, not a folder, empty or holds a bad record, a `--readme` that is missing or has
    no markers, an `--out` that is a folder: exit 2, one line naming the flag and the file, and neither the page nor
    the README is touched (both are rendered before either is written)."""
    results, readme, out = tmp_path / "results", tmp_path / "README.md", tmp_path / "m.md"
    (results / "empty").mkdir(parents=True)
    (results / "x.json").write_text(json.dumps(EARLIER))
    readme.write_text(f"intro\n{MARKED}end\n")
    out.write_text("old page\n")
    args = {"--results": str(results), "--readme": str(readme), "--out": str(out)}
    if case == "results missing":
        args["--results"] = str(results / "missing")
    elif case == "results a file":
        args["--results"] = str(results / "x.json")
    elif case == "results empty":
        args["--results"] = str(results / "empty")
    elif case == "results empty name":
        args["--results"] = ""
    elif case == "truncated record":
        (results / "cut.json").write_text('{"format": ')
    elif case == "record without its fields":
        (results / "zz.json").write_text(json.dumps({"format": FORMAT, "scenario": "zz"}))
    elif case == "readme without markers":
        args["--readme"] = str(tmp_path / "plain.md")
        (tmp_path / "plain.md").write_text("no markers here\n")
    elif case == "readme missing":
        args["--readme"] = str(tmp_path / "gone.md")
    elif case == "out a folder":
        args["--out"] = str(tmp_path / "folder")
        (tmp_path / "folder").mkdir()
    with pytest.raises(SystemExit) as usage:
        main(["docs", *(part for pair in args.items() for part in pair)])
    error = capsys.readouterr().err
    assert usage.value.code == 2 and "Traceback" not in error
    line = error.strip().splitlines()[-1]
    assert line.startswith(f"python -m benchmarks: error: {flag}: ") and said in line, error
    assert out.read_text() == "old page\n" and readme.read_text() == f"intro\n{MARKED}end\n"


def test_readme_generated_blocks_are_current():
    """The README's plugin table, cards and fits tables and headline figures are what `python -m benchmarks docs` writes from the registry
    and benchmarks/results/ now: a new plugin or result without regenerating fails here."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text()
    assert blocks(render(text, root / "benchmarks" / "results")) == blocks(text)
    assert set(blocks(text)) == {"plugins", "cards", "fits", "headline"}
    with pytest.raises(ValueError, match="markers of the generated block 'plugins'"):
        render("no markers here", root / "benchmarks" / "results")


def test_readme_sets_the_ring_beside_group_offloading_only_when_both_ran(tmp_path):
    from benchmarks.readme import _beside_group_offload

    def record(offload_equal: bool) -> dict:
        arm = {"under_cap": True, "cap_bytes": 48 * 2**30, "peak_bytes": 43 * 2**30, "seconds": [11.0, 11.1]}
        return {
            "format": FORMAT, "smoke": False, "date": "2026-12-04T10:00:00", "device": {"name": "NVIDIA H200"},
            "arms": {
                "resident": {"median_s": 11.0},
                "ring-48GiB": {**arm, "config": {"block_ring": {}}, "median_s": 11.05, "equal_to_resident": True},
                "group_offload-48GiB": {**arm, "config": {"group_offload": {}}, "median_s": 13.4,
                                        "equal_to_resident": offload_equal},
            },
        }  # fmt: skip

    (tmp_path / "ring-group-offload-48GiB.json").write_text(json.dumps(record(True)))
    (tmp_path / "ring-group-offload-24GiB.json").write_text(json.dumps(record(False)))
    lines = [line for line in _beside_group_offload(tmp_path) if line]
    assert len(lines) == 1 and "ring-group-offload-48GiB.json" in lines[0] and "2 A/B/A pairs" in lines[0]
    assert "11.05 s with the block ring" in lines[0] and "13.40 s with diffusers' group offloading" in lines[0]


@pytest.mark.parametrize(
    "nvml_gib, said", [(48.9, "0.9 GiB over the cap, which bounds the allocator"), (46.0, "under the cap")]
)
def test_readme_h3_request_line_says_whether_the_device_peak_passed_the_cap(tmp_path, nvml_gib, said):
    from benchmarks.readme import _measured_h3_request

    row = {"completed": True, "seconds": 194.2, "peak_bytes": {"denoise": 43 * 2**30},
           "planned_peak_bytes": {"denoise": 43 * 2**30}, "nvml_peak_used_bytes": int(nvml_gib * 2**30)}  # fmt: skip
    record = {"format": FORMAT, "smoke": False, "date": "2026-12-04T13:10:05", "device": {"name": "NVIDIA H200"},
              "shape": {"cap": 48 * 2**30, "request": {"frames": 243, "height": 736, "width": 992, "steps": 17}},
              "arms": {"plan": row}}  # fmt: skip
    (tmp_path / "request-h3-capped.json").write_text(json.dumps(record))
    line = "".join(_measured_h3_request(tmp_path))
    assert f"{nvml_gib:.1f} GiB, {said}." in line and "under a 48.0 GiB memory cap in 194.2 s" in line


def _envelope(scenario: str, arms: dict, ratios: dict, shape: dict | None = None) -> dict:
    return {"format": FORMAT, "scenario": scenario, "what": f"{scenario} run", "command": f"run {scenario}",
            "commit": "0123456789", "dirty": False, "date": "2026-12-03", "versions": {}, "smoke": False,
            "device": {"name": "NVIDIA H200", "type": "cuda"}, "shape": shape or {}, "arms": arms, "ratios": ratios,
            "notes": []}  # fmt: skip


RATIO = {"median": 2.375, "low": 2.370, "high": 2.382, "n_pairs": 3}
BASE = {"fused_block_norms": {}, "adaln_precompute": {}}


@pytest.mark.parametrize("status", ["not_confirmed", "quality_confirmed", "calibrated"])
def test_a_candidate_its_record_does_not_confirm_shows_no_speed_up_in_any_table(tmp_path, status):
    """As in workbench.evidence.review: the page's ratio row and the README's headline show no speed-up for an arm
    whose `status` is not "calibrated"; its times stay in the arms' table."""
    from benchmarks.readme import HEADLINE, headline_table

    stem, key, _ = next(row for row in HEADLINE if row[0] == "calibrate-wan")
    arms = {"stock": {"median_s": 22.5, "config": {}},
            "within-budget": {"median_s": 9.48, "config": {**BASE, "block_sparse": {"tau": 3.0}}, "status": status}}  # fmt: skip
    shape = {"plugins": ["block_sparse"], "base": BASE}
    (tmp_path / f"{stem}.json").write_text(json.dumps(_envelope(stem, arms, {key: RATIO}, shape)))
    page = docs.page(tmp_path)
    headline = "\n".join(headline_table(tmp_path))
    assert "| within-budget | 9.480 s |" in page
    if status == "calibrated":
        assert f"| {key} | 2.375x | [2.370, 2.382] | 3 |" in page and "2.375x" in headline
        assert "block_sparse calibrated over fused_block_norms, adaln_precompute |" in headline  # what ran
    else:
        assert f"| {key} | none: within-budget: {status}, no speed claim | | 3 |" in page
        assert "2.375x" not in page and "2.375x" not in headline


@pytest.mark.parametrize("fa4", [True, False])
def test_headline_says_without_fa4_from_the_candidate_arms_config(tmp_path, fa4):
    from benchmarks.readme import HEADLINE, headline_table

    for stem in ("request-lora", "ring-exact-fast-48GiB"):
        key = next(key for s, key, _ in HEADLINE if s == stem)
        config = {**BASE, **({"flash4_attention": {}} if fa4 else {})}
        arms = {key.split("/")[0]: {"config": {}}, key.split("/")[1]: {"config": config}}
        (tmp_path / f"{stem}.json").write_text(json.dumps(_envelope(stem, arms, {key: RATIO})))
    rows = headline_table(tmp_path)[2:]
    assert len(rows) == 2 and all(("exact-fast (without FA4)" in row) != fa4 for row in rows), rows
    assert all(row.count("FA4") <= 1 for row in rows)


def test_docs_list_the_records_of_every_other_subfolder(tmp_path):
    """A subfolder other than probes/ and gpu-tests/ gets a section: a row per JSON record (what, device, commit,
    outcome; a qualification's verdict, never its speed-up), then its other files by name."""
    results = tmp_path / "results"
    folder = results / "calibrate-x" / "run-1"
    folder.mkdir(parents=True)
    scope = {"model": "demo-av", "device": {"name": "x86_64", "threads": 2}, "git": {"commit": "5b43b0d36eecb7"}}
    calibration = {"kind": "calibration", "plugin": "easycache", "knob": {"option": "threshold"}, "scope": scope,
                   "status": "quality_confirmed", "setting": {"cross_kv_cache": {}, "easycache": {"threshold": 0.046875}}}  # fmt: skip
    qualification = {"kind": "qualification", "verdict": "not_executed", "candidate": {"easycache": {"threshold": 0.2}},
                     "baseline": {}, "model": "demo-av", "device": {"name": "NVIDIA H200"}, "git": {"commit": "abc"},
                     "cases": [{"speedup": {"median": 1.9, "low": 1.8, "high": 2.0}}]}  # fmt: skip
    (folder / "calibration.json").write_text(json.dumps(calibration))
    (results / "calibrate-x" / "qualification.json").write_text(json.dumps(qualification))
    (folder / "call-1.log").write_text("log")
    page = docs.page(results)
    shown = f"{tmp_path.name}/results"
    assert "### `" + shown + "/calibrate-x/`" in page
    assert (f"| `{shown}/calibrate-x/run-1/calibration.json` | calibration of easycache's threshold on demo-av | "
            "x86_64 (2 threads) | `5b43b0d36e` |  | quality_confirmed; setting cross_kv_cache + "
            "easycache(threshold=0.046875) |") in page  # fmt: skip
    assert "qualification of easycache(threshold=0.2) against stock on demo-av | NVIDIA H200 |" in page
    assert "| not_executed |" in page and "1.9" not in page
    assert "Also kept: `run-1/call-1.log`." in page
