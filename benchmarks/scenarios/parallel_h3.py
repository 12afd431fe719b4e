"""Context parallelism on the full MiniMax-H3 transformer (33.1B, random weights, bf16): one forward of the seeds' 10 s
t2va packing (52,648 rows, `forward_h3`'s inputs) split by Ulysses over 2, 4 and 8 GPUs, against the same forward on one
GPU, alone and stacked with the `exact-fast` profile.

One torchrun launch per world size in `PARALLEL_H3_WORLDS` (default "2,4,8", those the machine holds; each launch builds
its own copies of the model, so one world size per device call is the safe size, e.g. PARALLEL_H3_WORLDS=8). In each,
every rank builds the transformer and the inputs, then takes rank 0's by broadcast (identical weights and inputs on
every rank); the arms, A/B/A against `1-gpu`:
- `1-gpu`: rank 0 runs the forward alone while the other ranks wait at the barrier (the single-GPU reference);
- `1-gpu+exact-fast`: the same with the exact-fast profile;
- `ulysses`: `context_parallel` (Ulysses degree = world size, the workbench's direct relayouts) on every rank;
- `ulysses+exact-fast`: the profile's plugins on every rank, with the same split.
Each visit is one forward between two barriers, timed by rank 0's wall clock after a device sync; one untimed check per
arm first, whose output rank 0 compares with `1-gpu`'s (and `ulysses+exact-fast`'s also with `1-gpu+exact-fast`'s;
relative L2 and equality: context parallelism is `reduction`, so equality is not promised). Arm and ratio names carry
the launch's world size (`ulysses@8`).

Not measured here: the 17-step request (text encoder, decodes and the scheduler run replicated on every rank; its time
is 16 such forwards plus those stages, which `request-h3-capped` measures on one GPU). `--smoke`: tiny-h3's transformer
at head dim 128 and forward_h3's small packing (34 rows), two gloo ranks on the CPU with the relayout kernels
interpreted: the same code end to end; the numbers say nothing.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios import forward_h3
from benchmarks.workloads import equal, launch_ranks, rank_visit, split_arms, worker_main
from workbench.io import json_bytes, write_atomic
from workbench.quality.latent import rel_l2

NAME = "parallel-h3"
SUMMARY = (
    "issue 27: MiniMax-H3 33.1B forward, 52,648 rows, Ulysses context parallelism over 2/4/8 GPUs vs 1 GPU, alone and "
    "with exact-fast"
)
GPUS = 8
SETTINGS = ("PARALLEL_H3_WORLDS",)  # environment it reads (the record names those set)
WORLDS = "2,4,8"
SMOKE_WORLDS = (2,)
TIMEOUT_S = 540.0


def worlds(available: int) -> list[int]:
    """The world sizes of PARALLEL_H3_WORLDS (default 2,4,8) that `available` GPUs hold; ValueError naming the
    variable when it is not a comma list of ints >= 2."""
    text = os.environ.get("PARALLEL_H3_WORLDS", WORLDS)
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(size < 2 for size in sizes):
        raise ValueError(f"PARALLEL_H3_WORLDS: {text!r}; allowed: a comma list of world sizes >= 2, e.g. 2,4,8")
    return [size for size in sizes if size <= available]


def run(context: Context) -> Measurement:
    available = torch.cuda.device_count() if torch.cuda.is_available() and not context.smoke else 0
    sizes = list(SMOKE_WORLDS) if context.smoke else worlds(available)
    if not sizes:
        raise RuntimeError(
            f"{NAME}: needs at least 2 CUDA devices for the world sizes asked, this machine has {available}"
        )
    shape: dict[str, Any] = {}
    arms: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    notes: list[str] = []
    for size in sizes:
        measured = launch_ranks("benchmarks.scenarios.parallel_h3", size, context.rounds, context.smoke, TIMEOUT_S)
        shape = {**measured["shape"], "worlds": sizes}
        arms.update({f"{name}@{size}": row for name, row in measured["arms"].items()})
        ratios.update({f"{key}@{size}": value for key, value in measured["ratios"].items()})
        notes += [f"{size} ranks: {note}" for note in measured["notes"]]
    notes.append(
        "Arms and ratios named @N ran in the launch of N ranks; 1-gpu@N is rank 0 alone in that launch. Times: the "
        "wall clock of rank 0 around one forward between barriers. Random weights: the error figures compare two "
        "computations of the same random model, not image quality."
        + (" Smoke: tiny transformer, two gloo ranks on the CPU; the numbers say nothing." if context.smoke else "")
    )
    return Measurement(SUMMARY, shape, arms, ratios, notes)


def worker(out: Path, rounds: int, smoke: bool) -> None:
    """One torchrun rank: build, take rank 0's weights and inputs, A/B/A rounds; rank 0 writes {shape, arms, ratios,
    notes} to `out`."""
    import torch.distributed as dist

    from workbench import distributed
    from workbench.evidence.timing import aba_rounds

    device = distributed.init_worker("cpu" if smoke else "cuda", timeout_s=TIMEOUT_S)
    rank, world = dist.get_rank(), dist.get_world_size()
    built = forward_h3.build(forward_h3.SMOKE_CONFIG if smoke else {}, device, torch.bfloat16, seed=0)
    model = built.pop("model")
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)
    inputs = forward_h3.packed_inputs(model, forward_h3.SMOKE if smoke else forward_h3.FULL, device, seed=1)
    for value in inputs.values():
        if isinstance(value, torch.Tensor):
            dist.broadcast(value, src=0)
    session = forward_h3.transformer_session(model, device)
    notes: list[str] = []
    configs = split_arms("h3", device, world, notes)
    outputs: dict[str, Any] = {}
    errors: dict[str, str] = {}

    def visit(name: str) -> float:
        def forward() -> None:
            with torch.inference_mode():
                outputs.setdefault(name, tuple(model(**inputs)))

        return rank_visit(session, configs[name], name.startswith("ulysses") or rank == 0, forward)

    for name in list(configs):  # untimed checks (compiles included); an arm that cannot run is dropped on every rank
        try:
            visit(name)
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"
    failed = [None] * world
    dist.all_gather_object(failed, sorted(errors))
    dropped = sorted({name for names in failed for name in names})
    if "1-gpu" in dropped:
        raise RuntimeError(f"{NAME}: the 1-gpu arm cannot run: {errors.get('1-gpu', 'on another rank')}")
    others = {name: (lambda name=name: visit(name)) for name in configs if name != "1-gpu" and name not in dropped}
    measured = aba_rounds(("1-gpu", lambda: visit("1-gpu")), others, rounds)
    if rank != 0:
        return
    reference = outputs["1-gpu"]
    arms: dict[str, Any] = {}
    for name in configs:
        row: dict[str, Any] = {"config": configs[name]}
        if name in dropped:
            row["error"] = errors.get(name, "failed on another rank")
        seconds = measured.seconds.get(name) or []
        if seconds:
            row.update(median_s=statistics.median(seconds), seconds=seconds)
        if name in outputs and name != "1-gpu":
            row.update(rel_l2_vs_1gpu=rel_l2(outputs[name], reference), equal_to_1gpu=equal(outputs[name], reference))
        single = outputs.get("1-gpu+exact-fast")
        if name == "ulysses+exact-fast" and name in outputs and single is not None:  # against the same profile
            row.update(rel_l2_vs_1gpu_exact_fast=rel_l2(outputs[name], single),
                       equal_to_1gpu_exact_fast=equal(outputs[name], single))  # fmt: skip
        arms[name] = row
    shape = {"rows": inputs["position_ids"].shape[0], "layers": model.config.num_layers,
             "heads": model.config.num_attention_heads, "head_dim": model.config.attention_head_dim,
             "parameters": built["parameters"], "dtype": "bfloat16"}  # fmt: skip
    record = {
        "shape": shape,
        "arms": arms,
        "ratios": {key: value.to_dict() for key, value in measured.ratios().items()},
        "notes": notes + [f"arm {name} failed during the rounds: {error}" for name, error in measured.errors.items()],
    }
    write_atomic(out, json_bytes(record))


if __name__ == "__main__":
    worker_main("a torchrun worker of the parallel-h3 scenario", worker)
