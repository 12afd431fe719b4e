"""A whole Wan2.1-1.3B-shaped request through `Session.generate`: 480x832, 81 frames, 6 steps with CFG 5 (12
transformer passes), text encoding and VAE decode included; stock against the `exact-fast` profile.

Random weights at the real transformer and VAE shapes, bf16. One untimed pilot request per arm (compiles, and the
output every timed request must equal), then A/B/A rounds of whole requests. Per arm: total and per-stage medians,
peak memory per stage, receipts of the pilot (which plugins ran), and the pilot's latent relative L2 against stock.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import exact_fast, open_wan, wan_request
from workbench import Result, Session
from workbench.evidence.timing import aba_rounds
from workbench.quality.latent import rel_l2

NAME = "request-wan"
SUMMARY = "Wan2.1-1.3B request, 480x832x81, 6 steps CFG 5, through Session.generate: stock vs exact-fast"
GPUS = 1
STEPS = 6


Arm = tuple[dict[str, Any], Callable[[], AbstractContextManager]]  # accelerations config, what wraps its request


class Requests:
    """Pilot and timed requests of arms on a session (installed per request, removed after it); a timed request whose
    latents differ from its arm's pilot is counted, and its row says `outputs_match_pilot: false`. Rows compare each
    pilot's latents with the `reference` arm's pilot."""

    def __init__(self, session: Session, request: Any, reference: str = "stock"):
        self.session, self.request, self.reference = session, request, reference
        self.pilots: dict[str, Result] = {}
        self.timed: dict[str, list[Result]] = {}
        self.mismatches: dict[str, int] = {}  # timed requests whose latents differ from the arm's pilot

    def generate(self, config: dict[str, Any], within: Callable[[], AbstractContextManager] = nullcontext) -> Result:
        """One request of arm `config`; `within()` wraps the request only (not the install or the removal)."""
        self.session.accelerate(config)
        try:
            with within():
                return self.session.generate(self.request, progress=False)
        finally:
            self.session.accelerate({})

    def visit(
        self, name: str, config: dict[str, Any], within: Callable[[], AbstractContextManager] = nullcontext
    ) -> float:
        result = self.generate(config, within)
        if not torch.equal(result.latents, self.pilots[name].latents):
            self.mismatches[name] = self.mismatches.get(name, 0) + 1
        self.timed.setdefault(name, []).append(result)
        return result.timings["total"]

    def row(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        pilot, timed = self.pilots[name], self.timed.get(name, [])
        row: dict[str, Any] = {"config": config, "receipts": pilot.receipts, "exact": pilot.exact}
        if timed:
            row["seconds"] = [r.timings["total"] for r in timed]
            row["median_s"] = statistics.median(row["seconds"])
            row["outputs_match_pilot"] = not self.mismatches.get(name)
            row["stages_median_s"] = {
                stage: statistics.median(r.timings[stage] for r in timed) for stage in timed[0].timings
            }
            row["peak_bytes"] = {stage: max(r.memory.get(stage, 0) for r in timed) for stage in timed[0].memory}
        if name != self.reference:
            row[f"latent_rel_l2_vs_{self.reference}"] = rel_l2(pilot.latents, self.pilots[self.reference].latents)
        return row


def compare_requests(requests: Requests, arms: dict[str, Arm], rounds: int, notes: list[str]) -> tuple[dict, dict]:
    """One untimed pilot request per arm, then A/B/A rounds of whole requests of every other arm against
    `requests.reference` (an arm of `arms`): (rows, ratios). An arm failing in the rounds is dropped, noted."""
    for name, (config, within) in arms.items():
        requests.pilots[name] = requests.generate(config, within)
    base = requests.reference
    measured = aba_rounds(
        (base, lambda: requests.visit(base, *arms[base])),
        {name: (lambda name=name: requests.visit(name, *arms[name])) for name in arms if name != base},
        rounds,
    )
    for name, error in measured.errors.items():
        notes.append(f"arm {name} failed during the rounds: {error}")
    rows = {name: requests.row(name, config) for name, (config, _) in arms.items()}
    return rows, {key: ratio.to_dict() for key, ratio in measured.ratios().items()}


def stage_notes(rows: dict[str, Any]) -> list[str]:
    """One sentence per timed arm: its per-stage medians (the envelope's docs table shows no nested values)."""
    notes = []
    for name, row in rows.items():
        if "stages_median_s" in row:
            split = ", ".join(f"{stage} {seconds:.3f} s" for stage, seconds in row["stages_median_s"].items())
            notes.append(f"Stage split of {name} (medians): {split}.")
    return notes


def run(context: Context) -> Measurement:
    notes: list[str] = []
    session = open_wan(context.smoke, context.device)
    request = wan_request(STEPS, context.smoke)
    configs = {"stock": {}, "exact-fast": exact_fast("wan", context.device, notes, session.model)}
    arms, ratios = compare_requests(
        Requests(session, request), {name: (config, nullcontext) for name, config in configs.items()}, context.rounds,
        notes,
    )  # fmt: skip
    shape = {"model": session.model.name, "request": session.resolve(request).to_dict(), "dtype": "bfloat16",
             "init_seconds": session.init_seconds}  # fmt: skip
    notes.append(
        "Times: the session's request total (CUDA events per stage); pilots untimed."
        if not context.smoke
        else "Smoke: tiny-wan, 5 frames at 16x16, 1 step, on the CPU; the numbers say nothing about speed."
    )
    return Measurement(SUMMARY, shape, arms, ratios, notes)
