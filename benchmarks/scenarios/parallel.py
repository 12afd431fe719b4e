"""Context parallelism (Ulysses, the workbench's direct relayouts) over two GPUs against one GPU, on a
Wan2.1-1.3B-shaped request (480x832x81, 4 steps CFG 5, bf16, random weights broadcast from rank 0), alone and with the
`exact-fast` profile on each rank against one GPU with the same profile.

The scenario starts itself in two torchrun workers (`workbench.distributed.launch`); both ranks run the same A/B/A
rounds: `1-gpu` (rank 0 generates alone, rank 1 waits at the barrier) against `ulysses` (`context_parallel`, both
ranks), `1-gpu+exact-fast` and `ulysses+exact-fast`; each split arm's latents against one GPU's with the same plugins.
Each visit is one request between two barriers, timed by rank 0's wall clock; one untimed pilot per arm first.
Needs >= 2 CUDA devices and refuses otherwise. `--smoke`: tiny-wan on two gloo ranks on the CPU (relayout kernels
interpreted), the same code end to end.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import launch_ranks, rank_visit, split_arms, wan_request, worker_main
from workbench.io import json_bytes, write_atomic
from workbench.quality.latent import latent_rel_l2

NAME = "parallel"
SUMMARY = (
    "Wan2.1-1.3B request, 4 steps CFG: Ulysses context parallelism over 2 GPUs vs 1 GPU, alone and with exact-fast"
)
GPUS = 2
STEPS = 4
TIMEOUT_S = 560.0


def run(context: Context) -> Measurement:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < GPUS and not context.smoke:
        raise RuntimeError(f"parallel: needs at least {GPUS} CUDA devices, this machine has {count}")
    measured = launch_ranks("benchmarks.scenarios.parallel", GPUS, context.rounds, context.smoke, TIMEOUT_S)
    if context.smoke:
        measured["notes"].append("Smoke: tiny-wan, two gloo ranks on the CPU; the numbers say nothing.")
    return Measurement(SUMMARY, measured["shape"], measured["arms"], measured["ratios"], measured["notes"])


def worker(out: Path, rounds: int, smoke: bool) -> None:
    """One torchrun rank: the A/B/A rounds; rank 0 writes {shape, arms, ratios, notes} to `out`."""
    import torch.distributed as dist

    from workbench import Session, distributed
    from workbench.evidence.timing import aba_rounds

    device = distributed.init_worker("cpu" if smoke else "cuda", timeout_s=300)
    rank = dist.get_rank()
    model = "tiny-wan" if smoke else "random-wan-1.3b"
    session = Session.open(model, device=str(device), dtype=None if smoke else "bfloat16")
    for component in session.model.pipeline.components.values():  # every rank runs rank 0's random weights
        if isinstance(component, torch.nn.Module):
            for tensor in [*component.parameters(), *component.buffers()]:
                dist.broadcast(tensor.data, src=0)
    request = wan_request(STEPS, smoke=smoke)
    notes: list[str] = []
    configs = split_arms("wan", device, GPUS, notes)
    results: dict[str, list[Any]] = {name: [] for name in configs}

    def visit(name: str) -> float:
        def generate() -> None:
            results[name].append(session.generate(request, progress=False))

        return rank_visit(session, configs[name], name.startswith("ulysses") or rank == 0, generate)

    for name in results:  # untimed pilots
        visit(name)
    others = {name: (lambda name=name: visit(name)) for name in configs if name != "1-gpu"}
    measured = aba_rounds(("1-gpu", lambda: visit("1-gpu")), others, rounds)
    if rank != 0:
        return
    arms = {
        name: {
            "seconds": measured.seconds[name],
            "median_s": statistics.median(measured.seconds[name]),
            "denoise_median_s": statistics.median(r.timings["denoise"] for r in runs[1:]),
            "receipts": runs[0].receipts,
        }
        for name, runs in results.items()
        if measured.seconds[name]
    }
    for name, single in (("ulysses", "1-gpu"), ("ulysses+exact-fast", "1-gpu+exact-fast")):
        if name in arms:  # each split arm against one GPU with the same plugins
            got, want = results[name][0].latents, results[single][0].latents
            arms[name][f"latents_equal_{single}"] = bool(torch.equal(got, want))
            arms[name][f"latent_rel_l2_vs_{single}"] = latent_rel_l2(want, got)
    record = {
        "shape": {"model": model, "world_size": dist.get_world_size(), "request": request.to_dict()},
        "arms": arms,
        "ratios": {k: v.to_dict() for k, v in measured.ratios().items()},
        "notes": notes
        + [f"arm {k} failed: {v}" for k, v in measured.errors.items()]
        + ["Times: rank 0's wall clock around one request between barriers (text encoding and decode included)."],
    }
    write_atomic(out, json_bytes(record))


if __name__ == "__main__":
    worker_main("a torchrun worker of the parallel scenario", worker)
