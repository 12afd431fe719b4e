"""Group offload under a memory cap: a Wan2.1-1.3B-shaped request (480x832x81, 6 steps CFG 5, bf16) with the denoiser's
blocks kept in CPU memory and streamed to the GPU (`group_offload`, contract bitwise), against stock.

The cap is the stock request's peak allocated memory less half the transformer's weight bytes: stock cannot meet it,
group offload (at most two groups resident) must. It is enforced on the offload arm's visits with
`torch.cuda.set_per_process_memory_fraction` at the cap less what the device spends outside the allocator (an allocation
past it raises out-of-memory, recorded as the arm's failure); stock runs uncapped. A/B/A rounds of whole requests; per
arm the peak per stage and whether the latents equal stock's. `--smoke`: group_offload needs CUDA, so the smoke runs the
stock path only (see its notes).
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios.request_wan import Requests
from benchmarks.workloads import open_wan, wan_request
from workbench.accelerations.memory.residency import hold_cap
from workbench.evidence.timing import aba_rounds

NAME = "memory"
SUMMARY = "Wan2.1-1.3B request under a GPU memory cap: group_offload vs stock (uncapped)"
GPUS = 1
ALLOCATOR = "expandable_segments:True"  # the harness sets it; see benchmarks/__main__.py
STEPS = 6
OFFLOAD = {"group_offload": {}}


class Capped:
    """Within: this process may allocate at most `cap` bytes on `device`, less what the device spends outside its
    allocator and the libraries' reserve (the session's own rule: `residency.hold_cap`)."""

    def __init__(self, device: torch.device, cap: int):
        if device.index is None:  # set_per_process_memory_fraction needs an index
            device = torch.device(device.type, torch.cuda.current_device())
        self.index, self.cap, self.total = device.index, cap, torch.cuda.get_device_properties(device).total_memory

    def __enter__(self) -> None:
        self.lift = hold_cap(self, self.index, self.cap, self.total)

    def __exit__(self, *exc: object) -> None:
        self.lift()


def run(context: Context) -> Measurement:
    device, notes = context.device, []
    session = open_wan(context.smoke, device)
    request = wan_request(STEPS, context.smoke)
    requests = Requests(session, request)
    requests.pilots["stock"] = requests.generate({})
    weights = sum(p.numel() * p.element_size() for p in session.model.pipeline.transformer.parameters())
    shape: dict[str, Any] = {"model": session.model.name, "request": session.resolve(request).to_dict(),
                             "transformer_weight_bytes": weights}  # fmt: skip
    if device.type != "cuda":
        timed = [requests.visit("stock", {}) for _ in range(context.rounds)]
        notes.append("Smoke: group_offload runs on CUDA only and no cap can be enforced on a CPU; stock path only.")
        return Measurement(SUMMARY, shape, {"stock": {**requests.row("stock", {}), "seconds": timed}}, {}, notes)
    allocator = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    stock_peak = max(requests.pilots["stock"].memory.values())
    cap = int(stock_peak - weights / 2)
    shape.update(stock_peak_bytes=stock_peak, cap_bytes=cap, allocator=allocator)

    def capped() -> Capped:  # the request runs under the cap; installing and removing the offload do not
        return Capped(device, cap)

    def offload() -> float:
        return requests.visit("group_offload", OFFLOAD, capped)

    try:
        requests.pilots["group_offload"] = requests.generate(OFFLOAD, capped)
    except Exception as error:
        raise RuntimeError(f"memory: group_offload did not run under the cap of {cap} bytes: {error}") from error
    rounds = aba_rounds(("stock", lambda: requests.visit("stock", {})), {"group_offload": offload}, context.rounds)
    notes += [f"arm {k} failed during the rounds: {v}" for k, v in rounds.errors.items()]
    arms = {name: requests.row(name, config) for name, config in (("stock", {}), ("group_offload", OFFLOAD))}
    offload_peak = max(requests.pilots["group_offload"].memory.values())
    arms["group_offload"].update(
        peak_bytes_max=offload_peak,
        under_cap=offload_peak <= cap,
        latents_equal_stock=bool(
            torch.equal(requests.pilots["group_offload"].latents, requests.pilots["stock"].latents)
        ),
    )
    arms["stock"]["peak_bytes_max"] = stock_peak
    if rounds.seconds["group_offload"]:
        arms["group_offload"]["slowdown_median"] = statistics.median(
            rounds.seconds["group_offload"]
        ) / statistics.median(rounds.seconds["stock"])
    notes.append("Ratios are stock / group_offload request seconds (< 1: offloading costs time).")
    return Measurement(SUMMARY, shape, arms, {k: v.to_dict() for k, v in rounds.ratios().items()}, notes)
