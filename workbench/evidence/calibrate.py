"""Calibration: a quality budget turned into a setting (seed 004 "Combination search").

`calibrate` searches one approximate plugin's knob (`Spec.knob`: an option from `low`, the closest to dense, to
`high`, the most aggressive value ever tried) on the calibration requests. Each tried value runs every calibration
request once and is compared with the stock dense output of the same request; its `spent` is the worst request's
`Budget.spent` (0 identical, 1 exactly at a limit). A value is inside when `spent <= margin`. The search tries
`low` (outside: no setting qualifies), then `high` (inside: `high` is the setting; the search never goes past it),
then bisects between the last value inside and the first outside until `max_evals` runs are spent. The knee is
the most aggressive value found inside, the cliff the least aggressive found outside: the setting is always on
the dense side of the cliff. A value whose outputs equal stock bit for bit (`spent == 0`: a threshold of 0 skips
nothing) is inside but does nothing; when nothing else is inside, no setting qualifies.

The setting is then confirmed on the test requests (other seeds) by `qualify`, the A/B/A harness, against the
full budget, one test request at a time. It is *calibrated* only when that confirmation's verdict is `qualified`
(inside the budget with a speed claim: a clean CUDA run). On a CPU the confirmation can at most show the quality
holds (`quality_confirmed`); no speed is claimed there. A point's speed-up is one run per value against the dense
references' run in the same process (`Point.session`): indicative, used to order and plot, never a claim; seconds
of different processes are never compared.

Both install what they try on the caller's session, and on every exit (a result, an error, an interrupt, a stop at
`max_seconds`) put back the accelerations it held when the call began (`harness.accelerations_kept`).

`resume=` (a folder) makes a calibration or stack resumable at one step (a tried value, or one test request's
confirmation) and `max_seconds=` stops it cleanly at a step boundary with a `Partial`: `workbench.evidence.resume`.

`stack` calibrates each plugin alone over the same base (the exact plugins the caller puts underneath), then adds
them greedily: first the one with the best indicative speed-up gained per share of the budget added, then, each
round, every plugin not yet added is searched again with the stack so far installed (a cache changes what attention
sees) and the best by the same measure is added; a plugin whose search finds nothing inside the budget, or that does
not make the stack faster, is left out with the reason. The whole stack is then confirmed on the test requests. Off
CUDA one run's seconds rank nothing: the plugins keep the given order, each searched once on the stack before it and
kept when the stack stays inside the budget (the record says `ranked_by_speed: false`). Its record is the
`within-budget` profile: the config with the budget, model, request geometry, device and seeds it holds for
(`workbench.profiles.within_budget`).

`attention_policy="auto"` serves a sparse-attention setting only on a qualification of that setting alone. A
calibrated result whose block_sparse (or sol_attn) setting shares its config with a base or other members therefore
qualifies that member alone on the same test requests too (`result.attention`); `write` turns the qualified record
into an entry (`registry_entry`, `attention_registry.json`).
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from workbench import environment
from workbench.accelerations import REGISTRY
from workbench.accelerations.base import Knob
from workbench.evidence.harness import (
    MIN_ROUNDS,
    accelerations_kept,
    check_common,
    check_requests,
    qualify,
)
from workbench.evidence.records import record_bytes
from workbench.evidence.report import Table, page, speedup_text
from workbench.evidence.resume import Journal, Partial, Paused, merge_cases, run_key
from workbench.io import write_set
from workbench.plots import LABEL_PT, figure_png, label_points, png_figure_html
from workbench.progress import progress as progress_bar
from workbench.quality import Budget, compare
from workbench.request import Request, integer, number
from workbench.result import Result
from workbench.session import Session

MARGIN = 0.8  # a calibrated setting uses at most 80 % of the budget on the calibration requests
MAX_EVALS = 7  # tried values per knob: low, high, then five bisections (the gap shrinks 32x)
PROFILE = "within-budget"


@dataclass(frozen=True)
class Point:
    """One tried knob value: worst `spent` over the calibration requests (inf when a run failed), the failures of
    that worst request against the full budget, total seconds of one run per request and the indicative speed-up
    against stock: the stock run of the same requests in the same process, `session` (seconds are comparable only
    within one session; speed-ups across sessions). `idle`: the plugins of the config whose receipts show no work on
    any calibration request (a cache that reused nothing); empty in records made before it was kept."""

    value: float
    spent: float
    seconds: float
    speedup: float
    failures: tuple[str, ...] = ()
    error: str = ""
    session: str = ""
    idle: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        spent = "inf" if math.isinf(self.spent) else self.spent
        return {"value": self.value, "spent": spent, "seconds": self.seconds, "speedup": self.speedup} | {
            "failures": list(self.failures),
            "error": self.error,
            "session": self.session,
            "idle": list(self.idle),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Point:
        """The point `to_dict` wrote (a strict-JSON null stands for NaN)."""
        number = {k: math.nan if data[k] is None else float(data[k]) for k in ("value", "spent", "seconds", "speedup")}
        return cls(
            **number,
            failures=tuple(data["failures"]),
            error=data["error"],
            session=data.get("session", ""),
            idle=tuple(data.get("idle", ())),
        )


@dataclass
class Calibration:
    """One plugin's calibration. `setting` is the accelerations config found (base + plugin), or None; `status`:
    "calibrated" (confirmed, qualified), "quality_confirmed" (confirmed inside the budget, no speed claim here),
    "not_confirmed" (the test requests left the budget or the confirmation failed), "searched" (not confirmed
    yet: inside a stack) or "no_setting"; `reason` says why in words."""

    plugin: str
    knob: Knob
    base: dict[str, Any]
    options: dict[str, Any]
    budget: Budget
    margin: float
    points: list[Point]
    knee: float | None
    cliff: float | None
    setting: dict[str, Any] | None
    status: str
    reason: str
    confirmation: dict[str, Any] | None = None
    scope: dict[str, Any] | None = None
    attention: dict[str, Any] | None = None  # `_confirm_attention_alone`'s record, when it ran

    @property
    def config(self) -> dict[str, Any] | None:
        """The setting as `Session.accelerate` takes it (a Stack's `config`, for code that takes either)."""
        return self.setting

    @property
    def knee_point(self) -> Point | None:
        return next((p for p in self.points if p.value == self.knee), None)

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": "calibration",
            "plugin": self.plugin,
            "knob": dataclasses.asdict(self.knob),
            "base": self.base,
            "options": self.options,
            "budget": self.budget.to_dict(),
            "margin": self.margin,
            "points": [p.to_dict() for p in self.points],
            "knee": self.knee,
            "cliff": self.cliff,
            "setting": self.setting,
            "status": self.status,
            "reason": self.reason,
            "scope": self.scope,
            "confirmation": self.confirmation,
            "attention": self.attention,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Calibration:
        """The calibration `to_record` wrote (a record read back from a store, to report or confirm it)."""
        fields = ("plugin", "base", "options", "margin", "knee", "cliff", "setting", "status", "reason")
        result = cls(
            **{name: record[name] for name in fields},
            knob=Knob(**record["knob"]),
            budget=Budget.from_dict(record["budget"]),
            points=[Point.from_dict(p) for p in record["points"]],
        )
        result.confirmation, result.scope = record["confirmation"], record["scope"]
        result.attention = record.get("attention")
        return result


@dataclass
class Stack:
    """A greedy stack of calibrated plugins: `config` (what `Session.accelerate` takes), the single-plugin
    calibrations it started from, the re-searches in the order added (`members`), the plugins left out and why,
    the confirmation on the test requests, and what the profile holds for (`scope`)."""

    config: dict[str, Any]
    base: dict[str, Any]
    budget: Budget
    margin: float
    singles: list[Calibration]
    members: list[Calibration]
    left_out: dict[str, str]
    status: str
    reason: str
    scope: dict[str, Any]
    confirmation: dict[str, Any] | None = None
    base_point: Point | None = None
    ranked_by_speed: bool = False
    attention: dict[str, Any] | None = None  # `_confirm_attention_alone`'s record, when it ran

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": "stack",
            "profile": PROFILE,
            "config": self.config,
            "base": self.base,
            "budget": self.budget.to_dict(),
            "margin": self.margin,
            "status": self.status,
            "reason": self.reason,
            "scope": self.scope,
            "base_point": None if self.base_point is None else self.base_point.to_dict(),
            "members": [m.to_record() for m in self.members],
            "singles": [s.to_record() for s in self.singles],
            "left_out": self.left_out,
            "ranked_by_speed": self.ranked_by_speed,
            "confirmation": self.confirmation,
            "attention": self.attention,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Stack:
        """The stack `to_record` wrote."""
        fields = ("config", "base", "margin", "left_out", "status", "reason", "scope", "confirmation")
        result = cls(
            **{name: record[name] for name in fields},
            budget=Budget.from_dict(record["budget"]),
            singles=[Calibration.from_record(r) for r in record["singles"]],
            members=[Calibration.from_record(r) for r in record["members"]],
        )
        result.ranked_by_speed, result.attention = record["ranked_by_speed"], record.get("attention")
        result.base_point = None if record["base_point"] is None else Point.from_dict(record["base_point"])
        return result


class _Evaluator:
    """Runs configs on the calibration requests against stock references computed once in this process (their
    digests checked against the journal's), each point through the journal (answered from it when recorded). The
    first point of each set of plugins in a process runs one untimed request first on CUDA, so compilation stays out
    of its seconds (elsewhere the seconds rank nothing). It uninstalls the session's accelerations to run the
    references and after each point: its caller puts the caller's set back (`harness.accelerations_kept`)."""

    def __init__(
        self,
        session: Session,
        requests: list[Request],
        budget: Budget,
        journal: Journal,
        on_step: Callable[[str], None] | None = None,
    ):
        self.session, self.requests, self.budget, self.journal = session, requests, budget, journal
        self.on_step, self.steps = on_step, 0
        session.accelerate({})
        session.generate(requests[0], progress=False)  # warm-up: first-use costs stay out of the seconds
        self.references, self.seconds = self._run()
        # plugin sets run once in this process (JIT, autotune behind them); only CUDA's speed-ups rank anything
        self.warmed = {()} if session.device.type == "cuda" else None
        journal.check_references(self.references, [r.seed for r in requests])

    def _run(self) -> tuple[list[Result], float]:
        results, seconds = [], 0.0
        for request in self.requests:
            start = time.perf_counter()
            results.append(self.session.generate(request, progress=False))
            seconds += time.perf_counter() - start
        return results, seconds

    def point(self, value: float, config: dict[str, Any]) -> Point:
        """The point of `value` (`config` installed): recorded, or measured now."""
        key = {"config": config, "value": value}
        point = Point.from_dict(
            self.journal.step("point", key, lambda: self._measure(value, config).to_dict(), self.seconds)
        )
        speed = f", {point.speedup:.2f}x (indicative)" if math.isfinite(point.speedup) else ""
        trial = "base" if math.isnan(value) else f"{value:g}"
        self._tell(
            f"{trial} with {', '.join(sorted(config)) or 'nothing'}: spends {point.spent:.3g} of the budget{speed}"
        )
        return point

    def confirmation(self, request: Request, config: dict[str, Any], rounds: int, progress: bool) -> dict[str, Any]:
        """`qualify` of `config` against stock on `request` (one case): recorded, or run now."""
        expected = (2 * rounds + 3) * self.seconds / len(self.requests)
        key = {"config": config, "request": request.to_dict()}

        def run() -> dict[str, Any]:
            return qualify(self.session, [request], {}, config, rounds, self.budget, progress)[0]

        record = self.journal.step("confirmation", key, run, expected)
        self._tell(f"confirmed {', '.join(sorted(config))} on seed {request.seed}: {record['verdict']}")
        return record

    def _tell(self, what: str) -> None:
        self.steps += 1
        if self.on_step is not None:
            self.on_step(f"step {self.steps}: {what}")

    def _measure(self, value: float, config: dict[str, Any]) -> Point:
        session = self.journal.session
        try:
            self.session.accelerate(config)
            if self.warmed is not None and tuple(sorted(config)) not in self.warmed:  # a resumed run starts cold
                self.session.generate(self.requests[0], progress=False)
                self.warmed.add(tuple(sorted(config)))
            results, seconds = self._run()
        except (RuntimeError, ValueError) as error:  # a value the plugin refuses, a non-finite output
            return Point(value, math.inf, math.nan, math.nan, error=f"{type(error).__name__}: {error}", session=session)
        finally:
            self.session.accelerate({})
        spent, failures = 0.0, ()
        for reference, result in zip(self.references, results, strict=True):
            comparison = compare(reference, result, self.budget)
            share = self.budget.spent(comparison.measured())
            if comparison.failures and share <= 1:  # structural failures (frame count, black frames) count fully
                share = math.inf
            if share >= spent:
                spent, failures = share, tuple(comparison.failures)
        idle = tuple(sorted(set(config) - {name for r in results for name, x in r.receipts.items() if x["executed"]}))
        return Point(value, spent, seconds, self.seconds / seconds, failures, session=session, idle=idle)


def calibrate(
    session: Session,
    calibration: list[Request],
    test: list[Request] | None,
    plugin: str,
    budget: Budget | None = None,
    *,
    knob: str | None = None,
    options: dict[str, Any] | None = None,
    base: dict[str, Any] | None = None,
    margin: float = MARGIN,
    max_evals: int = MAX_EVALS,
    rounds: int = MIN_ROUNDS,
    progress: bool = True,
    resume: str | Path | None = None,
    max_seconds: float | None = None,
    started: float | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Calibration | Partial:
    """Search `plugin`'s knob (its `Spec.knob`: one declared option and range; `knob`, when given, must name that
    option) for the most aggressive value inside `margin` of `budget` on `calibration`, over `base` (installed
    underneath, with the plugin's other `options`), then confirm it on `test` (None: leave it "searched"). See the
    module docstring.

    `resume`: a folder for the partial record, read when there and rewritten after every step; `max_seconds`
    (needs `resume`): stop at the step boundary past which the next step would not end in time, and return a
    `Partial` (`workbench.evidence.resume`), counting from `started` (a `time.perf_counter()` reading; default: this
    call's start). `on_step(text)` hears each finished step (a tried value, a confirmation case) in a line of words:
    what a panel shows while it runs. ValueError, before any run, for an unknown plugin, one without a knob, a bad
    margin, max_evals, rounds, budget, progress, max_seconds or started, request lists that are empty or not lists
    of Request, or a partial record of another run. The session's accelerations are as they were when it returns or
    raises."""
    spec = check_arguments([plugin], knob, margin, max_evals)[0]
    margin, max_evals = float(margin), int(max_evals)  # checked: numpy numbers as plain ones (records are JSON)
    rounds, budget, progress = check_common(session, rounds, budget, progress)
    _check_requests(session, calibration, test)
    base, options = dict(base or {}), dict(options or {})
    _check_options(spec, plugin, base, options)  # a bad option fails before any run
    scope = scope_of(session, calibration, test)  # one geometry, checked before any run
    arguments = {"plugins": [plugin], "knob": spec.knob.option, "options": options, "base": base, "margin": margin}
    run = _identity("calibration", session, calibration, test, budget, arguments | {"max_evals": max_evals})
    at_most = max_evals + 2 * len(test or [])
    journal = Journal(resume, "calibration", run | {"rounds": rounds}, at_most, max_seconds, started)
    try:
        with accelerations_kept(session):
            evaluator = _Evaluator(session, calibration, budget, journal, on_step)
            result = _calibrate(evaluator, plugin, spec, options, base, margin, max_evals, progress)
            result.scope = scope
            if result.status == "searched" and test is not None:
                _confirm(evaluator, test, result, rounds, progress)
                _confirm_attention_alone(evaluator, test, result, rounds, progress)
    except Paused as paused:
        return paused.partial
    return result


def _calibrate(
    evaluator: _Evaluator,
    plugin: str,
    spec: Any,
    options: dict[str, Any],
    base: dict[str, Any],
    margin: float,
    max_evals: int,
    progress: bool,
) -> Calibration:
    """The knob search of `calibrate` on `evaluator` (status "searched" or "no_setting"; no scope)."""
    _check_options(spec, plugin, base, options)
    config_of = _configs(base, plugin, options, spec.knob.option)
    with progress_bar(total=max_evals, desc=f"calibrate {plugin}.{spec.knob.option}", enabled=progress) as bar:

        def evaluate(value: float) -> Point:
            point = evaluator.point(value, config_of(value))
            bar.update(1)
            bar.set_postfix_str(f"{value:.4g}: spent {point.spent:.3g}")
            return point

        limited = any(limit is not None for limit in evaluator.budget.to_dict().values())
        points, knee, cliff = _search(evaluate, spec.knob, margin, max_evals, plugin, limited)
    budget = evaluator.budget
    result = Calibration(plugin, spec.knob, base, options, budget, margin, points, knee, cliff, None, "", "")
    if knee is None:
        result.status = "no_setting"
        result.reason = _no_setting_reason(points, spec.knob, margin, plugin)
        return result
    result.setting = config_of(knee)
    result.status, result.reason = "searched", f"{spec.knob.option}={knee:.4g} spends {result.knee_point.spent:.3g}"
    return result


def stack(
    session: Session,
    calibration: list[Request],
    test: list[Request] | None,
    plugins: list[str],
    budget: Budget | None = None,
    *,
    base: dict[str, Any] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    margin: float = MARGIN,
    max_evals: int = MAX_EVALS,
    rounds: int = MIN_ROUNDS,
    progress: bool = True,
    resume: str | Path | None = None,
    max_seconds: float | None = None,
    started: float | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Stack | Partial:
    """Greedy composition of `plugins` over `base` (the exact set underneath; see the module docstring).

    `options` gives each plugin's fixed options besides its knob (`check_options`); `test=None` leaves the stack
    "searched" (not confirmed); `resume`, `max_seconds`, `started` and `on_step` as for `calibrate`. ValueError, before
    any run, as for `calibrate`, and for a repeated or empty plugin list or `options` that `check_options` refuses (a
    plugin not among `plugins` too). The session's accelerations are as they were when it returns or raises."""
    if not plugins or len(set(plugins)) != len(plugins):
        raise ValueError(f"plugins: need at least one, each once; got {plugins!r}")
    specs = check_arguments(plugins, None, margin, max_evals)
    margin, max_evals = float(margin), int(max_evals)  # checked: numpy numbers as plain ones (records are JSON)
    rounds, budget, progress = check_common(session, rounds, budget, progress)
    _check_requests(session, calibration, test)
    base = dict(base or {})
    options = {p: dict(o) for p, o in check_options(plugins, {} if options is None else options).items()}
    for plugin, spec in zip(plugins, specs, strict=True):
        _check_options(spec, plugin, base, options.get(plugin, {}))  # a plugin the base installs too
    scope = scope_of(session, calibration, test)
    search_scope = {**scope, "test_seeds": []}  # what the searches alone hold for
    arguments = {"plugins": plugins, "options": options, "base": base, "margin": margin, "max_evals": max_evals}
    run = _identity("stack", session, calibration, test, budget, arguments | {"rounds": rounds})
    searches = len(plugins) * (len(plugins) + 1) // 2  # the singles, then a shrinking round of re-searches each
    at_most = 1 + searches * max_evals + 2 * len(test or [])
    journal = Journal(resume, "stack", run, at_most, max_seconds, started)
    try:
        with accelerations_kept(session):
            evaluator = _Evaluator(session, calibration, budget, journal, on_step)
            result = _stack(evaluator, plugins, specs, options, base, margin, max_evals, progress, search_scope)
            result.scope = scope
            if result.status == "searched" and test is not None:
                _confirm(evaluator, test, result, rounds, progress)
                _confirm_attention_alone(evaluator, test, result, rounds, progress)
    except Paused as paused:
        return paused.partial
    return result


def _stack(
    evaluator: _Evaluator,
    plugins: list[str],
    specs: list[Any],
    options: dict[str, dict[str, Any]],
    base: dict[str, Any],
    margin: float,
    max_evals: int,
    progress: bool,
    search_scope: dict[str, Any],
) -> Stack:
    """The searches of `stack` on `evaluator` (status "searched" or "no_setting"; not confirmed)."""

    def search(plugin: str, spec: Any, under: dict[str, Any]) -> Calibration:
        found = _calibrate(evaluator, plugin, spec, options.get(plugin, {}), under, margin, max_evals, progress)
        found.scope = search_scope
        return found

    base_point = evaluator.point(math.nan, base)
    singles = [search(p, spec, base) for p, spec in zip(plugins, specs, strict=True)]
    left_out = {s.plugin: s.reason for s in singles if s.knee is None}
    alone = {s.plugin: s for s in singles}
    pending = [s.plugin for s in singles if s.knee is not None]
    timed = evaluator.session.device.type == "cuda"  # elsewhere one run's seconds rank nothing: keep the given order
    config, speed, spent, members = dict(base), base_point.speedup, base_point.spent, []
    while pending:
        # the candidates of this round, searched with the stack so far installed (over the bare base: the singles);
        # timed, every pending plugin and the best gain per budget spent is added; untimed, the next in order
        tried = pending if timed else pending[:1]
        found = {p: alone[p] if config == base else search(p, REGISTRY[p], config) for p in tried}
        for plugin, again in found.items():
            if again.knee is None:
                left_out[plugin] = f"with {sorted(config)} installed: {again.reason}"
            elif timed and not again.knee_point.speedup > speed:
                gain = f"{again.knee_point.speedup:.3f}x against {speed:.3f}x without it"
                left_out[plugin] = f"no gain on the stack: {gain} (indicative)"
        kept = [again for plugin, again in found.items() if plugin not in left_out]
        pending = [p for p in pending if p not in left_out]
        if not kept:
            continue
        best = max(kept, key=lambda a: _gain_per_spent(a.knee_point, speed, spent)) if timed else kept[0]
        config, speed, spent = dict(best.setting), best.knee_point.speedup, best.knee_point.spent
        members.append(best)
        pending.remove(best.plugin)
    result = Stack(config, base, evaluator.budget, margin, singles, members, left_out, "", "", search_scope)
    result.base_point, result.ranked_by_speed = base_point, timed
    if not members:
        result.status = "no_setting"
        result.reason = "no plugin has a setting inside the budget: " + "; ".join(
            f"{k}: {v}" for k, v in left_out.items()
        )
    else:
        result.status, result.reason = "searched", f"stack of {[m.plugin for m in members]} (not confirmed yet)"
    return result


def check_arguments(plugins: list[str], knob: str | None, margin: float, max_evals: int) -> list[Any]:
    """The plugins' specs, after checking what needs no model: each plugin exists, declares a knob (`knob`, when
    given, is that knob) and is given once, the margin is a number in (0, 1], max_evals an integer >= 2 (numpy
    numbers taken as the numbers they hold). ValueError naming the field otherwise."""
    specs = []
    for index, plugin in enumerate(plugins):
        if plugin in plugins[:index]:
            raise ValueError(f"plugin: {plugin!r} given more than once; each plugin is searched once")
        spec = REGISTRY.get(plugin)
        if spec is None:
            raise ValueError(f"plugin: unknown {plugin!r}; calibratable: {calibratable()}")
        if spec.knob is None:
            raise ValueError(f"plugin: {plugin!r} declares no knob; calibratable: {calibratable()}")
        if knob is not None and knob != spec.knob.option:
            raise ValueError(f"knob: {plugin} calibrates {spec.knob.option!r}, got {knob!r}")
        specs.append(spec)
    try:
        number("margin", margin, math.nextafter(0.0, 1.0), 1.0)  # (0, 1]
    except ValueError:
        raise ValueError(f"margin: {margin!r}; allowed: a number in (0, 1]") from None
    try:
        integer("max_evals", max_evals, 2, sys.maxsize)
    except ValueError:
        raise ValueError(f"max_evals: {max_evals!r}; allowed: an integer >= 2 (low and high)") from None
    return specs


def check_options(plugins: list[str], options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`options` (plugin -> its fixed options besides the knob, e.g. mag_cache's `mag_ratios`) checked against the
    plugins' specs with the knob at its low end: a plugin not among `plugins`, an entry that is not a dict, one that
    sets the knob itself, or an option the spec refuses is a ValueError naming it."""
    if not isinstance(options, dict):
        raise ValueError(f"options: expected a JSON object of plugin -> options, got {type(options).__name__}")
    for plugin, fixed in options.items():
        if plugin not in plugins:
            raise ValueError(f"options: {plugin!r} is not among the plugins calibrated {plugins}")
        knob = REGISTRY[plugin].knob.option
        if not isinstance(fixed, dict) or knob in fixed:
            raise ValueError(f"options.{plugin}: expected an object of its options besides its knob {knob!r}")
        REGISTRY[plugin].validate({**fixed, knob: REGISTRY[plugin].knob.low})
    return options


def calibratable() -> list[str]:
    """The registered plugins that declare a knob."""
    return sorted(name for name, spec in REGISTRY.items() if spec.knob is not None)


def _check_requests(session: Session, calibration: list[Request], test: list[Request] | None) -> None:
    """`harness.check_requests` of the calibration requests and of the test requests when given: ValueError naming
    `calibration` or `test` for a list that is empty, not a list of Request, or holds one the model cannot take."""
    check_requests(session, calibration, "calibration")
    if test is not None:
        check_requests(session, test, "test")


def _check_options(spec: Any, plugin: str, base: dict[str, Any], options: dict[str, Any]) -> None:
    if plugin in base:
        raise ValueError(f"base: already installs {plugin!r}, the plugin being calibrated")
    if spec.knob.option in options:
        raise ValueError(f"options: sets {spec.knob.option!r}, the knob being searched")
    spec.validate({**options, spec.knob.option: spec.knob.low})


def _identity(
    kind: str, session: Session, calibration: list[Request], test: list[Request] | None, budget: Budget, arguments
) -> dict[str, Any]:
    """What a partial record must agree on to be resumed: the arguments, requests, model, dtype and device."""
    requests = {
        "calibration": [r.to_dict() for r in calibration],
        "test": None if test is None else [r.to_dict() for r in test],
    }
    return run_key(kind, session, budget, arguments | requests)


def _configs(base: dict[str, Any], plugin: str, options: dict[str, Any], option: str) -> Callable[[float], dict]:
    return lambda value: {**base, plugin: {**options, option: value}}


def _search(
    evaluate: Callable[[float], Point],
    knob: Knob,
    margin: float,
    max_evals: int,
    plugin: str = "",
    limited: bool = True,
):
    """(points in the order tried, knee, cliff); a point inside is `spent <= margin`, and useful when `spent > 0`
    and `plugin` (the one searched) did work there: its spend alone can be the base's, underneath it. Under a budget
    that sets no limit (`limited` False) every point spends 0, so `spent` says nothing of the output: the receipts
    alone decide, and the knee is the top of the range where the plugin works there."""
    points = [evaluate(knob.low)]
    if points[0].spent > margin:
        return points, None, knob.low
    points.append(evaluate(knob.high))
    if points[-1].spent <= margin:
        good, bad = knob.high, None
    else:
        good, bad = knob.low, knob.high
        while len(points) < max_evals and (middle := knob.between(good, bad)) is not None:
            points.append(evaluate(middle))
            good, bad = (middle, bad) if points[-1].spent <= margin else (good, middle)
    knee_point = next(p for p in points if p.value == good)
    useful = (knee_point.spent > 0 or not limited) and plugin not in knee_point.idle
    return points, (good if useful else None), bad


def _no_setting_reason(points: list[Point], knob: Knob, margin: float, plugin: str) -> str:
    first = points[0]
    least = f"{knob.option}={knob.low:g}, the least aggressive value,"
    if first.error:
        return f"no setting qualifies: {least} cannot run ({first.error})"
    if first.spent > margin:
        why = "; ".join(first.failures) or "inside the budget, outside the margin"
        return f"no setting qualifies: even {least} spends {first.spent:.3g} of the budget, over {margin:g} ({why})"
    if any(plugin in p.idle for p in points if p.spent <= margin):
        inside = f"at the values inside {margin:g} of the budget, {plugin}'s receipts show no work"
    else:
        inside = f"the values inside {margin:g} of the budget change nothing (outputs equal stock)"
    if all(p.spent <= margin for p in points):  # nothing outside: no value tried did anything
        return f"no setting qualifies: {inside}, and no value tried is outside"
    return f"no setting qualifies: {inside}; the least aggressive value that does anything is outside"


def _confirm(evaluator: _Evaluator, test: list[Request], result: Calibration | Stack, rounds, progress) -> None:
    """Qualify `result`'s config against stock on `test`, one request (one journal step) at a time."""
    records = [evaluator.confirmation(request, result.config, rounds, progress) for request in test]
    apply_confirmation(result, merge_cases(records))


def attention_member(result: Calibration | Stack) -> tuple[str, dict[str, Any]] | None:
    """The one sparse-attention plugin `attention_policy` can serve (ROUTABLE) in `result`'s config, with its
    options; None when there is none (or more than one)."""
    from workbench.accelerations.attention.attention_policy import ROUTABLE

    config = result.config or {}
    found = [plugin for plugin in ROUTABLE if plugin in config]
    return (found[0], config[found[0]]) if len(found) == 1 else None


def _confirm_attention_alone(evaluator: _Evaluator, test: list[Request], result, rounds, progress) -> None:
    """A calibrated `result` whose sparse-attention member shares its config with other plugins (a base, a stack)
    earns an `attention_policy` entry only with evidence of that member alone: qualify `{plugin: options}` against
    stock on the same test requests (journal steps of their own) into `result.attention`. Off CUDA nothing is
    "calibrated", so this never runs there."""
    member = attention_member(result)
    if result.status != "calibrated" or member is None or result.config == dict([member]):
        return
    records = [evaluator.confirmation(request, dict([member]), rounds, progress) for request in test]
    result.attention = merge_cases(records)


def apply_confirmation(result: Calibration | Stack, record: dict[str, Any]) -> None:
    """Set `result`'s confirmation, status and reason from `record`, the qualification of its config (candidate)
    against stock (baseline) on the test requests with its budget."""
    result.confirmation, cases = record, record["cases"]
    inside = all(case["quality"]["within_budget"] for case in cases)
    if record["verdict"] == "qualified":
        result.status, result.reason = "calibrated", f"confirmed on {len(cases)} test request(s): qualified"
    elif inside and record["verdict"] == "no_speed_claim":
        reasons = sorted({case["reason"].removeprefix("quality within the budget; ") for case in cases})
        result.status = "quality_confirmed"
        result.reason = f"inside the budget on {len(cases)} test request(s); {'; '.join(reasons)}"
    else:
        worst = min(cases, key=lambda c: c["quality"]["within_budget"])
        result.status = "not_confirmed"
        result.reason = f"confirmation {record['verdict']}: {worst['reason']}"


def _gain_per_spent(point: Point, speed: float, spent: float) -> float:
    """The speed-up `point` adds to a stack running at `speed` per share of the budget it adds to the stack's `spent`
    (a spend it does not raise counts as a thousandth)."""
    return (point.speedup / speed - 1.0) / max(point.spent - spent, 1e-3)


def scope_of(session: Session, calibration: list[Request], test: list[Request] | None) -> dict[str, Any]:
    """What a setting holds for: model, dtype, device, request geometry (one for every request), seeds."""
    from workbench.accelerations.attention.attention_policy import model_key

    test = test or []
    shapes = [
        {k: v for k, v in session.resolve(r).to_dict().items() if k not in ("prompt", "negative_prompt", "seed")}
        for r in [*calibration, *test]
    ]
    if any(shape != shapes[0] for shape in shapes):
        raise ValueError(f"requests: calibration and test requests must share one geometry, got {shapes}")
    return {
        "model": session.model.name,
        "model_key": model_key(session.model),
        "family": session.model.family.name,
        "dtype": str(session.dtype).removeprefix("torch."),
        "request": shapes[0],
        "calibration_seeds": [r.seed for r in calibration],
        "test_seeds": [r.seed for r in test],
        **environment.describe(session.device),
    }


# ---- evidence --------------------------------------------------------------------------------------------------


def pareto_figure(result: Calibration | Stack) -> Figure:
    """Indicative speed-up against budget spent, one series per searched knob, each point labelled by its value; knee
    circled, cliff crossed."""
    figure = Figure(figsize=(7.0, 4.2), dpi=100)
    axes = figure.subplots()
    right = 1.0  # the x axis reaches past the budget limit and the right-most point
    labels = []  # (x, y, text) of each point
    for run, label in _searches(result):
        points = [p for p in run.points if math.isfinite(p.spent) and math.isfinite(p.speedup)]
        if not points:
            continue
        right = max(right, *(p.spent for p in points))
        # unclipped: a value that spent nothing sits on the left spine (x = 0), drawn whole rather than cut in half
        xs, ys = [p.spent for p in points], [p.speedup for p in points]
        line = axes.plot(xs, ys, "o", label=label, alpha=0.8, clip_on=False)[0]
        labels += [(p.spent, p.speedup, f"{p.value:.3g}") for p in points]
        knee = run.knee_point
        if knee is not None:
            axes.plot([knee.spent], [knee.speedup], "o", ms=14, mfc="none", mec=line.get_color(), clip_on=False)
        cliff = next((p for p in points if p.value == run.cliff), None)
        if cliff is not None:
            axes.plot([cliff.spent], [cliff.speedup], "x", ms=12, color=line.get_color(), clip_on=False)
    axes.axvline(result.margin, color="#888", ls="--", lw=1, label=f"margin {result.margin:g}")
    axes.axvline(1.0, color="#e15759", lw=1, label="budget limit")
    axes.plot([], [], "o", ms=10, mfc="none", mec="#444", label="knee (the setting)")  # legend keys for the markers
    axes.plot([], [], "x", ms=9, color="#444", label="cliff")
    axes.set_xlabel("budget spent (worst calibration request; 1 = at a limit)")
    axes.set_ylabel("speed-up vs stock (one run: indicative)")
    axes.set_xscale("symlog", linthresh=0.05)
    axes.set_xlim(0.0, 1.6 * right)  # spent is never negative; room for the right-most labels
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # plain text: no mathtext fonts
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.grid(alpha=0.3)
    figure.tight_layout()
    label_points(axes, labels, fontsize=LABEL_PT)
    axes.legend(fontsize=LABEL_PT)
    return figure


def _searches(result: Calibration | Stack) -> list[tuple[Calibration, str]]:
    """Each knob search once, labelled: a plugin alone over the base, or re-searched on the stack in round i. Round
    1's search runs over the bare base, so it is the plugin's search alone: listed once, as both."""
    if isinstance(result, Calibration):
        return [(result, f"{result.plugin}.{result.knob.option}")]
    first = result.members[0].to_record() if result.members else None
    shown = next((s for s in result.singles if s.to_record() == first), None)  # round 1's search, listed as a single
    searches = [
        (s, f"{s.plugin}.{s.knob.option} alone" + (", added in round 1" if s is shown else "")) for s in result.singles
    ]
    searches += [
        (m, f"{m.plugin}.{m.knob.option} on the stack, added in round {i}")
        for i, m in enumerate(result.members, 1)
        if not (i == 1 and shown is not None)
    ]
    return searches


# The columns of a search's table after the knob's value: what each measured (a CPU's seconds rank nothing).
SEARCH_COLUMNS = [
    "budget spent (1 = at a limit)",
    "seconds (one run per request, summed)",
    "speed-up vs stock (one run: indicative)",
    "failures",
]


def render(result: Calibration | Stack) -> str:
    """A static HTML report: status, the setting (JSON), the device the times were measured on, the Pareto plot, every
    tried point, the confirmation's cases (each budget term beside its limit) and receipts."""
    title = f"calibration: {result.plugin}" if isinstance(result, Calibration) else f"{PROFILE} stack"
    setting = "none" if result.config is None else json.dumps(result.config)  # as the qualification reports write it
    summary = {"status": result.status, "reason": result.reason, "setting": setting}
    if (result.scope or {}).get("device"):  # what every time and speed-up below was measured on
        summary["device"] = environment.device_label(result.scope["device"])
    summary |= {"budget": result.budget.describe(), "margin": result.margin}
    if isinstance(result, Stack) and result.base_point is not None and result.base:
        point = result.base_point  # what the exact plugins underneath give alone
        summary["base alone"] = f"{point.speedup:.3f}x stock, spends {point.spent:.3g} (one run: indicative)"
    body = [
        f"<h1>{html.escape(title)}</h1>",
        Table(summary).html(),
        png_figure_html(figure_png(pareto_figure(result)), "Pareto plot"),
    ]
    for run, label in _searches(result):
        under = ", ".join(sorted(run.base)) or "stock"
        knee = "none inside the budget" if run.knee is None else f"{run.knee:.4g}"
        cliff = "none in the knob's range" if run.cliff is None else f"{run.cliff:.4g}"
        body.append(f"<h2>{html.escape(f'{label} (over {under})')}</h2>")
        body.append(f"<p>knee {knee}, cliff {cliff}: {html.escape(f'{run.status}, {run.reason}')}</p>")
        rows = [
            (f"{p.value:.4g}", [f"{p.spent:.3g}", f"{p.seconds:.3f}", f"{p.speedup:.3f}", "; ".join(p.failures) or p.error])
            for p in run.points
        ]  # fmt: skip
        body.append(Table(rows, ["value", *SEARCH_COLUMNS]).html())
    if result.confirmation is not None:
        body.append("<h2>confirmation on the test requests</h2>")
        limits = [name for name, limit in result.budget.to_dict().items() if limit is not None]
        for case in result.confirmation["cases"]:
            seed = case["request"]["seed"]
            rows = {"seed": seed, "verdict": case["verdict"], "speed-up (CI95)": speedup_text(case)}
            rows |= {"timed rounds": len(case["candidate_seconds"]), "reason": case["reason"]}
            # each budget term as measured, beside its limit and unit ("psnr_db (>= 33 dB)")
            rows |= {f"{name} ({result.budget.bound(name)})": case["quality"].get(name) for name in limits}
            body.append(Table(rows).html())
            receipts = html.escape(json.dumps(case["receipts"], indent=1, default=str))
            body.append(f"<details><summary>receipts, seed {seed}</summary><pre>{receipts}</pre></details>")
    if result.attention is not None:
        body.append(f"<h2>{html.escape(str(result.attention['candidate']))} alone (the attention_policy evidence)</h2>")
        for case in result.attention["cases"]:
            rows = {"seed": case["request"]["seed"], "verdict": case["verdict"], "speed-up (CI95)": speedup_text(case)}
            body.append(Table(rows | {"reason": case["reason"]}).html())
    return page(title, body)


def registry_entry(result: Calibration | Stack, evidence: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The `attention_policy` registry entry a calibrated result earns, with the qualification record it rests on
    (to be written at `evidence`), or None. Earned only by a "calibrated" result (qualified on a GPU) whose config
    holds one sparse-attention plugin the policy can route, with a qualified record of exactly `{plugin: options}`
    against stock: the confirmation itself when the config is that alone, else `result.attention` (the member
    qualified alone); and only at the one video size that record ran."""
    member = attention_member(result)
    if result.status != "calibrated" or member is None:
        return None
    plugin, options = member
    record = result.confirmation if result.config == {plugin: options} else result.attention
    if record is None or record["verdict"] != "qualified":
        return None
    sizes = {n for case in record["cases"] for n in case["receipts"][plugin]["notes"]["video_tokens"]}
    if len(sizes) != 1:
        return None
    entry = {
        "family": result.scope["family"],
        "device": result.scope["device"]["name"],
        "model_key": result.scope["model_key"],
        "video_tokens": sizes.pop(),
        "plugin": plugin,
        "options": options,
        "evidence": evidence,
    }
    return entry, record


def write(result: Calibration | Stack, out: str | Path) -> tuple[Path, Path]:
    """`<kind>.json` and `<kind>.html` in `out`, written as one set (both or neither). A calibrated sparse-attention
    setting (`registry_entry`) also gets `qualification.json` (the record it rests on) and
    `attention_registry.json`, which `attention_policy` takes as `registry` (the evidence path in it is absolute:
    the folder's, as written)."""
    kind = "calibration" if isinstance(result, Calibration) else "stack"
    files = {f"{kind}.json": record_bytes(result.to_record()), f"{kind}.html": render(result).encode()}
    evidence = str((Path(out) / "qualification.json").resolve())
    earned = registry_entry(result, evidence)
    if earned is not None:
        entry, record = earned
        files["qualification.json"] = record_bytes(record)
        files["attention_registry.json"] = record_bytes({"version": 1, "entries": [entry]})
    paths = write_set(out, files)
    return paths[f"{kind}.json"], paths[f"{kind}.html"]
