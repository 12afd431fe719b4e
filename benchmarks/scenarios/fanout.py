"""What the Ray engine costs per cell (issue 26): the same sweep of qualification cells run in this process and
through `workbench.evidence.fanout` on one Ray worker holding the same model on the same GPU.

The sweep: `easycache` thresholds (`VALUES`) against stock on one Wan2.1-1.3B-shaped request (random weights, bf16,
480x832x81, `STEPS` steps with CFG), each value one cell (one request's A/B/A qualification, `MIN_ROUNDS` rounds).
Arms, A/B/A over `--rounds`: `in-process` (`workbench.evidence.sweep.sweep` on a Session opened here) and `ray`
(`fanout_jobs.sweep` on a Fanout of one GPU worker, a fresh store each visit, so every visit runs every cell). Before
the rounds each arm runs one untimed pilot sweep of another value on a 5-frame request (`PILOT_FRAMES`, same height
and width): the worker opens its Session and both arms load their code and the CUDA context outside the timed visits,
for seconds instead of two full cells. Per Ray visit the store's entries give the engine's overhead per cell
directly: `wall_seconds` (from handing the cell to the worker to its result) less `seconds` (the cell inside the
worker). The ratio in-process / ray of whole sweeps is the overhead seen by a user (< 1: Ray is slower); issue 26's
target is an overhead under 2 % of a cell's time.
A cell at the full shape is about a minute (nine whole requests), so three rounds (seven visits) and the pilots fill
most of a 10-minute call: with `--max-seconds` the rounds stop after the last one that leaves time for another (the
envelope says how many ran; a CI95 needs three).
`--smoke`: tiny-wan on the CPU with one CPU worker, one value, small request: checks the path, not the cost.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from typing import Any

from benchmarks.envelope import Context, Measurement
from workbench import Request, Session
from workbench.evidence import fanout_jobs
from workbench.evidence.fanout import Fanout, Store
from workbench.evidence.harness import MIN_ROUNDS
from workbench.evidence.sweep import sweep
from workbench.evidence.timing import Rounds, aba_rounds

NAME = "fanout"
SUMMARY = "Ray fan-out overhead per cell: a sweep's qualification cells on one Ray GPU worker vs in this process"
GPUS = 1
STOPS_AT_MAX_SECONDS = True  # reads --max-seconds (benchmarks/__main__.py)
STEPS = 2
VALUES = [0.1]  # one cell per sweep: a visit is already ~40 s of whole requests at the full shape
PILOT_VALUE = 0.2
PILOT_FRAMES = 5  # the pilots' request: the sweep's, this many frames
PROMPT = "a red fox runs through snow"


def run(context: Context) -> Measurement:
    smoke = context.smoke
    model = "tiny-wan" if smoke else "random-wan-1.3b"
    shape = {"frames": 5, "height": 16, "width": 16} if smoke else {"frames": 81, "height": 480, "width": 832}
    request = Request(PROMPT, seed=0, steps=STEPS, **shape)
    pilot = dataclasses.replace(request, frames=PILOT_FRAMES)
    values = VALUES[:1] if smoke else VALUES
    dtype = None if smoke else "bfloat16"
    device = "cpu" if smoke else "cuda"
    started = time.perf_counter()
    session = Session.open(model, device=device, dtype=dtype)
    entries: list[dict[str, Any]] = []

    def in_process(sweep_values: list[float], on: Request = request) -> float:
        start = time.perf_counter()
        sweep(session, [on], "easycache", "threshold", sweep_values, progress=False)
        seconds = time.perf_counter() - start
        print(f"fanout: in-process sweep of {len(sweep_values)} cell(s) {seconds:.1f} s", flush=True)
        return seconds

    with Fanout(model, workers=1, device=device, dtype=dtype) as fanout:

        def through_ray(sweep_values: list[float], on: Request = request, keep: bool = True) -> float:
            with tempfile.TemporaryDirectory() as root:
                store = Store(root)
                start = time.perf_counter()
                fanout_jobs.sweep(fanout, store, [on], "easycache", "threshold", sweep_values)
                seconds = time.perf_counter() - start
                print(f"fanout: ray sweep of {len(sweep_values)} cell(s) {seconds:.1f} s", flush=True)
                if keep:
                    entries.extend(store.entries().values())
            return seconds

        pilot_ray = through_ray([PILOT_VALUE], pilot, keep=False)  # opens the worker's Session
        pilot_in_process = in_process([PILOT_VALUE], pilot)  # code and CUDA context loaded here as in the worker
        rounds = aba_rounds(
            ("in-process", lambda: in_process(values)),
            {"ray": lambda: through_ray(values)},
            context.rounds,
            stop=lambda done: out_of_time(done, started, context.max_seconds),
        )
        worker = fanout.identities[0]
    finished = [e for e in entries if e["status"] == "finished"]
    overheads = [e["wall_seconds"] - e["seconds"] for e in finished]
    cells = [e["seconds"] for e in finished]
    medians = rounds.medians()
    arms = {
        "in-process": {"seconds": rounds.seconds["in-process"], "pilot_s": pilot_in_process},
        "ray": {
            "seconds": rounds.seconds["ray"],
            "pilot_s_with_worker_open": pilot_ray,
            "cells": len(entries),
            "failed_cells": len(entries) - len(finished),
            "cell_seconds": cells,
            "overhead_seconds_per_cell": overheads,
            "worker": worker,
        },
    }
    for name in arms:
        if name in medians:
            arms[name]["median_s"] = medians[name]
    if overheads:
        arms["ray"]["overhead_fraction_of_cell"] = statistics.median(
            o / c for o, c in zip(overheads, cells, strict=True)
        )
    pairs = len(rounds.seconds["ray"])
    notes = [
        f"{len(values)} cells per sweep ({MIN_ROUNDS}-round A/B/A qualification each); the Ray worker was opened in "
        f"the pilot ({pilot_ray:.1f} s with its first sweep, on a {PILOT_FRAMES}-frame request), outside the timed "
        "rounds.",
        f"{pairs} of {context.rounds} rounds ran"
        + (" (the time limit ended the others)." if pairs < context.rounds else "."),
        "Ratios are in-process / ray seconds of whole sweeps (< 1: Ray is slower); overhead_seconds_per_cell is "
        "the store's wall_seconds less seconds per cell.",
    ]
    notes += [f"arm {name} failed during the rounds: {error}" for name, error in rounds.errors.items()]
    notes += cache_note()
    return Measurement(
        SUMMARY,
        {"model": model, **shape, "steps": STEPS, "values": values, "cells_per_sweep": len(values)},
        arms,
        {k: v.to_dict() for k, v in rounds.ratios().items()},
        notes,
    )


def cache_note() -> list[str]:
    """A note when the cells' easycache, at its default warm-up and final dense steps, has no step of `STEPS` to
    reuse (its receipts then say executed=false), or nothing."""
    from workbench.accelerations import REGISTRY

    defaults = {option.name: option.default for option in REGISTRY["easycache"].options}
    if STEPS > defaults["warmup"] + defaults["final_dense"]:
        return []
    return [
        f"At {STEPS} steps easycache's defaults (warmup {defaults['warmup']}, final_dense {defaults['final_dense']}) "
        "leave no step to reuse: every request of a cell runs dense. That is the work the engine's overhead is set "
        "against here; the cells are not a cache result."
    ]


def out_of_time(done: Rounds, started: float, max_seconds: float | None) -> bool:
    """True when another round like the last one would end after `max_seconds` from `started` (None: never)."""
    if max_seconds is None:
        return False
    if not done.seconds["ray"]:  # the Ray arm failed: nothing left to pair
        return True
    last_round = done.seconds["ray"][-1] + done.seconds["in-process"][-1]
    return time.perf_counter() - started + last_round > max_seconds
