"""Shared by the benchmark scripts: the JSON envelope every results file carries, and the kernel-time split."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workbench import Request, environment

ATTENTION = ("flash", "fmha", "cudnn", "attention", "sdpa")
GEMM = ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")
GEMM_CPU = ("aten::mm", "aten::addmm", "aten::bmm")  # --smoke only: CPU ops, no kernels
INDUCTOR_POINTWISE = ("triton_poi", "triton_red", "triton_per")


def envelope(what: str, shape: dict[str, Any], arms: dict[str, Any], ratios: dict[str, Any], notes: str) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    described = environment.describe(device)
    return {
        "what": what,
        "device": described["device"],
        "torch": torch.__version__,
        "triton": described["versions"].get("triton"),
        "diffusers": described["versions"].get("diffusers"),
        "commit": os.environ.get("WORKBENCH_COMMIT") or described["git"]["commit"],
        "date": datetime.date.today().isoformat(),
        "shape": shape,
        "arms": arms,
        "ratios": ratios,
        "notes": notes,
    }


def write(record: dict, name: str) -> Path:
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['date']}-{name}.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    print(f"wrote {path}")
    return path


def wan_1_3b_request(steps: int) -> Request:
    """The request every Wan2.1-1.3B-shaped measurement uses: 480x832, 81 frames (32,760 tokens), CFG 5."""
    return Request(
        "a red circle moves left over a blue floor",
        seed=42,
        frames=81,
        height=480,
        width=832,
        steps=steps,
        guidance=5.0,
    )


def kernel_class(name: str, cpu: bool) -> str:
    """attention, gemm or rest, from a kernel's name (on the CPU, from the aten op's name)."""
    low = name.lower()
    if low.startswith(INDUCTOR_POINTWISE):  # named after the ops they fuse, e.g. `..._cudnn_attention_0` copies
        return "rest"
    if any(tag in low for tag in ATTENTION):
        return "attention"
    if any(tag in low for tag in GEMM) or (cpu and name in GEMM_CPU):
        return "gemm"
    return "rest"


def kernel_split(run: Callable[[], Any], cuda: bool) -> tuple[Any, dict[str, list[float]], dict[str, Any]]:
    """Profile one call of `run`: (its result, {kernel: [device us, calls]}, the attention/GEMM/rest split)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        result = run()
    per_kernel: dict[str, list[float]] = {}
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0.0) if cuda else event.self_cpu_time_total
        if device_us <= 0 or (not cuda and not event.key.startswith("aten::")):
            continue
        if cuda and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        per_kernel[event.key] = [device_us, event.count]
    by_class = {"attention": 0.0, "gemm": 0.0, "rest": 0.0}
    for name, (us, _) in per_kernel.items():
        by_class[kernel_class(name, not cuda)] += us
    total = sum(by_class.values())
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])
    split = {
        "kernel_seconds": total / 1e6,
        "share": {k: v / total for k, v in by_class.items()} if total else by_class,
        "seconds_by_class": {k: v / 1e6 for k, v in by_class.items()},
        "top_kernels": [{"name": n[:160], "us": us, "calls": c} for n, (us, c) in top[:12]],
        "top_rest_kernels": [
            {"name": n[:160], "us": us, "calls": c} for n, (us, c) in top if kernel_class(n, not cuda) == "rest"
        ][:12],
    }
    return result, per_kernel, split
