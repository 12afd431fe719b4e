"""MiniMax-H3's text encoding with its layers streamed through the block ring, against the text model copied onto the
device whole and against it resident: Qwen3-VL-32B's text model (`model_sizes.QWEN3_VL_32B_TEXT`: 64 layers, hidden
5120, FFN 25600; random weights, bf16, about 60 GiB) on a 512-token prompt, run as H3's conditioner runs it
(`output_hidden_states`; H3 reads hidden state 50).

Model: built on the meta device and materialised on the GPU (`model_sizes.materialise`); each `nn.Linear` and
`nn.Embedding` runs its own `reset_parameters()` there, the RMSNorm weights are ones, the rotary table is the
constructor's (float32). Then every weight moves into pinned host chunks (`ring.pin_on_host`), where the memory plan
keeps an offloaded text encoder; the device holds only what the visiting arm puts there.

Arms, one timed forward per visit, A/B/A against `onload`:
- `onload`: the whole text model copied from the pinned chunks onto the device (side stream, then synchronised, as
  the residency brings an offloaded component on for its stage), then the forward, all timed: what a plan that
  moves the text encoder whole costs each request (what the planner did before the text ring).
- `ring-<card>`: the layers the planner streams under that card's plan for the released H3 (`model_sizes.plan`, the
  MiniMax-H3 33.1B column of the README's fits table) stream through RING_IN_FLIGHT slots (allocated before the timed
  part, freed after) with prefetch on a side stream (`ring.Ring`); the embedding, the final norm and the other
  layers are copied on first, timed.
- `resident`: every weight copied on before the timed part: the speed of a card that holds the text model.
Per arm: the allocated peak of its visits, whether its hidden states (50 and the last) equal `resident`'s, and for
ring arms the layers streamed and late per forward and the planned peak (the non-streamed weights, the slots and the
planner's text_encode activation estimate).
`--smoke`: a 12-layer text model of width 64 on the CPU (nothing to copy on one memory; the ring's schedule runs) with
a ring arm streaming every other layer.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import equal
from workbench.accelerations.base import Receipt
from workbench.accelerations.memory.ring import (
    RING_IN_FLIGHT,
    Ring,
    Slots,
    module_bytes,
    pin_on_host,
    streamed_positions,
    tensors_of,
)
from workbench.evidence.timing import aba_rounds, time_call
from workbench.memory_estimate import TEXT_ROWS
from workbench.memory_plan import gib

NAME = "text-ring"
SUMMARY = (
    "MiniMax-H3 text encoding (Qwen3-VL-32B text model, 512 tokens): layers streamed by the ring vs onload vs resident"
)
GPUS = 1
TOKENS = 512  # H3's prompt rows (`h3._denoise_shape`: up to 512 text rows)
HIDDEN_STATE = 50  # the hidden state H3 conditions on
CARDS = ("rtx4090-48gb", "h200")  # a 48 GiB card streams most of the text encoder's layers, an H200 few
SMOKE_TEXT = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 12,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]},
}


def build(text: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """Qwen3-VL's text model of config `text` from the meta device, materialised on `device` (module docstring)."""
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    from workbench.model_sizes import materialise

    config = Qwen3VLConfig(text_config=text).text_config
    config._attn_implementation = "sdpa"
    return materialise(lambda: Qwen3VLTextModel(config), device, dtype, seed)


class _Placement:
    """The text model's weights living in pinned host chunks (CUDA; in place on the CPU), and what each visit puts
    on the device: `onload(skip)` copies every weight but `skip` on (side stream, synchronised), `offload()` points
    every weight back at its host tensor (the device copies are freed)."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model, self.device = model, device
        self.tensors = tensors_of(model)
        if device.type == "cuda":
            pin_on_host(self.tensors)
            torch.cuda.empty_cache()
        self.host = [t.data for t in self.tensors]
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def onload(self, skip: set[int]) -> None:
        if self.stream is None:
            return
        with torch.cuda.stream(self.stream):
            for t, host in zip(self.tensors, self.host, strict=True):
                if id(t) not in skip:
                    t.data = host.to(self.device, non_blocking=True)
        self.stream.synchronize()

    def offload(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream(self.device).synchronize()
        for t, host in zip(self.tensors, self.host, strict=True):
            t.data = host


def run(context: Context) -> Measurement:
    from workbench.model_sizes import QWEN3_VL_32B_TEXT, plan

    device, notes = context.device, []
    cuda = device.type == "cuda"
    start = time.perf_counter()
    model = build(SMOKE_TEXT if context.smoke else QWEN3_VL_32B_TEXT, device, torch.bfloat16, seed=0)
    layers = list(model.layers)
    if cuda:
        torch.cuda.synchronize(device)
    built_s = time.perf_counter() - start
    weights, layer_bytes = module_bytes(model), [module_bytes(layer) for layer in layers]
    placement = _Placement(model, device)
    generator = torch.Generator().manual_seed(1)
    tokens = 16 if context.smoke else TOKENS
    ids = torch.randint(model.config.vocab_size, (1, tokens), generator=generator).to(device)
    read = min(HIDDEN_STATE, len(layers))

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, output_hidden_states=True)
        return out.hidden_states[read], out.last_hidden_state

    if context.smoke:
        rings = {"ring-half": streamed_positions(len(layers), len(layers) // 2)}
        activation = {"ring-half": None}
    else:
        plans = {card: plan("MiniMax-H3 33.1B", card) for card in CARDS}
        rings = {f"ring-{card}": list(p.streamed_text_layers) for card, p in plans.items()}
        activation = {f"ring-{card}": p.activation.get("text_encode") for card, p in plans.items()}
    outputs: dict[str, Any] = {}
    peaks: dict[str, int] = {}
    receipts: dict[str, Receipt] = {}

    def visit(name: str) -> float:
        streamed = rings.get(name, [])
        chosen = [layers[i] for i in streamed]
        skip = {id(t) for layer in chosen for t in tensors_of(layer)}
        ring = slots = None
        try:
            if name == "resident":
                placement.onload(set())
            if chosen:
                slots = Slots(chosen, RING_IN_FLIGHT, device) if cuda else None
                ring = Ring(
                    model, chosen, receipts.setdefault(name, Receipt(("text_blocks_streamed",))), slots, "text_"
                )
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            last: list[Any] = [None]

            def timed() -> None:
                if name != "resident":
                    placement.onload(skip)
                last[0] = forward()

            with torch.inference_mode():
                timing = time_call(timed, device, 1, 0, queued=False)
            if cuda:
                peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device))
        finally:
            if ring is not None:
                ring.unhook()
            placement.offload()
            del slots
        if name not in outputs:
            outputs[name] = last[0]
        elif not equal(last[0], outputs[name]):
            outputs[name + "/mismatch"] = True
        return timing.median_s

    arms = ["resident", *rings]
    rounds = aba_rounds(("onload", lambda: visit("onload")), {a: (lambda a=a: visit(a)) for a in arms}, context.rounds)
    notes += [f"arm {name} failed during the rounds: {error}" for name, error in rounds.errors.items()]
    medians = rounds.medians()
    rows: dict[str, Any] = {}
    for name in ["onload", *arms]:
        row: dict[str, Any] = {"seconds": rounds.seconds.get(name, [])}
        if name in medians:
            row["median_s"] = medians[name]
        if name in peaks:
            row["peak_bytes"] = peaks[name]
        if name in rings:
            streamed = rings[name]
            kept = weights - sum(layer_bytes[i] for i in streamed)
            row.update(streamed_layers=streamed, resident_layers=len(layers) - len(streamed))
            if activation[name] is not None:
                row["planned_peak_bytes"] = kept + RING_IN_FLIGHT * max(layer_bytes) + activation[name]
                if name in peaks:
                    row["within_plan"] = peaks[name] <= row["planned_peak_bytes"]
            receipt = receipts[name].to_dict() if name in receipts else {}
            visits = max(1, len(rounds.seconds.get(name, [])))
            row.update(streamed_per_forward=receipt.get("text_blocks_streamed", 0) / visits,
                       late_per_forward=receipt.get("text_late", 0) / visits)  # fmt: skip
        if name != "resident" and name in outputs and "resident" in outputs:
            row["equal_to_resident"] = equal(outputs[name], outputs["resident"]) and name + "/mismatch" not in outputs
        rows[name] = row
    shape = {
        "tokens": tokens,
        "layers": len(layers),
        "hidden_state": read,
        "weight_bytes": weights,
        "layer_bytes": max(layer_bytes),
        "text_rows_planned": TEXT_ROWS,
        "build_seconds": built_s,
    }
    if context.smoke:
        notes.append("Smoke: one memory, nothing copied; the ring's schedule runs and its counts are real.")
    notes.append(
        f"Ratios are onload / arm seconds (> 1: the arm is faster than copying the whole text model, {gib(weights)}, "
        "onto the device first); resident needs the whole text model on the card."
    )
    return Measurement(SUMMARY, shape, rows, {k: v.to_dict() for k, v in rounds.ratios().items()}, notes)
