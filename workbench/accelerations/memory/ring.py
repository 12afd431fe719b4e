"""The block ring's machinery, shared by the `block_ring` plugin and the session's memory residency.

A `Ring` holds one denoiser's streamed transformer blocks and the schedule that moves them (the `block_ring`
module docstring describes it): diffusers' `ModuleGroup` per streamed block for the pinned host copies, the side-stream
copy and the release; torch forward pre/post hooks for when. Counts go to the `Receipt` it is given.

On CUDA the streamed weights are first copied into one pinned host buffer (`pin_into_one_buffer`), each weight a view
of it, so diffusers finds them pinned and keeps them as they are: one device -> pinned copy per weight instead of a
pageable copy and a pinned copy, and one host allocation instead of one per weight (torch's pinned-memory cache rounds
each allocation up to a power of two: ~1.6x the weights in host memory otherwise).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from diffusers.hooks.group_offloading import ModuleGroup

RING_IN_FLIGHT = 3  # streamed blocks that can hold device memory at once: computing, arriving, released-but-queued


def streamed_positions(count: int, streamed: int) -> list[int]:
    """Which of `count` blocks stream when `streamed` of them do: the last block of each of `streamed` equal runs
    (4 of 8 -> [1, 3, 5, 7]; 1 of 8 -> [7]), so resident blocks come before each streamed one."""
    if not 0 <= streamed <= count:
        raise ValueError(f"streamed blocks: {streamed} is not in [0, {count}]")
    return [(j + 1) * count // streamed - 1 for j in range(streamed)]


def tensors_of(module: torch.nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, each once (tied weights counted once)."""
    return list({id(t): t for t in itertools.chain(module.parameters(), module.buffers())}.values())


def pin_into_one_buffer(tensors: list[torch.Tensor], alignment: int = 512) -> torch.Tensor:
    """Move `tensors` (on any device) into views of one new pinned host buffer, in place (`t.data` becomes the view);
    returns the buffer. Values are unchanged (a copy); each view starts at a multiple of `alignment` bytes."""
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // alignment) * alignment
    buffer = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    for t, offset in zip(tensors, offsets, strict=True):
        view = buffer[offset : offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        view.copy_(t.data)
        t.data = view
    return buffer


def module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(module))


class Ring:
    """One denoiser's streamed blocks, in execution order, and the schedule that moves them."""

    def __init__(
        self,
        denoiser: torch.nn.Module,
        blocks: list[torch.nn.Module],
        positions: list[int],
        device: torch.device,
        stream: Any,
        receipt: Any,
    ):
        self.receipt, self.stream, self.hooks = receipt, stream, []
        self.blocks = [blocks[i] for i in positions]
        self.tensors = [tensors_of(block) for block in self.blocks]
        self.nbytes = [sum(t.numel() * t.element_size() for t in tensors) for tensors in self.tensors]
        if stream is not None and self.blocks:
            pin_into_one_buffer([t for tensors in self.tensors for t in tensors])
        self.groups = [
            ModuleGroup(
                modules=[block],
                offload_device=torch.device("cpu"),
                onload_device=device,
                offload_leader=block,
                onload_leader=block,
                non_blocking=stream is not None,
                stream=stream,
                record_stream=stream is not None,
            )
            for block in self.blocks
        ]
        self.on_device = [True] * len(self.blocks)
        for j in range(len(self.blocks)):
            self.release(j, count=False)
        if self.blocks:
            self.hooks.append(denoiser.register_forward_pre_hook(lambda *_: self.onload(0, ahead=True)))
        for j, block in enumerate(self.blocks):
            self.hooks.append(block.register_forward_pre_hook(lambda *_, j=j: self.enter(j)))
            self.hooks.append(block.register_forward_hook(lambda *_, j=j: self.release(j)))

    def onload(self, j: int, ahead: bool) -> None:
        if self.on_device[j]:
            return
        self.groups[j].onload_()
        self.on_device[j] = True
        self.receipt.count("blocks_streamed")
        self.receipt.count("bytes_moved", self.nbytes[j])
        if ahead:
            self.receipt.count("prefetched")

    def enter(self, j: int) -> None:
        if not self.on_device[j]:
            self.receipt.count("late")
            self.onload(j, ahead=False)
        if self.stream is not None:
            self.stream.synchronize()  # block j's copy has landed before its kernels are queued
        if j + 1 < len(self.blocks):
            self.onload(j + 1, ahead=True)

    def release(self, j: int, count: bool = True) -> None:
        if self.on_device[j]:
            self.groups[j].offload_()
            self.on_device[j] = False
            if count:
                self.receipt.count("released")

    def release_all(self) -> None:
        """After a request (also one that raised part-way): no streamed block stays on the device."""
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

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        for j in range(len(self.blocks)):
            if not self.on_device[j]:
                self.groups[j].onload_()
                self.on_device[j] = True
        if self.stream is not None:
            self.stream.synchronize()


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
    """One `Ring` per denoiser in `plan`, its streamed blocks moved to pinned host memory; all or none."""
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    rings: list[Ring] = []
    try:
        for name, positions in plan.items():
            denoiser = getattr(model.pipeline, name)
            rings.append(Ring(denoiser, model.family.blocks(denoiser), positions, device, stream, receipt))
    except Exception:
        for ring in rings:
            ring.remove()
        raise
    return rings
