"""Issue-3 measurement: every plugin against stock diffusers on a Wan2.1-1.3B-shaped full request.

One persistent session. Each round runs A, B1, A, B2, A, ... (A = stock, Bi = plugin i installed),
so every plugin request sits between two stock requests; its paired baseline is the mean of those
two (A/B/A). Install/uninstall happen outside the timed requests. Quality of each plugin's first
output against the stock output of the same request; every timed output is checked against its
arm's first (pilot) output.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.common import envelope, wan_1_3b_request, write
from workbench import Session
from workbench.evidence.stats import paired_ratio_ci
from workbench.quality import compare

CANDIDATES = {
    "attention_backend=_native_flash": {"attention_backend": {"backend": "_native_flash"}},
    "fused_qkv": {"fused_qkv": {}},
    "cross_kv_cache": {"cross_kv_cache": {}},
    "easycache=0.1": {"easycache": {"threshold": 0.1, "warmup": 2, "final_dense": 1}},
    "first_block_cache=0.05": {"first_block_cache": {"threshold": 0.05}},
    "pyramid_attention_broadcast": {"pyramid_attention_broadcast": {}},
    "group_offload": {"group_offload": {}},
    "selective_fp8=ffn": {"selective_fp8": {"include": ["blocks.*.ffn.net.0.proj", "blocks.*.ffn.net.2"]}},
    "teacache=0.2": {"teacache": {"rel_l1_thresh": 0.2}},
    "taylorseer": {"taylorseer": {}},
    "mag_cache": {"mag_cache": {}},  # ratios filled in by a calibration request of the same step count
    "cache_dit=0.08": {"cache_dit": {}},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    parser.add_argument("--name", default="plugins-wan-1.3b")
    args = parser.parse_args()
    if args.only:
        unknown = set(args.only.split(",")) - set(CANDIDATES)
        if unknown:
            raise SystemExit(f"--only: unknown {sorted(unknown)}; choose from {sorted(CANDIDATES)}")
        for name in set(CANDIDATES) - set(args.only.split(",")):
            del CANDIDATES[name]

    session = Session.open("random-wan-1.3b", device="cuda", dtype="bfloat16")
    request = wan_1_3b_request(args.steps)
    if "mag_cache" in CANDIDATES:
        CANDIDATES["mag_cache"] = {"mag_cache": {"mag_ratios": _mag_ratios(session, request)}}

    def run(config: dict) -> tuple[object, float]:
        start = time.perf_counter()
        session.accelerate(config)
        install = time.perf_counter() - start
        return session.generate(request, progress=False), install

    pilot_a, _ = run({})  # warm-up and pilot of the stock arm
    pilots, warm, quality, installs = {}, {}, {}, {}
    for name, config in CANDIDATES.items():  # warm each candidate once (JIT, autotune), excluded
        pilots[name], installs[name] = run(config)
        warm[name] = pilots[name].timings["total"]
        quality[name] = compare(pilot_a, pilots[name]).to_dict()
        quality[name]["receipt"] = pilots[name].receipts
    session.accelerate({})

    times = {name: [] for name in CANDIDATES}
    paired_a = {name: [] for name in CANDIDATES}
    stages = {name: [] for name in CANDIDATES}
    stages_a = []
    matches = {name: True for name in CANDIDATES}
    a_matches = True
    for _ in range(args.rounds):
        before, _ = run({})
        a_matches &= bool(np.array_equal(before.frames, pilot_a.frames))
        stages_a.append(before.timings)
        for name, config in CANDIDATES.items():
            result, _ = run(config)
            after, _ = run({})
            a_matches &= bool(np.array_equal(after.frames, pilot_a.frames))
            matches[name] &= bool(np.array_equal(result.frames, pilots[name].frames))
            times[name].append(result.timings["total"])
            stages[name].append(result.timings)
            paired_a[name].append((before.timings["total"] + after.timings["total"]) / 2)
            before = after
            stages_a.append(after.timings)

    arms, ratios = {"stock": {"median_timings": _median_timings(stages_a), "outputs_match_pilot": a_matches}}, {}
    for name in CANDIDATES:
        ci = paired_ratio_ci(paired_a[name], times[name])
        denoise_ci = paired_ratio_ci(
            [statistics.median(s["denoise"] for s in stages_a)] * len(stages[name]),
            [s["denoise"] for s in stages[name]],
        )
        arms[name] = {
            "config": CANDIDATES[name],
            "install_seconds": installs[name],
            "first_request_seconds": warm[name],
            "request_seconds": times[name],
            "paired_stock_seconds": paired_a[name],
            "median_timings": _median_timings(stages[name]),
            "outputs_match_pilot": matches[name],
            "quality_vs_stock": quality[name],
        }
        ratios[name] = {"request": ci.to_dict(), "denoise_vs_median_stock": denoise_ci.median}
    shape = {
        "model": "random-wan-1.3b",
        "frames": 81,
        "height": 480,
        "width": 832,
        "tokens": 32760,
        "steps": args.steps,
        "cfg": True,
        "dtype": "bfloat16",
        "rounds": args.rounds,
    }
    notes = (
        "Ratios are stock/candidate seconds of the whole request (>1 = faster), A/B/A paired per round, "
        "bootstrap CI95 of the median. Random weights: quality numbers say how far a plugin moves the "
        "output of this random model, not how a trained model looks. "
        f"GPU: {torch.cuda.get_device_name()}"
    )
    write(envelope(args.name, shape, arms, ratios, notes), args.name)


def _mag_ratios(session: Session, request: object) -> list[float]:
    """MagCache's ratios are per checkpoint and schedule: calibrate on this model and step count (cond branch)."""
    session.accelerate({"mag_cache": {"calibrate": True}})
    ratios = session.generate(request, progress=False).receipts["mag_cache"]["notes"]["mag_ratios"]
    session.accelerate({})
    print("mag_cache calibration:", ratios)
    return ratios.get("cond") or next(iter(ratios.values()))


def _median_timings(runs: list[dict]) -> dict:
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}


if __name__ == "__main__":
    main()
