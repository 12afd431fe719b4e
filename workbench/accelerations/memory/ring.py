"""The block ring's machinery, shared by the `block_ring` plugin and the session's memory residency.

A `Ring` holds one ordered list of streamed blocks (a denoiser's transformer blocks, a text encoder's decoder layers)
and the schedule that moves them (the `block_ring` module docstring describes it); torch forward pre/post hooks say
when. Counts go to the `Receipt` it is given, under its own prefix. Rings installed together (`shared_rings`) share
one set of slots: their blocks run at different times (one denoiser at a time, the text encoder before denoising).

Where the streamed weights live (CUDA). On the host: views of one pinned buffer (`pin_into_one_buffer`: one
allocation and one device -> pinned copy per weight; torch's pinned cache would round each weight's own allocation up
to a power of two, ~1.6x the weights). On the device: `Slots`, RING_IN_FLIGHT flat buffers allocated once at install,
each the size of the largest streamed block, shared by all the rings of one install (one ring's blocks compute at a
time: Wan2.2's experts take turns and the text encoder runs before denoising, as the planner's working set assumes).
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
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

RING_IN_FLIGHT = 3  # streamed blocks that can hold device memory at once: computing, arriving, released-but-queued
ALIGNMENT = 512  # bytes; where each tensor starts inside a pinned buffer or a slot


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


def pin_into_one_buffer(tensors: list[torch.Tensor], alignment: int = ALIGNMENT) -> torch.Tensor:
    """Move `tensors` (on any device) into views of one new pinned host buffer, in place (`t.data` becomes the view);
    returns the buffer. Values are unchanged (a copy); each view starts at a multiple of `alignment` bytes."""
    offsets, total = aligned_layout(tensors, alignment)
    buffer = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    for t, view in zip(tensors, views_of(buffer, tensors, offsets), strict=True):
        view.copy_(t.data)
        t.data = view
    return buffer


def module_bytes(module: torch.nn.Module) -> int:
    return sum(_nbytes(t) for t in tensors_of(module))


class Slots:
    """`count` flat device buffers, each large enough for any of `blocks` (module docstring), with each slot's events
    and the (ring, index) of the block it holds. On a CPU `device` (tests of the layout) copies are synchronous and
    there are no events."""

    def __init__(self, blocks: list[torch.nn.Module], count: int, device: torch.device):
        nbytes = max(aligned_layout(tensors_of(block))[1] for block in blocks)
        self.device = device
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(count)]
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.landed: list[Any] = [None] * count
        self.done: list[Any] = [None] * count
        self.holder: list[tuple[Ring, int] | None] = [None] * count

    def views(self, j: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Where streamed block j's `tensors` live on the device: views of slot j % count."""
        return views_of(self.buffers[j % len(self.buffers)], tensors, aligned_layout(tensors)[0])

    def fill(self, ring: Ring, j: int) -> None:
        """Queue the copy of `ring`'s block j into its slot, after releasing the block that holds the slot."""
        s = j % len(self.buffers)
        if self.holder[s] is not None:
            holder, k = self.holder[s]
            holder.release(k)
        pairs = zip(ring.views[j], ring.host[j], strict=True)
        if self.stream is None:
            for view, host in pairs:
                view.copy_(host)
        else:
            with torch.cuda.stream(self.stream):
                if self.done[s] is not None:
                    self.stream.wait_event(self.done[s])
                for view, host in pairs:
                    view.copy_(host, non_blocking=True)
                self.landed[s] = self.stream.record_event()
        self.holder[s] = (ring, j)

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
    """Streamed blocks, in execution order, and the schedule that moves them through `slots` (None on the CPU: one
    memory, nothing to copy; the schedule and its counts run the same). `root` is the module whose forward runs them
    (a denoiser, a text encoder's layer stack): its start prefetches the first. The receipt's counters are named
    `prefix` + blocks_streamed, prefetched, late, released, bytes_moved."""

    def __init__(
        self,
        root: torch.nn.Module,
        blocks: list[torch.nn.Module],
        receipt: Any,
        slots: Slots | None,
        prefix: str = "",
    ):
        self.receipt, self.slots, self.hooks, self.prefix = receipt, slots, [], prefix
        self.blocks = blocks
        self.tensors = [tensors_of(block) for block in blocks]
        self.nbytes = [sum(_nbytes(t) for t in tensors) for tensors in self.tensors]
        self.host = [[t.data for t in tensors] for tensors in self.tensors]
        self.views = [slots.views(j, tensors) for j, tensors in enumerate(self.tensors)] if slots is not None else []
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
        """Unhook; every streamed weight becomes a plain tensor on the slots' device (a fresh copy of its host view),
        and this ring lets go of the slots (freed with the last ring that holds them)."""
        self.unhook()
        if self.slots is None:
            return
        device = self.slots.device
        for tensors, hosts in zip(self.tensors, self.host, strict=True):
            for t, host in zip(tensors, hosts, strict=True):
                t.data = host.to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the side stream's copies into the slots and these copies have finished
        self.slots = self.host = self.views = None


def check_resident(model: Any, plan: dict[str, list[int]], device: torch.device) -> None:
    """RuntimeError unless every weight of the denoisers in `plan` (name -> streamed positions) that does not stream
    is on `device`."""
    for name, positions in plan.items():
        denoiser = getattr(model.pipeline, name)
        streamed = {id(t) for i in positions for t in tensors_of(model.family.blocks(denoiser)[i])}
        where = {t.device for t in tensors_of(denoiser) if id(t) not in streamed}
        if where - {device}:
            raise RuntimeError(f"block_ring: {name}'s resident weights are on {where}, expected {device}")


def rings_for(model: Any, plan: dict[str, list[int]], device: torch.device, receipt: Any) -> list[Ring]:
    """One `Ring` per denoiser in `plan` (name -> streamed positions), sharing one set of slots (`shared_rings`)."""
    streams = []
    for name, positions in plan.items():
        denoiser = getattr(model.pipeline, name)
        blocks = model.family.blocks(denoiser)
        streams.append((denoiser, [blocks[i] for i in positions], ""))
    return shared_rings(streams, device, receipt)


def shared_rings(
    streams: list[tuple[torch.nn.Module, list[torch.nn.Module], str]], device: torch.device, receipt: Any
) -> list[Ring]:
    """One `Ring` per (root, streamed blocks, receipt prefix) of `streams`, all sharing one set of `Slots` on CUDA
    (as many as the longest ring needs, up to RING_IN_FLIGHT); the streamed blocks' weights moved to one pinned host
    buffer first (so their device copies are freed before the slots are allocated); all or none."""
    blocks = [block for _, chosen, _ in streams for block in chosen]
    slots = None
    if device.type == "cuda" and blocks:
        tensors = list({id(t): t for block in blocks for t in tensors_of(block)}.values())
        if odd := sorted({type(t.data).__name__ for t in tensors if type(t.data) is not torch.Tensor}):
            raise RuntimeError(
                f"block_ring: streamed weights of type {odd} (a tensor subclass, such as torchao's FP8) have no byte "
                "layout the ring's slots can hold; keep those blocks resident or install the ring without that plugin"
            )
        pin_into_one_buffer(tensors)
        try:
            slots = Slots(blocks, min(RING_IN_FLIGHT, max(len(chosen) for _, chosen, _ in streams)), device)
        except BaseException:
            for t in tensors:
                t.data = t.data.to(device)
            raise
    return [Ring(root, chosen, receipt, slots, prefix) for root, chosen, prefix in streams]
