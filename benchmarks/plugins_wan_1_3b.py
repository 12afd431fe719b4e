"""Issue-3 measurement: every plugin against stock diffusers on a Wan2.1-1.3B-shaped full request.

One persistent session. Each round runs A, B1, A, B2, A, ... (A = stock, Bi = plugin i installed),
so every plugin request sits between two stock requests; its paired baseline is the mean of those
two (A/B/A). Install/uninstall happen outside the timed requests. Quality of each plugin's first
output against the stock output of the same request; every timed output is checked against its
arm's first (pilot) output.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch

from benchmarks.common import envelope, wan_1_3b_request, write
from workbench import Session
from workbench.evidence.stats import MIN_PAIRS, paired_ratio_ci
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
    parser.add_argument("--model", default="random-wan-1.3b", help="tiny-wan on cpu: a dry run of this script")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.rounds < MIN_PAIRS:
        raise SystemExit(f"--rounds: the CI needs at least {MIN_PAIRS} paired rounds, got {args.rounds}")
    if args.only:
        unknown = set(args.only.split(",")) - set(CANDIDATES)
        if unknown:
            raise SystemExit(f"--only: unknown {sorted(unknown)}; choose from {sorted(CANDIDATES)}")
        for name in set(CANDIDATES) - set(args.only.split(",")):
            del CANDIDATES[name]

    dtype = "bfloat16" if args.device == "cuda" else "float32"
    session = Session.open(args.model, device=args.device, dtype=dtype)
    request = wan_1_3b_request(args.steps)
    if args.model != "random-wan-1.3b":
        request = dataclasses.replace(request, frames=9, height=32, width=32)
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
        print(f"pilot {name}: {warm[name]:.2f} s, receipt {pilots[name].receipts}")
    session.accelerate({})

    times = {name: [] for name in CANDIDATES}
    paired_a = {name: [] for name in CANDIDATES}
    stages = {name: [] for name in CANDIDATES}
    stages_a = []
    matches = {name: True for name in CANDIDATES}
    a_matches = True
    for round_index in range(args.rounds):
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
        print(f"round {round_index + 1}/{args.rounds} done")
        # Written after every round, so a run cut short keeps the rounds it finished.
        arms = {"stock": {"median_timings": _median_timings(stages_a), "outputs_match_pilot": a_matches}}
        ratios = {}
        for name in CANDIDATES:
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
            if len(times[name]) >= MIN_PAIRS:
                denoise_ci = paired_ratio_ci(
                    [statistics.median(s["denoise"] for s in stages_a)] * len(stages[name]),
                    [s["denoise"] for s in stages[name]],
                )
                ratios[name] = {
                    "request": paired_ratio_ci(paired_a[name], times[name]).to_dict(),
                    "denoise_vs_median_stock": denoise_ci.median,
                }
        shape = {
            "model": args.model,
            "frames": request.frames,
            "height": request.height,
            "width": request.width,
            "steps": args.steps,
            "cfg": True,
            "dtype": dtype,
            "rounds": round_index + 1,
        }
        notes = (
            "Ratios are stock/candidate seconds of the whole request (>1 = faster), A/B/A paired per round, "
            "bootstrap CI95 of the median. Random weights: quality numbers say how far a plugin moves the "
            "output of this random model, not how a trained model looks. "
            f"Device: {torch.cuda.get_device_name() if args.device == 'cuda' else args.device}"
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
