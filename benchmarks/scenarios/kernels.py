"""Each fused Triton kernel (its DEFAULT launch) against its torch reference, reported against the roofline.

The Wan block's kernels at Wan2.1-1.3B's shape (x (1, 32,760, 1536) bf16, FFN 8960, 12 heads of 128:
`workbench.kernel_bench.cases`), and `head_norm_rope` at the full-size MiniMax-H3's q (1, 52,648, 56, 128) bf16.
Every kernel is first checked against its reference on the inputs it is timed on (bitwise, or within its
contract's bound). Then A/B/A rounds, reference / kernel / reference, each visit the median of 20 synchronised calls
(`time_call`, warm-up excluded); the roofline is max(bytes / copy bandwidth, flops / bf16 GEMM rate) from the
kernel's `cost()`, at the ceilings measured on the same device at the start of the run
(`kernel_bench.measure_ceilings`, recorded in `shape.ceilings`). `--smoke`: tiny shapes on the CPU under the Triton
interpreter.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import calls, ceilings
from workbench import kernel_bench
from workbench.evidence.timing import aba_rounds, time_call
from workbench.kernels import head_norm_rope

NAME = "kernels"
SUMMARY = "fused Triton kernels vs their torch references at Wan2.1-1.3B / MiniMax-H3 shapes, against the roofline"
GPUS = 1
WAN = {"batch": 1, "tokens": 32760, "channels": 1536, "heads": 12}
H3_Q = (1, 52648, 56, 128)
H3_ROTARY = 96  # rotated channels of each head
SMOKE_WAN = {"batch": 1, "tokens": 8, "channels": 64, "heads": 2}
SMOKE_H3_Q = (1, 8, 1, 128)


def head_norm_rope_case(shape: tuple[int, int, int, int], device: torch.device) -> kernel_bench.Case:
    g = torch.Generator(device).manual_seed(1)
    x = (torch.randn(shape, generator=g, device=device) * 2 + 0.1).bfloat16()
    weight = torch.randn(shape[-1], generator=g, device=device).bfloat16()
    cos, sin = (torch.randn(shape[1], H3_ROTARY, generator=g, device=device) for _ in range(2))
    moved = head_norm_rope.cost(shape)
    bytes_moved, flops = moved if isinstance(moved, tuple) else (moved, 0)
    return kernel_bench.Case(
        "head_norm_rope",
        lambda: head_norm_rope.head_norm_rope(x, weight, 1e-6, cos, sin),
        lambda: head_norm_rope.reference(x, weight, 1e-6, cos, sin),
        bytes_moved,
        flops,
        exact=False,
        rel_l2_bound=1e-2,
    )


def run(context: Context) -> Measurement:
    device = context.device
    wan, h3_q = (SMOKE_WAN, SMOKE_H3_Q) if context.smoke else (WAN, H3_Q)
    clock = calls(context.smoke, repeats=20, warmup=2)
    device_ceilings = ceilings(context.smoke, device)
    cases = [*kernel_bench.cases(**wan, device=device), head_norm_rope_case(h3_q, device)]
    arms: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    notes: list[str] = []
    for case in cases:
        checked = kernel_bench.check(case)
        row: dict[str, Any] = {**checked, "bytes_moved": case.bytes_moved, "flops": case.flops}
        arms[case.name] = row
        if not checked["within"]:
            notes.append(f"{case.name}: output outside its contract's bound; not timed ({checked}).")
            continue
        rounds = aba_rounds(
            (f"{case.name} reference", lambda c=case: time_call(c.reference, device, **clock).device_s),
            {case.name: lambda c=case: time_call(c.kernel, device, **clock).device_s},
            context.rounds,
        )
        if case.name in rounds.errors:
            row["error"] = rounds.errors[case.name]
            notes.append(f"{case.name}: failed while timed: {row['error']}")
            continue
        medians = rounds.medians()
        roofline = device_ceilings.roofline_seconds(case.bytes_moved, case.flops)
        row.update(
            median_s=medians[case.name],
            reference_median_s=medians[f"{case.name} reference"],
            roofline_s=roofline,
            fraction_of_roofline=roofline / medians[case.name],
            achieved_gbps=case.bytes_moved / medians[case.name] / 1e9,
        )
        ratios.update({k: v.to_dict() for k, v in rounds.ratios().items()})
    shape = {"wan": wan, "h3_q": list(h3_q), "dtype": "bfloat16", "ceilings": device_ceilings.to_dict()}
    notes.append(
        "Times: calls queued back to back (device time per call, as inside a forward), median of the A/B/A "
        "visits; ratios are reference time / kernel time (> 1: the kernel is faster). roofline_s at the ceilings "
        "measured on this device in this run (shape.ceilings: copy bytes read plus written per second, bf16 GEMM "
        "flop/s)."
    )
    return Measurement(SUMMARY, shape, arms, ratios, notes)
