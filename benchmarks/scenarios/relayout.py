"""The Ulysses relayout kernels at the Wan2.1-1.3B shape, world size 2 (32,760 tokens, 12 heads x 128, bf16:
T_local 16,380, 6 heads per rank): the direct kernels (DEFAULT launch) against the reference copy chains and a plain
contiguous copy of the same bytes.

Ops: `pack_qkv` (q, k, v (1, T_local, 12, 128) before the all-to-all), `split_result` ((1, T, 6, 128) attention
output: already rank-major, so both sides return a view and copy nothing; recorded as `copies: false` and not
timed), `split_result batch 2` (the same at batch 2, where the kernel copies), `merge_heads`
((2, 1, T_local, 6, 128) received heads). Each call is timed as a CUDA-graph replay (device
time, no host launch cost: what a call costs inside a step where the host runs ahead), A/B/A: reference / direct /
reference, and copy / direct; `relayout.cost` bytes per second against the copy bandwidth measured on the same
device at the start of the run (`kernel_bench.device_ceilings`, recorded in `shape.ceilings`). The direct
output must equal the reference bit for bit. `--smoke`: a tiny shape on the CPU under the Triton interpreter, host
clock, no graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import calls
from workbench import kernel_bench
from workbench.evidence.timing import aba_rounds, time_call
from workbench.kernels import relayout

NAME = "relayout"
SUMMARY = "Ulysses relayout kernels (pack q/k/v, split result, merge heads) vs reference chains, Wan2.1-1.3B, world 2"
GPUS = 1
SHAPE = {"batch": 1, "tokens": 32760, "heads": 12, "head_dim": 128, "world_size": 2}
SMOKE_SHAPE = {"batch": 1, "tokens": 22, "heads": 4, "head_dim": 16, "world_size": 2}


def ops(shape: dict[str, int], device: torch.device) -> dict[str, tuple[Callable, Callable, torch.Tensor, tuple]]:
    """op -> (direct call, reference call, the input a copy of the same bytes clones, the shape `cost` takes); an op's
    first word is the relayout function it times."""
    b, t, h, d, w = (shape[k] for k in ("batch", "tokens", "heads", "head_dim", "world_size"))
    g = torch.Generator(device).manual_seed(0)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g, device=device).bfloat16()

    q, k, v = (randn(b, t // w, h, d) for _ in range(3))
    stacked = torch.stack((q, k, v))
    out, received = randn(b, t, h // w, d), randn(w, b, t // w, h // w, d)
    out2 = randn(2 * b, t, h // w, d)
    return {
        "pack_qkv": (lambda: relayout.pack_qkv(q, k, v, w), lambda: relayout.pack_qkv_reference(q, k, v, w),
                     stacked, tuple(q.shape)),
        "split_result": (lambda: relayout.split_result(out, w), lambda: relayout.split_result_reference(out, w),
                         out, tuple(out.shape)),
        "split_result batch 2": (lambda: relayout.split_result(out2, w), lambda: relayout.split_result_reference(out2, w),
                                 out2, tuple(out2.shape)),
        "merge_heads": (lambda: relayout.merge_heads(received, w), lambda: relayout.merge_heads_reference(received, w),
                        received, tuple(received.shape)),
    }  # fmt: skip


def run(context: Context) -> Measurement:
    device, smoke = context.device, context.smoke
    shape = SMOKE_SHAPE if smoke else SHAPE
    graph = device.type == "cuda"
    clock = calls(smoke, repeats=50, warmup=2)
    device_ceilings = kernel_bench.device_ceilings(device, smoke)

    def timed(fn: Callable[[], Any]) -> float:
        return time_call(fn, device, graph=graph, **clock).device_s

    arms: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for op, (direct, reference, source, cost_shape) in ops(shape, device).items():
        result = direct()
        equal = bool(torch.equal(result, reference()))
        copies = result.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()  # a view moves nothing
        arms[op] = {"equal_to_reference": equal, "copies": copies}
        if not copies:  # both sides return a view: an empty graph, nothing to time
            continue
        rounds = aba_rounds(
            (f"{op} reference", lambda f=reference: timed(f)),
            {op: lambda f=direct: timed(f), f"{op} copy": lambda s=source: timed(s.clone)},
            context.rounds,
        )
        bytes_moved = relayout.cost(op.split()[0], cost_shape)[0]
        medians = rounds.medians()
        arms[op] |= {"bytes_moved": bytes_moved, "errors": rounds.errors,
                     **{f"{name.removeprefix(op).strip() or 'direct'}_median_s": s for name, s in medians.items()}}  # fmt: skip
        if op in medians:
            arms[op]["median_s"] = medians[op]
            arms[op]["fraction_of_copy_bandwidth"] = bytes_moved / medians[op] / device_ceilings.copy_bytes_per_s
        ratios.update({k: v.to_dict() for k, v in rounds.ratios().items()})
    notes = [
        "Times: CUDA-graph replays queued back to back (device time); split_result at batch 1 returns a view on both "
        "sides (copies: false) and is not timed; ratios are reference / candidate (direct kernel, or a plain copy of "
        "the same bytes: the ceiling), > 1: the candidate is faster."
        if graph
        else "Smoke: host clock on the CPU under the Triton interpreter, no graphs; the numbers say nothing about speed."
    ]
    return Measurement(
        SUMMARY, {**shape, "dtype": "bfloat16", "ceilings": device_ceilings.to_dict()}, arms, ratios, notes
    )
