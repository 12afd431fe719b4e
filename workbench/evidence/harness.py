"""A/B/A qualification in one persistent session (seeds 001 "Reproducing a comparison", 004 "Validation").

For each request: install the baseline, warm it and keep its pilot output; install the candidate, warm
it and keep its pilot; then time A, B, A, B, ..., A. Each candidate run is paired with the mean of
the stock runs either side of it, so slow drift cancels. Installation and the warm-up (JIT, autotune)
are reported apart from the timed runs. Every timed output must equal its arm's pilot, or timing says
nothing about the output that was judged.

Resumable (`resume=` a folder): after every finished case the partial record `qualify.partial.json` there is
rewritten atomically (`workbench.evidence.resume.Journal`, one step per case), so an interrupted run loses at most
the case in flight; the same call again runs only the cases not recorded and returns the record an uninterrupted
call returns. A case is the unit because its A/B/A is timed whole inside one process: seconds of two processes
are never compared. Each case's pilot outputs are kept beside the record (`qualify.partial.pilots/`), so a case read
back from it has its pilots too. With `max_seconds` a run stops cleanly at a case boundary (`resume.Journal`).

Every run installs its arms on the caller's session; on every exit (a record, an error, an interrupt, a stop at
`max_seconds`) the session holds again the accelerations it held when the call began (`accelerations_kept`).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from workbench import environment
from workbench.accelerations import REGISTRY, install
from workbench.evidence.stats import RatioCI, paired_ratio_ci, verdict
from workbench.models.loaded import LoadedModel
from workbench.progress import progress as progress_bar
from workbench.quality import Budget, compare
from workbench.quality.budget import default_for
from workbench.request import Request, flag, integer, shown
from workbench.result import Result
from workbench.session import Session

if TYPE_CHECKING:
    from workbench.evidence.resume import Journal, Partial  # it imports this module

MIN_ROUNDS = 3
MAX_ROUNDS = 100  # each round is two whole requests per case: more is a typo, not a measurement plan
# The weakest case verdict is the suite's verdict.
SUITE_ORDER = ("not_executed", "rejected_quality", "measured_quality_tradeoff", "no_speed_claim", "qualified")


def default_budget(session: Session) -> Budget:
    """`quality.budget.default_for` the session's model: the audio limits too when it makes sound."""
    return default_for(session.model.family.has_audio)


def check_rounds(rounds: object) -> int:
    """`rounds` as a Python int (a numpy integer taken as the int it holds) if it is an integer of interleaved A/B/A
    rounds in [MIN_ROUNDS, MAX_ROUNDS]; else ValueError naming it."""
    try:
        return integer("rounds", rounds, MIN_ROUNDS, MAX_ROUNDS)
    except ValueError:
        allowed = f"an int of interleaved rounds in [{MIN_ROUNDS}, {MAX_ROUNDS}]"
        raise ValueError(f"rounds: {rounds!r}; allowed: {allowed}") from None


def check_budget(budget: object, default: Callable[[], Budget]) -> Budget:
    """`budget`, or `default()` for None (`default_budget` of the session's model); anything else is a ValueError
    naming it (a dict of limits too: `Budget.from_dict` makes a Budget of one)."""
    if budget is None:
        return default()
    if not isinstance(budget, Budget):
        raise ValueError(
            f"budget: expected a workbench.quality.Budget (or None for the model's default), got "
            f"{type(budget).__name__} {shown(budget)}"
        )
    return budget


def check_common(session: Session, rounds: object, budget: object, progress: object) -> tuple[int, Budget, bool]:
    """The arguments every evidence function (qualify, sweep, search, calibrate, stack) shares, checked before any
    run: `rounds` (`check_rounds`), the budget (`check_budget`: the model's default for None) and `progress`
    (`request.flag`, as `Session.generate` checks it), returned as plain Python values."""
    return check_rounds(rounds), check_budget(budget, lambda: default_budget(session)), flag("progress", progress)


@contextlib.contextmanager
def accelerations_kept(session: Session) -> Iterator[None]:
    """Run the body, then install on `session` the accelerations it held on entry, on every exit: success, an error,
    an interrupt (Ctrl-C, `Session.stop`) or a stop at a step boundary (`resume.Paused`). An evidence run installs
    its arms on the caller's session; a candidate left installed would make the caller's later requests silently
    approximate."""
    before = session.accelerations
    try:
        yield
    finally:
        if session.accelerations != before:  # a run read back whole from a journal installed nothing
            session.accelerate(before)


def check_requests(session: Session | LoadedModel, requests: list[Request], where: str = "requests") -> list[Request]:
    """Every one of `requests` resolved against `session`'s model (`Session.resolve`) before any runs, so a request
    the model cannot take (frames its VAE refuses, a mode it lacks) is refused before the ones ahead of it have
    run. ValueError naming it as `{where}[i]` (`requests[1]: frames: 10 is not accepted ...`), for no requests, or
    for `requests` not a list (or tuple) of them: a single Request too.
    `session` may be a `LoadedModel` instead, such as `models.preview`'s (no weight loaded): the `--ray` driver
    checks the cases so before any worker starts. Returns the resolved requests."""
    if not isinstance(requests, list | tuple):
        hint = " (a single request goes in a list: [request])" if isinstance(requests, Request) else ""
        raise ValueError(f"{where}: expected a list of workbench.Request, got {type(requests).__name__}{hint}")
    if not requests:
        raise ValueError(f"{where}: at least one request is required")
    resolved = []
    for index, request in enumerate(requests):
        try:
            resolved.append(session.resolve(request))
        except ValueError as error:
            raise ValueError(f"{where}[{index}]: {error}") from None
    return resolved


def validate(
    session: Session, configs: list[dict[str, Any]], rounds: int | None = None, requests: list[Request] | None = None
) -> None:
    """Refuse, before any run, too few rounds, no requests, a request the model cannot take (`check_requests`), or a
    configuration `session` cannot install (ValueError naming it; RuntimeError when this device cannot run it).
    Without `requests` (a batch, whose requests each fail only their own cell), the configurations alone."""
    if requests is not None:
        check_rounds(rounds)
        check_requests(session, requests)
    for config in configs:
        install.validate(REGISTRY, session.model, config, session.device)


def qualify(
    session: Session,
    requests: list[Request],
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    rounds: int = MIN_ROUNDS,
    budget: Budget | None = None,
    progress: bool = True,
    desc: str = "qualify runs",
    resume: str | Path | None = None,
    identity: dict[str, Any] | None = None,
    max_seconds: float | None = None,
    started: float | None = None,
) -> tuple[dict[str, Any] | Partial, list[tuple[Result, Result] | None]]:
    """Qualify `candidate` against `baseline` on `requests` under `budget` (default: `default_budget(session)`);
    returns the record and each case's pilots. `rounds`, `budget` and `progress` (`check_common`), every request and
    both arms are checked against the model and device before the first runs (`validate`). `desc` names the progress
    bar (a sweep says which of its values this is). The session's accelerations are as they were when it returns or
    raises (`accelerations_kept`).

    `resume`: a folder for the partial record (`qualify.partial.json`), read when there and rewritten after every
    finished case; the cases it holds are not run again, and their pilots are read back from
    `qualify.partial.pilots/` (frames, audio and fps only; None where not found). The record returned is then an
    uninterrupted run's, its environment fields this process's. `max_seconds` (with `resume`; counted from
    `started`, a `time.perf_counter()` reading, default now): a new case starts only while it is expected to end
    within it (`resume.Journal`), else the call returns `(Partial, [])`, the same call continuing it; every call
    runs at least one new case. `identity`: more fields the partial record must agree on (the CLI's: the suite). A
    partial record of other arguments (`resume.run_key`: the configurations, rounds, budget, requests, `identity`,
    model, dtype, device) is a ValueError naming each field that differs, its recorded and its given value. The
    caller removes the partial record and its pilots once the final record is published (`resume.remove_partial`)."""
    rounds, budget, progress = check_common(session, rounds, budget, progress)
    validate(session, [baseline, candidate], rounds, requests)
    from workbench.evidence.resume import Paused, case_journal  # it imports this module

    arguments = {"baseline": baseline, "candidate": candidate, "rounds": rounds}
    limit = {"max_seconds": max_seconds, "started": started}
    journal = case_journal(resume, "qualification", session, budget, requests, arguments, identity, **limit)
    try:
        return qualify_cases(session, requests, baseline, candidate, rounds, budget, progress, desc, journal)
    except Paused as paused:
        return paused.partial, []


def qualify_cases(
    session: Session,
    requests: list[Request],
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    rounds: int,
    budget: Budget,
    progress: bool,
    desc: str,
    journal: Journal | None = None,
) -> tuple[dict[str, Any], list[tuple[Result, Result] | None]]:
    """`qualify` of checked arguments, each case a step of `journal` (`workbench.evidence.resume.Journal`, keyed by
    the candidate and the request) when one is given: a case it holds is read back (its pilots as the journal kept
    them, else None), any other is run and recorded at once with its pilots. A sweep or search passes one journal
    through all its configurations. Raises `resume.Paused` at a case boundary past the journal's time limit. On every
    exit the session holds the accelerations it held on entry (`accelerations_kept`)."""

    cases: list[dict[str, Any]] = []
    pilots: list[tuple[Result, Result] | None] = []
    runs, ran = 2 * rounds + 3, []  # ran: this case's pilots (run now, or as the journal kept them)
    with accelerations_kept(session), progress_bar(total=len(requests) * runs, desc=desc, enabled=progress) as bar:

        def run(request: Request) -> dict[str, Any]:
            case, pair = _qualify_one(session, request, baseline, candidate, rounds, budget, bar)
            ran.append(pair)
            if journal is not None:
                journal.keep(pair)  # before the case is recorded: a recorded case has its pilots
            return case

        for request in requests:
            ran.clear()
            if journal is None:
                case = run(request)
            else:
                key = {"candidate": candidate, "request": request.to_dict()}
                case = journal.step("case", key, functools.partial(run, request), 0.0)
                if not ran:
                    bar.update(runs)  # recorded by an earlier process
                    ran.append(journal.kept(journal.cursor - 1))
            cases.append(case)
            pilots.append(ran[0] if ran else None)
    overall = min((c["verdict"] for c in cases), key=SUITE_ORDER.index)
    record = {
        "kind": "qualification",
        "verdict": overall,
        "cases": cases,
        "baseline": baseline,
        "candidate": candidate,
        "rounds": rounds,
        "budget": budget.to_dict(),
        "model": session.model.name,
        "dtype": str(session.dtype).removeprefix("torch."),
        "init_seconds": session.init_seconds,
        **environment.describe(session.device),
    }
    return record, pilots


def _qualify_one(
    session: Session, request: Request, baseline: dict, candidate: dict, rounds: int, budget: Budget, bar: Any
) -> tuple[dict[str, Any], tuple[Result, Result]]:
    arms = {"baseline": baseline, "candidate": candidate}
    install_seconds: dict[str, list[float]] = {"baseline": [], "candidate": []}

    def run(arm: str) -> Result:
        start = time.perf_counter()
        session.accelerate(arms[arm])
        install_seconds[arm].append(time.perf_counter() - start)
        result = session.generate(request, progress=False)
        if not result.finite:  # a session may return one when told to (generate's allow_non_finite)
            raise RuntimeError(
                f"qualify: the {arm} arm's output is not finite ({'; '.join(result.metadata.get('non_finite', []))}); "
                "evidence is never taken from NaN/inf outputs"
            )
        bar.update(1)
        return result

    pilot_a, pilot_b = run("baseline"), run("candidate")  # warm-ups: JIT and first-use cost stay here
    timed_a = [run("baseline")]
    timed_b = []
    for _ in range(rounds):
        timed_b.append(run("candidate"))
        timed_a.append(run("baseline"))
    paired_a = [(timed_a[i].timings["total"] + timed_a[i + 1].timings["total"]) / 2 for i in range(rounds)]
    totals_b = [r.timings["total"] for r in timed_b]
    device_timed = session.device.type == "cuda"
    ci = paired_ratio_ci(paired_a, totals_b)
    stage_ratios = _stage_ratios(timed_a, timed_b)
    comparison = compare(pilot_a, pilot_b, budget)
    receipts = [r.receipts for r in [pilot_b, *timed_b]]
    idle = sorted({name for receipt in receipts for name, x in receipt.items() if not x.get("executed")})
    executed = bool(candidate) and not idle
    matches = {
        "baseline": all(_same(pilot_a, r) for r in timed_a),
        "candidate": all(_same(pilot_b, r) for r in timed_b),
    }
    gpu_clean = device_timed and all(_clean(r) for r in [*timed_a, *timed_b])
    word, reason = verdict(
        within_budget=comparison.within_budget and all(matches.values()),
        finite=comparison.finite,
        executed=executed,
        ci=ci if all(matches.values()) else None,
        device_type=session.device.type,
        gpu_clean=gpu_clean,
    )
    if word == "not_executed" and idle != sorted(pilot_b.receipts):  # some members did work: name the idle ones
        reason = f"the receipts show {idle} did no work (every member must run for a claim about the set)"
    if not all(matches.values()):
        reason += f"; timed outputs differ from their pilot: {matches}"
    case = {
        "request": request.to_dict(),
        "verdict": word,
        "reason": reason,
        "speedup": ci.to_dict(),
        "stage_speedups": stage_ratios,
        "baseline_seconds": [r.timings["total"] for r in timed_a],
        "candidate_seconds": totals_b,
        "warmup_seconds": {"baseline": pilot_a.timings["total"], "candidate": pilot_b.timings["total"]},
        "install_seconds": {arm: statistics.median(v) for arm, v in install_seconds.items()},
        "timed_outputs_match_pilot": matches,
        "gpu_clean": gpu_clean,
        "nvml": [r.metadata.get("nvml", {}) for r in [*timed_a, *timed_b]],
        "quality": comparison.to_dict(),
        "receipts": pilot_b.receipts,
        "exact": pilot_b.exact,
    }
    return case, (pilot_a, pilot_b)


def _stage_ratios(timed_a: list[Result], timed_b: list[Result]) -> dict[str, Any]:
    out = {}
    for stage in timed_b[0].timings:
        try:
            a = [(timed_a[i].timings[stage] + timed_a[i + 1].timings[stage]) / 2 for i in range(len(timed_b))]
            ratio: RatioCI = paired_ratio_ci(a, [r.timings[stage] for r in timed_b])
        except (KeyError, ValueError):
            continue  # a stage absent from one arm or with zero time has no ratio
        out[stage] = {"median": ratio.median, "low": ratio.low, "high": ratio.high}
    return out


def _same(a: Result, b: Result) -> bool:
    same = np.array_equal(a.frames, b.frames)
    if a.audio is not None or b.audio is not None:
        same = same and a.audio is not None and b.audio is not None and np.array_equal(a.audio, b.audio)
    if a.latents is not None and b.latents is not None:
        same = same and torch.equal(a.latents, b.latents)
    return same


def _clean(result: Result) -> bool:
    """No throttling and no other process on the GPU while this run was timed."""
    nvml = result.metadata.get("nvml") or {}
    return bool(nvml) and nvml.get("throttled_samples", 1) == 0 and nvml.get("max_processes", 2) <= 1
