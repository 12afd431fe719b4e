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
"""

from __future__ import annotations

import functools
import statistics
import time
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
from workbench.request import Request
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
    """`rounds` if it is an int of interleaved A/B/A rounds in [MIN_ROUNDS, MAX_ROUNDS]; else ValueError naming it."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not MIN_ROUNDS <= rounds <= MAX_ROUNDS:
        raise ValueError(f"rounds: {rounds!r}; allowed: an int of interleaved rounds in [{MIN_ROUNDS}, {MAX_ROUNDS}]")
    return rounds


def check_requests(session: Session | LoadedModel, requests: list[Request], where: str = "requests") -> list[Request]:
    """Every one of `requests` resolved against `session`'s model (`Session.resolve`) before any runs, so a request
    the model cannot take (frames its VAE refuses, a mode it lacks) is refused before the ones ahead of it have
    run. ValueError naming it as `{where}[i]` (`requests[1]: frames: 10 is not accepted ...`), or for no requests.
    `session` may be a `LoadedModel` instead, such as `models.preview`'s (no weight loaded): the `--ray` driver
    checks the cases so before any worker starts. Returns the resolved requests."""
    if not requests:
        raise ValueError(f"{where}: at least one request is required")
    resolved = []
    for index, request in enumerate(requests):
        try:
            resolved.append(session.resolve(request))
        except ValueError as error:
            raise ValueError(f"{where}[{index}]: {error}") from None
    return resolved


def validate(session: Session, configs: list[dict[str, Any]], rounds: int, requests: list[Request]) -> None:
    """Refuse, before any run, too few rounds, no requests, a request the model cannot take (`check_requests`), or a
    configuration `session` cannot install (ValueError naming it; RuntimeError when this device cannot run it)."""
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
    returns the record and each case's pilots. Every request and both arms are checked against the model and device
    before the first runs (`validate`). `desc` names the progress bar (a sweep says which of its values this is).

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
    validate(session, [baseline, candidate], rounds, requests)
    budget = budget or default_budget(session)
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
    through all its configurations. Raises `resume.Paused` at a case boundary past the journal's time limit."""
    from workbench.evidence.resume import Paused  # it imports this module

    cases: list[dict[str, Any]] = []
    pilots: list[tuple[Result, Result] | None] = []
    runs, ran = 2 * rounds + 3, []  # ran: this case's pilots (run now, or as the journal kept them)
    with progress_bar(total=len(requests) * runs, desc=desc, enabled=progress) as bar:

        def run(request: Request) -> dict[str, Any]:
            case, pair = _qualify_one(session, request, baseline, candidate, rounds, budget, bar)
            ran.append(pair)
            if journal is not None:
                journal.keep(pair)  # before the case is recorded: a recorded case has its pilots
            return case

        try:
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
        except Paused:
            session.accelerate({})  # stopped at a case boundary: the session left as a finished run leaves it
            raise
    session.accelerate({})
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
