"""Issue 24's Wan2.2 bar at the Wan2.2-T2V-A14B shape (`wan.random_a14b`: two experts of 14.3B, 40 layers, dim 5120,
both resident, ~57 GB in bf16; random weights; 480x832, 81 frames; CFG 4; UniPC with shift 12 and the boundary at
0.875, the T2V-A14B defaults), in two parts, each measured whole inside one process:

- `speed`: whole requests through `Session.generate`, stock against the `exact-fast` profile: one untimed pilot per
  arm, then A/B/A rounds (`request_wan.compare_requests`): total and per-stage medians, peak memory per stage, the
  pilots' receipts and latent relative L2. At 40 steps a request is 80 forwards of ~1.7 PFLOP, minutes each on one
  GPU, so an A/B/A of whole 40-step requests would take the better part of an hour: the part runs `WAN22_STEPS` steps
  (default 4). The boundary
  stays the same noise level (timestep 875 of 1000) on the same shifted schedule, so the high-noise expert keeps
  about the same share of the steps, up to the coarser discretisation; `shape.experts` gives the split at the
  measured steps and at 40 (4 steps: 3 high + 1 low; 40 steps: 26 + 14). The ratio is that of a reduced-steps
  request: text encoding and decode weigh more in it than in a 40-step one (the per-stage medians give the denoise
  ratio alone).
- `cache`, once per threshold of `WAN22_THRESHOLDS` (default 0.3) and mode: easycache at that threshold, per expert
  (`per_expert=True`: warm-up and final dense steps counted within each expert's run) and boundary-unaware
  (`per_expert=False`: counted over the whole request), one request each at `WAN22_CACHE_STEPS` steps (default 12:
  8 high + 4 low, about the 40-step share), against the dense (stock) request of the same model and steps made in the
  same process (once per process, before its first cache part): latent relative L2, PSNR, minimum-frame SSIM and the
  default budget's verdict (`workbench.quality.compare`), each expert's computed/reused decisions per CFG branch, the
  request steps each skipped, and the request seconds (one run each: indicative, no CI). Each mode is its own part, so
  a run with `--max-seconds` can stop and resume between them. Both arms keep the cache state per expert (one hook per denoiser); they differ in which steps the options
  force dense, so this does not reproduce a cache that carries one expert's state into the other's steps.

`WAN22_PARTS` (default `speed,cache`) picks the parts: `cache` alone runs the cache parts without the speed part.

The parts run in chunks across device calls: after each part (a step of `workbench.evidence.resume.Journal`) the
partial record `<out>/request-wan22/calibrate.partial.json` is rewritten; with `--max-seconds S` the run stops before a
part that would end past S (its time estimated from the recorded stock request) and raises `Unfinished`; the same
command with that record in place replays the finished parts and runs the rest, then writes the envelope and removes
the record. A record made with other settings is refused. Ratios and speed-ups are only ever formed inside one part,
so inside one process; the dense digest of each cache part is kept, and a note says if two processes' dense outputs
differed. `--smoke`: tiny-wan22 on the CPU at 5 frames of 16x16, 1 step for speed (the high-noise expert only:
exact-fast's Triton kernels run in the interpreter), 8 for the cache part (3 high + 5 low).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from contextlib import nullcontext
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement, journal_parts
from benchmarks.scenarios.request_wan import Requests, compare_requests, stage_notes
from benchmarks.workloads import exact_fast, wan_request
from workbench import Session
from workbench.evidence.resume import Journal, digest, parts_line
from workbench.models import experts, wan
from workbench.quality import compare

NAME = "request-wan22"
SUMMARY = (
    "issue 24: Wan2.2-A14B shape (2 x 14.3B experts) 480x832x81 CFG 4: stock vs exact-fast at WAN22_STEPS steps; "
    "easycache per expert vs boundary-unaware against dense"
)
GPUS = 1
STOPS_AT_MAX_SECONDS = True  # reads --max-seconds (benchmarks/__main__.py)
# the environment it reads (the record names those set)
SETTINGS = ("WAN22_STEPS", "WAN22_CACHE_STEPS", "WAN22_THRESHOLDS", "WAN22_PARTS")
STEPS, CACHE_STEPS, THRESHOLDS = 4, 12, (0.3,)  # WAN22_STEPS, WAN22_CACHE_STEPS, WAN22_THRESHOLDS
PARTS = ("speed", "cache")  # WAN22_PARTS: a comma list of these
MODES = {"per-expert": True, "boundary-unaware": False}  # cache part mode: easycache's per_expert
SMOKE_STEPS, SMOKE_CACHE_STEPS = 1, 8
CACHE = "easycache"
GUIDANCE = 4.0
COMPARE_SECONDS = 30.0  # two quality comparisons at 480x832x81 on the host (SSIM of 81 frames each), estimated


def run(context: Context) -> Measurement:
    started = time.perf_counter()
    smoke, device = context.smoke, context.device
    steps, cache_steps, thresholds = settings(smoke)
    parts = chosen_parts()
    building = time.perf_counter()
    if smoke:
        session = Session.open("tiny-wan22", device=str(device), dtype="bfloat16")
    else:
        session = Session.open(wan.random_a14b(0, device, torch.bfloat16), device=str(device), dtype="bfloat16")
    build = time.perf_counter() - building
    speed_request, cache_request = (_request(n, smoke) for n in (steps, cache_steps))
    folder = None if context.out is None else context.out / NAME
    run_key = {"model": session.model.name, "dtype": "bfloat16", "device": device.type, "rounds": context.rounds,
               "speed": session.resolve(speed_request).to_dict(), "cache": session.resolve(cache_request).to_dict(),
               "plugin": CACHE, "thresholds": list(thresholds), "parts": list(parts)}  # fmt: skip
    limit = None if context.max_seconds is None else max(0.0, context.max_seconds - (time.perf_counter() - started))
    cache_parts = [(t, mode) for t in thresholds for mode in MODES] if "cache" in parts else []
    journal = Journal(folder, NAME, run_key, at_most=("speed" in parts) + len(cache_parts), max_seconds=limit)
    caches = _Caches(session, cache_request)
    with journal_parts(folder):
        speed = None
        if "speed" in parts:
            speed = journal.step("speed", {"steps": steps}, lambda: _speed(session, speed_request, context), 0.0)
        done = []
        for threshold, mode in cache_parts:
            key = {"threshold": threshold, "steps": cache_steps, "mode": mode}
            expected = caches.expected(speed, steps)
            done.append(journal.step("cache", key, lambda t=threshold, m=mode: caches.measure(t, m), expected))
    arms, notes = dict(speed["arms"]) if speed else {}, list(speed["notes"]) if speed else []
    for part in done:
        arms |= part["arms"]
        notes += part["notes"]
    notes += [_compared(arms, threshold, session.model, cache_steps) for threshold in thresholds if cache_parts]
    digests = {str(part["dense_digest"]) for part in done}
    if len(digests) > 1:
        notes.append("The dense cache-part requests of different processes differ bit for bit: compare parts "
                     "measured in different processes with care.")  # fmt: skip
    elif len(done) > 1:
        notes.append("Every cache part's dense request (one per process) gave the same latents, frames and audio.")
    notes.append(parts_line(journal.steps, lambda s: f"{s['kind']} {json.dumps(s['key'])}"))
    notes.append(
        "Times: the session's request total (CUDA events per stage); pilots untimed. Random weights: quality figures "
        "compare outputs of the same noise, not image quality."
        if not smoke
        else "Smoke: tiny-wan22 on the CPU, 5 frames at 16x16, 1 and 8 steps; the numbers say nothing about speed."
    )
    request = speed_request if speed else cache_request
    return Measurement(SUMMARY, _shape(session, request, cache_steps, thresholds, build), arms,
                       speed["ratios"] if speed else {}, notes)  # fmt: skip


def settings(smoke: bool) -> tuple[int, int, tuple[float, ...]]:
    """(speed steps, cache steps, thresholds) from WAN22_STEPS, WAN22_CACHE_STEPS, WAN22_THRESHOLDS (a comma list);
    ValueError naming the variable. A smoke run uses its own step counts."""

    def count(variable: str, default: int) -> int:
        text = os.environ.get(variable, str(default))
        if not text.isdigit() or not 1 <= int(text) <= 100:
            raise ValueError(f"{variable}: {text!r}; allowed: an integer number of steps from 1 to 100")
        return int(text)

    steps, cache_steps = count("WAN22_STEPS", STEPS), count("WAN22_CACHE_STEPS", CACHE_STEPS)
    text = os.environ.get("WAN22_THRESHOLDS", ",".join(map(str, THRESHOLDS)))
    try:
        thresholds = tuple(float(t) for t in text.split(","))
    except ValueError:
        thresholds = ()
    if not thresholds or not all(0 < t <= 10 for t in thresholds):
        raise ValueError(f"WAN22_THRESHOLDS: {text!r}; allowed: a comma list of easycache thresholds in (0, 10]")
    return (SMOKE_STEPS, SMOKE_CACHE_STEPS, thresholds) if smoke else (steps, cache_steps, thresholds)


def chosen_parts() -> tuple[str, ...]:
    """The parts named by WAN22_PARTS (a comma list of `PARTS`, in that order); ValueError naming the variable."""
    text = os.environ.get("WAN22_PARTS", ",".join(PARTS))
    names = [name.strip() for name in text.split(",")]
    if not names or not set(names) <= set(PARTS) or len(set(names)) != len(names):
        raise ValueError(f"WAN22_PARTS: {text!r}; allowed: a comma list of {', '.join(PARTS)}, each at most once")
    return tuple(name for name in PARTS if name in names)


def _request(steps: int, smoke: bool) -> Any:
    return dataclasses.replace(wan_request(steps, smoke), steps=steps, guidance=GUIDANCE)


def _speed(session: Session, request: Any, context: Context) -> dict[str, Any]:
    """The speed part: pilots and A/B/A rounds of stock and exact-fast whole requests."""
    notes: list[str] = []
    configs = {"stock": {}, "exact-fast": exact_fast("wan", context.device, notes, session.model)}
    rows, ratios = compare_requests(
        Requests(session, request), {name: (config, nullcontext) for name, config in configs.items()}, context.rounds,
        notes,
    )  # fmt: skip
    return {"arms": rows, "ratios": ratios, "notes": notes + stage_notes(rows)}


class _Caches:
    """The cache parts of one process: the dense request is made once, before the first part run here."""

    def __init__(self, session: Session, request: Any):
        self.session, self.request = session, request
        self.requests = Requests(session, request)
        self.dense = None

    def expected(self, speed: dict[str, Any] | None, speed_steps: int) -> float:
        """A cache part's seconds, estimated: its cached request taken as a dense one (this process's dense request,
        else the speed part's stock request with its denoise scaled by the steps), the dense one when not made yet,
        and the quality comparison. 0 when there is nothing to estimate from (the part runs)."""
        if self.dense is not None:
            return self.dense.timings["total"] + COMPARE_SECONDS / 2
        stages = (speed or {}).get("arms", {}).get("stock", {}).get("stages_median_s") or {}
        if "denoise" not in stages:
            return 0.0
        per_request = stages["total"] + stages["denoise"] * (self.request.steps / speed_steps - 1)
        return 2 * per_request + COMPARE_SECONDS / 2

    def measure(self, threshold: float, mode: str) -> dict[str, Any]:
        """One cached request (easycache at `threshold`, `mode` of `MODES`) against this process's dense request."""
        if self.dense is None:
            self.dense = self.requests.generate({})
        schedule = experts.schedule(self.session.model, self.request.steps)
        dense_s = self.dense.timings["total"]
        name = f"{CACHE}={threshold:g} {mode}"
        config = {CACHE: {"threshold": threshold, "per_expert": MODES[mode]}}
        result = self.requests.generate(config)
        receipt = result.receipts[CACHE]
        quality = compare(self.dense, result)
        decisions = _by_expert(receipt.get("notes", {}).get("decisions", {}), schedule)
        seconds = result.timings["total"]
        row = {
            "config": config,
            "latent_rel_l2_vs_dense": quality.latent_rel_l2,
            "psnr_db_vs_dense": quality.psnr_db,
            "min_ssim_vs_dense": quality.min_ssim,
            "within_budget": quality.within_budget,
            "reused_fraction": receipt.get("reused", 0) / max(1, receipt.get("reused", 0) + receipt.get("computed", 0)),
            "median_s": seconds,
            "seconds": [seconds],
            "speedup_vs_dense_one_run": dense_s / seconds,
            "dense_s": dense_s,
            "failures": quality.failures,
            "decisions": decisions,
            "receipt": receipt,
            "stages_s": result.timings,
        }
        said = "; ".join(
            f"{expert} {branch} {d['decisions']} (skipped request steps {d['skipped'] or 'none'})"
            for expert, branches in decisions.items()
            for branch, d in branches.items()
        )
        note = (
            f"{name}: {said}; latent rel-L2 {quality.latent_rel_l2:.4f}, PSNR {quality.psnr_db:.2f} dB vs dense "
            f"of {self.request.steps} steps; {dense_s / seconds:.3f}x the dense request of its process (one run)."
        )
        return {"arms": {name: row}, "notes": [note], "dense_digest": digest(self.dense)}


def _compared(arms: dict[str, Any], threshold: float, model: Any, steps: int) -> str:
    """One sentence: where the two modes' decisions at `threshold` differ (or that one of them did not run)."""
    rows = [arms.get(f"{CACHE}={threshold:g} {mode}") for mode in MODES]
    if None in rows:
        return f"{CACHE}={threshold:g}: only one of the modes ran; nothing to compare."
    differ = _differences(rows[0]["decisions"], rows[1]["decisions"])
    switch = experts.schedule(model, steps).span("transformer_2").start
    if not differ:
        return f"{CACHE}={threshold:g}: both counts made the same decisions at every step."
    return (
        f"{CACHE}={threshold:g}: the boundary-unaware count changes the decisions at request steps {differ} "
        f"(expert switch before step {switch})."
    )


def _by_expert(decisions: dict[str, str], schedule: experts.Schedule) -> dict[str, dict[str, Any]]:
    """{expert: {branch: {"decisions": "CCRC", "skipped": [request steps reused]}}} from the receipt's
    "<expert>/<branch>" decision strings (one letter per call of that expert and branch, in step order)."""
    out: dict[str, dict[str, Any]] = {}
    for key, letters in sorted(decisions.items()):
        expert, branch = key.split("/", 1)
        start = schedule.span(expert).start
        skipped = [start + i for i, letter in enumerate(letters) if letter == "R"]
        out.setdefault(expert, {})[branch] = {"decisions": letters, "skipped": skipped}
    return out


def _differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> list[int]:
    """The request steps where two arms' decisions differ, in any expert and branch."""
    steps = set()
    for expert in a.keys() | b.keys():
        for branch in a.get(expert, {}).keys() | b.get(expert, {}).keys():
            left, right = (x.get(expert, {}).get(branch, {}) for x in (a, b))
            steps |= set(left.get("skipped", [])) ^ set(right.get("skipped", []))
    return sorted(steps)


def _shape(session: Session, request: Any, cache_steps: int, thresholds: tuple, build: float) -> dict[str, Any]:
    pipe = session.model.pipeline
    split = {}
    for steps in (request.steps, cache_steps, 40):
        names = experts.schedule(session.model, steps).experts
        split[str(steps)] = {name: names.count(name) for name in ("transformer", "transformer_2")}
    parameters = {name: sum(p.numel() for p in m.parameters()) for name, m in experts.named_denoisers(session.model)}
    weights = sum(p.numel() * p.element_size() for name in parameters for p in getattr(pipe, name).parameters())
    return {
        "model": session.model.name,
        "dtype": "bfloat16",
        "request": session.resolve(request).to_dict(),
        "cache_steps": cache_steps,
        "thresholds": list(thresholds),
        "boundary_ratio": pipe.config.boundary_ratio,
        "scheduler": {
            "class": type(pipe.scheduler).__name__,
            **{k: pipe.scheduler.config.get(k) for k in ("flow_shift", "shift") if k in pipe.scheduler.config},
        },  # fmt: skip
        "experts": split,
        "expert_parameters": parameters,
        "denoiser_weights_gib": weights / 2**30,
        "build_seconds": build,
        "init_seconds": session.init_seconds,
    }
