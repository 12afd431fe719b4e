"""Block ring: K transformer blocks of each denoiser stay on the device, the others stream in per forward (bitwise).

The streamed blocks' weights live in pinned host memory. Each forward, the first streamed block is prefetched when
the denoiser starts; when a streamed block starts, its copy is waited for and the next streamed block's copy is
issued on a side CUDA stream, so it lands while the blocks in between compute; when a streamed block ends its device
copy is released (`record_stream` keeps the memory until the queued kernels that read it have run). The streamed
blocks are spread evenly among the resident ones (`streamed_positions`), so each transfer hides behind the compute
of the resident blocks before it. Same kernels, same inputs: only where the weights live changes.

What does the moving: diffusers' `ModuleGroup` (diffusers.hooks.group_offloading), one per streamed block, holds its
pinned host copies and does the side-stream copy (`onload_`) and the release (`offload_`). diffusers'
`apply_group_offloading` itself cannot keep chosen blocks resident (it offloads every block of a ModuleList and the
rest of the model too), so the scheduling is a small own hook: torch forward pre/post hooks on the blocks and the
denoiser, which also run when another plugin replaces a block's `forward` (a diffusers `HookRegistry` wrapper would
be replaced with it).

On the CPU there is no second memory: the groups' onload/offload are no-ops there, but the schedule (which block is
on the device, prefetch order, release) runs the same and its receipt counts it: `blocks_streamed` (onloads),
`prefetched` (those issued ahead of their block), `late` (a streamed block that started without its copy issued:
loaded synchronously), `released`, `bytes_moved` (host -> device bytes). Bytes moved per request are
`forwards x streamed bytes`.

Installing moves the streamed blocks to pinned host memory (from wherever they are); the denoiser's other weights and
its resident blocks must already be on the session device. Uninstall puts the streamed blocks back on the device.
If another plugin replaces the weights of a streamed block after the ring is installed (fused projections, FP8),
the ring would not move them: the next request refuses to run (RuntimeError naming the block).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.hooks.group_offloading import ModuleGroup

from workbench.accelerations.base import Handle, Spec, option

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


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], model: Any, plan: dict[str, list[int]], device):
        super().__init__(spec, options, proof=("blocks_streamed",))
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.rings: list[Ring] = []
        try:
            for denoiser in model.denoisers():
                name = next(n for n in model.family.denoisers if getattr(model.pipeline, n, None) is denoiser)
                blocks = model.family.blocks(denoiser)
                self.rings.append(Ring(denoiser, blocks, plan[name], device, stream, self.receipt))
        except Exception:
            self._remove()
            raise
        self.streamed = {name: positions for name, positions in plan.items()}

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        for ring in self.rings:
            ring.check()
        self.receipt.notes["streamed_blocks"] = self.streamed

    def end_request(self, request_id: int) -> None:
        for ring in self.rings:
            ring.release_all()

    def _remove(self) -> None:
        for ring in self.rings:
            ring.remove()
        self.rings = []


@dataclass(frozen=True)
class BlockRingConfig:
    """block_ring's options."""

    resident_blocks: int = option(
        0, minimum=0, help="transformer blocks of each denoiser kept on the device; the others stream per forward"
    )


def ring_plan(model: Any, resident_blocks: int) -> dict[str, list[int]]:
    """denoiser name -> positions of its streamed blocks when `resident_blocks` stay (ValueError if it has fewer)."""
    plan = {}
    for name in model.family.denoisers:
        denoiser = getattr(model.pipeline, name, None)
        if denoiser is None:
            continue
        count = len(model.family.blocks(denoiser))
        if resident_blocks > count:
            raise ValueError(
                f"block_ring.resident_blocks: {resident_blocks} is more than {name}'s {count} blocks; "
                f"allowed: 0 to {count}"
            )
        plan[name] = streamed_positions(count, count - resident_blocks)
    return plan


def prepare_ring(model: Any, options: dict[str, Any], device: torch.device, plan: dict[str, list[int]]):
    """Check that everything the ring does not stream is on `device`; returns the activation. `plan` is denoiser name
    -> streamed block positions (the session's memory plan passes its own)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for name, positions in plan.items():
        denoiser = getattr(model.pipeline, name)
        streamed = {id(t) for i in positions for t in tensors_of(model.family.blocks(denoiser)[i])}
        where = {t.device for t in tensors_of(denoiser) if id(t) not in streamed}
        if where - {device}:
            raise RuntimeError(f"block_ring: {name}'s resident weights are on {where}, expected {device}")
    return lambda: _Installed(SPEC, options, model, plan, device)


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    return prepare_ring(model, options, device, ring_plan(model, options["resident_blocks"]))


SPEC = Spec(
    name="block_ring",
    contract="bitwise",
    summary="K denoiser blocks resident, the rest streamed per forward from pinned host memory with prefetch",
    prepare_fn=_prepare,
    config=BlockRingConfig,
    touches=("denoiser.weights_device",),
    order=85,
)
SPECS = (SPEC,)
