"""Each fused Triton kernel (the launch it ships) against its torch reference, A/B/A, reported against the roofline.

What runs is `workbench.kernel_bench.benchmark` (its docstring: the shapes, the check before timing, the rounds and
the roofline), the same code `notebooks/30_kernels.ipynb` shows; this scenario records it. The ceilings measured at
the start of the run are in `shape.ceilings`, the GPU's clocks, temperature and throttling while it ran in
`shape.nvml`. `--smoke`: tiny shapes on the CPU under the Triton interpreter.
"""

from __future__ import annotations

from benchmarks.envelope import Context, Measurement
from workbench import kernel_bench

NAME = "kernels"
SUMMARY = "fused Triton kernels vs their torch references at Wan2.1-1.3B / MiniMax-H3 shapes, against the roofline"
GPUS = 1


def run(context: Context) -> Measurement:
    result = kernel_bench.benchmark(context.device, context.rounds, context.smoke)
    wan, h3_q = kernel_bench.shapes(context.smoke)
    shape = {"wan": wan, "h3_q": list(h3_q), "dtype": "bfloat16", "ceilings": result.ceilings.to_dict(),
             "nvml": result.device_state}  # fmt: skip
    return Measurement(SUMMARY, shape, result.arms, result.ratios, result.notes)
