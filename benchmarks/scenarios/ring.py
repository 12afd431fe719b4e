"""The block ring under a memory cap: one forward of the full-size MiniMax-H3 transformer (33.1B, random weights, bf16,
the 52,648-row t2va packing of `forward_h3`), resident (uncapped) against `block_ring` and diffusers' group offloading
(`group_offload`, one block per group, streams) under caps of 48 GiB and 24 GiB, and the ring stacked with the
`exact-fast` profile (`block_ring+exact-fast`: the profile's plugins installed with the same ring), and the ring with
its streamed matrices moved as FP8 (`fp8_ring`: the same resident blocks, about half the bytes per forward; approximate,
so its row reports the relative L2 against resident instead of equality). Issue 23's bars: the ring >= 0.97x resident at
48 GiB and >= 0.92x at 24 GiB, both faster than group offloading at the same cap; stacked with exact-fast, faster than
resident stock (> 1x) under both caps.

The ring's resident block count comes from the planner (`workbench.memory_plan.plan_memory`, keeping
`outside_for(device)` out of the plan) given the cap and the activation peak measured in the resident forward
(allocated peak less the weights). A cap is enforced around each capped arm's timed forwards (`memory.Capped`: the
session's rule, the cap less what the device spends outside the allocator and the libraries' reserve; an allocation
past it raises, recorded as the arm's failure); installing and removing an arm happen outside it. `RING_CAPS=48GiB`
(a comma list of the caps' names) measures a subset, so each cap's A/B/A can fit one device call; `RING_ARMS` (a comma
list of block_ring, group_offload, block_ring+exact-fast, fp8_ring; default all) the arms, e.g.
`RING_ARMS=block_ring+exact-fast` for the stacked bar alone; `--max-seconds` ends the rounds early, before one that
would end past it (the record says after how many). The stacked arms' kernels compile in one untimed forward of
exact-fast alone (resident, uncapped) before the rounds; its output is what the stacked arms must equal (the ring is
bitwise; exact-fast's own contract is `reduction` against stock). After each capped visit the pinned host copies go back
to the OS (torch's host-cache flush): the host allocator caches freed pinned memory, and the arms' copies (up to the
whole 66 GB model each) would otherwise pile up in the machine's memory. A/B/A rounds through
`workbench.evidence.timing.aba_rounds`, one timed forward per visit; per arm its peak, its allocator retries over the
timed forwards (`num_alloc_retries`: under the cap the caching allocator frees cached blocks, with device syncs, and
retries; the ring's fixed slots should make none) and whether its output equals the resident one. Runs with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (`ALLOCATOR`: the harness sets it before CUDA starts). `--smoke`:
tiny-h3's transformer (8 blocks) on the CPU with the estimated activation and two caps, the smallest that fits and
halfway from it to the resident peak; the ring runs its schedule (no copies on one memory), alone and with exact-fast
(its Triton kernels interpreted), and group offloading (CUDA only) is left out.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios.forward_h3 import FULL, SMOKE, SMOKE_CONFIG, build, packed_inputs, transformer_session
from benchmarks.scenarios.memory import Capped
from benchmarks.workloads import ForwardArm, equal, exact_fast
from workbench.accelerations.memory.ring import module_bytes
from workbench.evidence.timing import aba_rounds, time_call
from workbench.memory_estimate import denoise_activation
from workbench.memory_plan import Footprint, gib, outside_for, plan_memory
from workbench.quality.latent import rel_l2

NAME = "ring"
SUMMARY = (
    "MiniMax-H3 33.1B forward under 48/24 GiB caps: block_ring (alone and with exact-fast), fp8_ring and "
    "group_offload vs resident (uncapped)"
)
GPUS = 1
STOPS_AT_MAX_SECONDS = True  # reads --max-seconds (benchmarks/__main__.py)
SETTINGS = ("RING_CAPS", "RING_ARMS")  # environment it reads (the record names those set)
ALLOCATOR = "expandable_segments:True"  # the harness sets it; see benchmarks/__main__.py
GIB = 2**30
CAPS = {"48GiB": 48 * GIB, "24GiB": 24 * GIB}
ARMS = ("block_ring", "group_offload", "block_ring+exact-fast", "fp8_ring")
# torch's flush of its pinned host cache: `_accelerator_emptyHostCache` in 2.13, `_host_emptyCache` before
EMPTY_HOST_CACHE = getattr(torch._C, "_accelerator_emptyHostCache", None) or getattr(torch._C, "_host_emptyCache", None)


def run(context: Context) -> Measurement:
    started = time.perf_counter()
    device, notes = context.device, []
    cuda = device.type == "cuda"
    built = build({**SMOKE_CONFIG, "num_layers": 8} if context.smoke else {}, device, torch.bfloat16, seed=0)
    model = built.pop("model")
    shape = dict(SMOKE if context.smoke else FULL)
    inputs = packed_inputs(model, shape, device, seed=1)
    session = transformer_session(model, device)
    blocks = session.family.blocks(model)
    weights = module_bytes(model)
    rows = inputs["position_ids"].shape[0]

    def forward() -> tuple[torch.Tensor, ...]:
        return tuple(model(**inputs))

    resident = ForwardArm("resident", {})
    with torch.inference_mode():
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        resident.output = forward()
    footprint = Footprint({}, {"transformer": tuple(module_bytes(b) for b in blocks)},
                          {"transformer": weights - sum(module_bytes(b) for b in blocks)}, {})  # fmt: skip
    arm_names = os.environ.get("RING_ARMS", ",".join(ARMS)).split(",")
    if unknown := set(arm_names) - set(ARMS):
        raise ValueError(f"RING_ARMS: {sorted(unknown)}; allowed: a comma list of {', '.join(ARMS)}")
    if cuda:
        activation = torch.cuda.max_memory_allocated(device) - weights
        chosen = os.environ.get("RING_CAPS", ",".join(CAPS)).split(",")
        if unknown := set(chosen) - set(CAPS):
            raise ValueError(f"RING_CAPS: {sorted(unknown)}; allowed: a comma list of {list(CAPS)}")
        caps = {name: CAPS[name] for name in chosen}
    else:  # the planner's estimate (workbench.memory_estimate)
        activation = denoise_activation(session.family, model, rows)
        everything = plan_memory(footprint, {"denoise": activation}, 2**62, forwards=1)
        resident_cap = math.ceil(everything.stage_peaks["denoise"] / 0.9)
        caps = {"halfway": (everything.minimum_cap + resident_cap) // 2, "smallest": everything.minimum_cap}
    fast, fast_output = None, None
    if "block_ring+exact-fast" in arm_names:  # compiles its kernels; what the stacked arms must equal (after the
        # resident peak is read)
        fast = exact_fast("h3", device, notes)
        session.accelerate(fast)
        try:
            with torch.inference_mode():
                fast_output = forward()
        finally:
            session.accelerate({})
    arms, capped, plans = [resident], {}, {}
    for label, cap in caps.items():
        plan = plan_memory(footprint, {"denoise": activation}, cap, forwards=1, outside=outside_for(device))
        plans[label] = str(plan)
        resident_blocks = len(blocks) - len(plan.streamed_blocks["transformer"])
        ring_config = {"block_ring": {"resident_blocks": resident_blocks}}
        if "block_ring" in arm_names:
            arms.append(ForwardArm(f"ring-{label}", ring_config))
            capped[arms[-1].name] = cap
        if fast is not None:
            arms.append(ForwardArm(f"ring+exact-fast-{label}", {**fast, **ring_config}))
            capped[arms[-1].name] = cap
        if "fp8_ring" in arm_names:
            arms.append(ForwardArm(f"fp8_ring-{label}", {"fp8_ring": ring_config["block_ring"]}))
            capped[arms[-1].name] = cap
        if cuda and "group_offload" in arm_names:
            offload = ForwardArm(f"group_offload-{label}", {"group_offload": {}})
            arms.append(offload)
            capped[offload.name] = cap
    if not cuda:
        notes.append(
            "Smoke: group_offload runs on CUDA only and a CPU enforces no cap; the ring's schedule runs without it."
        )
    peaks: dict[str, int] = {}
    retries: dict[str, int] = {}

    def visit(arm: ForwardArm) -> float:
        session.accelerate(arm.config)
        try:
            with Capped(device, capped[arm.name]) if cuda and arm.name in capped else contextlib.nullcontext():
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                    start = torch.cuda.memory_stats(device)["num_alloc_retries"]
                last: list[Any] = [None]
                with torch.inference_mode():
                    timing = time_call(lambda: last.__setitem__(0, forward()), device, 1, 0, queued=False)
                if cuda:
                    peaks[arm.name] = max(peaks.get(arm.name, 0), torch.cuda.max_memory_allocated(device))
                    retries[arm.name] = (
                        retries.get(arm.name, 0) + torch.cuda.memory_stats(device)["num_alloc_retries"] - start
                    )
        finally:
            session.accelerate({})
            if cuda and EMPTY_HOST_CACHE is not None:
                EMPTY_HOST_CACHE()
        if arm.output is None:
            arm.output = last[0]
        arm.mismatches += not equal(last[0], arm.output)
        arm.timings.append(timing)
        return timing.median_s

    round_ends = [time.perf_counter()]  # wall clock as the rounds start and after each (installs, host copies too)
    stopped = []

    def out_of_time(done: Any) -> bool:
        """Another round as long as the last would end past `--max-seconds` from the scenario's start."""
        round_ends.append(time.perf_counter())
        last = round_ends[-1] - round_ends[-2]
        if context.max_seconds is not None and round_ends[-1] - started + last > context.max_seconds:
            stopped.append(len(round_ends) - 1)
        return bool(stopped)

    rounds = aba_rounds(("resident", lambda: visit(resident)), {a.name: (lambda a=a: visit(a)) for a in arms[1:]},
                        context.rounds, stop=out_of_time)  # fmt: skip
    if stopped:
        notes.append(
            f"Stopped after {stopped[0]} of {context.rounds} rounds: another would have ended past "
            f"--max-seconds {context.max_seconds:g} (each round took about {round_ends[-1] - round_ends[-2]:.0f} s)."
        )
    notes += [f"arm {name} failed during the rounds: {error}" for name, error in rounds.errors.items()]
    medians = rounds.medians()
    rows_out: dict[str, Any] = {}
    for arm in arms:
        row: dict[str, Any] = {"config": arm.config, "seconds": rounds.seconds.get(arm.name, [])}
        if arm.name in medians:
            row["median_s"] = medians[arm.name]
        if arm.name in capped:
            row["cap_bytes"] = capped[arm.name]
        if arm.name in peaks:  # CUDA only
            row["peak_bytes"] = peaks[arm.name]
            row["under_cap"] = peaks[arm.name] <= capped.get(arm.name, peaks[arm.name])
            row["alloc_retries"] = retries[arm.name]
        if arm.output is not None and arm is not resident:
            row.update(equal_to_resident=equal(arm.output, resident.output), rel_l2=rel_l2(arm.output, resident.output))
            if "block_ring" in arm.config and fast is not None and set(fast) <= set(arm.config):
                row["equal_to_exact_fast"] = equal(arm.output, fast_output)
        rows_out[arm.name] = row
    shape.update(rows=rows, layers=len(blocks), parameters=built["parameters"], weight_bytes=weights,
                 activation_bytes=activation, activation_source="measured" if cuda else "estimate",
                 plans=plans)  # fmt: skip
    if fast is not None:
        shape["exact_fast"] = {"config": fast, "rel_l2_vs_resident": rel_l2(fast_output, resident.output)}
    if cuda and EMPTY_HOST_CACHE is None:
        notes.append("This torch has no pinned host-cache flush: the arms' pinned copies stayed cached between visits.")
    notes.append(
        f"Ratios are resident (stock, uncapped) / arm forward seconds (< 1: the arm is slower); weights {gib(weights)}."
    )
    return Measurement(SUMMARY, shape, rows_out, {k: v.to_dict() for k, v in rounds.ratios().items()}, notes)
