"""A memory budget for a session: how a loaded model fits under a device cap, decided before anything runs.

`Session.open(model, memory="48GiB")` measures the model (`footprint`), estimates the activation peak of each stage
for the request shape it plans for (`estimate_activation`, or measured values given in `MemoryBudget.activation`),
and picks the cheapest arrangement that fits (`plan_memory`): the plan that moves the fewest bytes host -> device per
request. The choices:

- each component a stage runs (text encoder, VAE, audio VAE, vocoder, connectors: `Family.stage_components`) stays
  resident, or lives in (pinned) host memory and is on the device only during its stages;
- each denoiser keeps all its transformer blocks resident, or streams S of them per forward through a ring
  (`workbench.accelerations.memory.ring`, which also says which S blocks);
- an offloaded text encoder comes onto the device whole for text_encode, or streams T of its decoder layers
  (`Family.text_blocks`) through the same ring while the rest of it comes on whole; the streamed layers move once
  per text-encoder forward (`Family.text_forwards`: twice with a separately encoded negative prompt);
- the denoisers' non-streamed weights stay on the device, or are there during denoise only (host memory in the other
  stages, moved back once per request): what makes room for a large text encoder or decode without streaming more
  blocks every forward;
- the denoisers' streamed blocks move as stored (bitwise), or with `MemoryBudget(ring_transfer="fp8")` their weight
  matrices move as row-wise FP8 (approximate: the blocks compute on the FP8 round trip of their matrices; the ring
  module says how), about half the bytes per forward, and the planner weighs them at those bytes. Only the host copy
  changes: the device slots hold the dequantized weights in their own dtype, the same bytes as stored. The FP8
  transfers' staging buffer (the largest streamed matrix's FP8 bytes and scales) is left to the headroom. The text
  encoder's streamed layers always move as stored: they move once or twice a request, so FP8 would save little while
  perturbing the conditioning of every step;
- the video VAE decodes untiled, or tiled (diffusers' `enable_tiling`) where untiled would not fit without moving
  more bytes (streaming a 14B denoiser's blocks 100 times a request to make room for one untiled decode is no deal).

Peak of a stage = the components not offloaded + the ring's working set + the denoisers' non-streamed weights (in
every stage, or during denoise only) + the offloaded components that stage runs (less the streamed text layers) +
its activation peak. The ring's working set is `RING_IN_FLIGHT` slots (the block computing, the one arriving, the one
released whose kernels may still be queued; fewer when fewer blocks stream), each the size of the largest streamed
block or layer, shared by the denoisers and the text encoder and allocated for the whole session, so on the device in
every stage. A plan fits when every stage's peak is at most `(cap - outside) * (1 - headroom)`: `outside` is what a
CUDA device spends beyond the allocator (`DEVICE_OUTSIDE` for a CUDA session or a card, 0 on the CPU), the headroom
is for the allocator's fragmentation and the libraries' workspaces (attention, convolution algorithms: a cuDNN
convolution denied its workspace falls back to a slower algorithm with other rounding), which no formula here sees.

Activation peaks come from `workbench.memory_estimate` (rough formulas, documented there) or are measured and given in
`MemoryBudget.activation` (a Result's `memory` holds the allocated peak per stage of a CUDA request).

On the CPU a cap is planning arithmetic only (nothing enforces it); on CUDA the session enforces it with
`torch.cuda.set_per_process_memory_fraction` at the cap less what the device already spends outside the allocator
(the CUDA context) and less `LIBRARY_RESERVE` for the kernels the libraries load later, so a wrong plan fails with
out-of-memory instead of borrowing memory the card it plans for does not have.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

from workbench.accelerations.memory.ring import (
    AS_STORED,
    FP8,
    RING_IN_FLIGHT,
    TRANSFERS,
    module_bytes,
    streamed_positions,
    transfer_bytes,
)
from workbench.cards import CARDS, card, is_card
from workbench.memory_estimate import estimate_activation
from workbench.request import Request, number, shown
from workbench.telemetry import STAGES

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
MAX_BYTES = 2**60  # 1 EiB: more than any machine holds, and far inside what int64 and float64 carry
_AMOUNT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
DEFAULT_HEADROOM = 0.1
# What a CUDA device spends outside torch's allocator, kept out of every plan for a CUDA device or a card: the CUDA
# context with the first requests' kernels loaded, and LIBRARY_RESERVE, what the libraries take after the cap is set
# (kernel modules loaded on first launch: cuDNN, cuBLAS, Triton's and FlashAttention's kernels; their own
# workspaces). Why both are needed: benchmarks/results/request-capped-wan14b-24GiB-*.json, request-h3-capped.json.
CUDA_CONTEXT = 768 * 2**20
LIBRARY_RESERVE = 1536 * 2**20
DEVICE_OUTSIDE = CUDA_CONTEXT + LIBRARY_RESERVE
TEXT = "text_encoder"  # the component whose decoder layers may stream (`Family.text_layers`)


def parse_bytes(value: Any, name: str = "memory", cards: bool = False) -> int:
    """`value` in bytes: an int, or a string such as "48GiB", "24GB", "1.5 GiB", "512MiB" (KB/MB/GB/TB are powers
    of 10, KiB/MiB/GiB/TiB powers of 2, case-insensitive). ValueError naming `name` for anything else or <= 0 (and,
    with `cards`, listing the card names `parse_cap` also takes)."""
    allowed = "allowed: a positive int of bytes up to 1 EiB or a string such as '48GiB', '24GB', '512MiB'"
    if cards:
        allowed += f", or a card's name ({', '.join(CARDS)})"
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        number = int(value)
    elif isinstance(value, str) and (match := _AMOUNT.fullmatch(value)) and match[2].upper() in UNITS:
        amount = float(match[1]) * UNITS[match[2].upper()]  # inf past float's range: refused below, never int()ed
        number = int(amount) if amount <= MAX_BYTES else MAX_BYTES + 1
    else:
        raise ValueError(f"{name}: {shown(value)} is not an amount of memory; {allowed}")
    if number <= 0:
        raise ValueError(f"{name}: {shown(value)} is not positive; {allowed}")
    if number > MAX_BYTES:
        raise ValueError(f"{name}: {shown(value)} is more than 1 EiB; {allowed}")
    return number


def parse_cap(value: Any, name: str = "memory") -> int:
    """A memory cap in bytes: what `parse_bytes` takes, or a card's name (`workbench.cards`: that card's memory)."""
    return card(value).memory if is_card(value) else parse_bytes(value, name, cards=True)


def gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB" if value >= 2**26 else f"{value:,} B"


@dataclass(frozen=True)
class MemoryBudget:
    """What `Session.open(..., memory=...)` takes: a cap (or just the cap as "48GiB" / bytes / a card's name).

    `activation`: measured activation peaks per stage (bytes or strings) replacing the estimates; `request`: the
    request shape to plan for (default: the model's defaults); `headroom`: share of the cap left unplanned;
    `ring_transfer`: how the denoisers' streamed blocks move, "as stored" (bitwise) or "fp8" (approximate: results
    are then not exact)."""

    cap: int | str
    activation: dict[str, int | str] = field(default_factory=dict)
    request: Any = None
    headroom: float = DEFAULT_HEADROOM
    ring_transfer: str = AS_STORED

    @classmethod
    def of(cls, memory: Any) -> MemoryBudget:
        """`memory` (a MemoryBudget, or its cap alone) checked field by field, its headroom as a Python float; a bad
        field is a ValueError naming it (`memory.headroom: ...`)."""
        budget = memory if isinstance(memory, MemoryBudget) else cls(memory)
        budget.cap_bytes  # noqa: B018 (validates the cap)
        if not isinstance(budget.activation, dict):
            raise ValueError(f"memory.activation: expected a dict of stage -> bytes, got {shown(budget.activation)}")
        for stage, amount in budget.activation.items():
            if stage not in STAGES:
                raise ValueError(f"memory.activation: unknown stage {shown(stage)}; allowed: {', '.join(STAGES)}")
            parse_bytes(amount, f"memory.activation[{stage!r}]")
        if budget.request is not None and not isinstance(budget.request, Request):
            raise ValueError(f"memory.request: expected a workbench.Request or None, got {shown(budget.request)}")
        try:  # a numpy number taken as the Python float it holds (a plan serialises to JSON)
            headroom = number("memory.headroom", budget.headroom, 0.0, 0.9)
        except ValueError:
            raise ValueError(f"memory.headroom: {shown(budget.headroom)}; allowed: a number in [0, 0.9]") from None
        budget = replace(budget, headroom=headroom)
        if not isinstance(budget.ring_transfer, str) or budget.ring_transfer not in TRANSFERS:
            raise ValueError(
                f"memory.ring_transfer: {shown(budget.ring_transfer)}; allowed: {', '.join(map(repr, TRANSFERS))}"
            )
        return budget

    @property
    def cap_bytes(self) -> int:
        """The cap in bytes: bytes, an amount ("48GiB"), or a card's memory (`workbench.cards`: "rtx4090-48gb")."""
        return parse_cap(self.cap)


@dataclass(frozen=True)
class Footprint:
    """Weight bytes of a loaded model as the planner sees it.

    `components`: every module component that is not a denoiser -> bytes. `blocks`: denoiser -> bytes of each
    transformer block in order; `denoiser_rest`: denoiser -> bytes outside its blocks. `stages`: stage -> the
    components it runs (the planner may offload exactly these). `text_layers`: bytes of each of the text encoder's
    decoder layers in order (`Family.text_blocks`; part of `components["text_encoder"]`), empty where they cannot
    stream. `fp8_blocks`: denoiser -> bytes one FP8 transfer of each block moves (`ring.transfer_bytes`); empty:
    the same as `blocks`."""

    components: dict[str, int]
    blocks: dict[str, tuple[int, ...]]
    denoiser_rest: dict[str, int]
    stages: dict[str, tuple[str, ...]]
    text_layers: tuple[int, ...] = ()
    fp8_blocks: dict[str, tuple[int, ...]] = field(default_factory=dict)


def footprint(model: Any, request: Any = None) -> Footprint:
    """Measure `model` (a LoadedModel) wherever its weights are. With a resolved `request`, `stages` holds only the
    stages it runs (image_encode only with a keyframe)."""
    pipeline, family = model.pipeline, model.family
    denoisers = {name: getattr(pipeline, name, None) for name in family.denoisers}
    denoisers = {name: module for name, module in denoisers.items() if module is not None}
    components = {
        name: module_bytes(module)
        for name, module in pipeline.components.items()
        if isinstance(module, torch.nn.Module) and name not in denoisers
    }
    blocks = {name: tuple(module_bytes(b) for b in family.blocks(module)) for name, module in denoisers.items()}
    rest = {name: module_bytes(module) - sum(blocks[name]) for name, module in denoisers.items()}
    stages = {stage: tuple(c for c in names if c in components) for stage, names in family.stage_components.items()}
    keyframes = request is None or request.image is not None or request.last_image is not None
    runs = {stage: names for stage, names in stages.items() if names and (keyframes or stage != "image_encode")}
    text = getattr(pipeline, TEXT, None) if family.text_layers else None
    layers = tuple(module_bytes(layer) for layer in family.text_blocks(text)[1]) if text is not None else ()
    fp8 = {name: tuple(transfer_bytes(b, FP8) for b in family.blocks(m)) for name, m in denoisers.items()}
    return Footprint(components, blocks, rest, runs, layers, fp8)


@dataclass(frozen=True)
class MemoryPlan:
    """The receipt of a plan: what stays where, the decode mode, the planned peak per stage and what it costs.

    `streamed_blocks`: denoiser -> positions of the blocks the ring streams (empty: all resident).
    `streamed_text_layers`: positions of the text encoder's layers (of `text_layer_count`) the ring streams during
    text_encode (the text encoder is then offloaded; its other weights come on whole for its stage).
    `denoisers_offloaded`: the denoisers' non-streamed weights are on the device during denoise only (host memory
    in the other stages; brought back once per request).
    `bytes_moved`: host -> device bytes per request (offloaded components once per stage that runs them; streamed
    blocks once per denoiser forward, streamed text layers once per text-encoder forward; offloaded denoisers once).
    `resident_bytes`: what is on the device in every stage (components not offloaded, the ring's slots, the
    denoisers' non-streamed weights unless offloaded). `minimum_cap`: the smallest cap any plan fits under.
    `ring_transfer`: how the streamed denoiser blocks move (`MemoryBudget.ring_transfer`; `bytes_moved` counts
    their FP8 bytes with "fp8"); `approximate`: FP8 and some block streams, so results are not exact."""

    cap: int
    usable: int
    resident: tuple[str, ...]
    offloaded: tuple[str, ...]
    streamed_blocks: dict[str, tuple[int, ...]]
    block_counts: dict[str, int]
    streamed_text_layers: tuple[int, ...]
    text_layer_count: int
    denoisers_offloaded: bool
    tiled_decode: bool
    stage_peaks: dict[str, int]
    activation: dict[str, int]
    activation_source: dict[str, str]
    resident_bytes: int
    bytes_moved: int
    forwards: int
    text_forwards: int
    minimum_cap: int
    ring_transfer: str = AS_STORED
    outside: int = 0  # bytes of the cap kept out of the plan (`DEVICE_OUTSIDE` on CUDA)

    @property
    def approximate(self) -> bool:
        return self.ring_transfer == FP8 and any(self.streamed_blocks.values())

    def __str__(self) -> str:
        ring = ", ".join(
            f"{name}: {count - len(self.streamed_blocks[name])} of {count} blocks resident"
            + (f", {len(self.streamed_blocks[name])} streamed {list(self.streamed_blocks[name])}" if
               self.streamed_blocks[name] else "")
            for name, count in self.block_counts.items()
        )  # fmt: skip
        if self.approximate:
            ring += "; streamed blocks move as FP8 (approximate)"
        if self.denoisers_offloaded:
            ring += "; on the device during denoise only"
        text, streamed = self.text_layer_count, len(self.streamed_text_layers)
        layers = (
            [f"  {TEXT}: {text - streamed} of {text} layers resident, {streamed} streamed during text_encode"]
            if streamed
            else []
        )
        peaks = ", ".join(f"{stage} {gib(peak)}" for stage, peak in self.stage_peaks.items())
        return "\n".join(
            (
                f"memory plan under {gib(self.cap)} ({gib(self.usable)} planned"
                + (f", {gib(self.outside)} kept for the CUDA context and libraries" if self.outside else "")
                + f", smallest cap that fits {gib(self.minimum_cap)})",
                f"  resident: {', '.join(self.resident) or 'none'}; offloaded between stages: "
                f"{', '.join(self.offloaded) or 'none'}",
                f"  denoiser: {ring}",
                *layers,
                f"  video decode: {'tiled' if self.tiled_decode else 'untiled'}",
                f"  planned peaks: {peaks}",
                f"  moves {gib(self.bytes_moved)} host->device per request ({self.forwards} denoiser forwards)",
            )
        )

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["streamed_blocks"] = {k: list(v) for k, v in self.streamed_blocks.items()}
        values["resident"], values["offloaded"] = list(self.resident), list(self.offloaded)
        values["streamed_text_layers"] = list(self.streamed_text_layers)
        return values


def plan_memory(
    fp: Footprint,
    activation: dict[str, int],
    cap: int,
    forwards: int,
    tiled_activation: int | None = None,
    headroom: float = DEFAULT_HEADROOM,
    sources: dict[str, str] | None = None,
    text_forwards: int = 1,
    ring_transfer: str = AS_STORED,
    outside: int = 0,
) -> MemoryPlan:
    """The plan moving the fewest bytes per request whose every stage fits in `(cap - outside) * (1 - headroom)`.

    `activation`: stage -> activation peak (stages missing count 0); `tiled_activation`: the video decode's peak when
    tiled (None: the model has no tiled mode, or it is its default); `text_forwards`: text-encoder forwards per
    request; `ring_transfer`: how streamed blocks move (FP8: at `fp.fp8_blocks` bytes). Every arrangement is weighed
    (offloaded components x streamed denoiser blocks x streamed text layers x denoisers offloaded or not x decode
    mode). A tiled decode moves nothing, so it is chosen where untiled would fit
    only by moving more bytes; at equal bytes untiled wins (tiled is slower and not bit-equal to untiled), then fewer
    offloaded components, denoisers kept, fewer streamed text layers, fewer streamed blocks. ValueError naming
    `memory` with the smallest cap that fits when none does."""
    usable = int(max(0, cap - outside) * (1 - headroom))
    offloadable = sorted({c for names in fp.stages.values() for c in names})
    tables = _Tables.of(fp, ring_transfer)
    best, smallest = None, None
    for mask, offload_denoisers, tiled in itertools.product(
        range(2 ** len(offloadable)),
        (False, True) if fp.blocks else (False,),
        (False, True) if tiled_activation is not None else (False,),
    ):
        offloaded = tuple(c for i, c in enumerate(offloadable) if mask >> i & 1)
        layers = len(fp.text_layers) if TEXT in offloaded else 0
        s, t = np.arange(len(tables.resident))[:, None], np.arange(layers + 1)[None, :]
        peaks, moved = _arrange(fp, tables, activation, offloaded, s, t, tiled_activation if tiled else None,
                                offload_denoisers, forwards, text_forwards)  # fmt: skip
        top = np.max(np.stack(list(peaks.values())), axis=0)
        smallest = int(top.min()) if smallest is None else min(smallest, int(top.min()))
        fits = top <= usable
        if not fits.any():
            continue
        cheapest = int(moved[fits].min())
        t_best, s_best = min((int(b), int(a)) for a, b in np.argwhere(fits & (moved == cheapest)))
        key = (cheapest, tiled, len(offloaded), offload_denoisers, t_best, s_best)
        if best is None or key < best[0]:
            chosen = {stage: int(peak[s_best, t_best]) for stage, peak in peaks.items()}
            best = (key, offloaded, tiled, chosen)
    minimum_cap = math.ceil(smallest / (1 - headroom)) + outside
    if best is None:
        kept = f" and {gib(outside)} for the CUDA context and libraries" if outside else ""
        raise ValueError(
            f"memory: a cap of {gib(cap)} cannot hold this model and request (at least {gib(smallest)} must be on "
            f"the device at once, with {headroom:.0%} headroom{kept}); the smallest cap that fits is "
            f"{gib(minimum_cap)} ({minimum_cap} bytes)"
        )
    (moved_per_request, _, _, offload_denoisers, t_best, s_best), offloaded, tiled, peaks = best
    slots = int(tables.slots(s_best, t_best))
    kept = sum(fp.components[c] for c in fp.components if c not in offloaded)
    return MemoryPlan(
        cap=cap,
        usable=usable,
        resident=tuple(c for c in fp.components if c not in offloaded),
        offloaded=offloaded,
        streamed_blocks=tables.positions(fp, s_best),
        block_counts={name: len(b) for name, b in fp.blocks.items()},
        streamed_text_layers=tuple(streamed_positions(len(fp.text_layers), t_best)),
        text_layer_count=len(fp.text_layers),
        denoisers_offloaded=offload_denoisers,
        tiled_decode=tiled,
        stage_peaks=peaks,
        activation={**activation, **({"video_decode": tiled_activation} if tiled else {})},
        activation_source=dict(sources or dict.fromkeys(activation, "estimate")),
        resident_bytes=kept + slots + (0 if offload_denoisers else int(tables.resident[s_best])),
        bytes_moved=moved_per_request,
        forwards=forwards,
        text_forwards=text_forwards,
        minimum_cap=minimum_cap,
        ring_transfer=ring_transfer,
        outside=outside,
    )


@dataclass(frozen=True)
class _Tables:
    """What the device holds for each count of streamed denoiser blocks (index s: each denoiser streams min(s, its
    blocks) at `streamed_positions`) and of streamed text layers (index t), and what one forward moves (as stored,
    or with FP8 transfers `Footprint.fp8_blocks`)."""

    resident: np.ndarray  # the denoisers' non-streamed weights (all denoisers: their rest and resident blocks)
    per_forward: np.ndarray  # bytes one denoiser forward moves (the denoisers' mean: Wan2.2 switches experts)
    largest: np.ndarray  # the largest streamed block
    count: np.ndarray  # the most blocks one denoiser streams
    text_streamed: np.ndarray  # bytes of the streamed text layers
    text_largest: np.ndarray  # the largest streamed text layer

    @classmethod
    def of(cls, fp: Footprint, ring_transfer: str = AS_STORED) -> _Tables:
        most = max((len(b) for b in fp.blocks.values()), default=0)
        moving = (fp.fp8_blocks or fp.blocks) if ring_transfer == FP8 else fp.blocks
        rows = []
        for s in range(most + 1):
            chosen_at = {name: streamed_positions(len(b), min(s, len(b))) for name, b in fp.blocks.items()}
            streamed = {name: [b[i] for i in chosen_at[name]] for name, b in fp.blocks.items()}
            sums = [sum(chosen) for chosen in streamed.values()]
            moved = [sum(moving[name][i] for i in at) for name, at in chosen_at.items()]
            rows.append((
                sum(fp.denoiser_rest.values()) + sum(map(sum, fp.blocks.values())) - sum(sums),
                sum(moved) // len(moved) if moved else 0,
                max((size for chosen in streamed.values() for size in chosen), default=0),
                max((len(chosen) for chosen in streamed.values()), default=0),
            ))  # fmt: skip
        text = [[fp.text_layers[i] for i in streamed_positions(len(fp.text_layers), t)]
                for t in range(len(fp.text_layers) + 1)]  # fmt: skip
        columns = [np.array(column, dtype=np.int64) for column in zip(*rows, strict=True)]
        return cls(
            *columns,
            np.array([sum(chosen) for chosen in text], dtype=np.int64),
            np.array([max(chosen, default=0) for chosen in text], dtype=np.int64),
        )

    def slots(self, s: Any, t: Any) -> Any:
        """The ring's working set: RING_IN_FLIGHT slots (fewer when fewer blocks stream) shared by the denoisers and
        the text encoder, each the size of the largest block any of them streams; on the device in every stage."""
        count = np.minimum(RING_IN_FLIGHT, np.maximum(self.count[s], t))
        return count * np.maximum(self.largest[s], self.text_largest[t])

    def positions(self, fp: Footprint, s: int) -> dict[str, tuple[int, ...]]:
        return {name: tuple(streamed_positions(len(b), min(s, len(b)))) for name, b in fp.blocks.items()}


def _arrange(
    fp: Footprint,
    tables: _Tables,
    activation: dict[str, int],
    offloaded: tuple[str, ...],
    s: Any,
    t: Any,
    tiled: int | None,
    offload_denoisers: bool,
    forwards: int,
    text_forwards: int,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(stage -> peak, host -> device bytes per request) of one arrangement for each s streamed denoiser blocks and
    t streamed text layers (index arrays, broadcast together; t > 0 only with the text encoder offloaded).

    A stage's peak: the always-resident components, the stage components not offloaded, the ring's slots, the
    denoisers' non-streamed weights (during denoise; in the other stages unless `offload_denoisers`), the offloaded
    components the stage runs (the text encoder less its streamed layers) and the stage's activation."""
    kept = sum(size for name, size in fp.components.items() if name not in offloaded)
    base = kept + tables.slots(s, t)
    denoisers = tables.resident[s]
    shape = np.broadcast_shapes(np.shape(s), np.shape(t))
    peaks = {"denoise": np.broadcast_to(base + denoisers + activation.get("denoise", 0), shape)}
    moved = forwards * tables.per_forward[s] + (denoisers if offload_denoisers else 0)
    for stage, names in fp.stages.items():
        here = sum(fp.components[c] for c in names if c in offloaded)
        moved = moved + here
        if TEXT in names and TEXT in offloaded:  # the streamed layers move once per text-encoder forward
            here = here - tables.text_streamed[t]
            moved = moved + (text_forwards - 1) * tables.text_streamed[t]
        act = tiled if stage == "video_decode" and tiled is not None else activation.get(stage, 0)
        peaks[stage] = np.broadcast_to(base + (0 if offload_denoisers else denoisers) + here + act, shape)
    return peaks, np.broadcast_to(moved, shape)


def outside_for(device: torch.device) -> int:
    """What a plan for `device` keeps out of the cap: `DEVICE_OUTSIDE` on CUDA, nothing elsewhere (the CPU)."""
    return DEVICE_OUTSIDE if device.type == "cuda" else 0


def plan_for(model: Any, budget: MemoryBudget, request: Any, outside: int = 0) -> MemoryPlan:
    """The plan for `model` (a LoadedModel, weights anywhere) and a resolved `request` under `budget`; `outside`:
    bytes of the cap kept out of the plan (`outside_for(device)`; `DEVICE_OUTSIDE` for a card)."""
    budget = MemoryBudget.of(budget)
    estimate, tiled = estimate_activation(model, request)
    measured = {stage: parse_bytes(v, f"memory.activation[{stage!r}]") for stage, v in budget.activation.items()}
    sources = {stage: "measured" if stage in measured else "estimate" for stage in {**estimate, **measured}}
    if "video_decode" in measured:
        tiled = None  # a measured decode peak is of the mode it was measured in
    _, forwards = model.family.denoise_shape(request)
    fp, activation = footprint(model, request), {**estimate, **measured}
    text_forwards = model.family.text_forwards(request)
    return plan_memory(fp, activation, budget.cap_bytes, forwards, tiled, budget.headroom, sources, text_forwards,
                       budget.ring_transfer, outside)  # fmt: skip


def check_request(model: Any, plan: MemoryPlan, budget: MemoryBudget, request: Any) -> None:
    """ValueError naming `request` when `plan`'s arrangement, made for another request shape, does not fit this one
    (its estimated or measured stage peaks above the plan's usable bytes)."""
    estimate, tiled = estimate_activation(model, request)
    activation = {**estimate, **{s: parse_bytes(v) for s, v in budget.activation.items()}}
    fp = footprint(model, request)
    streamed = max((len(p) for p in plan.streamed_blocks.values()), default=0)
    tiled = tiled if plan.tiled_decode else None
    peaks, _ = _arrange(fp, _Tables.of(fp), activation, plan.offloaded, streamed, len(plan.streamed_text_layers),
                        tiled, plan.denoisers_offloaded, plan.forwards, plan.text_forwards)  # fmt: skip
    over = {stage: int(peak) for stage, peak in peaks.items() if peak > plan.usable}
    if over:
        stage, peak = max(over.items(), key=lambda item: item[1])
        raise ValueError(
            f"request: its {stage} needs about {gib(peak)} under this session's memory plan, which has "
            f"{gib(plan.usable)}; open the session with memory=MemoryBudget(cap, request=<this request>) to plan for it"
        )
