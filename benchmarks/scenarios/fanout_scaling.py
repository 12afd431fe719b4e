"""How the Ray fan-out scales over the GPUs of one host: the same kind of sweep as `fanout`
(easycache thresholds against stock on one Wan2.1-1.3B-shaped request, random weights, bf16, 480x832x81, `STEPS`
steps with CFG; each value one cell, one request's A/B/A qualification) through `workbench.evidence.fanout` on 1, 2,
4 and 8 GPU workers (`FANOUT_SCALING_WORKERS`, those the machine holds; one actor per GPU).

Weak scaling: each worker count runs `CELLS_PER_WORKER` cells per worker, so every count gives each worker the same
work. Per count: the timed sweep's wall time, cells per hour, the engine's overhead per cell (the store's
`wall_seconds` less the worker's `seconds`), each worker's host and device, and the efficiency: cells per hour over
(workers x the one-worker count's cells per hour), issue 27's target >= 0.9. The workers open their Sessions in an
untimed pilot sweep (one cell per worker, a `fanout.PILOT_FRAMES`-frame request) before the timed one. One timed
sweep per count: a throughput, not an A/B/A ratio (each cell's own speed ratio stays inside its worker). A count's
cells at the full shape take about a minute each, so 1, 2, 4 and 8 workers take one device call per two counts;
every call should include 1 (the efficiency's base), e.g. `FANOUT_SCALING_WORKERS=1,8` then `1,2,4`.
`--smoke`: tiny-wan on one and two CPU workers, one cell each: the path, not the cost.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios import fanout as single
from workbench import Request
from workbench.evidence import fanout_jobs
from workbench.evidence.fanout import Fanout, Store

NAME = "fanout-scaling"
SUMMARY = "issue 27: Ray fan-out over 1/2/4/8 GPU workers of one host, Wan2.1-1.3B cells: cells per hour, efficiency"
GPUS = 8
SETTINGS = ("FANOUT_SCALING_WORKERS",)  # environment it reads (the record names those set)
WORKERS = "1,2,4,8"
CELLS_PER_WORKER = 2


def worker_counts(available: int) -> list[int]:
    """The counts of FANOUT_SCALING_WORKERS (default 1,2,4,8) that `available` GPUs hold; ValueError naming the
    variable when it is not a comma list of positive ints."""
    text = os.environ.get("FANOUT_SCALING_WORKERS", WORKERS)
    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise ValueError(f"FANOUT_SCALING_WORKERS: {text!r}; allowed: a comma list of worker counts >= 1, e.g. 1,2,4,8")
    return [count for count in counts if count <= available]


def run(context: Context) -> Measurement:
    smoke = context.smoke
    model = "tiny-wan" if smoke else "random-wan-1.3b"
    shape = {"frames": 5, "height": 16, "width": 16} if smoke else {"frames": 81, "height": 480, "width": 832}
    request = Request(single.PROMPT, seed=0, steps=single.STEPS, **shape)
    pilot = dataclasses.replace(request, frames=single.PILOT_FRAMES)
    per_worker = 1 if smoke else CELLS_PER_WORKER
    counts = [1, 2] if smoke else worker_counts(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if not counts:
        raise RuntimeError(f"{NAME}: no worker count of FANOUT_SCALING_WORKERS fits this machine's GPUs")
    device, dtype = ("cpu", None) if smoke else ("cuda", "bfloat16")
    arms: dict[str, Any] = {}
    for count in counts:
        values = [round(0.05 + 0.001 * i, 3) for i in range(count * per_worker)]  # distinct cells
        with Fanout(model, workers=count, device=device, dtype=dtype) as fan, tempfile.TemporaryDirectory() as root:
            pilots = [round(single.PILOT_VALUE + 0.001 * i, 3) for i in range(count)]
            fanout_jobs.sweep(fan, Store(os.path.join(root, "pilot")), [pilot], "easycache", "threshold", pilots)
            store = Store(os.path.join(root, "timed"))
            start = time.perf_counter()
            fanout_jobs.sweep(fan, store, [request], "easycache", "threshold", values)
            seconds = time.perf_counter() - start
            entries = list(store.entries().values())
            identities = [identity for identity in fan.identities if identity is not None]
        finished = [e for e in entries if e["status"] == "finished"]
        arms[f"{count} workers"] = {
            "workers": count,
            "sweep_s": seconds,
            "cells": len(entries),
            "failed_cells": len(entries) - len(finished),
            "cells_per_hour": len(finished) / seconds * 3600,
            "cell_median_s": statistics.median(e["seconds"] for e in finished) if finished else None,
            "overhead_median_s": statistics.median(e["wall_seconds"] - e["seconds"] for e in finished)
            if finished
            else None,
            "workers_on": [f"{i['host']}: {i['label']}" for i in identities],
        }
        print(f"{NAME}: {count} worker(s), {len(finished)} cells in {seconds:.1f} s", flush=True)
    base = arms[f"{counts[0]} workers"] if counts[0] == 1 else None
    for row in arms.values():
        if base is not None and base["cells_per_hour"]:
            row["efficiency"] = row["cells_per_hour"] / (row["workers"] * base["cells_per_hour"])
    notes = [
        f"{per_worker} cell(s) per worker (weak scaling), each cell a {single.STEPS}-step request's A/B/A "
        "qualification; one timed sweep per worker count after an untimed pilot that opened the workers. efficiency: "
        "cells per hour / (workers x one worker's cells per hour)"
        + ("." if base is not None else "; not computed: 1 worker was not among the counts run."),
        "Smoke: tiny-wan on CPU workers; the numbers say nothing about scaling." if smoke else "Random weights.",
        *single.cache_note(),
    ]
    return Measurement(SUMMARY, {"model": model, **shape, "steps": single.STEPS, "counts": counts}, arms, {}, notes)
