"""Foundation measurement: a Wan2.1-1.3B-shaped request through the resident session on one GPU.

Random weights at the real transformer and VAE shapes, 480x832, 81 frames, bf16, CFG. One warm-up
request, then `--repeats` requests; reports stage timings, per-step times and peaks of each.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.common import envelope, wan_1_3b_request, write
from workbench import Session


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    session = Session.open("random-wan-1.3b", device="cuda", dtype="bfloat16")
    request = wan_1_3b_request(args.steps)
    warm = session.generate(request, progress=False)
    runs = [session.generate(request, progress=False) for _ in range(args.repeats)]
    same = all((r.frames == warm.frames).all() for r in runs)

    stages = sorted({k for r in runs for k in r.timings})
    arms = {
        "session": {
            "init_seconds": session.init_seconds,
            "warmup_timings": warm.timings,
            "timings": [r.timings for r in runs],
            "median_seconds": {s: statistics.median(r.timings.get(s, 0.0) for r in runs) for s in stages},
            "step_seconds": [r.step_seconds for r in runs],
            "median_step_seconds": statistics.median(x for r in runs for x in r.step_seconds),
            "memory_peak_bytes": runs[-1].memory,
            "nvml": runs[-1].metadata["nvml"],
            "outputs_equal_warmup": same,
            "frames_shape": list(warm.frames.shape),
        }
    }
    shape = {
        "model": "random-wan-1.3b",
        "frames": 81,
        "height": 480,
        "width": 832,
        "tokens": 32760,
        "steps": args.steps,
        "cfg": True,
        "dtype": "bfloat16",
    }
    notes = (
        "One step = two transformer forwards (CFG) + scheduler. Text encoder shape-reduced (2 UMT5 "
        "layers at width 4096), so text_encode is not representative. Stock diffusers attention "
        f"(native dispatch). torch.cuda.get_device_name: {torch.cuda.get_device_name()}"
    )
    write(envelope("session-wan-1.3b", shape, arms, {}, notes), "session-wan-1.3b")


if __name__ == "__main__":
    main()
