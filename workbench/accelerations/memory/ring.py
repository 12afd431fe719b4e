"""The block ring's machinery, shared by the `block_ring` plugin and the session's memory residency.

A `Ring` holds one ordered list of streamed blocks (a denoiser's transformer blocks, a text encoder's decoder layers)
and the schedule that moves them (the `block_ring` module docstring describes it); torch forward pre/post hooks say
when. Counts go to the `Receipt` it is given, under its own prefix. Rings installed together (`shared_rings`) share
one set of slots: their blocks run at different times (one denoiser at a time, the text encoder before denoising).

Where the streamed weights live (CUDA). On the host: views of a few pinned chunks whose sizes are powers of two
(`chunk_layout`, `pin_on_host`). torch's pinned allocator rounds every allocation up to a power of two (torch 2.13 can
be told not to above a threshold, 2.11 cannot): one allocation per weight, or one buffer for them all, takes up to 2x
the bytes it holds (a size just past a power of two is rounded up to the next). A power-of-two chunk is taken at its
size, so the host holds the weights plus less than one tensor per chunk, on any torch, with no process-wide setting. On
the device: `Slots`, RING_IN_FLIGHT flat buffers allocated once at install, each the size of the largest streamed block,
shared by all the rings of one install (one ring's blocks compute at a time: Wan2.2's experts take turns and the text
encoder runs before denoising, as the planner's working set assumes).
Streamed block j computes from views of slot j % count, its tensors at aligned offsets in its own layout; outside its
forward its `.data` are the pinned views again. So after install the streamed weights never touch the caching
allocator: allocating per onload on a side stream (diffusers' `ModuleGroup`, which has no fixed-slot mode) lets the
reserved memory outgrow the allocated one, and under a memory fraction the allocator then frees cached blocks with
device syncs. diffusers is not used here.

Ordering (per slot s: `done[s]` recorded on the compute stream when a block leaves s, after its forward or evicted;
`landed[s]` on the side stream after a copy into s; all waits are device-side). A copy into s waits on `done[s]`, so
it never overwrites weights that queued kernels still read (block j's copy, issued when j-1 starts, waits on j-3's
`done`, recorded on the host before; a never-used slot waits on nothing). A block's first kernel is queued after the
compute stream waits on its `landed`. A copy into s first releases the block holding s (prefetched but skipped, or
left by an error), so a block's `.data` point into a slot only while it holds it, and no block reads another's.

Transfers (`Stream.transfer`). AS_STORED (bitwise): each tensor moves as it is. FP8 (approximate): the weight matrix
of each Linear layer of a streamed block (`fp8_weights`; biases, norms, modulation tables and every other tensor move
as stored: they are a sliver of the bytes, and the modulation sets every activation's scale) is held on the host only
as `RowwiseFP8` (e4m3 plus one float32 scale per output row, `quantize_rows`) in the host chunks, so host
memory and bytes moved per transfer are about halved against bf16. A fill copies a matrix's FP8 bytes and scales into
one staging buffer on the device, then dequantizes them (`dequantize_into`) into the slot's view in the matrix's own
dtype, before `landed` is recorded: the block computes with the same kernels on the dequantized weights. On the CPU an
FP8 ring has CPU slots (synchronous copies, no events), so the CPU runs the same numerics.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from workbench.accelerations.base import refuse_own_copy_forwards
from workbench.kernels._fp8_rows import reference as fp8_rows  # torch only: no triton

RING_IN_FLIGHT = 3  # streamed blocks that can hold device memory at once: computing, arriving, released-but-queued
ALIGNMENT = 512  # bytes; where each tensor starts inside a pinned buffer or a slot
AS_STORED, FP8 = "as stored", "fp8"
TRANSFERS = (AS_STORED, FP8)  # how a ring's streamed blocks move (module docstring)


def streamed_positions(count: int, streamed: int) -> list[int]:
    """Which of `count` blocks stream when `streamed` of them do: the last block of each of `streamed` equal runs
    (4 of 8 -> [1, 3, 5, 7]; 1 of 8 -> [7]), so resident blocks come before each streamed one."""
    if not 0 <= streamed <= count:
        raise ValueError(f"streamed blocks: {streamed} is not in [0, {count}]")
    return [(j + 1) * count // streamed - 1 for j in range(streamed)]


def tensors_of(module: torch.nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, each once (tied weights counted once)."""
    return list({id(t): t for t in itertools.chain(module.parameters(), module.buffers())}.values())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def aligned_layout(tensors: list[torch.Tensor], alignment: int = ALIGNMENT) -> tuple[list[int], int]:
    """Byte offsets of `tensors` laid out in order, each at a multiple of `alignment`, and the bytes they span."""
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-_nbytes(t) // alignment) * alignment
    return offsets, total


def views_of(buffer: torch.Tensor, tensors: list[torch.Tensor], offsets: list[int]) -> list[torch.Tensor]:
    """Contiguous views of the flat uint8 `buffer` with the dtypes and shapes of `tensors`, at byte `offsets`."""
    return [buffer[o : o + _nbytes(t)].view(t.dtype).view(t.shape) for t, o in zip(tensors, offsets, strict=True)]


def chunk_layout(sizes: list[int], alignment: int = ALIGNMENT) -> tuple[list[int], list[tuple[int, int]]]:
    """Where tensors of `sizes` bytes go in host chunks whose sizes are powers of two: (chunk sizes, (chunk, byte
    offset) of each tensor), each tensor inside one chunk at a multiple of `alignment`.

    Each chunk is the largest power of two not above the bytes still to place, or the smallest that holds the largest
    tensor still to place when that is larger (it then holds everything left); it takes the tensors left, largest
    first, each that still fits. So a chunk other than the last leaves unused less than the smallest tensor placed
    after it, the last chunk less than its content, and chunk sizes never grow."""
    aligned = [-(-n // alignment) * alignment for n in sizes]
    order = sorted(range(len(sizes)), key=lambda i: -aligned[i])
    where: list[tuple[int, int]] = [(0, 0)] * len(sizes)
    chunks: list[int] = []
    left = sum(aligned)
    while order:
        size = max(1 << (left.bit_length() - 1) if left else 1, 1 << max(aligned[order[0]] - 1, 0).bit_length())
        used, later = 0, []
        for i in order:
            if used + aligned[i] <= size:
                where[i] = (len(chunks), used)
                used += aligned[i]
            else:
                later.append(i)
        chunks.append(size)
        left -= used
        order = later
    return chunks, where


def host_chunks(
    tensors: list[torch.Tensor], pin: bool, alignment: int = ALIGNMENT
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """New host chunks for `tensors`' layouts (`chunk_layout`; pinned when `pin`) and an empty view of each tensor's
    dtype and shape in them, in order: (chunks, views). Values are not copied."""
    sizes, where = chunk_layout([_nbytes(t) for t in tensors], alignment)
    chunks = [torch.empty(n, dtype=torch.uint8, pin_memory=pin) for n in sizes]
    views = [views_of(chunks[c], [t], [o])[0] for t, (c, o) in zip(tensors, where, strict=True)]
    return chunks, views


def pin_on_host(tensors: list[torch.Tensor], alignment: int = ALIGNMENT) -> list[torch.Tensor]:
    """Move `tensors` (on any device) into views of new pinned host chunks (`chunk_layout`), in place (`t.data`
    becomes the view), one at a time; returns the chunks. Values are unchanged (a copy). A diffusers `ModuleGroup` made
    over such tensors keeps them as its pinned copies (`pin_memory()` of a pinned tensor is the tensor)."""
    return store_on_host(tensors, set(), pin=True, keep=False, alignment=alignment)[0]


def module_bytes(module: torch.nn.Module) -> int:
    return sum(_nbytes(t) for t in tensors_of(module))


@dataclass(frozen=True)
class RowwiseFP8:
    """A weight of shape (rows, ...) held as float8_e4m3fn `q` (its shape) and float32 `scale` (rows, 1), one per
    output row: weight ~ q.float() * scale (`dequantize_into`)."""

    q: torch.Tensor
    scale: torch.Tensor

    @property
    def nbytes(self) -> int:
        return _nbytes(self.q) + _nbytes(self.scale)


def fp8_weights(module: torch.nn.Module) -> set[int]:
    """The ids of the tensors an FP8 transfer of `module` moves as FP8: its Linear layers' non-empty floating-point
    weight matrices. Everything else (biases, norm weights, modulation tables, embeddings) moves as stored."""
    linears = [layer.weight for layer in module.modules() if isinstance(layer, torch.nn.Linear)]
    return {id(w) for w in linears if w.is_floating_point() and w.numel() > 0}


def quantize_rows(w: torch.Tensor) -> RowwiseFP8:
    """`w` (rows, ...) as e4m3 with one scale per row of dim 0, on `w`'s device: the row quantizer of the FP8 kernels
    (`workbench.kernels.fp8_rowwise.reference`) on the rows flattened to (rows, K), i.e. scale =
    max(amax(|row|), EPS) / 448 and q = clamp(row / scale, -448, 448) rounded to nearest e4m3 (an all-zero row:
    scale EPS / 448, zero bytes, dequantized to exactly zero). Per row the error of the round trip is at most half
    an e4m3 step of the row's largest binade: |w - dequantized| <= max(amax(|row|), EPS) / 28 (+ the rounding to
    `w`'s dtype)."""
    q, scale = fp8_rows(w.reshape(w.shape[0], -1))  # (rows, K), (rows, 1)
    return RowwiseFP8(q.reshape(w.shape), scale)


def dequantize_into(out: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`out` (contiguous, q's shape, any float dtype) = (q.float() * scale) rounded once to out's dtype, in place:
    e4m3 values are exact in bf16/fp16/fp32, and the product is taken in float32 (scale's dtype). Allocates nothing
    on CUDA, so it can run on the ring's side stream. Returns `out`."""
    out.copy_(q)
    out.view(q.shape[0], -1).mul_(scale)
    return out


def dequantize(packed: RowwiseFP8, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new tensor on `device` holding `packed` dequantized to `dtype`."""
    out = torch.empty(packed.q.shape, dtype=dtype, device=device)
    return dequantize_into(out, packed.q.to(device), packed.scale.to(device))


def _fp8_layout(t: torch.Tensor) -> list[torch.Tensor]:
    """Meta tensors with the dtypes and shapes of `t`'s FP8 bytes and scales (layouts without memory)."""
    return [torch.empty(t.shape, dtype=torch.float8_e4m3fn, device="meta"),
            torch.empty((t.shape[0], 1), dtype=torch.float32, device="meta")]  # fmt: skip


def transfer_bytes(module: torch.nn.Module, transfer: str) -> int:
    """Bytes one transfer of `module` moves host -> device: its tensors as stored, or with FP8 its eligible matrices
    as their FP8 bytes and scales (works on the meta device)."""
    if transfer == AS_STORED:
        return module_bytes(module)
    fp8 = fp8_weights(module)
    return sum(t.numel() + 4 * t.shape[0] if id(t) in fp8 else _nbytes(t) for t in tensors_of(module))


def store_on_host(
    tensors: list[torch.Tensor], fp8: set[int], pin: bool, keep: bool, alignment: int = ALIGNMENT
) -> tuple[list[torch.Tensor], dict[int, torch.Tensor | RowwiseFP8]]:
    """Move `tensors` (on any device) into views of new host chunks (`host_chunks`; pinned when `pin`), one at a time
    (no second copy of them all at once); returns the chunks and id(tensor) -> what moves: the view of a tensor as
    stored, or for an id in `fp8` its `RowwiseFP8` (quantized where the tensor is, then copied in).

    Afterwards `t.data` is the view of a tensor as stored. For an FP8 one it is, with `keep`, a pageable host copy of
    the original (so that removal can give the weights back exactly); without `keep`, a NaN placeholder of its shape
    and dtype (zero strides, no memory): the original values are gone and only the FP8 copy remains."""
    parts = [_fp8_layout(t) if id(t) in fp8 else [t] for t in tensors]
    chunks, flat_views = host_chunks([p for part in parts for p in part], pin, alignment)
    views = iter(flat_views)
    stored: dict[int, torch.Tensor | RowwiseFP8] = {}
    for t in tensors:
        if id(t) not in fp8:
            stored[id(t)] = view = next(views)
            view.copy_(t.data)
            t.data = view
            continue
        packed = quantize_rows(t.data)
        stored[id(t)] = RowwiseFP8(next(views).copy_(packed.q), next(views).copy_(packed.scale))
        if keep:
            t.data = t.data.to("cpu")
        else:
            t.data = torch.full((), float("nan"), dtype=t.dtype).expand(t.shape)
    return chunks, stored


class Slots:
    """`count` flat device buffers, each large enough for any of `blocks` (module docstring), with each slot's events
    and the (ring, index) of the block it holds, and a staging buffer of `staging` bytes for FP8 transfers. On a CPU
    `device` copies are synchronous and there are no events."""

    def __init__(self, blocks: list[torch.nn.Module], count: int, device: torch.device, staging: int = 0):
        nbytes = max(aligned_layout(tensors_of(block))[1] for block in blocks)
        self.device = device
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(count)]
        self.staging = torch.empty(staging, dtype=torch.uint8, device=device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.landed: list[Any] = [None] * count
        self.done: list[Any] = [None] * count
        self.holder: list[tuple[Ring, int] | None] = [None] * count

    def views(self, j: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Where streamed block j's `tensors` live on the device: views of slot j % count."""
        return views_of(self.buffers[j % len(self.buffers)], tensors, aligned_layout(tensors)[0])

    def staged(self, packed: RowwiseFP8) -> tuple[torch.Tensor, torch.Tensor]:
        """Where `packed`'s FP8 bytes and scales land on the device before dequantization: views of the staging
        buffer (at its start: every FP8 tensor uses the same bytes, see `fill`)."""
        q, scale = views_of(self.staging, [packed.q, packed.scale], aligned_layout([packed.q, packed.scale])[0])
        return q, scale

    def fill(self, ring: Ring, j: int) -> None:
        """Queue the copy of `ring`'s block j into its slot, after releasing the block that holds the slot.

        Each tensor in order: as stored, copied into its view; FP8, copied into the staging buffer and dequantized
        from there into its view. One staging buffer serves every FP8 tensor of every fill because on CUDA all of it
        is queued on the one side stream: a copy into the staging buffer runs after the dequantization that read the
        previous one (stream order), and nothing else touches it."""
        s = j % len(self.buffers)
        if self.holder[s] is not None:
            holder, k = self.holder[s]
            holder.release(k)
        if self.stream is None:
            self._copy(ring, j, non_blocking=False)
        else:
            with torch.cuda.stream(self.stream):
                if self.done[s] is not None:
                    self.stream.wait_event(self.done[s])
                self._copy(ring, j, non_blocking=True)
                self.landed[s] = self.stream.record_event()
        self.holder[s] = (ring, j)

    @staticmethod
    def _copy(ring: Ring, j: int, non_blocking: bool) -> None:
        for view, stored, staged in zip(ring.views[j], ring.stored[j], ring.staged[j], strict=True):
            if staged is None:
                view.copy_(stored, non_blocking=non_blocking)
            else:
                q, scale = staged
                q.copy_(stored.q, non_blocking=non_blocking)
                scale.copy_(stored.scale, non_blocking=non_blocking)
                dequantize_into(view, q, scale)

    def ready(self, j: int) -> None:
        """Kernels queued from now on the compute stream run after block j's copy has landed (device-side wait)."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self.landed[j % len(self.buffers)])

    def vacate(self, j: int) -> None:
        """Block j leaves its slot: the kernels queued so far on the compute stream are the last to read it."""
        s = j % len(self.buffers)
        if self.stream is not None:
            self.done[s] = torch.cuda.current_stream(self.device).record_event()
        self.holder[s] = None


class Ring:
    """Streamed blocks, in execution order, and the schedule that moves them through `slots` (None on the CPU with
    transfers as stored: one memory, nothing to copy; the schedule and its counts run the same). `root` is the module
    whose forward runs them (a denoiser, a text encoder's layer stack): its start prefetches the first. `stored`:
    id(tensor) -> what moves for it (`store_on_host`, in `chunks`; a tensor missing moves as its `.data`); `kept`:
    whether an FP8 tensor's `.data` outside its block's forward is its original (else a placeholder: `remove` gives
    back the dequantized weight). The receipt's counters are named `prefix` + blocks_streamed, prefetched, late,
    released, bytes_moved (the bytes each transfer moves: FP8 bytes and scales for FP8 tensors)."""

    def __init__(
        self,
        root: torch.nn.Module,
        blocks: list[torch.nn.Module],
        receipt: Any,
        slots: Slots | None,
        prefix: str = "",
        stored: dict[int, torch.Tensor | RowwiseFP8] | None = None,
        kept: bool = True,
        chunks: list[torch.Tensor] | None = None,
    ):
        self.receipt, self.slots, self.hooks, self.prefix, self.kept = receipt, slots, [], prefix, kept
        self.chunks = chunks or []  # the host chunks `stored` lives in (shared by the rings of one install)
        self.blocks = blocks
        self.tensors = [tensors_of(block) for block in blocks]
        self.host = [[t.data for t in tensors] for tensors in self.tensors]
        self.stored = [[(stored or {}).get(id(t), t.data) for t in tensors] for tensors in self.tensors]
        self.nbytes = [sum(s.nbytes if isinstance(s, RowwiseFP8) else _nbytes(s) for s in b) for b in self.stored]
        self.views = [slots.views(j, tensors) for j, tensors in enumerate(self.tensors)] if slots is not None else []
        self.staged = [[slots.staged(s) if isinstance(s, RowwiseFP8) else None for s in b] for b in self.stored]
        self.on_device = [False] * len(blocks)
        if blocks:
            self.hooks.append(root.register_forward_pre_hook(lambda *_: self.onload(0, ahead=True)))
        for j, block in enumerate(blocks):
            self.hooks.append(block.register_forward_pre_hook(lambda *_, j=j: self.enter(j)))
            self.hooks.append(block.register_forward_hook(lambda *_, j=j: self.release(j)))

    def onload(self, j: int, ahead: bool) -> None:
        if self.on_device[j]:
            return
        if self.slots is not None:
            self.slots.fill(self, j)
            for t, view in zip(self.tensors[j], self.views[j], strict=True):
                t.data = view
        self.on_device[j] = True
        self.receipt.count(self.prefix + "blocks_streamed")
        self.receipt.count(self.prefix + "bytes_moved", self.nbytes[j])
        if ahead:
            self.receipt.count(self.prefix + "prefetched")

    def enter(self, j: int) -> None:
        if not self.on_device[j]:
            self.receipt.count(self.prefix + "late")
            self.onload(j, ahead=False)
        if self.slots is not None:
            self.slots.ready(j)
        if j + 1 < len(self.blocks):
            self.onload(j + 1, ahead=True)

    def release(self, j: int, count: bool = True) -> None:
        if not self.on_device[j]:
            return
        if self.slots is not None:
            self.slots.vacate(j)
            for t, host in zip(self.tensors[j], self.host[j], strict=True):
                t.data = host
        self.on_device[j] = False
        if count:
            self.receipt.count(self.prefix + "released")

    def release_all(self) -> None:
        """After a request (also one that raised part-way): no streamed block points into a slot."""
        for j in range(len(self.blocks)):
            self.release(j)

    def check(self) -> None:
        """RuntimeError if a streamed block's weights are no longer the ones the ring moves."""
        for block, tensors in zip(self.blocks, self.tensors, strict=True):
            if {id(t) for t in tensors_of(block)} != {id(t) for t in tensors}:
                raise RuntimeError(
                    f"block_ring: the weights of streamed block {type(block).__name__} were replaced after the ring "
                    "was installed (a plugin that rewrites weights); install that plugin first or drop the ring"
                )

    def unhook(self) -> None:
        """Stop scheduling: the hooks go and every streamed block's weights are its host tensors again."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        for j in range(len(self.blocks)):
            self.release(j, count=False)

    def remove(self) -> None:
        """Unhook; every streamed weight becomes a plain tensor on the slots' device, a fresh copy of its host tensor
        (as stored; FP8 with its original `kept`), or else of its FP8 copy dequantized (not the original values:
        those are gone), and this ring lets go of the slots (freed with the last ring that holds them)."""
        self.unhook()
        if self.slots is None:
            return
        device = self.slots.device
        for tensors, hosts, stored in zip(self.tensors, self.host, self.stored, strict=True):
            for t, host, moved in zip(tensors, hosts, stored, strict=True):
                t.data = restored(t, host, moved, self.kept, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the side stream's copies into the slots and these copies have finished
        self.slots = self.host = self.views = self.stored = self.staged = None
        self.chunks = []  # the host chunks go with the last view of them


def check_resident(model: Any, plan: dict[str, list[int]], device: torch.device, plugin: str) -> None:
    """RuntimeError naming `plugin` unless every weight of the denoisers in `plan` (name -> streamed positions) that
    does not stream is on `device`."""
    for name, positions in plan.items():
        denoiser = getattr(model.pipeline, name)
        streamed = {id(t) for i in positions for t in tensors_of(model.family.blocks(denoiser)[i])}
        where = {t.device for t in tensors_of(denoiser) if id(t) not in streamed}
        if where - {device}:
            raise RuntimeError(f"{plugin}: {name}'s resident weights are on {where}, expected {device}")


def restored(
    t: torch.Tensor, host: torch.Tensor, moved: torch.Tensor | RowwiseFP8, kept: bool, device: torch.device
) -> torch.Tensor:
    """`t`'s weight as a new plain tensor on `device`: a copy of `host` (as stored, or an FP8 tensor's `kept`
    original), else `moved` (its `RowwiseFP8`) dequantized to `t`'s dtype."""
    if isinstance(moved, RowwiseFP8) and not kept:
        return dequantize(moved, t.dtype, device)
    return host.to(device, non_blocking=True, copy=True)


class Stream(NamedTuple):
    """One ring of `shared_rings`: the module whose forward runs `blocks` (the streamed blocks, in execution order),
    the receipt prefix of its counters and how its blocks move (one of TRANSFERS)."""

    root: torch.nn.Module
    blocks: list[torch.nn.Module]
    prefix: str = ""
    transfer: str = AS_STORED


def rings_for(
    model: Any, plan: dict[str, list[int]], device: torch.device, receipt: Any, plugin: str, transfer: str = AS_STORED
) -> list[Ring]:
    """One `Ring` per denoiser in `plan` (name -> streamed positions), sharing one set of slots (`shared_rings`, for
    `plugin`), its blocks moving by `transfer`; FP8 originals are kept in pageable host memory (`store_on_host`), so
    removal gives back the model exactly."""
    streams = []
    for name, positions in plan.items():
        denoiser = getattr(model.pipeline, name)
        blocks = model.family.blocks(denoiser)
        streams.append(Stream(denoiser, [blocks[i] for i in positions], "", transfer))
    return shared_rings(streams, device, receipt, plugin, keep=True)


def shared_rings(
    streams: list[Stream], device: torch.device, receipt: Any, plugin: str, keep: bool = False
) -> list[Ring]:
    """One `Ring` per `Stream`, all sharing one set of `Slots` (as many as the longest ring needs, up to
    RING_IN_FLIGHT) on CUDA, and on the CPU when a stream moves FP8. The streamed blocks' weights are moved to host
    chunks first, pinned on CUDA (so their device copies are freed before the slots are allocated), the FP8 ones
    quantized (`store_on_host`; `keep`: an FP8 tensor's original stays in pageable host memory); all or none.
    `plugin` (what installs the rings) names the refusals: a streamed layer whose forward computes from weight copies
    of its own (`base.own_copy`), weights of a tensor subclass."""
    blocks = [block for stream in streams for block in stream.blocks]
    refuse_own_copy_forwards(plugin, {f"streamed block {j}": block for j, block in enumerate(blocks)})
    fp8 = {i for s in streams if s.transfer == FP8 for b in s.blocks for i in fp8_weights(b)}
    if not blocks or device.type != "cuda" and not fp8:
        return [Ring(s.root, s.blocks, receipt, None, s.prefix) for s in streams]
    tensors = list({id(t): t for block in blocks for t in tensors_of(block)}.values())
    if odd := sorted({type(t.data).__name__ for t in tensors if type(t.data) is not torch.Tensor}):
        raise RuntimeError(
            f"{plugin}: streamed weights of type {odd} (a tensor subclass, such as torchao's FP8) have no byte "
            "layout the ring's slots can hold; keep those blocks resident or install the ring without that plugin"
        )
    chunks, stored = store_on_host(tensors, fp8, pin=device.type == "cuda", keep=keep)
    staging = max((aligned_layout(_fp8_layout(t))[1] for t in tensors if id(t) in fp8), default=0)
    try:
        slots = Slots(blocks, min(RING_IN_FLIGHT, max(len(s.blocks) for s in streams)), device, staging)
    except BaseException:
        for t in tensors:
            t.data = restored(t, t.data, stored[id(t)], keep, device)
        raise
    return [Ring(s.root, s.blocks, receipt, slots, s.prefix, stored, keep, chunks) for s in streams]
