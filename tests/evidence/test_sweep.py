"""Option sweeps and fixed-candidate search: pure knee/cliff/ranking logic on synthetic rows, and the
real thing on CPU with the tiny Wan (where nothing may ever be recommended: CPU times make no speed claim)."""

import json

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure

from tests.evidence.test_report import assert_readable, html_text, pngs
from workbench import Request, Session
from workbench.cli import main
from workbench.environment import device_label
from workbench.evidence.records import read_record
from workbench.evidence.report import budget_text
from workbench.evidence.sweep import (
    Row,
    SearchResult,
    SweepResult,
    knee_and_cliff,
    pareto_figure,
    pareto_front,
    rank,
    recommend,
    render,
    search,
    summarize,
    sweep,
    sweep_configs,
    write,
)
from workbench.quality import Budget

REQUEST = Request("a red circle moves left", seed=42, frames=9, steps=4, height=32, width=32)
BASE = {"warmup": 1, "final_dense": 1}
SUITE = {
    "name": "tiny-sweep",
    "version": 1,
    "model": "tiny-wan",
    "calibration": [],
    "test": [{"prompt": "a red circle moves left", "seed": 42, "frames": 9, "height": 32, "width": 32, "steps": 4}],
}


def row(value, speedup, within_budget, executed=True, verdict=None, low=None, latent=0.01):
    verdict = verdict or ("no_speed_claim" if within_budget else "rejected_quality")
    low = speedup - 0.05 if low is None else low
    return Row(value, verdict, speedup, low, speedup + 0.05, within_budget, executed, latent_rel_l2=latent)


def record(verdict, medians, latents, within=True):
    """A synthetic qualification record with one case per speed-up median."""
    cases = [
        {
            "verdict": verdict,
            "reason": f"because {verdict}",
            "speedup": {"median": m, "low": m - 0.1, "high": m + 0.1},
            "quality": {
                "latent_rel_l2": l2,
                "psnr_db": 40.0,
                "min_ssim": 0.99,
                "within_budget": within,
                "exact": False,
            },
            "receipts": {},
        }
        for m, l2 in zip(medians, latents, strict=True)
    ]
    return {"verdict": verdict, "cases": cases, "candidate": {"p": {"x": medians[0]}}}


@pytest.fixture(scope="module")
def session():
    return Session.open("tiny-wan", device="cpu")


@pytest.fixture(scope="module")
def threshold_sweep(session):
    return sweep(session, [REQUEST], "easycache", "threshold", [0.0, 10.0], BASE, rounds=3, progress=False)


# --- pure functions on synthetic rows ---------------------------------------------------------------


def test_knee_is_fastest_in_budget_and_cliff_the_first_failure_after_it():
    rows = [
        row(0.0, 1.0, True, executed=False),  # did nothing: never the knee
        row(0.05, 1.2, True),
        row(0.1, 1.5, True),  # knee
        row(0.15, 1.4, True),
        row(0.2, 1.9, False),  # cliff
        row(0.3, 2.5, False),
    ]
    assert knee_and_cliff(rows) == (2, 4)


def test_knee_and_cliff_edge_cases():
    assert knee_and_cliff([]) == (None, None)
    assert knee_and_cliff([row(1, 1.3, True), row(2, 1.3, True)]) == (0, None)  # tie: the earlier, no cliff
    # no knee (the only in-budget value did not execute): the cliff is the first executed failure
    assert knee_and_cliff([row(0, 1.0, True, executed=False), row(10, 2.0, False)]) == (None, 1)
    # a failure before the knee is not its cliff
    assert knee_and_cliff([row(1, 1.1, False), row(2, 1.5, True), row(3, 1.6, False)]) == (1, 2)


def test_rank_orders_qualified_rows_by_speedup_and_ignores_the_rest():
    records = [
        record("qualified", [1.10, 1.30], [0.01, 0.02]),  # slowest case decides: 1.10
        record("measured_quality_tradeoff", [3.0], [0.5], within=False),  # fast but outside the budget
        record("qualified", [1.25], [0.02]),
        record("no_speed_claim", [2.0], [0.0]),
        record("qualified", [1.25], [0.01]),
    ]
    rows = [summarize(r) for r in records]
    assert rows[0].speedup == 1.10 and rows[0].latent_rel_l2 == 0.02 and rows[0].value == {"p": {"x": 1.10}}
    assert rank(rows) == [2, 4, 0]
    index, reason = recommend(rows, "cuda")
    assert index == 2 and "fastest qualified" in reason


def test_recommend_never_picks_what_failed():
    rows = [row(1, 3.0, False, verdict="measured_quality_tradeoff"), row(2, 1.2, True)]
    index, reason = recommend(rows, "cuda")
    assert index is None and "no value is qualified" in reason
    index, reason = recommend(rows, "cpu")
    assert index is None and "no speed claim" in reason


def test_pareto_front_keeps_undominated_executed_points():
    rows = [
        row("a", 1.0, True, executed=False, latent=0.0),  # not executed: off the front
        row("b", 1.2, True, latent=0.01),
        row("c", 1.1, True, latent=0.02),  # dominated by b
        row("d", 2.0, False, latent=0.2),
    ]
    assert pareto_front(rows) == [1, 3]
    with pytest.raises(ValueError, match="metric"):
        pareto_front(rows, "speed")


def test_pareto_figure_of_synthetic_sweep_draws_knee_cliff_and_budget():
    """Crowded points near speed-up 1 and the knee: every label readable where the report shows it, none on another."""
    rows = [row(0.0, 1.0, True, executed=False, verdict="not_executed", latent=0.0)]
    rows += [
        row(v, s, True, latent=v / 5) for v, s in ((0.02, 1.05), (0.05, 1.2), (0.08, 1.32), (0.1, 1.4), (0.12, 1.45))
    ]
    rows += [row(0.15, 1.6, False, latent=0.05), row(0.2, 1.9, False, latent=0.2)]
    values = [r.value for r in rows]
    result = SweepResult("easycache", "threshold", values, {}, {}, Budget(), rows, 0.12, 0.15, None, "", [])
    figure = pareto_figure(result)
    assert isinstance(figure, Figure)
    texts = {t.get_text() for t in figure.axes[0].texts}
    assert {"knee", "cliff", "0.0 (not executed)", "0.05", "0.12", "0.2"} <= texts
    (shown,) = pngs(render(result))
    assert_readable(figure, shown.width)


NOT_A_CLAIM = "(baseline / candidate time); not a speed claim (see the verdict)"
NOT_EXECUTED = "none: the candidate did not execute, so its timings measure something else"
DEVICE = {"type": "cpu", "name": "x86_64", "cpu": "AMD EPYC 9654 96-Core Processor", "threads": 2}


def mixed_rows():
    """One row of each verdict a sweep row can have, least to most aggressive."""
    return [
        row(0.0, 0.62, True, executed=False, verdict="not_executed", latent=0.0),  # its speed-up is noise
        row(0.05, 1.2, True, verdict="qualified"),
        row(0.1, 1.3, True),  # no_speed_claim
        row(0.2, 1.9, False),  # rejected_quality
        row(0.3, 2.5, False, verdict="measured_quality_tradeoff", latent=0.2),
    ]


def test_sweep_page_words_speed_ups_device_and_budget_as_the_other_reports():
    """As the qualification and review reports (`report.speedup_text`, `budget_text`, `device_label`): a row that did
    not execute shows no speed-up, one whose verdict makes no speed claim says so beside its speed-up, the device is
    named as a reader knows it and the budget is in words (no JSON, no null); the figure's caption says what it shows
    and whether any of its speed-ups is a claim."""
    rows = mixed_rows()
    budget = Budget().with_audio()
    records = [{"model": "tiny-wan", "rounds": 3, "device": DEVICE, "git": {"commit": "f" * 40, "dirty": False}}]
    result = SweepResult(
        "easycache", "threshold", [r.value for r in rows], {}, {}, budget, rows, 0.05, 0.2, 0.05, "", records
    )
    text = html_text(render(result))
    assert NOT_EXECUTED in text
    assert "0.6200" not in text  # the speed-up of a row that did not execute is nowhere
    assert f"1.3000 [1.2500, 1.3500] {NOT_A_CLAIM}" in text and f"1.9000 [1.8500, 1.9500] {NOT_A_CLAIM}" in text
    for claim in ("1.2000 [1.1500, 1.2500]", "2.5000 [2.4500, 2.5500]"):  # qualified, measured_quality_tradeoff
        assert f"{claim} (baseline / candidate time) " in text and f"{claim} {NOT_A_CLAIM}" not in text
    assert device_label(DEVICE) in text and "x86_64" not in text
    assert budget_text(budget.to_dict()) in text and "null" not in text and '"psnr_db"' not in text
    assert "min-frame SSIM" in text and "the slowest case's speed-up" in text
    assert "Only a qualified or measured_quality_tradeoff verdict's speed-up is a speed claim." in text
    cpu = SweepResult("easycache", "threshold", [0.1], {}, {}, budget, rows[2:3], None, None, None, "", records)
    assert "None of these speed-ups is a speed claim (see the verdicts)." in html_text(render(cpu))


def test_search_page_ranks_candidates_by_name_and_says_when_none_qualified():
    candidates = [{"a": {}}, {"b": {}}, {"c": {}}]
    rows = [row(c, s, True, verdict="qualified") for c, s in zip(candidates, (1.2, 1.5, 1.1), strict=True)]
    found = SearchResult(candidates, {}, Budget(), rows, rank(rows), candidates[1], "", [])
    assert '1. {"b": {}}; 2. {"a": {}}; 3. {"c": {}}' in html_text(render(found))
    rows = [row(c, 1.2, True) for c in candidates]  # no_speed_claim
    none = SearchResult(candidates, {}, Budget(), rows, rank(rows), None, "", [])
    page = html_text(render(none))
    assert "none: no candidate is qualified" in page and "[]" not in page


def test_pareto_figure_puts_what_did_not_execute_at_speed_up_1_and_keys_each_verdict_outside_the_axes():
    """A row that did not execute has no speed-up to plot (drawn at 1, no CI bar); rows at one point share a label;
    each verdict's colour is named in a legend that covers no point."""
    rows = [row(0.01, 0.62, True, executed=False, verdict="not_executed", latent=0.0)]
    rows += [row(0.02, 1.83, True, executed=False, verdict="not_executed", latent=0.0)]
    rows += mixed_rows()[1:]
    values = [r.value for r in rows]
    result = SweepResult("easycache", "threshold", values, {}, {}, Budget(), rows, 0.05, 0.2, None, "", [])
    figure = pareto_figure(result)
    axes = figure.axes[0]
    points = [tuple(xy) for c in axes.collections if isinstance(c, PathCollection) for xy in c.get_offsets()]
    assert (1.0, 0.0) in points and not {(0.62, 0.0), (1.83, 0.0)} & set(points)
    assert len([c for c in axes.containers if isinstance(c, ErrorbarContainer)]) == 4  # the executed rows only
    texts = [t.get_text() for t in axes.texts]
    assert "0.01, 0.02 (not executed)" in texts and not any(t.startswith("0.01 (") for t in texts)
    (legend,) = figure.legends
    assert {"qualified", "no_speed_claim", "rejected_quality", "measured_quality_tradeoff", "not_executed"} <= {
        t.get_text() for t in legend.get_texts()
    }
    figure.draw_without_rendering()
    assert not legend.get_window_extent().overlaps(axes.get_window_extent())
    assert_readable(figure, pngs(render(result))[0].width)


# --- the real thing on CPU ---------------------------------------------------------------------------


def test_threshold_sweep_rows_differ_as_expected(threshold_sweep):
    exact, lossy = threshold_sweep.rows
    assert exact.value == 0.0 and exact.verdict == "not_executed" and not exact.executed
    assert exact.exact and exact.within_budget and exact.latent_rel_l2 == 0.0
    assert lossy.value == 10.0 and lossy.executed and not lossy.exact and not lossy.within_budget
    assert lossy.receipts[0]["easycache"]["reused"] > 0
    assert lossy.verdict == "rejected_quality" and lossy.failures
    assert threshold_sweep.records[1]["candidate"] == {"easycache": {**BASE, "threshold": 10.0}}
    assert threshold_sweep.knee is None and threshold_sweep.cliff == 10.0


def test_cpu_sweep_recommends_nothing(threshold_sweep):
    assert threshold_sweep.recommended is None
    assert "no speed claim" in threshold_sweep.reason


def test_sweep_writes_strict_json_and_offline_html(threshold_sweep, tmp_path):
    figure = pareto_figure(threshold_sweep, "psnr_db")
    assert isinstance(figure, Figure) and "0.0 (exact) (not executed)" in {t.get_text() for t in figure.axes[0].texts}
    record_path, page_path = write(threshold_sweep, tmp_path / "out")
    saved = read_record(record_path)
    assert saved["kind"] == "sweep" and saved["recommended"] is None
    assert saved["rows"][0]["psnr_db"] == "inf" and saved["cliff"] == {"index": 1, "value": 10.0}
    assert len(saved["records"]) == 2 and saved["model"] == "tiny-wan"
    page = page_path.read_text()
    assert "data:image/png;base64," in page and "<script" not in page and "rejected_quality" in page
    text = html_text(page)  # the CPU run's speed-ups: none for threshold 0, not a claim for threshold 10
    assert NOT_EXECUTED in text and NOT_A_CLAIM in text and device_label(saved["device"]) in text


def test_sweep_refuses_bad_input_before_running(session):
    with pytest.raises(ValueError, match="nosuchcache"):
        sweep(session, [REQUEST], "nosuchcache", "threshold", [0.1], progress=False)
    with pytest.raises(ValueError, match="repeats"):
        sweep(session, [REQUEST], "easycache", "threshold", [0.1, 0.1], progress=False)
    with pytest.raises(ValueError, match="at least one value"):
        sweep(session, [REQUEST], "easycache", "threshold", [], progress=False)
    for values in ("0.1", (value for value in [0.1])):  # a str is not swept character by character
        with pytest.raises(
            ValueError, match=r"^values: expected a list of the option's values, .* got (str|generator)"
        ):
            sweep(session, [REQUEST], "easycache", "threshold", values, progress=False)
    with pytest.raises(ValueError, match="nosuchcache"):
        search(session, [REQUEST], [{"cross_kv_cache": {}}, {"nosuchcache": {}}], progress=False)
    odd = Request("a blue square", seed=43, frames=9, steps=4, height=40, width=32)  # Wan: a multiple of 16
    with pytest.raises(ValueError, match=r"^requests\[1\]: height: 40 must be a multiple of 16"):
        sweep(session, [REQUEST, odd], "easycache", "threshold", [0.1], progress=False)
    with pytest.raises(ValueError, match=r"^requests\[1\]: height: 40 must be a multiple of 16"):
        search(session, [REQUEST, odd], [{"cross_kv_cache": {}}], progress=False)
    with pytest.raises(ValueError, match=r"^candidates\[1\]: repeats candidates\[0\]"):
        search(session, [REQUEST], [{"cross_kv_cache": {}}, {"cross_kv_cache": {}}], progress=False)


def test_numpy_values_are_swept_as_the_python_numbers_they_hold():
    configs = sweep_configs("easycache", "warmup", np.arange(0, 2), {"threshold": 0.1})  # was a TypeError (JSON)
    assert [c["easycache"]["warmup"] for c in configs] == [0, 1]
    assert all(type(c["easycache"]["warmup"]) is int for c in configs)


def test_cpu_search_has_no_best(session):
    result = search(session, [REQUEST], [{"cross_kv_cache": {}}], rounds=3, progress=False)
    assert [r.verdict for r in result.rows] == ["no_speed_claim"]
    assert result.ranking == [] and result.best is None and "no speed claim" in result.reason
    assert result.to_record()["records"][0]["candidate"] == {"cross_kv_cache": {}}


def test_cli_sweep_writes_json_and_html(tmp_path, capsys):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({**SUITE, "test": [{**SUITE["test"][0], "mode": "t2v"}]}))
    out = tmp_path / "s"
    argv = ["sweep", "--model", "tiny-wan", "--suite", str(suite), "--plugin", "easycache", "--option"]
    argv += ["threshold", "--values", "0,10", "--base", json.dumps(BASE), "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "recommended: none" in printed and "cliff: 10" in printed
    rows = [line for line in printed.splitlines() if line.startswith("  ")]  # one line a value
    assert [line.split(",")[0] for line in rows] == ["  0: not_executed", "  10: rejected_quality"]
    assert not any("speed-up" in line for line in rows)  # 0 skipped nothing; 10 on a CPU: no speed claim
    record = json.loads((out / "sweep.json").read_text())
    assert [r["executed"] for r in record["rows"]] == [False, True]
    assert "<script" not in (out / "sweep.html").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--plugin", "easycache", "--option", "threshold", "--values", "0,,0.1"], "--values"),
        (["sweep", "--plugin", "easycache", "--option", "threshold", "--values", "0,abc"], "--values"),
        (["sweep", "--plugin", "easycache", "--option", "threshold", "--values", "0", "--base", "{x"], "--base"),
        (["search", "--candidates", '[{"easycache": {}}'], "--candidates: not valid JSON"),
        (["search", "--candidates", '{"easycache": {}}'], "--candidates: expected"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path, capsys, argv, message):
    common = ["--model", "tiny-wan", "--suite", "data_manifests/tiny-smoke.json", "--out", str(tmp_path / "o")]
    assert main([*argv, *common]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--plugin", "teacache", "--option", "rel_l1_thresh", "--values", "0.5,1,1.0"], "--values: [0.5, 1,"),
        (["search", "--candidates", '[{"teacache": {"rel_l1_thresh": 1}}, {"teacache": {"rel_l1_thresh": 1.0}}]'], ""),
        (["search", "--candidates", '[{"teacache": {"rel_l1_thresh": 0.1}}, {"teacache": {"rel_l1_thresh": 0.1, '
          '"warmup": 1}}]'], ""),  # warmup 1 is its default
        (["search", "--candidates", '[{"cross_kv_cache": {}}, {"cross_kv_cache": null}]'], ""),
    ],
)  # fmt: skip
def test_cli_one_setting_spelled_twice_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, argv, message):
    """The same acceleration given twice in other words (1 and 1.0 of a float option, an option at its default
    spelled out, null for no options) would be qualified twice and shown as two rows of one setting."""
    monkeypatch.setattr(Session, "open", classmethod(lambda *a, **k: pytest.fail("the model loaded")))
    common = ["--model", "tiny-wan", "--suite", "data_manifests/tiny-smoke.json", "--out", str(tmp_path / "o")]
    assert main([*argv, *common]) == 2
    err = capsys.readouterr().err
    expected = (
        "repeats a setting: 1.0 sets" if argv[0] == "sweep" else "--candidates: candidates[1]: repeats candidates[0]"
    )
    assert message in err and expected in err and not (tmp_path / "o").exists()


def test_cli_unknown_plugin_exits_2(tmp_path, capsys):
    argv = ["search", "--model", "tiny-wan", "--suite", "data_manifests/tiny-smoke.json", "--device", "cpu"]
    argv += ["--candidates", '[{"nosuchcache": {}}]', "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "nosuchcache" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_a_sweeps_bars_say_which_value_of_how_many_and_a_search_speaks_of_candidates(monkeypatch):
    """A sweep runs one qualify bar per value, each from 0 again: without its name a bar says nothing of how far the
    sweep is. A search's reason names candidates, not values."""
    from workbench.evidence import sweep as sweeps

    bars = []

    def qualify_cases(session, requests, baseline, candidate, rounds, budget, progress, desc, journal):
        bars.append(desc)
        made = record("no_speed_claim", [1.0], [0.01])
        return {**made, "candidate": candidate, "device": {"type": "cpu"}}, []

    monkeypatch.setattr(sweeps, "qualify_cases", qualify_cases)
    monkeypatch.setattr(sweeps, "validate", lambda *args: None)  # no model: the bars' names are what is checked
    sweep(None, [REQUEST], "easycache", "threshold", [0.05, 0.1], BASE, budget=Budget())
    found = search(None, [REQUEST], [{"cross_kv_cache": {}}, {"fused_qkv": {}}], budget=Budget())
    assert bars == ["value 1/2: threshold=0.05", "value 2/2: threshold=0.1", "candidate 1/2", "candidate 2/2"]
    assert found.reason.startswith("nothing to recommend: no candidate is qualified (")
