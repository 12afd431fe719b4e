"""Option sweeps and fixed-candidate search over `qualify` (seed 004 "Combination search").

`sweep` qualifies one plugin at each value of one option (a cache threshold, say) and summarises every
value in one row: worst verdict, smallest speed-up, worst quality over the requests. Quality of a lossy
cache often falls off a cliff between neighbouring values, so the sweep marks the *knee* (the executed
value with the highest speed-up still inside the budget) and the *cliff* (the first value past the knee
that leaves the budget). `search` qualifies a fixed list of whole configurations and ranks the ones that
qualified by speed-up.

Neither ever recommends what failed: a value or configuration is recommended only when its verdict is
`qualified` (quality within the budget *and* a speed claim, which needs a clean CUDA run). On CPU that
never happens, so `recommended`/`best` is None and `reason` says why. Everything chosen holds only for
the requests, seeds, geometry and device it was measured on.

Both are resumable (`resume=` a folder): the partial record (`sweep.partial.json` / `search.partial.json`) is
rewritten after every finished (configuration, request) case, each timed A/B/A whole inside one process
(`harness.qualify_cases`); the same call again runs only the cases not recorded and returns an uninterrupted
run's result. With `max_seconds` a run stops cleanly at a case boundary and returns a `resume.Partial`.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from workbench.accelerations import REGISTRY, install
from workbench.environment import device_label
from workbench.evidence.harness import (
    MIN_ROUNDS,
    SUITE_ORDER,
    check_common,
    qualify_cases,
    validate,
)
from workbench.evidence.records import record_bytes
from workbench.evidence.report import NO_SPEED_CLAIM, Table, page, speedup_text
from workbench.evidence.resume import Partial, Paused, case_journal
from workbench.io import write_set
from workbench.plots import LABEL_PT, figure_png, label_points, png_figure_html
from workbench.quality import Budget
from workbench.request import Request, shown
from workbench.session import Session

_VERDICT_COLORS = {
    "qualified": "#59a14f",
    "no_speed_claim": "#4e79a7",
    "measured_quality_tradeoff": "#f28e2b",
    "rejected_quality": "#e15759",
    "not_executed": "#bab0ac",
}
_UNSET: Any = object()
_METRICS = {"latent_rel_l2": "latent relative L2 (lower is better)", "psnr_db": "whole-clip PSNR dB (higher is better)"}


@dataclass(frozen=True)
class Row:
    """One qualified configuration summarised over all its requests (the worst case decides).

    `value` is the swept option's value (a sweep) or the candidate configuration (a search).
    `verdict` is the suite verdict (weakest case); `speedup`/`speedup_low`/`speedup_high` are the median and
    CI of the case with the smallest median speed-up; `latent_rel_l2` is the largest, `psnr_db` (inf when
    identical) and `min_ssim` the smallest over the cases (None when a case could not measure it).
    `executed`: no case is `not_executed` (the candidate's work ran). `within_budget`/`exact`: every case.
    `receipts` holds each case's candidate receipts, in request order.
    """

    value: Any
    verdict: str
    speedup: float
    speedup_low: float
    speedup_high: float
    within_budget: bool
    executed: bool
    latent_rel_l2: float | None = None
    psnr_db: float | None = None
    min_ssim: float | None = None
    exact: bool = False
    reason: str = ""
    failures: tuple[str, ...] = ()
    receipts: tuple[dict[str, Any], ...] = ()
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return json.dumps(self.value, sort_keys=True) if isinstance(self.value, dict | list) else str(self.value)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly (an infinite PSNR becomes the string "inf", as in `Comparison.to_dict`)."""
        return {
            "value": self.value,
            "config": self.config,
            "verdict": self.verdict,
            "reason": self.reason,
            "speedup": {"median": self.speedup, "low": self.speedup_low, "high": self.speedup_high},
            "latent_rel_l2": self.latent_rel_l2,
            "psnr_db": _json_float(self.psnr_db),
            "min_ssim": self.min_ssim,
            "within_budget": self.within_budget,
            "executed": self.executed,
            "exact": self.exact,
            "failures": list(self.failures),
            "receipts": list(self.receipts),
        }


def summarize(record: dict[str, Any], value: Any = _UNSET) -> Row:
    """The `Row` of one qualification record (as `qualify` returns it); pure, so synthetic records work.

    `value` labels the row (default: the record's candidate configuration).
    """
    cases = record["cases"]
    if not cases:
        raise ValueError("record: has no cases")
    slowest = min(cases, key=lambda case: case["speedup"]["median"])
    worst = min(cases, key=lambda case: SUITE_ORDER.index(case["verdict"]))
    quality = [case["quality"] for case in cases]
    return Row(
        value=record.get("candidate") if value is _UNSET else value,
        config=record.get("candidate", {}),
        verdict=record["verdict"],
        reason=worst.get("reason", ""),
        speedup=float(slowest["speedup"]["median"]),
        speedup_low=float(slowest["speedup"]["low"]),
        speedup_high=float(slowest["speedup"]["high"]),
        latent_rel_l2=_worst([q.get("latent_rel_l2") for q in quality], max),
        psnr_db=_worst([q.get("psnr_db") for q in quality], min),
        min_ssim=_worst([q.get("min_ssim") for q in quality], min),
        within_budget=all(q.get("within_budget", False) for q in quality),
        executed=all(case["verdict"] != "not_executed" for case in cases),
        exact=all(bool(q.get("exact")) for q in quality),
        failures=tuple(failure for q in quality for failure in q.get("failures", [])),
        receipts=tuple(case.get("receipts", {}) for case in cases),
    )


def knee_and_cliff(rows: Sequence[Row]) -> tuple[int | None, int | None]:
    """Indices of the knee and the cliff in `rows` (sweep order: least to most aggressive), or None.

    Knee: the executed row inside the budget with the highest speed-up median (ties: the earlier row).
    A `not_executed` row never is the knee: its time is the baseline's, its speed-up only noise.
    Cliff: the first executed row after the knee that is outside the budget; with no knee, the first
    executed row outside the budget (quality was already lost at the first value that did anything).
    """
    candidates = [i for i, row in enumerate(rows) if row.executed and row.within_budget]
    knee = max(candidates, key=lambda i: (rows[i].speedup, -i)) if candidates else None
    start = -1 if knee is None else knee
    cliff = next((i for i in range(start + 1, len(rows)) if rows[i].executed and not rows[i].within_budget), None)
    return knee, cliff


def rank(rows: Sequence[Row]) -> list[int]:
    """Indices of the `qualified` rows, fastest first (speed-up median, then CI low end; ties keep order)."""
    qualified = [i for i, row in enumerate(rows) if row.verdict == "qualified" and row.within_budget]
    return sorted(qualified, key=lambda i: (-rows[i].speedup, -rows[i].speedup_low, i))


def recommend(rows: Sequence[Row], device_type: str, noun: str = "value") -> tuple[int | None, str]:
    """The row to recommend (the fastest `qualified` one) and why; None when nothing qualified. `noun` names a row
    in the reason: a sweep's "value", a search's "candidate".

    Only a row within the budget with a speed claim is ever recommended: never a quality trade-off,
    never a row that did not execute, never a CPU timing.
    """
    order = rank(rows)
    if order:
        best = rows[order[0]]
        return order[0], f"{best.label}: the fastest qualified configuration ({best.reason})"
    verdicts = ", ".join(f"{row.label}: {row.verdict}" for row in rows)
    reason = f"nothing to recommend: no {noun} is qualified ({verdicts})"
    if device_type.split(":")[0] != "cuda":
        reason += f"; timed on {device_type!r}: no speed claim is possible without a CUDA device"
    else:
        blocked = [row for row in rows if row.within_budget and row.verdict == "no_speed_claim"]
        if blocked:
            reason += f"; {blocked[0].label}: {blocked[0].reason}"
    return None, reason


def pareto_front(rows: Sequence[Row], metric: str = "latent_rel_l2") -> list[int]:
    """Indices of the executed rows no other executed row beats on both speed-up and `metric`, by speed-up.

    `metric` is "latent_rel_l2" (lower is better) or "psnr_db" (higher is better); rows lacking it are skipped.
    """
    if metric not in _METRICS:
        raise ValueError(f"metric: {metric!r}; expected one of {list(_METRICS)}")
    sign = 1.0 if metric == "latent_rel_l2" else -1.0  # as a cost: lower is better
    points = {
        i: (row.speedup, sign * getattr(row, metric))
        for i, row in enumerate(rows)
        if row.executed and getattr(row, metric) is not None and not math.isnan(getattr(row, metric))
    }

    def dominated(i: int) -> bool:
        s, c = points[i]
        return any(s2 >= s and c2 <= c and (s2 > s or c2 < c) for j, (s2, c2) in points.items() if j != i)

    return sorted((i for i in points if not dominated(i)), key=lambda i: points[i][0])


@dataclass
class SweepResult:
    """A sweep of `plugin`.`option` over `values`: one row per value, knee, cliff and recommendation.

    `knee`/`cliff`/`recommended` are values from `values` (None when there is none); `reason` explains the
    recommendation or its absence. `records` are the full qualification records, one per value.
    """

    plugin: str
    option: str
    values: list[Any]
    base_options: dict[str, Any]
    baseline: dict[str, Any]
    budget: Budget
    rows: list[Row]
    knee: Any
    cliff: Any
    recommended: Any
    reason: str
    records: list[dict[str, Any]]

    def to_record(self) -> dict[str, Any]:
        knee, cliff = knee_and_cliff(self.rows)
        return {
            "kind": "sweep",
            "plugin": self.plugin,
            "option": self.option,
            "values": self.values,
            "base_options": self.base_options,
            "baseline": self.baseline,
            "budget": self.budget.to_dict(),
            "rows": [row.to_dict() for row in self.rows],
            "knee": {"index": knee, "value": self.knee},
            "cliff": {"index": cliff, "value": self.cliff},
            "recommended": self.recommended,
            "reason": self.reason,
            **_environment(self.records),
            "records": self.records,
        }


@dataclass
class SearchResult:
    """A fixed-candidate search: one row per candidate, `ranking` (indices of the qualified ones, fastest
    first) and `best` (that candidate's configuration, or None with `reason`)."""

    candidates: list[dict[str, Any]]
    baseline: dict[str, Any]
    budget: Budget
    rows: list[Row]
    ranking: list[int]
    best: dict[str, Any] | None
    reason: str
    records: list[dict[str, Any]]

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": "search",
            "candidates": self.candidates,
            "baseline": self.baseline,
            "budget": self.budget.to_dict(),
            "rows": [row.to_dict() for row in self.rows],
            "ranking": self.ranking,
            "best": self.best,
            "reason": self.reason,
            **_environment(self.records),
            "records": self.records,
        }


def sweep(
    session: Session,
    requests: list[Request],
    plugin: str,
    option: str,
    values: Sequence[Any],
    base_options: dict[str, Any] | None = None,
    baseline: dict[str, Any] | None = None,
    rounds: int = MIN_ROUNDS,
    budget: Budget | None = None,
    progress: bool = True,
    resume: str | Path | None = None,
    identity: dict[str, Any] | None = None,
    max_seconds: float | None = None,
    started: float | None = None,
) -> SweepResult | Partial:
    """Qualify `{plugin: {**base_options, option: value}}` against `baseline` (default `{}`) for each value.

    Order `values` from least to most aggressive: the cliff is looked for after the knee. `values` is a list, tuple
    or 1-D numpy array (`check_values`: numpy scalars taken as the Python values they hold). Every configuration,
    `rounds`, `budget` and `progress` (`harness.check_common`) are checked before anything runs, so a bad plugin,
    option or value is a ValueError (RuntimeError: not runnable on this device) without spending any time. The
    session's accelerations are as they were when it returns or raises.

    `resume`, `identity`, `max_seconds`, `started`: as for `harness.qualify`, one step per (value, request) in
    `sweep.partial.json` (no pilots kept); a run stopped at `max_seconds` returns its `Partial`. The run's fields
    are `plugin`, `option`, `values`, `base_options`, `baseline`, `rounds`, `requests`, the budget, `identity`,
    model, dtype and device.
    """
    values, base_options, baseline = check_values(values), dict(base_options or {}), dict(baseline or {})
    configs = sweep_configs(plugin, option, values, base_options)
    rounds, budget, progress = check_common(session, rounds, budget, progress)
    validate(session, [baseline, *configs], rounds, requests)
    arguments = {"plugin": plugin, "option": option, "values": values, "base_options": base_options}
    arguments |= {"baseline": baseline, "rounds": rounds}
    limit = {"max_seconds": max_seconds, "started": started}
    journal = case_journal(resume, "sweep", session, budget, requests, arguments, identity, len(configs), **limit)
    try:
        records = [
            qualify_cases(
                session,
                requests,
                baseline,
                c,
                rounds,
                budget,
                progress,
                f"value {i}/{len(values)}: {option}={v}",
                journal,
            )[0]
            for i, (c, v) in enumerate(zip(configs, values, strict=True), 1)
        ]  # each bar says which value of how many it runs
    except Paused as paused:
        return paused.partial
    return sweep_result(plugin, option, values, base_options, baseline, budget, records)


def sweep_result(
    plugin: str,
    option: str,
    values: list[Any],
    base_options: dict[str, Any],
    baseline: dict[str, Any],
    budget: Budget,
    records: list[dict[str, Any]],
) -> SweepResult:
    """The `SweepResult` of one qualification record per value (in `values` order), however they were run
    (`sweep` here, or cells fanned out over workers: `workbench.evidence.fanout_jobs`)."""
    rows = [summarize(record, value) for record, value in zip(records, values, strict=True)]
    knee, cliff = knee_and_cliff(rows)
    chosen, reason = recommend(rows, records[0]["device"]["type"])
    return SweepResult(
        plugin=plugin,
        option=option,
        values=values,
        base_options=base_options,
        baseline=baseline,
        budget=budget,
        rows=rows,
        knee=None if knee is None else values[knee],
        cliff=None if cliff is None else values[cliff],
        recommended=None if chosen is None else values[chosen],
        reason=reason,
        records=records,
    )


def search(
    session: Session,
    requests: list[Request],
    candidates: list[dict[str, Any]],
    baseline: dict[str, Any] | None = None,
    rounds: int = MIN_ROUNDS,
    budget: Budget | None = None,
    progress: bool = True,
    resume: str | Path | None = None,
    identity: dict[str, Any] | None = None,
    max_seconds: float | None = None,
    started: float | None = None,
) -> SearchResult | Partial:
    """Qualify each candidate configuration against `baseline` (default `{}`) and pick the fastest qualified.

    Every candidate is validated before anything runs (ValueError/RuntimeError as for `sweep`); the session's
    accelerations are as they were when it returns or raises. `resume`,
    `identity`, `max_seconds`, `started`: as for `sweep`, one step per (candidate, request) in `search.partial.json`;
    the run's fields are `candidates`, `baseline`, `rounds`, `requests`, the budget, `identity`, model, dtype and
    device.
    """
    check_candidates(candidates)
    baseline = dict(baseline or {})
    rounds, budget, progress = check_common(session, rounds, budget, progress)
    validate(session, [baseline, *candidates], rounds, requests)
    arguments = {"candidates": candidates, "baseline": baseline, "rounds": rounds}
    limit = {"max_seconds": max_seconds, "started": started}
    journal = case_journal(resume, "search", session, budget, requests, arguments, identity, len(candidates), **limit)
    try:
        records = [
            qualify_cases(
                session, requests, baseline, c, rounds, budget, progress, f"candidate {i}/{len(candidates)}", journal
            )[0]
            for i, c in enumerate(candidates, 1)
        ]
    except Paused as paused:
        return paused.partial
    return search_result(candidates, baseline, budget, records)


def search_result(
    candidates: list[dict[str, Any]], baseline: dict[str, Any], budget: Budget, records: list[dict[str, Any]]
) -> SearchResult:
    """The `SearchResult` of one qualification record per candidate (in `candidates` order), as `sweep_result`."""
    rows = [summarize(record, candidate) for record, candidate in zip(records, candidates, strict=True)]
    ranking = rank(rows)
    chosen, reason = recommend(rows, records[0]["device"]["type"], "candidate")
    return SearchResult(
        candidates=candidates,
        baseline=baseline,
        budget=budget,
        rows=rows,
        ranking=ranking,
        best=None if chosen is None else candidates[chosen],
        reason=reason,
        records=records,
    )


def pareto_figure(result: SweepResult | SearchResult, metric: str = "latent_rel_l2") -> Figure:
    """Speed-up (x) against `metric` (y) for every row, labelled by value and coloured by verdict; the Pareto front of
    the executed rows as a line, the knee ringed, the cliff crossed, the budget's limit and speed-up 1 as dashed lines.
    The legend, outside the axes (it hides no point), names the lines and each verdict drawn.

    A row that did not execute has no speed-up (its runs did the baseline's work): it is drawn grey at speed-up 1,
    without a CI bar. An identical output's infinite PSNR is drawn at the top, labelled. Rows drawn at one point share
    one label ("0, 0.05 (not executed)").
    """
    rows = result.rows
    front = pareto_front(rows, metric)
    knee, cliff = knee_and_cliff(rows) if isinstance(result, SweepResult) else (None, None)
    limit = getattr(result.budget, metric)
    finite = [y for row in rows if (y := getattr(row, metric)) is not None and math.isfinite(y)]
    top = max([*finite, limit or 0.0]) + 10.0  # where an infinite PSNR is drawn

    def y_of(row: Row) -> float | None:
        y = getattr(row, metric)
        if y is None or math.isnan(y):
            return None
        return top if math.isinf(y) else y

    figure = Figure(figsize=(8.5, 4.5), layout="constrained")
    axes = figure.add_subplot()
    names: dict[tuple[float, float, str], list[str]] = {}  # (x, y, suffix) -> the labels of the rows drawn there
    marks = []  # (x, y, text): the knee's and the cliff's labels
    verdicts = {}  # verdict -> colour, of the rows drawn
    for i, row in enumerate(rows):
        y = y_of(row)
        if y is None:
            continue
        x = row.speedup if row.executed else 1.0
        verdicts[row.verdict] = _VERDICT_COLORS.get(row.verdict, "#000000")
        on_top = 3 if row.executed else 2.5  # an executed point hides under no point that did not execute
        axes.scatter(x, y, s=40, color=verdicts[row.verdict], zorder=on_top)
        if row.executed:
            axes.errorbar(
                x,
                y,
                xerr=[[max(row.speedup - row.speedup_low, 0.0)], [max(row.speedup_high - row.speedup, 0.0)]],
                color="#999999",
                linewidth=0.8,
                zorder=2,
            )
        suffix = (" (exact)" if math.isinf(getattr(row, metric)) else "") + ("" if row.executed else " (not executed)")
        names.setdefault((x, y, suffix), []).append(row.label)
        if i == knee:
            axes.scatter(x, y, s=260, facecolors="none", edgecolors="#000000", linewidths=1.5, zorder=4)
            marks.append((x, y, "knee"))
        if i == cliff:
            axes.scatter(x, y, s=160, marker="x", color="#e15759", linewidths=2, zorder=4)
            marks.append((x, y, "cliff"))
    if front:
        points = [(rows[i].speedup, y_of(rows[i])) for i in front]
        axes.plot(*zip(*points, strict=True), color="#000000", linewidth=1, linestyle="-", label="Pareto front")
    if limit is not None:
        axes.axhline(limit, color="#e15759", linestyle="--", linewidth=1, label=f"budget {metric} {limit:g}")
    axes.axvline(1.0, color="#999999", linestyle=":", linewidth=1)
    axes.set_xlabel("speed-up (median, CI95 bars; >1 is faster)")
    axes.set_ylabel(_METRICS[metric])
    if isinstance(result, SweepResult):
        axes.set_title(f"{result.plugin}.{result.option} sweep")
    else:
        axes.set_title("candidate search")
    handles = axes.get_legend_handles_labels()[0]
    handles += [
        Line2D([], [], marker="o", linestyle="", color=verdicts[verdict], label=verdict)
        for verdict in reversed(SUITE_ORDER)  # the strongest verdict first
        if verdict in verdicts
    ]
    if handles:
        figure.legend(handles=handles, loc="outside right upper", fontsize=LABEL_PT)
    labels = [(x, y, ", ".join(rows_there) + suffix) for (x, y, suffix), rows_there in names.items()]
    label_points(axes, labels + marks, fontsize=LABEL_PT)  # last: the legend outside the axes narrows them
    return figure


def render(result: SweepResult | SearchResult) -> str:
    """A static HTML page (`report.page`: no script, nothing fetched): the summary (the device as
    `environment.device_label` names it, the budget in words as `Budget.describe` writes it, a search's ranking by
    candidate), one table row per value or candidate, its speed-up worded as `report.speedup_text` (none for a row
    that did not execute, marked as no speed claim under a verdict that makes none), and the Pareto PNG with a
    caption saying what it shows and whether any speed-up in it is a speed claim."""
    record = result.to_record()
    sweeping = isinstance(result, SweepResult)
    noun = "value" if sweeping else "candidate"
    title = f"Sweep {result.plugin}.{result.option}" if sweeping else "Candidate search"
    summary: dict[str, Any] = {"model": record.get("model"), "baseline": json.dumps(result.baseline)}
    if sweeping:
        summary |= {
            "plugin": result.plugin,
            "option": result.option,
            "base options": json.dumps(result.base_options),
            "knee": _text(result.knee),
            "cliff": _text(result.cliff),
            "recommended": _text(result.recommended),
        }
    else:
        ranked = "; ".join(f"{place}. {result.rows[i].label}" for place, i in enumerate(result.ranking, 1))
        summary |= {"ranking": ranked or "none: no candidate is qualified", "best": _text(result.best)}
    summary |= {
        "reason": result.reason,
        "rounds": record.get("rounds"),
        "device": device_label(record["device"]) if record.get("device") else None,
        "commit": f"{(record.get('git') or {}).get('commit')} (dirty={(record.get('git') or {}).get('dirty')})",
        "budget": result.budget.describe(),
    }
    body = [
        f"<h1>{html.escape(title)}</h1>",
        Table(summary).html(),
        "<h2>Results</h2>",
        f"<p>One row per {noun}, the worst over its requests: the weakest case's verdict, the slowest case's "
        "speed-up, the largest latent rel-L2, the smallest PSNR and min-frame SSIM.</p>",
        _rows_table(result.rows, noun),
        png_figure_html(figure_png(pareto_figure(result)), _pareto_caption(result, noun)),
        "<p>A recommendation needs quality within the budget and a speed claim (clean CUDA timing with a CI "
        "above 1); it holds only for these requests, seeds, geometry and device.</p>",
    ]
    return page(title, body)


def _pareto_caption(result: SweepResult | SearchResult, noun: str) -> str:
    """What `pareto_figure` (its default metric) shows, and whether any of its speed-ups is a speed claim."""
    marks = ", the knee ringed, the cliff crossed" if isinstance(result, SweepResult) else ""
    marks += ", the budget's limit dashed" if result.budget.latent_rel_l2 is not None else ""
    claims = [row for row in result.rows if row.verdict not in NO_SPEED_CLAIM]
    return (
        f"Speed-up (median, CI95) against {_METRICS['latent_rel_l2']}, one point per {noun} coloured by its "
        f"verdict: the Pareto front of the executed ones as a line{marks}. A {noun} that did not execute sits at "
        "speed-up 1 without a bar (its runs did the baseline's work). "
        + ("Only a qualified or measured_quality_tradeoff verdict's speed-up is a speed claim." if claims else
           "None of these speed-ups is a speed claim (see the verdicts).")
    )  # fmt: skip


def write(result: SweepResult | SearchResult, out: str | Path) -> tuple[Path, Path]:
    """Write `<kind>.json` (strict JSON) and `<kind>.html` into `out` as one set (`workbench.io.write_set`:
    a killed write leaves the previous pair or the new pair, never a mix); returns both paths."""
    kind = "sweep" if isinstance(result, SweepResult) else "search"
    paths = write_set(out, {f"{kind}.json": record_bytes(result.to_record()), f"{kind}.html": render(result).encode()})
    return paths[f"{kind}.json"], paths[f"{kind}.html"]


def check_values(values: Sequence[Any]) -> list[Any]:
    """`values` as a list, each numpy scalar as the Python value it holds (records stay JSON); ValueError naming
    `values` for a str or bytes (a sweep of its characters) or anything else that is not a list, tuple, range or
    1-D numpy array."""
    one_d_array = isinstance(values, np.ndarray) and values.ndim == 1
    if isinstance(values, str | bytes) or not (isinstance(values, Sequence) or one_d_array):
        raise ValueError(
            f"values: expected a list of the option's values, least to most aggressive, got "
            f"{type(values).__name__} {shown(values)}"
        )
    return [value.item() if isinstance(value, np.generic) else value for value in values]


def sweep_configs(plugin: str, option: str, values: list[Any], base_options: dict[str, Any]) -> list[dict[str, Any]]:
    """The configuration of each value, `{plugin: {**base_options, option: value}}`, after refusing `values` that
    `check_values` refuses, no values, a repeated value (or two that are one setting, `setting_key`: 1 and 1.0 of a
    float option), or `base_options` setting the swept option (ValueError naming the field)."""
    values = check_values(values)
    if not values:
        raise ValueError("values: at least one value is required")
    if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
        raise ValueError(f"values: {values!r} repeats a value")
    if option in base_options:
        raise ValueError(f"base_options: sets {option!r}, the option being swept")
    configs = [{plugin: {**base_options, option: value}} for value in values]
    seen: dict[str, int] = {}
    for i, config in enumerate(configs):  # 1 and 1.0 of a float option: one setting, qualified twice
        if (earlier := seen.setdefault(setting_key(config), i)) != i:
            raise ValueError(
                f"values: {values!r} repeats a setting: {values[i]!r} sets {plugin}.{option} as {values[earlier]!r} "
                f"(values[{earlier}]) does; give each value once"
            )
    return configs


def check_candidates(candidates: list[dict[str, Any]]) -> None:
    """Refuse an empty candidate list, a candidate that is not a dict of name -> options, or one that installs the
    same setting as an earlier candidate (`setting_key`: it would be qualified twice; `sweep` refuses a repeated
    value alike): ValueError naming it."""
    if not isinstance(candidates, list) or not candidates:
        raise ValueError("candidates: at least one candidate configuration is required")
    seen: dict[str, int] = {}
    for i, candidate in enumerate(candidates):
        if not isinstance(candidate, dict):
            raise ValueError(f"candidates[{i}]: expected a dict of name -> options, got {type(candidate).__name__}")
        text = setting_key(candidate)
        if text in seen:
            shown = json.dumps(candidate, sort_keys=True, default=repr)
            raise ValueError(
                f"candidates[{i}]: repeats candidates[{seen[text]}] ({shown} installs the same setting, its options "
                "resolved: defaults filled in, 1 and 1.0 alike); give each configuration once"
            )
        seen[text] = i


def setting_key(config: dict[str, Any]) -> str:
    """`config` as the accelerations it installs, in one text: each plugin's options resolved as installing checks
    them (`install.check_options`: defaults filled in, an int given to a float option as that float, `null` as no
    options), so two spellings of one setting have one key. A config installing would refuse keeps its own JSON
    (its error comes from the check that refuses it)."""
    try:
        resolved = {spec.name: options for spec, options in install.check_options(REGISTRY, config)}
    except ValueError:
        resolved = config
    return json.dumps(resolved, sort_keys=True, default=repr)


def _worst(values: list[Any], pick: Any) -> float | None:
    numbers = [_float(v) for v in values]
    if any(v is None for v in numbers):
        return None  # one case could not measure it: the row cannot claim a value
    return pick(numbers) if numbers else None


def _float(value: Any) -> float | None:
    if value is None:
        return None
    if value in ("inf", "-inf"):
        return math.inf if value == "inf" else -math.inf
    return float(value)


def _json_float(value: float | None) -> float | str | None:
    if value is not None and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _text(value: Any) -> str:
    return "none" if value is None else json.dumps(value, sort_keys=True)


def _environment(records: list[dict[str, Any]]) -> dict[str, Any]:
    first = records[0] if records else {}
    keys = ("model", "dtype", "rounds", "git", "versions", "device")
    return {key: first[key] for key in keys if key in first}


def _rows_table(rows: Sequence[Row], first: str) -> str:
    head = [first, "verdict", "speed-up (median, CI95)", "latent rel-L2", "PSNR dB", "min-frame SSIM", "in budget"]
    head += ["executed", "exact", "budget failures"]
    cells = [
        (row.label, [
            row.verdict, speedup_text(_case(row)),
            _number(row.latent_rel_l2), _number(row.psnr_db), _number(row.min_ssim),
            str(row.within_budget), str(row.executed), str(row.exact), "; ".join(row.failures) or "none",
        ])
        for row in rows
    ]  # fmt: skip
    return Table(cells, head).html()


def _case(row: Row) -> dict[str, Any]:
    """The row's verdict and speed-up in a case's shape, as `report.speedup_text` reads it."""
    speedup = {"median": row.speedup, "low": row.speedup_low, "high": row.speedup_high}
    return {"verdict": row.verdict, "speedup": speedup}


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"
