"""Issue 22's GPU bar: calibrate `PLUGINS` (`CALIBRATE_WAN_PLUGINS`, a comma list of calibratable plugins; default
block_sparse,easycache) to the default budget and stack them at the Wan2.1-1.3B shape (480x832,
81 frames, 16 steps, CFG 5; random weights, bf16; quality against the dense output of the same model), then the
confirmed stack's whole-request speed-up against stock, A/B/A over `--rounds` on each test seed.

The suite is data_manifests/wan-1.3b-480p.json (calibration seeds 11/12, test seeds 42/43). Underneath: the
`exact-fast` profile, less any member that touches what a stacked plugin replaces (flash4_attention and
block_sparse are both the attention backend). The search at this size outlasts one device call, so it runs in
chunks: `--max-seconds S` stops it at a step boundary (a tried knob value, or one test seed's confirmation) and
raises `Unfinished`; its partial record stays in `<out>/calibrate-wan/calibrate.partial.json`, and the same command
with that file in place continues it (`workbench.evidence.resume`). When the stack is confirmed the envelope is
written, with the stack's record and report (`stack.json`, `stack.html`) beside the partial record's place.

`--smoke`: tiny-wan on the CPU at 5 frames of 16x16, 6 steps, one calibration and one test seed, nothing
underneath (exact-fast's Triton kernels would run in the interpreter), with a budget loose enough to reach the
confirmation: checks the path, not the speed or the quality.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.envelope import Context, Measurement, Unfinished
from benchmarks.workloads import exact_fast, open_wan
from workbench.accelerations import REGISTRY
from workbench.evidence.calibrate import Stack, calibratable, stack, write
from workbench.evidence.manifest import load_manifest
from workbench.evidence.resume import Partial, partial_path
from workbench.quality import Budget

NAME = "calibrate-wan"
PLUGINS = ["block_sparse", "easycache"]  # CALIBRATE_WAN_PLUGINS overrides
WHAT = "issue 22: calibrate + stack {plugins} to the default budget, Wan2.1-1.3B 16 steps"  # a run's: its plugins
SUMMARY = WHAT.format(plugins=f"CALIBRATE_WAN_PLUGINS (default {','.join(PLUGINS)})")
GPUS = 1
STOPS_AT_MAX_SECONDS = True  # reads --max-seconds (benchmarks/__main__.py)
SETTINGS = ("CALIBRATE_WAN_PLUGINS",)  # environment it reads (the record names those set)
# each stacked plugin's fixed options: selective_fp8 through the fused row-wise path (torchao's eager quantization
# costs about six torch passes per activation, as much as its FP8 GEMMs save on the H3 forward), its groups=N knob
# adding the groups in the order of the time their FP8 GEMMs save on this GPU (measured at install)
OPTIONS = {"selective_fp8": {"path": "fused", "order": "measured"}}
SUITE = Path(__file__).resolve().parents[2] / "data_manifests" / "wan-1.3b-480p.json"
SMOKE_SIZE = {"frames": 5, "height": 16, "width": 16, "steps": 6}
SMOKE_BUDGET = Budget(latent_rel_l2=0.3, psnr_db=None, min_ssim=None)


def run(context: Context) -> Measurement:
    started = time.perf_counter()
    if context.out is None:
        raise ValueError(f"{NAME}: needs the harness's --out (the folder its partial record is kept in)")
    folder = context.out / NAME
    plugins = plugins_from_environment()
    notes: list[str] = []
    session = open_wan(context.smoke, context.device)
    suite = load_manifest(SUITE, allow_other_model=True)
    calibration = [_request(case.to_request(), context.smoke) for case in suite.calibration]
    test = [_request(case.to_request(), context.smoke) for case in suite.test]
    if context.smoke:
        calibration, test = calibration[:1], test[:1]
    base = {} if context.smoke else _base(exact_fast("wan", context.device, notes, session.model), plugins, notes)
    base = _started_with(folder, base, notes)
    budget = SMOKE_BUDGET if context.smoke else Budget()
    limit = None if context.max_seconds is None else max(0.0, context.max_seconds - (time.perf_counter() - started))
    options = {plugin: OPTIONS[plugin] for plugin in plugins if plugin in OPTIONS}  # {} by default, as recorded
    result = stack(
        session, calibration, test, plugins, budget, base=base, options=options, rounds=context.rounds, resume=folder,
        max_seconds=limit, progress=not context.smoke,
    )  # fmt: skip
    if isinstance(result, Partial):
        raise Unfinished(f"{result.reason}. Partial record: {result.path}; the same command continues it")
    steps = json.loads(partial_path(folder).read_text())["steps"]
    record, report = write(result, folder)
    partial_path(folder).unlink()  # the stack's record holds every point; the envelope, every process's count
    notes += _notes(result, steps, record, report)
    if context.smoke:
        notes.append(
            "Smoke: tiny-wan on the CPU, 5 frames of 16x16, 6 steps, seeds 11 and 42, no base, loose budget: no "
            "speed or quality claim."
        )
    shape = {"model": session.model.name, "dtype": "bfloat16", "request": session.resolve(test[0]).to_dict()}
    shape |= {"plugins": plugins, "base": base, "budget": budget.to_dict(), "margin": result.margin}
    shape |= {"calibration_seeds": [r.seed for r in calibration], "test_seeds": [r.seed for r in test]}
    arms, ratios = _arms(result)
    return Measurement(WHAT.format(plugins=" and ".join(plugins)), shape, arms, ratios, notes)


def _request(request: Any, smoke: bool) -> Any:
    return dataclasses.replace(request, **SMOKE_SIZE) if smoke else request


def plugins_from_environment() -> list[str]:
    """The plugins stacked: CALIBRATE_WAN_PLUGINS (a comma list) or PLUGINS; ValueError naming the variable for an
    unknown plugin, one without a knob, or a repeat. A partial record made with other plugins is refused on resume."""
    text = os.environ.get("CALIBRATE_WAN_PLUGINS", ",".join(PLUGINS))
    plugins = [name.strip() for name in text.split(",") if name.strip()]
    if not plugins or len(set(plugins)) < len(plugins) or set(plugins) - set(calibratable()):
        raise ValueError(
            f"CALIBRATE_WAN_PLUGINS: {text!r}; allowed: a comma list of {', '.join(calibratable())}, each once"
        )
    return plugins


def _started_with(folder: Path, base: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The base a partial record in `folder` was started with (a resumed run keeps it, also when the exact-fast profile
    changed since), else `base`."""
    path = partial_path(folder)
    if not path.exists():
        return base
    recorded = json.loads(path.read_text())["run"]["base"]
    if recorded != base:
        notes.append(
            f"Resumed with the base the run started with, {sorted(recorded)}; the exact-fast profile now gives "
            f"{sorted(base)}."
        )
    return recorded


def _base(config: dict[str, Any], plugins: list[str], notes: list[str]) -> dict[str, Any]:
    """`config` less the plugins that touch a resource a stacked plugin touches (they could not be installed
    together)."""
    taken = {resource for plugin in plugins for resource in REGISTRY[plugin].touches}
    dropped = [name for name in config if taken & set(REGISTRY[name].touches)]
    for name in dropped:
        notes.append(f"exact-fast's {name} is left out of the base: it touches what {plugins} replace.")
    return {name: options for name, options in config.items() if name not in dropped}


def _arms(result: Stack) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stock and the confirmed stack: seconds of every timed request of the confirmation, and one ratio per test
    seed (its A/B/A CI95)."""
    if result.confirmation is None:
        return {"within-budget": {"config": None, "status": result.status, "reason": result.reason}}, {}
    cases = result.confirmation["cases"]
    arms = {}
    for arm, key in (("stock", "baseline_seconds"), ("within-budget", "candidate_seconds")):
        seconds = [s for case in cases for s in case[key]]
        arms[arm] = {"seconds": seconds, "median_s": statistics.median(seconds)}
    arms["stock"]["config"] = {}
    arms["within-budget"] |= {"config": result.config, "status": result.status, "reason": result.reason}
    arms["within-budget"]["receipts"] = cases[0]["receipts"]
    ratios = {f"stock/within-budget seed {case['request']['seed']}": case["speedup"] for case in cases}
    return arms, ratios


def _notes(result: Stack, steps: list[dict[str, Any]], record: Path, report: Path) -> list[str]:
    """What each plugin contributed, which budget term bound each search and the confirmation, and how many
    processes (device calls) the steps took."""
    sessions = sorted({step["session"] for step in steps})
    notes = [
        f"{len(steps)} steps ({sum(s['kind'] == 'point' for s in steps)} tried values, "
        f"{sum(s['kind'] == 'confirmation' for s in steps)} confirmations) over {len(sessions)} process(es); "
        f"{sum(s['seconds'] for s in steps):.0f} s in steps. Record {record.name}, report {report.name}.",
        f"Stack: {result.status}: {result.reason}.",
    ]
    base = result.base_point
    if base is not None and math.isfinite(base.speedup):
        notes.append(f"Base alone: {base.speedup:.3f}x stock over the calibration seeds (one run: indicative).")
    for member in result.members:
        knee = member.knee_point
        notes.append(
            f"Added {member.plugin}.{member.knob.option}={member.knee:.4g}: {knee.speedup:.3f}x stock on the stack "
            f"(indicative), spends {knee.spent:.3f}; {_bound(member)}."
        )
    for plugin, why in result.left_out.items():
        notes.append(f"Left out {plugin}: {why}.")
    if result.confirmation is not None:
        for case in result.confirmation["cases"]:
            shares = _shares(result.budget, case["quality"])
            worst = max(shares, key=shares.get) if shares else None
            shown = ", ".join(f"{k} {v:.3f}" for k, v in shares.items())
            notes.append(
                f"Test seed {case['request']['seed']}: {case['verdict']}; budget shares {shown}"
                + (f" (bound by {worst})." if worst else ".")
            )
    return notes


def _bound(member: Any) -> str:
    """Which budget term stopped a knob's search: the cliff's failures, or that the top of the range was inside."""
    if member.cliff is None:
        return f"{member.knob.option}'s whole range stayed inside the margin (not bound)"
    cliff = next(p for p in member.points if p.value == member.cliff)
    terms = sorted({failure.split(":")[0] for failure in cliff.failures})
    return f"cliff at {member.cliff:.4g} ({', '.join(terms) or f'spends {cliff.spent:.3f}, past the margin'})"


def _shares(budget: Budget, quality: dict[str, Any]) -> dict[str, float]:
    """Each set limit's share of the budget on one confirmation case (1 = at the limit)."""
    out = {}
    for name, limit in budget.to_dict().items():
        value = quality.get(name)
        if limit is None or value is None:
            continue
        alone = Budget(**{field: None for field in budget.to_dict()} | {name: limit})
        out[name] = alone.spent({name: float(value)})
    return out
