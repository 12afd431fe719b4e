"""Issue 23's MiniMax-H3 bar: one whole request of the released MiniMax-H3 (`h3.random_full`: the 33.1B transformer,
Qwen3-VL-32B, the video and audio VAEs, random weights, bf16, built on the GPU) at the reference 10 s t2va size (243
frames of 736x992 at 24 fps, Base16's 17 steps = 16 transformer forwards, a 512-token prompt) through
`Session.generate`, under a device cap of `REQUEST_H3_CAP` (default 48GiB):
`Session.open(model, memory=MemoryBudget(cap, request=request))`, the session's own plan with its estimated
activations (the whole model, ~124 GiB, never runs resident here, so nothing measures them first).

Recorded: the plan (printed, and whole in the row), per-stage seconds (`Result.timings`) and allocated peaks
(`Result.memory`), whether each stage's peak is under the cap, the NVML device peak, the residency's receipt (bytes
moved host -> device, blocks and text layers streamed, late prefetches), `exact` and `finite` (random weights may
overflow; the request is run with `allow_non_finite=True` so the memory record survives that). Each stage's end is
printed as it happens: a run cut off by the device call's limit still says how far it got. Out of device memory
during the request is the finding, not a crash: the row says in which stage, with the stages that finished.

Host memory: the plan keeps in pinned host memory everything it does not keep on the device. At 48 GiB: the 26
streamed transformer blocks and 59 streamed text layers (84.85 GiB) and the offloaded components' remaining weights
(text encoder 8.55 GiB, video VAE 5.19, audio VAE 0.56): 99.1 GiB of a 128 GiB host. torch's pinned allocator rounds
every allocation up to a power of two (one buffer for the streamed weights would take 128 GiB), so the residency pins
in power-of-two chunks (`ring.chunk_layout`), which it takes at their size. Before building anything the scenario
compares what the plan pins so (`host_pinned`, from the released shapes on the meta device) with the host's available
memory: RuntimeError naming both when it does not fit. The shape records the estimate and the host's memory; the
residency's receipt, the bytes it pinned (`host_bytes`).

Time: 16 transformer forwards with the streamed blocks' transfers hidden behind compute, plus the text encode, the
decodes, the build and the pinning; sized to fit one device call. `--smoke`: tiny-h3 on the CPU at its defaults (124
frames of 32x64, 3 steps), planned at the smallest cap that fits (estimated activations; a CPU enforces nothing): the
same code end to end.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil
import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios.request_capped import MOVED, reserved_peak
from workbench import Request, Result, Session
from workbench.accelerations.memory.ring import chunk_layout, tensors_of
from workbench.memory_plan import DEVICE_OUTSIDE, MemoryBudget, MemoryPlan, gib, plan_for
from workbench.models import h3, resolve

NAME = "request-h3-capped"
SUMMARY = (
    "issue 23: a whole MiniMax-H3 33.1B request (text encode, 17-step Base16 denoise, video and audio decode) at 10 s "
    "736x992 t2va under a 48 GiB (or the set) cap: the session's memory plan, peak per stage"
)
GPUS = 1
SETTINGS = ("REQUEST_H3_CAP",)  # environment it reads (the record names those set)
ALLOCATOR = "expandable_segments:True"  # the harness sets it; see benchmarks/__main__.py
CAP = "48GiB"
RELEASE = "MiniMax-H3 33.1B"
TEXT_ROWS = 512  # the prompt's tokens: H3's text rows at the reference packing (`h3._denoise_shape`)
# one token per non-space character with the synthetic tokenizer (`workbench.models.tokenizer`)
PROMPT = " ".join(["a lighthouse keeper climbs the spiral stairs at dusk, gulls wheel over a grey sea"] * 8)


def settings() -> str:
    """The cap from REQUEST_H3_CAP (default 48GiB); ValueError naming the variable and what it takes."""
    cap = os.environ.get("REQUEST_H3_CAP", CAP)
    try:
        MemoryBudget.of(cap)
    except ValueError as error:
        raise ValueError(f"REQUEST_H3_CAP: {cap!r}; allowed: a size such as 48GiB or 24GiB ({error})") from None
    return cap


def prompt(tokenizer: Any) -> str:
    """`PROMPT` cut to exactly TEXT_ROWS tokens of `tokenizer`."""
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    if len(ids) < TEXT_ROWS:
        raise RuntimeError(f"{NAME}: the prompt gives {len(ids)} tokens, fewer than {TEXT_ROWS}")
    return tokenizer.decode(ids[:TEXT_ROWS])


def host_pinned(model: Any, plan: MemoryPlan) -> tuple[int, int]:
    """Pinned host memory `plan` takes for `model`: (the weights' bytes, the bytes of the chunks the residency pins
    them in): the streamed blocks and text layers in one set of chunks (`ring.shared_rings`), each offloaded
    component's other weights in its own (`Residency._offload_group`), each set laid out by `ring.chunk_layout`."""
    pipeline, family = model.pipeline, model.family
    blocks = []
    for name, positions in plan.streamed_blocks.items():
        every = family.blocks(getattr(pipeline, name))
        blocks += [every[i] for i in positions]
    if plan.streamed_text_layers:
        layers = family.text_blocks(pipeline.text_encoder)[1]
        blocks += [layers[i] for i in plan.streamed_text_layers]
    streamed = list({id(t): t for block in blocks for t in tensors_of(block)}.values())
    ids = {id(t) for t in streamed}
    sets = [streamed] + [
        [t for t in tensors_of(getattr(pipeline, name)) if id(t) not in ids] for name in plan.offloaded
    ]
    sizes = [[t.numel() * t.element_size() for t in tensors] for tensors in sets if tensors]
    return sum(map(sum, sizes)), sum(sum(chunk_layout(each)[0]) for each in sizes)


def check_host(cap: str) -> tuple[dict[str, Any], MemoryPlan]:
    """Before anything is built: what the plan for the released shapes under `cap` (`model_sizes.meta_model`) pins,
    as this torch allocates it, against the host's available memory; RuntimeError naming both when it does not fit.
    Returns the record and that plan."""
    from workbench.model_sizes import meta_model, reference_request

    meta = meta_model(RELEASE)
    plan = plan_for(meta, MemoryBudget(cap), reference_request(RELEASE), DEVICE_OUTSIDE)
    exact, need = host_pinned(meta, plan)
    available = psutil.virtual_memory().available
    if need > available:
        raise RuntimeError(
            f"{NAME}: the plan pins {gib(need)} of host memory in power-of-two chunks ({gib(exact)} of weights) and "
            f"the host has {gib(available)} available. Run on a host with more memory, or with a larger REQUEST_H3_CAP"
        )
    return {"pinned_bytes": need, "pinned_exact_bytes": exact, "available_bytes": available}, plan


def run(context: Context) -> Measurement:
    smoke, device = context.smoke, context.device
    cuda = device.type == "cuda"
    cap = settings()
    host, preflight = check_host(cap) if cuda else ({}, None)
    building = time.perf_counter()
    model = h3.random_full(0, device, torch.bfloat16) if not smoke else resolve("tiny-h3", dtype=torch.bfloat16)
    if cuda:
        torch.cuda.synchronize(device)
    build = time.perf_counter() - building
    weights = {n: sum(t.numel() * t.element_size() for t in tensors_of(c))
               for n, c in model.pipeline.components.items() if isinstance(c, torch.nn.Module)}  # fmt: skip
    text = prompt(model.pipeline.tokenizer) if not smoke else "a lighthouse at dusk"
    request = Request(text, mode="t2va")
    if not smoke:
        budget = MemoryBudget(cap, request=request)
    else:  # the smallest cap the estimates allow: the plan offloads and streams what it can
        resolved = request.resolved(model.family, model.defaults)
        budget = MemoryBudget(
            plan_for(model, MemoryBudget(2**40, request=request), resolved).minimum_cap, request=request
        )
    opening = time.perf_counter()
    session = Session.open(model, device=str(device), dtype="bfloat16", memory=budget)
    if cuda:
        torch.cuda.empty_cache()  # the weights the plan moved to host memory leave their cached device blocks behind
    opened = time.perf_counter() - opening
    plan = session.memory_plan
    print(str(plan), flush=True)
    host["plan_pinned_exact_bytes"] = host_pinned(model, plan)[0]  # on CUDA; a CPU pins nothing
    events: list[Any] = []
    session.subscribe(lambda event: _progress(event, events))
    shape = {
        "model": model.name,
        "dtype": "bfloat16",
        "request": session.resolve(request).to_dict(),
        "text_rows": len(model.pipeline.tokenizer(text, add_special_tokens=False)["input_ids"]),
        "cap": plan.cap,
        "weights_bytes": weights,
        "parameters": {
            n: sum(p.numel() for p in model.pipeline.components[n].parameters())
            for n in ("transformer", "text_encoder")
        },  # fmt: skip
        "build_seconds": build,
        "open_seconds": opened,
        "host": host,
        "activation_source": "estimate",
    }
    if preflight is not None:  # the plan checked before the build is the one the session made
        host["plan_equals_preflight"] = plan.to_dict() == preflight.to_dict()
    try:
        row = _row(session.generate(request, progress=False, allow_non_finite=True), plan, cuda)
    except torch.OutOfMemoryError as error:  # over the cap: the finding
        row = _failed(error, events)
    row["plan"] = plan.to_dict()
    notes = [f"The {str(plan).replace(chr(10) + '  ', '; ')}."]
    if row["completed"]:
        peaks = ", ".join(f"{stage} {gib(peak)}" for stage, peak in row["peak_bytes"].items())
        split = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in row["stages_s"].items())
        notes.append(f"Request {row['seconds']:.1f} s ({split}); peaks {peaks or 'not measured (CPU)'}; moved "
                     f"{gib(row['moved_bytes'])} host -> device (receipt).")  # fmt: skip
    else:
        notes.append(f"The request did not complete under the cap: {row['error']} (in {row['failed_stage']}).")
    if cuda and row.get("nvml_peak_used_bytes"):
        used = row["nvml_peak_used_bytes"]
        notes.append(
            f"NVML device peak {gib(used)} ({'within' if used <= plan.cap else 'over'} the {gib(plan.cap)} cap): the "
            "whole device, the CUDA context and the allocator's cached blocks included."
        )
    if cuda:
        notes.append(
            f"Host: the plan pins {gib(host['pinned_bytes'])} in power-of-two chunks "
            f"({gib(host['pinned_exact_bytes'])} exact) of {gib(host['available_bytes'])} available before the build."
        )
    notes.append(
        "Smoke: tiny-h3 on the CPU at the smallest cap the estimates allow (nothing enforces a cap there); the numbers "
        "say nothing about speed or memory."
        if smoke
        else "Random weights; activations estimated by the planner; times are the session's (CUDA events per stage)."
    )
    return Measurement(SUMMARY, shape, {"plan": row}, {}, notes)


def _progress(event: Any, events: list[Any]) -> None:
    """Keeps `event`, and prints a stage's end as it happens."""
    events.append(event)
    if event.kind == "stage_end":
        peak = event.data.get("peak_bytes")
        print(f"{event.stage}: {event.data['seconds']:.1f} s" + (f", peak {gib(peak)}" if peak else ""), flush=True)


def _row(result: Result, plan: MemoryPlan, cuda: bool) -> dict[str, Any]:
    """The completed request: ran, under the cap, exact; then per-stage seconds and peaks, the receipt."""
    receipt = result.receipts["memory_residency"]
    peaks = dict(result.memory)
    return {
        "ran": True,
        "completed": True,
        "peak_gib": max(peaks.values()) / 2**30 if peaks else None,
        "under_cap": all(peak <= plan.cap for peak in peaks.values()) if cuda else None,
        "exact": result.exact,
        "finite": result.finite,
        "seconds": result.timings["total"],
        "stages_s": {stage: s for stage, s in result.timings.items() if stage != "total"},
        "peak_bytes": peaks,
        "under_cap_by_stage": {stage: peak <= plan.cap for stage, peak in peaks.items()},
        "planned_peak_bytes": dict(plan.stage_peaks),
        "nvml_peak_used_bytes": result.metadata["nvml"].get("peak_used_bytes"),
        "reserved_peak_bytes": reserved_peak(result),
        "moved_bytes": sum(receipt.get(key, 0) for key in MOVED),
        "receipt": receipt,
        "non_finite": result.metadata.get("non_finite", []),
    }


def _failed(error: BaseException, events: list[Any]) -> dict[str, Any]:
    """The request that ran out of device memory: the stages that finished (seconds, peaks) and where it stopped."""
    ended = {e.stage: e.data for e in events if e.kind == "stage_end"}
    started = [e.stage for e in events if e.kind == "stage_start" and e.stage not in ended]
    return {
        "ran": True,
        "completed": False,
        "error": f"{type(error).__name__}: {str(error)[:300]}",
        "failed_stage": started[-1] if started else None,
        "stages_s": {stage: data["seconds"] for stage, data in ended.items()},
        "peak_bytes": {stage: data["peak_bytes"] for stage, data in ended.items() if "peak_bytes" in data},
    }
