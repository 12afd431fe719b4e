"""A memory budget for a session: how a loaded model fits under a device cap, decided before anything runs.

`Session.open(model, memory="48GiB")` measures the model (`footprint`), estimates the activation peak of each stage
for the request shape it plans for (`estimate_activation`, or measured values given in `MemoryBudget.activation`),
and picks the cheapest arrangement that fits (`plan_memory`): the plan that moves the fewest bytes host -> device per
request. The choices:

- each component a stage runs (text encoder, VAE, audio VAE, vocoder, connectors: `Family.stage_components`) stays
  resident, or lives in (pinned) host memory and is on the device only during its stages;
- each denoiser keeps all its transformer blocks resident, or streams S of them per forward through a ring
  (`workbench.accelerations.memory.ring`, which also says which S blocks);
- the video VAE decodes untiled, or tiled (diffusers' `enable_tiling`) where untiled would not fit without moving
  more bytes (streaming a 14B denoiser's blocks 100 times a request to make room for one untiled decode is no deal).

Peak of a stage = bytes resident on the device all the time (resident components, the denoisers' resident blocks and
their non-block weights) + the offloaded components that stage runs + its activation peak; the denoise stage adds the
ring's working set: `RING_IN_FLIGHT` slots (the block computing, the one arriving, the one released whose kernels may
still be queued), each the size of the largest streamed block, shared by the denoisers. A plan fits when every stage's
peak is at most `cap * (1 - headroom)`; the headroom is for the allocator's fragmentation and library workspaces
(cuBLAS, attention), which no formula here sees.

Activation estimates (bytes; `b` is the element size of the module's weights). Rough on purpose and documented so a
measured value can replace them (`measured_activation(result, plan)` reads them back from a Result):
- denoise: `rows * b * max(8 * D, 2 * D + 3 * F)` with `rows` from `Family.denoise_shape` (tokens of one denoiser
  forward, CFG batch included), `D` a block's width (the most common `in_features` of its Linears) and `F` its
  feed-forward width (the widest input of a Linear back to `D`): inside a block, the residual, the norm output, q, k, v, the attention output and rotary temporaries (~8 D
  per row), or the residual, the norm output and the feed-forward's up / gate / product (2 D + 3 F per row).
- text_encode: the same per-row formula on the text encoder's Linears, for `TEXT_ROWS` rows.
- video_decode / image_encode: `b * frames * height * width * C * 3`, `C` the input channels of the decoder's last
  convolution (the widest map at full resolution), 3 live maps (input, output, norm). Tiled: `height` and `width`
  capped at the VAE's tile size (and `frames` at its temporal tile where it has one). An upper bound: a VAE that
  decodes a few frames at a time (Wan's causal decoder) peaks lower.
- audio_decode: `b * samples * C * 3` with `samples` = the clip's seconds x the output sample rate, `C` as above over
  the audio VAE's and vocoder's last convolutions.

On the CPU a cap is planning arithmetic only (nothing enforces it); on CUDA the session enforces it with
`torch.cuda.set_per_process_memory_fraction`, so a wrong plan fails with out-of-memory instead of borrowing memory
the card it plans for does not have.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from workbench.accelerations.memory.ring import RING_IN_FLIGHT, module_bytes, streamed_positions
from workbench.cards import CARDS, card, is_card
from workbench.request import shown

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
_AMOUNT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
TEXT_ROWS = 1024  # text-encoder rows planned for: a 512-token prompt and its negative
DEFAULT_HEADROOM = 0.1


def parse_bytes(value: Any, name: str = "memory") -> int:
    """`value` in bytes: an int, or a string such as "48GiB", "24GB", "1.5 GiB", "512MiB" (KB/MB/GB/TB are powers
    of 10, KiB/MiB/GiB/TiB powers of 2, case-insensitive). ValueError naming `name` for anything else or <= 0."""
    allowed = "allowed: a positive int of bytes or a string such as '48GiB', '24GB', '512MiB'"
    if name == "memory":
        allowed += f", or a card's name ({', '.join(CARDS)})"
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and (match := _AMOUNT.fullmatch(value)) and match[2].upper() in UNITS:
        number = int(float(match[1]) * UNITS[match[2].upper()])
    else:
        raise ValueError(f"{name}: {shown(value)} is not an amount of memory; {allowed}")
    if number <= 0:
        raise ValueError(f"{name}: {shown(value)} is not positive; {allowed}")
    return number


def gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB" if value >= 2**26 else f"{value:,} B"


@dataclass(frozen=True)
class MemoryBudget:
    """What `Session.open(..., memory=...)` takes: a cap (or just the cap as "48GiB" / bytes / a card's name).

    `activation`: measured activation peaks per stage (bytes or strings) replacing the estimates; `request`: the
    request shape to plan for (default: the model's defaults); `headroom`: share of the cap left unplanned."""

    cap: int | str
    activation: dict[str, int | str] = field(default_factory=dict)
    request: Any = None
    headroom: float = DEFAULT_HEADROOM

    @classmethod
    def of(cls, memory: Any) -> MemoryBudget:
        budget = memory if isinstance(memory, MemoryBudget) else cls(memory)
        budget.cap_bytes  # noqa: B018 (validates the cap)
        if not isinstance(budget.activation, dict):
            raise ValueError(f"memory.activation: expected a dict of stage -> bytes, got {shown(budget.activation)}")
        for stage, amount in budget.activation.items():
            parse_bytes(amount, f"memory.activation[{stage!r}]")
        if isinstance(budget.headroom, bool) or not isinstance(budget.headroom, int | float):
            raise ValueError(f"memory.headroom: {shown(budget.headroom)}; allowed: a number in [0, 0.9]")
        if not 0 <= budget.headroom <= 0.9:
            raise ValueError(f"memory.headroom: {shown(budget.headroom)}; allowed: a number in [0, 0.9]")
        return budget

    @property
    def cap_bytes(self) -> int:
        """The cap in bytes: bytes, an amount ("48GiB"), or a card's memory (`workbench.cards`: "rtx4090-48gb")."""
        return card(self.cap).memory if is_card(self.cap) else parse_bytes(self.cap)


@dataclass(frozen=True)
class Footprint:
    """Weight bytes of a loaded model as the planner sees it.

    `components`: every module component that is not a denoiser -> bytes. `blocks`: denoiser -> bytes of each
    transformer block in order; `denoiser_rest`: denoiser -> bytes outside its blocks. `stages`: stage -> the
    components it runs (the planner may offload exactly these)."""

    components: dict[str, int]
    blocks: dict[str, tuple[int, ...]]
    denoiser_rest: dict[str, int]
    stages: dict[str, tuple[str, ...]]


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
    return Footprint(components, blocks, rest, runs)


@dataclass(frozen=True)
class MemoryPlan:
    """The receipt of a plan: what stays where, the decode mode, the planned peak per stage and what it costs.

    `streamed_blocks`: denoiser -> positions of the blocks the ring streams (empty: all resident).
    `bytes_moved`: host -> device bytes per request (offloaded components once per stage that runs them; streamed
    blocks once per denoiser forward). `minimum_cap`: the smallest cap any plan fits under."""

    cap: int
    usable: int
    resident: tuple[str, ...]
    offloaded: tuple[str, ...]
    streamed_blocks: dict[str, tuple[int, ...]]
    block_counts: dict[str, int]
    tiled_decode: bool
    stage_peaks: dict[str, int]
    activation: dict[str, int]
    activation_source: dict[str, str]
    resident_bytes: int
    bytes_moved: int
    forwards: int
    minimum_cap: int

    def __str__(self) -> str:
        ring = ", ".join(
            f"{name}: {count - len(self.streamed_blocks[name])} of {count} blocks resident"
            + (f", {len(self.streamed_blocks[name])} streamed {list(self.streamed_blocks[name])}" if
               self.streamed_blocks[name] else "")
            for name, count in self.block_counts.items()
        )  # fmt: skip
        peaks = ", ".join(f"{stage} {gib(peak)}" for stage, peak in self.stage_peaks.items())
        return "\n".join(
            (
                f"memory plan under {gib(self.cap)} ({gib(self.usable)} planned, smallest cap that fits "
                f"{gib(self.minimum_cap)})",
                f"  resident: {', '.join(self.resident) or 'none'}; offloaded between stages: "
                f"{', '.join(self.offloaded) or 'none'}",
                f"  denoiser: {ring}",
                f"  video decode: {'tiled' if self.tiled_decode else 'untiled'}",
                f"  planned peaks: {peaks}",
                f"  moves {gib(self.bytes_moved)} host->device per request ({self.forwards} denoiser forwards)",
            )
        )

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["streamed_blocks"] = {k: list(v) for k, v in self.streamed_blocks.items()}
        values["resident"], values["offloaded"] = list(self.resident), list(self.offloaded)
        return values

    def weights_on_device(self, stage: str) -> int:
        """Planned weight bytes on the device during `stage` (its peak less its activation)."""
        return self.stage_peaks[stage] - self.activation.get(stage, 0)


def plan_memory(
    fp: Footprint,
    activation: dict[str, int],
    cap: int,
    forwards: int,
    tiled_activation: int | None = None,
    headroom: float = DEFAULT_HEADROOM,
    sources: dict[str, str] | None = None,
) -> MemoryPlan:
    """The plan moving the fewest bytes per request whose every stage fits in `cap * (1 - headroom)`.

    `activation`: stage -> activation peak (stages missing count 0); `tiled_activation`: the video decode's peak when
    tiled (None: the model has no tiled mode, or it is its default). A tiled decode moves nothing, so it is chosen
    where untiled would fit only by moving more bytes; at equal bytes untiled wins (tiled is slower and not
    bit-equal to untiled), then fewer offloaded components. ValueError naming `memory` with the smallest cap that fits when none does."""
    usable = int(cap * (1 - headroom))
    offloadable = sorted({c for names in fp.stages.values() for c in names})
    always = sum(size for name, size in fp.components.items() if name not in offloadable)
    most_blocks = max((len(b) for b in fp.blocks.values()), default=0)
    best, smallest = None, None
    for mask, streamed, tiled in itertools.product(
        range(2 ** len(offloadable)),
        range(most_blocks + 1),
        (False, True) if tiled_activation is not None else (False,),
    ):
        offloaded = tuple(c for i, c in enumerate(offloadable) if mask >> i & 1)
        positions = {name: tuple(streamed_positions(len(b), min(streamed, len(b)))) for name, b in fp.blocks.items()}
        peaks, moved, resident = _evaluate(fp, activation, offloaded, positions, tiled_activation if tiled else None)
        moved_per_request = moved["components"] + forwards * moved["per_forward"]
        top = max(peaks.values(), default=0) + always
        key = (moved_per_request, tiled, len(offloaded))
        if smallest is None or top < smallest[0]:
            smallest = (top, key)
        if top <= usable and (best is None or key < best[0]):
            best = (key, offloaded, positions, tiled, {s: p + always for s, p in peaks.items()}, resident + always)
    minimum_cap = math.ceil(smallest[0] / (1 - headroom))
    if best is None:
        raise ValueError(
            f"memory: a cap of {gib(cap)} cannot hold this model and request (at least {gib(smallest[0])} must be on "
            f"the device at once, with {headroom:.0%} headroom); the smallest cap that fits is {gib(minimum_cap)} "
            f"({minimum_cap} bytes)"
        )
    (moved_per_request, _, _), offloaded, positions, tiled, peaks, resident_bytes = best
    return MemoryPlan(
        cap=cap,
        usable=usable,
        resident=tuple(c for c in fp.components if c not in offloaded),
        offloaded=offloaded,
        streamed_blocks=positions,
        block_counts={name: len(b) for name, b in fp.blocks.items()},
        tiled_decode=tiled,
        stage_peaks=peaks,
        activation={**activation, **({"video_decode": tiled_activation} if tiled else {})},
        activation_source=dict(sources or dict.fromkeys(activation, "estimate")),
        resident_bytes=resident_bytes,
        bytes_moved=moved_per_request,
        forwards=forwards,
        minimum_cap=minimum_cap,
    )


def _evaluate(
    fp: Footprint,
    activation: dict[str, int],
    offloaded: tuple[str, ...],
    positions: dict[str, tuple[int, ...]],
    tiled: int | None,
) -> tuple[dict[str, int], dict[str, int], int]:
    """Stage peaks (without the always-resident components), bytes moved, and the resident bytes of one arrangement."""
    resident = sum(fp.components[c] for c in {c for names in fp.stages.values() for c in names} - set(offloaded))
    resident += sum(fp.denoiser_rest.values())
    slots, largest, per_forward = 0, 0, []
    for name, blocks in fp.blocks.items():
        streamed = [blocks[i] for i in positions[name]]
        resident += sum(blocks) - sum(streamed)
        slots, largest = max(slots, min(len(streamed), RING_IN_FLIGHT)), max([largest, *streamed])
        per_forward.append(sum(streamed))
    peaks = {"denoise": resident + slots * largest + activation.get("denoise", 0)}
    moved = 0
    for stage, names in fp.stages.items():
        here = sum(fp.components[c] for c in names if c in offloaded)
        moved += here
        act = tiled if stage == "video_decode" and tiled is not None else activation.get(stage, 0)
        peaks[stage] = resident + here + act
    # one forward runs one denoiser (Wan2.2 switches experts): the mean of their streamed bytes
    mean = sum(per_forward) // len(per_forward) if per_forward else 0
    return peaks, {"components": moved, "per_forward": mean}, resident


def _linear_widths(module: torch.nn.Module) -> tuple[int, int, int]:
    """(D, F, element bytes) of a module's Linears: D the most common input width; F the feed-forward width, the
    widest input of a Linear back to D (the down projection; a conditioning projection such as an adaLN one that
    widens D many times but runs on one row per sample does not count), D when there is none."""
    linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        return 0, 0, 0
    width = Counter(m.in_features for m in linears).most_common(1)[0][0]
    ffn = max((m.in_features for m in linears if m.out_features == width), default=width)
    return width, max(ffn, width), linears[0].weight.element_size()


def _per_row(module: torch.nn.Module) -> int:
    d, f, b = _linear_widths(module)
    return b * max(8 * d, 2 * d + 3 * f)


def _last_conv_channels(modules: list[torch.nn.Module]) -> tuple[int, int]:
    """(input channels, element bytes) of the last convolution among `modules` (a VAE's decoder, a vocoder)."""
    channels, size = 0, 0
    for module in modules:
        root = getattr(module, "decoder", module)
        convs = [m for m in root.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
        if convs:
            channels = max(channels, convs[-1].in_channels)
            size = max(size, convs[-1].weight.element_size())
    return channels, size


def estimate_activation(model: Any, request: Any) -> tuple[dict[str, int], int | None]:
    """(stage -> estimated activation peak, the video decode's peak when tiled or None) for a resolved `request`
    (module docstring: the formulas). The tiled figure is None when the VAE has no tiling or tiles by default."""
    pipeline, family = model.pipeline, model.family
    rows, _ = family.denoise_shape(request)
    denoisers = model.denoisers()
    estimate = {"denoise": max(rows * _per_row(family.blocks(d)[0]) for d in denoisers if family.blocks(d))}
    text = getattr(pipeline, "text_encoder", None)
    if text is not None:
        estimate["text_encode"] = TEXT_ROWS * _per_row(text)
    tiled = None
    vae = getattr(pipeline, "vae", None)
    if vae is not None:
        channels, size = _last_conv_channels([vae])
        per_pixel = size * channels * 3
        estimate["video_decode"] = per_pixel * request.frames * request.height * request.width
        if request.image is not None or request.last_image is not None:
            estimate["image_encode"] = per_pixel * request.height * request.width
        if hasattr(vae, "use_tiling") and hasattr(vae, "tile_sample_min_height"):
            frames = min(request.frames, getattr(vae, "tile_sample_min_num_frames", request.frames))
            height = min(request.height, vae.tile_sample_min_height)
            width = min(request.width, vae.tile_sample_min_width)
            tiled_peak = per_pixel * frames * height * width
            if vae.use_tiling:  # tiled is this model's own decode (MiniMax-H3): the only mode
                estimate["video_decode"] = tiled_peak
            else:
                tiled = tiled_peak
    audio = [m for name in ("audio_vae", "vocoder") if (m := getattr(pipeline, name, None)) is not None]
    if family.has_audio and audio:
        channels, size = _last_conv_channels(audio)
        rate = getattr(pipeline, "audio_sampling_rate", None) or _vocoder_rate(pipeline)
        estimate["audio_decode"] = size * channels * 3 * math.ceil(request.frames / request.fps * rate)
    return estimate, tiled


def _vocoder_rate(pipeline: Any) -> int:
    vocoder = getattr(pipeline, "vocoder", None)
    return int(vocoder.config.output_sampling_rate) if vocoder is not None else 48_000


def plan_for(model: Any, budget: MemoryBudget, request: Any) -> MemoryPlan:
    """The plan for `model` (a LoadedModel, weights anywhere) and a resolved `request` under `budget`."""
    budget = MemoryBudget.of(budget)
    estimate, tiled = estimate_activation(model, request)
    measured = {stage: parse_bytes(v, f"memory.activation[{stage!r}]") for stage, v in budget.activation.items()}
    sources = {stage: "measured" if stage in measured else "estimate" for stage in {**estimate, **measured}}
    if "video_decode" in measured:
        tiled = None  # a measured decode peak is of the mode it was measured in
    _, forwards = model.family.denoise_shape(request)
    return plan_memory(
        footprint(model, request), {**estimate, **measured}, budget.cap_bytes, forwards, tiled, budget.headroom, sources
    )


def measured_activation(result: Any, plan: MemoryPlan) -> dict[str, int]:
    """Activation peaks per stage measured in `result` (a Result of a CUDA session run under `plan`): its allocated
    peak per stage less the weights the plan had on the device then. Feed them back as `MemoryBudget.activation`."""
    return {
        stage: max(0, peak - plan.weights_on_device(stage))
        for stage, peak in result.memory.items()
        if stage in plan.stage_peaks
    }


def check_request(model: Any, plan: MemoryPlan, budget: MemoryBudget, request: Any) -> None:
    """ValueError naming `request` when `plan`'s arrangement, made for another request shape, does not fit this one
    (its estimated or measured stage peaks above the plan's usable bytes)."""
    estimate, tiled = estimate_activation(model, request)
    activation = {**estimate, **{s: parse_bytes(v) for s, v in budget.activation.items()}}
    fp = footprint(model, request)
    always = sum(size for name, size in fp.components.items() if name not in {c for n in fp.stages.values() for c in n})
    peaks, _, _ = _evaluate(fp, activation, plan.offloaded, plan.streamed_blocks, tiled if plan.tiled_decode else None)
    over = {stage: peak + always for stage, peak in peaks.items() if peak + always > plan.usable}
    if over:
        stage, peak = max(over.items(), key=lambda item: item[1])
        raise ValueError(
            f"request: its {stage} needs about {gib(peak)} under this session's memory plan, which has "
            f"{gib(plan.usable)}; open the session with memory=MemoryBudget(cap, request=<this request>) to plan for it"
        )
