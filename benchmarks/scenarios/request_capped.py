"""Issue 23's Wan2.1-14B bars (and issue 24's Wan2.2-A14B under 48 GiB): whole requests at the Wan2.1-T2V-14B shape
(`wan.random_14b`: 40 layers, dim 5120, 14.3B parameters, random weights, bf16, built on the GPU; 480x832, 81 frames,
`REQUEST_CAPPED_STEPS` steps (default 6, as request-wan) with CFG 5) through `Session.generate`, resident (uncapped)
against the same request under a cap of `REQUEST_CAPPED_CAP` (default 24GiB), each arm on the same weights in the
same process. `REQUEST_CAPPED_MODEL=wan2.2-a14b` runs the Wan2.2-T2V-A14B shape instead (`wan.random_a14b`: two such
experts, ~57 GB, both resident in the uncapped arm; take REQUEST_CAPPED_CAP=48GiB for issue 24's bar):

- `plan`: the session's memory budget, `Session.open(model, memory=MemoryBudget("24GiB", activation, request))` with
  the activation peaks per stage measured in this process's resident warm-up (allocated peak less the weights). The
  plan (printed into the notes, whole in the row), the receipt's bytes moved and the per-stage peaks are recorded.
  Contract bitwise: latents and frames equal resident (frames not, where the plan tiles the decode; the plan says).
- `group_offload`: the workbench plugin over diffusers' block-level group offloading (one block per group, CUDA
  streams, pinned host copies of the transformer); text encoder and VAE stay resident. Contract bitwise.
- `model_cpu_offload`: diffusers' `enable_model_cpu_offload` (each component on the device whole while it runs).
  Contract bitwise. The 14B transformer alone is over 24 GiB: one attempt is made and its error recorded; the rounds
  run only when the attempt completes.
- `sequential_cpu_offload`: diffusers' `enable_sequential_cpu_offload` (accelerate copies each leaf module's weights
  from pageable host memory before its forward). Contract bitwise. First one A/B/A round of single transformer
  forwards (the request's latent shape, its prompt, timestep 500); then one A/B/A round of whole requests only if
  its estimate (the resident request plus the forwards' measured extra per denoiser forward) ends before
  `--max-seconds`; otherwise the row says why it was skipped.

The cap: on the diffusers arms `set_per_process_memory_fraction` around the request (`memory.Capped`), installing and
removing outside it; on `plan` the residency sets it when it arranges the model and `Residency.dismantle` lifts it.
Every visit installs its arm and removes it afterwards (untimed; the model is resident again, checked before each
resident visit), and flushes torch's pinned host cache: at most one host copy of the model lives at a time
(group offload's pinned copy, or the plan's streamed blocks, or the pipeline parked by diffusers' offloading).

Parts: one per arm of `REQUEST_CAPPED_ARMS` (a comma list, default all, in that order), each an A/B/A of its own
against resident requests (`workbench.evidence.timing.aba_rounds`; ratios are resident / arm seconds, formed inside
one part, so one process). Each process first runs one untimed 1-step resident request (every kernel at the timed
shapes; its stage peaks are the measured activations); its first timed resident request is the reference every
visit's output is compared with. The parts run in chunks across device calls as request-wan22's do
(`workbench.evidence.resume.Journal`, `<out>/request-capped/calibrate.partial.json`; `--max-seconds` stops before a
part expected to end past it; the same command continues; a record of other settings is refused).
`--smoke`: tiny-wan (tiny-wan22 for wan2.2-a14b) on the CPU, 1 step at 5 frames of 16x16, the plan at the smallest cap that fits (estimated
activations; a CPU enforces nothing) and model_cpu_offload; group_offload and sequential offload are CUDA-only here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.envelope import Context, Measurement, journal_parts
from benchmarks.scenarios.memory import Capped
from benchmarks.scenarios.request_wan import stage_notes
from benchmarks.scenarios.ring import EMPTY_HOST_CACHE
from benchmarks.workloads import wan_forward_inputs, wan_request
from workbench import Result, Session
from workbench.accelerations.memory.ring import module_bytes
from workbench.evidence.resume import Journal, digest, parts_line
from workbench.evidence.timing import aba_rounds, time_call
from workbench.memory_plan import MemoryBudget, gib, plan_for
from workbench.models import resolve, wan

NAME = "request-capped"
SUMMARY = (
    "issues 23/24: Wan2.1-14B (or Wan2.2-A14B) shape 480x832x81 request, CFG 5, under a 24 GiB (or the set) cap: the "
    "session's memory plan vs diffusers' group / model / sequential offloading vs resident (uncapped)"
)
GPUS = 1
STOPS_AT_MAX_SECONDS = True  # reads --max-seconds (benchmarks/__main__.py)
SETTINGS = (
    "REQUEST_CAPPED_MODEL",
    "REQUEST_CAPPED_CAP",
    "REQUEST_CAPPED_STEPS",
    "REQUEST_CAPPED_ARMS",
)  # environment it reads (the record names those set)
ALLOCATOR = "expandable_segments:True"  # the harness sets it; see benchmarks/__main__.py
CAP, STEPS = "24GiB", 6
MODELS = {"wan2.1-14b": wan.random_14b, "wan2.2-a14b": wan.random_a14b}  # REQUEST_CAPPED_MODEL
ARMS = ("plan", "group_offload", "model_cpu_offload", "sequential_cpu_offload")
# what a CPU runs: group_offload is a CUDA plugin, and accelerate's sequential offload with the CPU as its execution
# device ("cpu:0", as diffusers names it) leaves a shared embedding a plain tensor and fails on the next move
CPU_ARMS = ("plan", "model_cpu_offload")
DIFFUSERS = {"model_cpu_offload": "enable_model_cpu_offload", "sequential_cpu_offload": "enable_sequential_cpu_offload"}
GROUP_OFFLOAD = {"group_offload": {}}
MOVED = ("bytes_moved", "component_bytes_moved", "text_bytes_moved")  # the residency receipt's host -> device bytes


def settings(smoke: bool) -> tuple[int, tuple[str, ...], str, str]:
    """(steps, arms, model, cap) from REQUEST_CAPPED_STEPS, REQUEST_CAPPED_ARMS, REQUEST_CAPPED_MODEL and
    REQUEST_CAPPED_CAP; ValueError naming the variable. A smoke run takes 1 step and the arms a CPU runs."""
    text = os.environ.get("REQUEST_CAPPED_STEPS", str(STEPS))
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise ValueError(f"REQUEST_CAPPED_STEPS: {text!r}; allowed: an integer number of steps from 1 to 100")
    names = os.environ.get("REQUEST_CAPPED_ARMS", ",".join(ARMS)).split(",")
    if not names or set(names) - set(ARMS) or len(set(names)) < len(names):
        raise ValueError(
            f"REQUEST_CAPPED_ARMS: {','.join(names)!r}; allowed: a comma list of {', '.join(ARMS)}, each once"
        )
    model = os.environ.get("REQUEST_CAPPED_MODEL", "wan2.1-14b")
    if model not in MODELS:
        raise ValueError(f"REQUEST_CAPPED_MODEL: {model!r}; allowed: {', '.join(MODELS)}")
    cap = os.environ.get("REQUEST_CAPPED_CAP", CAP)
    try:
        MemoryBudget.of(cap)
    except ValueError as error:
        raise ValueError(f"REQUEST_CAPPED_CAP: {cap!r}; allowed: a size such as 24GiB or 48GiB ({error})") from None
    if smoke:
        return 1, tuple(n for n in names if n in CPU_ARMS), model, cap
    return int(text), tuple(names), model, cap


def run(context: Context) -> Measurement:
    started = time.perf_counter()
    smoke, device = context.smoke, context.device
    steps, arms, model_name, cap = settings(smoke)
    building = time.perf_counter()
    if smoke:  # the tiny model of the same kind: one transformer, or Wan2.2's two experts
        model = resolve("tiny-wan22" if model_name == "wan2.2-a14b" else "tiny-wan", dtype=torch.bfloat16)
    else:
        model = MODELS[model_name](0, device, torch.bfloat16)
    for component in model.pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            component.requires_grad_(False)  # inference only; accelerate re-wraps weights under inference_mode
    build = time.perf_counter() - building
    request = dataclasses.replace(wan_request(steps, smoke), steps=steps)
    deadline = None if context.max_seconds is None else started + context.max_seconds
    capped = CappedRequests(model, device, request, deadline, context.rounds, cap)
    shape = capped.shape(build)
    folder = None if context.out is None else context.out / NAME
    run_key = {"model": model.name, "dtype": "bfloat16", "device": device.type, "rounds": context.rounds,
               "request": shape["request"], "cap": capped.cap, "arms": list(arms)}  # fmt: skip
    limit = None if deadline is None else max(0.0, deadline - time.perf_counter())
    journal = Journal(folder, NAME, run_key, at_most=len(arms), max_seconds=limit)
    with journal_parts(folder):
        parts = [journal.step(arm, {"arm": arm, "steps": steps}, lambda a=arm: capped.part(a), capped.expected(arm))
                 for arm in arms]  # fmt: skip
    rows, ratios, notes = {}, {}, []
    for part in parts:
        rows |= part["arms"]
        ratios |= part["ratios"]
        notes += part["notes"]
    if len({part["reference"] for part in parts}) > 1:
        notes.append("The resident requests of different processes differ bit for bit: compare parts with care.")
    notes.append(
        parts_line(journal.steps, lambda s: s["key"]["arm"])
        + " Ratios are resident / arm request seconds (< 1: the arm is slower), each inside its part."
    )
    notes.append(
        "Contracts: plan bitwise (latents and frames equal resident; frames differ where the plan tiles the decode); "
        "group_offload, model_cpu_offload and sequential_cpu_offload bitwise (the same kernels on weights copied to "
        "the device). In a forward row, latents_equal_resident compares the transformer's output."
    )
    notes.append(
        "Smoke: tiny-wan on the CPU (nothing enforces a cap there); the numbers say nothing about speed."
        if smoke
        else "Times: the session's request total (CUDA events per stage); installs untimed. Random weights."
    )
    return Measurement(SUMMARY, shape, rows, ratios, notes)


class CappedRequests:
    """The resident session over `model`, the arms' visits on the same weights, and one part per arm."""

    def __init__(
        self, model: Any, device: torch.device, request: Any, deadline: float | None, rounds: int, cap: str = CAP
    ):
        self.model, self.device, self.request, self.deadline, self.rounds = model, device, request, deadline, rounds
        self.cuda = device.type == "cuda"
        self.pipe = model.pipeline
        self.resident = Session.open(model, device=str(device), dtype="bfloat16")
        self.weights = {n: module_bytes(c) for n, c in self.pipe.components.items() if isinstance(c, torch.nn.Module)}
        self.warmup = self.resident.generate(dataclasses.replace(request, steps=1), progress=False)
        total = sum(self.weights.values())
        activation = {stage: max(0, peak - total) for stage, peak in self.warmup.memory.items()}
        if self.cuda:
            self.cap = MemoryBudget.of(cap).cap_bytes
        else:  # the smallest cap the estimates allow: the plan offloads what it can
            resolved = self.resident.resolve(request)
            self.cap = plan_for(model, MemoryBudget(2**40, request=request), resolved).minimum_cap
        self.budget = MemoryBudget(self.cap, activation=activation, request=request)
        self.reference: Result | None = None  # this process's first timed resident request
        self.plan: Any = None  # the plan arm's, once it ran

    def shape(self, build: float) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "dtype": "bfloat16",
            "request": self.resident.resolve(self.request).to_dict(),
            "cap": self.cap,
            "weights_bytes": self.weights,
            "transformer_parameters": sum(p.numel() for p in self.pipe.transformer.parameters()),
            "activation_bytes": dict(self.budget.activation),
            "activation_source": "measured (1-step resident warm-up)" if self.cuda else "estimate",
            "build_seconds": build,
            "warmup_seconds": self.warmup.timings,
        }

    def request_s(self) -> float:
        """The resident request's seconds, estimated from the 1-step warm-up."""
        return self.warmup.timings["total"] + (self.request.steps - 1) * self.warmup.timings["denoise"]

    def expected(self, arm: str) -> float:
        """About how long `arm`'s part takes: an A/B/A of r rounds is r + 1 resident requests and r of the arm's, each
        at the resident request's time t times the arm's assumed slowdown (the plan 1.1x, group offloading 1.2x:
        above what the request-capped records show), plus its installs."""
        t, r = self.request_s(), self.rounds
        return {"plan": (r + 1) * t + 1.1 * r * t + 20 * r, "group_offload": (r + 1) * t + 1.2 * r * t + 40 * r,
                "model_cpu_offload": t + 60, "sequential_cpu_offload": 4.5 * t + 60}[arm]  # fmt: skip

    def part(self, arm: str) -> dict[str, Any]:
        """`arm` against resident requests, A/B/A: rows, ratios, notes and the reference's digest."""
        notes: list[str] = []
        visits: dict[str, list[dict[str, Any]]] = {"resident": [], arm: []}
        rows: dict[str, Any] = {}
        candidate = {"plan": self._plan, "group_offload": self._group_offload}.get(arm) or (
            lambda: self._diffusers(DIFFUSERS[arm])
        )
        run = True
        if arm == "model_cpu_offload":
            run = self._attempt(candidate, arm, rows, notes)
        elif arm == "sequential_cpu_offload":
            run = self._forwards_first(arm, rows, notes)
        if run:
            rounds = self.rounds if arm != "sequential_cpu_offload" else 1
            measured = aba_rounds(
                ("resident", lambda: self._keep(visits["resident"], self._resident())),
                {arm: lambda: self._keep(visits[arm], candidate())},
                rounds,
            )
            notes += [f"arm {name} failed during the rounds: {error}" for name, error in measured.errors.items()]
            rows[f"resident ({arm} part)"] = self._row(visits["resident"])
            rows[arm] = self._row(visits[arm], measured.paired_baseline.get(arm))
            ratios = {key: ratio.to_dict() for key, ratio in measured.ratios().items()}
            notes += stage_notes(rows)
            if self.cuda and (used := rows[arm]["allocator"]["nvml_peak_used_bytes"]):
                notes.append(
                    f"{arm}: NVML device peak {gib(used)}, {'within' if used <= self.cap else 'over'} the "
                    f"{gib(self.cap)} cap (the whole device: the CUDA context, the libraries' memory and the "
                    f"allocator's cached blocks; the allocated peak is the row's)."
                )
        else:
            ratios = {}
        if arm == "plan" and self.plan is not None:
            rows[arm]["plan"] = self.plan.to_dict()
            receipts = [v["receipts"]["memory_residency"] for v in visits[arm]]
            moved = max((sum(r.get(k, 0) for k in MOVED) for r in receipts), default=0)
            peaks = ", ".join(f"{stage} {gib(peak)}" for stage, peak in rows[arm].get("peak_bytes", {}).items())
            notes.append(f"The {str(self.plan).replace(chr(10) + '  ', '; ')}; measured peaks {peaks or 'none'}; "
                         f"moved {gib(moved)} per request (receipt).")  # fmt: skip
        reference = "none" if self.reference is None else digest(self.reference)["latents"]
        return {"arms": rows, "ratios": ratios, "notes": notes, "reference": reference}

    # -- visits: each returns what one timed request of its arm gave -------------------------------------------
    def _resident(self) -> dict[str, Any]:
        self._check_resident()
        return self._timed(self.resident.generate, 0.0, resident=True)

    def _plan(self) -> dict[str, Any]:
        if self.cuda:
            torch.cuda.empty_cache()  # the cap counts cached blocks too
        self.resident.close()  # a model is held by one open session; the resident one opens again after
        start = time.perf_counter()
        try:
            session = Session.open(self.model, device=str(self.device), dtype="bfloat16", memory=self.budget)
            install = time.perf_counter() - start
            try:
                self.plan = session.memory_plan
                return self._timed(session.generate, install)
            finally:
                session.residency.dismantle()
                self._flush()
        finally:
            self.resident = Session.open(self.model, device=str(self.device), dtype="bfloat16")

    def _group_offload(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.resident.accelerate(GROUP_OFFLOAD)
        install = time.perf_counter() - start
        try:
            with self._capped():
                return self._timed(self.resident.generate, install)
        finally:
            self.resident.accelerate({})
            self._flush()

    def _diffusers(self, method: str, call: Callable[[], Any] | None = None) -> Any:
        """`method` of the pipeline installed, one request (or `call()`) under the cap, hooks removed after."""
        start = time.perf_counter()
        getattr(self.pipe, method)(device=self.device)
        install = time.perf_counter() - start
        try:
            with self._capped():
                return self._timed(self.resident.generate, install) if call is None else call()
        finally:
            self.pipe.remove_all_hooks()
            self.pipe.to(self.device)
            self._flush()

    def _timed(self, generate: Callable[..., Result], install: float, resident: bool = False) -> dict[str, Any]:
        """One request; its outputs compared with the reference (None before this process's first resident one)."""
        retries = self._retries()
        result = generate(self.request, progress=False)
        retries = self._retries() - retries
        if resident and self.reference is None:
            self.reference = result
        ref = self.reference
        return {
            "seconds": result.timings["total"],
            "timings": dict(result.timings),
            "memory": dict(result.memory),
            "latents_equal": None if ref is None else bool(torch.equal(result.latents, ref.latents)),
            "frames_equal": None if ref is None else bool(np.array_equal(result.frames, ref.frames)),
            "install_s": install,
            "retries": retries,
            "receipts": result.receipts,
            "device_peak": result.metadata["nvml"].get("peak_used_bytes"),
            "reserved_peak": reserved_peak(result),
        }

    # -- the arms that may not run ------------------------------------------------------------------------------
    def _attempt(self, candidate: Callable[[], Any], arm: str, rows: dict[str, Any], notes: list[str]) -> bool:
        """One untimed request of `arm` under the cap: False (the row says why) when it fails."""
        try:
            candidate()
            return True
        except Exception as error:  # out of memory under the cap: the finding
            largest = max(self.weights, key=self.weights.get)
            rows[arm] = {"ran": False, "error": f"{type(error).__name__}: {str(error)[:300]}",
                         "why": {f"{largest}_bytes": self.weights[largest], "cap_bytes": self.cap}}  # fmt: skip
            notes.append(
                f"{arm}: did not complete under the cap ({type(error).__name__}); it moves each component onto the "
                f"device whole, and the {largest} alone holds {gib(self.weights[largest])} against a cap of "
                f"{gib(self.cap)}."
            )
            return False

    def _forwards_first(self, arm: str, rows: dict[str, Any], notes: list[str]) -> bool:
        """One A/B/A round of single transformer forwards, resident against `arm` under the cap; True when one A/B/A
        round of whole requests is expected to end before the deadline (else the row says why not)."""
        kwargs, _ = wan_forward_inputs(self.resident, self.request)
        outputs: dict[str, list[torch.Tensor]] = {"resident": [], arm: []}

        def forward(name: str) -> float:
            with torch.inference_mode():
                timing = time_call(lambda: outputs[name].append(self.pipe.transformer(**kwargs)[0]), self.device,
                                   1, 0, queued=False)  # fmt: skip
            return timing.median_s

        def resident() -> float:
            self._check_resident()
            return forward("resident")

        measured = aba_rounds(("resident forward", resident),
                              {f"{arm} forward": lambda: self._diffusers(DIFFUSERS[arm], lambda: forward(arm))}, 1)  # fmt: skip
        if measured.errors:
            rows[arm] = {"ran": False, "error": measured.errors[f"{arm} forward"]}
            notes.append(f"{arm}: its transformer forward failed under the cap; no request was tried.")
            return False
        res, seq = statistics.median(measured.seconds["resident forward"]), measured.seconds[f"{arm} forward"][0]
        equal = all(torch.equal(o, outputs["resident"][0]) for o in outputs[arm])  # the transformer's output
        rows[f"{arm} forward"] = {"ran": True, "vs_resident": res / seq, "latents_equal_resident": equal,
                                  "median_s": seq, "seconds": [seq]}  # fmt: skip
        rows["resident forward"] = {"ran": True, "median_s": res, "seconds": measured.seconds["resident forward"]}
        forwards = self.request.steps * (2 if self.request.guidance > 1 else 1)
        resident_s = self.request_s()
        estimate = resident_s + forwards * (seq - res)
        needed = 2 * resident_s + 1.2 * estimate + 30
        notes.append(
            f"{arm}: one transformer forward {seq:.2f} s against {res:.2f} s resident; a request of {forwards} "
            f"forwards is estimated at {estimate:.0f} s."
        )
        if self.deadline is not None and time.perf_counter() + needed > self.deadline:
            rows[arm] = {"ran": False, "skipped": {"reason": "one A/B/A round of requests would end past "
                         "--max-seconds", "needed_s": needed, "estimated_request_s": estimate}}  # fmt: skip
            notes.append(f"{arm}: request skipped: its A/B/A round (~{needed:.0f} s) would end past --max-seconds.")
            return False
        return True

    # -- helpers ------------------------------------------------------------------------------------------------
    @staticmethod
    def _keep(visits: list[dict[str, Any]], visit: dict[str, Any]) -> float:
        visits.append(visit)
        return visit["seconds"]

    def _row(self, visits: list[dict[str, Any]], paired: list[float] | None = None) -> dict[str, Any]:
        """The docs table's seven columns are the first scalars seen (the resident row's first): ran, its ratio to
        resident (median of the paired visits), peak, under the cap, outputs equal, install seconds; the rest nested."""
        if not visits:
            return {"ran": False}
        peaks = {stage: max(v["memory"].get(stage, 0) for v in visits) for stage in visits[0]["memory"]}
        peak = max(peaks.values(), default=0)
        seconds = [v["seconds"] for v in visits]
        row: dict[str, Any] = {"ran": True}
        if paired:
            row["vs_resident"] = statistics.median(b / s for b, s in zip(paired, seconds, strict=False))
        row["peak_gib"] = peak / 2**30 if self.cuda else None
        if paired is not None:
            row["under_cap"] = peak <= self.cap if self.cuda else None
        row["latents_equal_resident"] = all(v["latents_equal"] for v in visits)
        row["frames_equal_resident"] = all(v["frames_equal"] for v in visits)
        if paired is not None:
            row["install_s"] = statistics.median(v["install_s"] for v in visits)
        row.update(
            median_s=statistics.median(seconds),
            seconds=seconds,
            stages_median_s={s: statistics.median(v["timings"][s] for v in visits) for s in visits[0]["timings"]},
            peak_bytes=peaks,
            allocator={
                "retries": sum(v["retries"] for v in visits),
                "nvml_peak_used_bytes": max(v["device_peak"] or 0 for v in visits),
                "reserved_peak_bytes": max(v["reserved_peak"] or 0 for v in visits),
            },  # fmt: skip
            receipts=visits[-1]["receipts"],
        )
        return row

    def _check_resident(self) -> None:
        """RuntimeError unless every weight is on the device again (an arm's removal that failed part-way)."""
        away = {t.device for c in self.pipe.components.values() if isinstance(c, torch.nn.Module)
                for t in list(c.parameters()) + list(c.buffers()) if t.device.type != self.device.type}  # fmt: skip
        if away:
            raise RuntimeError(f"request-capped: after an arm's removal weights are on {away}, not {self.device}")

    def _capped(self) -> contextlib.AbstractContextManager:
        return Capped(self.device, self.cap) if self.cuda else contextlib.nullcontext()

    def _retries(self) -> int:
        return torch.cuda.memory_stats(self.device)["num_alloc_retries"] if self.cuda else 0

    def _flush(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            if EMPTY_HOST_CACHE is not None:
                EMPTY_HOST_CACHE()


def reserved_peak(result: Any) -> int | None:
    """The allocator's reserved peak over a Result's stages (its stage_end events; None when not measured: CPU)."""
    peaks = [
        e.data["reserved_peak_bytes"]
        for e in result.events
        if e.kind == "stage_end" and "reserved_peak_bytes" in e.data
    ]
    return max(peaks, default=None)
