"""Block ring: K transformer blocks of each denoiser stay on the device, the others stream in per forward (bitwise).

The streamed blocks' weights live in pinned host memory. Each forward, the first streamed block is prefetched when
the denoiser starts; when a streamed block starts, the compute stream waits (on the device) for its copy and the next
streamed block's copy is issued on a side CUDA stream, so it lands while the blocks in between compute; when a
streamed block ends its weights point back at the host copy. On the device the streamed blocks take turns in
RING_IN_FLIGHT fixed slots allocated at install (`workbench.accelerations.memory.ring`: the slots, the events that
order the copies against the kernels, and why not diffusers' `ModuleGroup`), so streaming allocates nothing per
forward. The streamed blocks are spread evenly among the resident ones (`streamed_positions`), so each transfer hides
behind the compute of the resident blocks before it. Same kernels, same inputs: only where the weights live changes.

The scheduling is torch forward pre/post hooks on the blocks and the denoiser (diffusers' `apply_group_offloading`
cannot keep chosen blocks resident: it offloads every block of a ModuleList and the rest of the model too); they
also run when another plugin replaces a block's `forward` (a diffusers `HookRegistry` wrapper would be replaced with
it).

On the CPU there is no second memory and nothing is copied, but the schedule (which block is on the device, prefetch
order, release) runs the same and its receipt counts it: `blocks_streamed` (onloads), `prefetched` (those issued
ahead of their block), `late` (a streamed block that started without its copy issued: issued then), `released`,
`bytes_moved` (host -> device bytes). Bytes moved per request are `forwards x streamed bytes`.

Installing moves the streamed blocks to pinned host memory (from wherever they are) and allocates the slots; the
denoiser's other weights and its resident blocks must already be on the session device. Uninstall puts the streamed
blocks back on the device (fresh copies) and frees the slots. If another plugin replaces the weights of a streamed
block after the ring is installed (fused projections, FP8), the ring would not move them: the next request refuses
to run (RuntimeError naming the block).

`fp8_ring` (contract approximate): the same ring, its streamed blocks' Linear weights moved as row-wise FP8 (e4m3
and one float32 scale per output row; every other tensor, modulation tables included, as stored) and dequantized
into the slot on the device before their block runs (`ring` module docstring), so each forward moves about half the
bytes of bf16 and the blocks compute on the FP8 round trip of those weights. The pinned host chunks hold the FP8
copies; the originals wait in pageable host memory, so uninstall gives the model back exactly (the session's memory
budget, `MemoryBudget(ring_transfer="fp8")`, drops them instead). Both plugins change where the denoiser's weights live:
they cannot be installed together. Their receipts' notes say the transfer, the bytes each denoiser's forward
moves (`bytes_per_forward`) and the bytes of the host chunks holding the streamed blocks (`host_bytes`: pinned on
CUDA, `ring.chunk_layout`; 0 on a CPU moving them as stored: one memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.base import Handle, Spec, option
from workbench.accelerations.memory.ring import (
    AS_STORED,
    FP8,
    check_resident,
    rings_for,
    streamed_positions,
)


class _Installed(Handle):
    def __init__(
        self, spec: Spec, options: dict[str, Any], model: Any, plan: dict[str, list[int]], device, transfer: str
    ):
        super().__init__(spec, options, proof=("blocks_streamed",))
        self.rings = rings_for(model, plan, device, self.receipt, spec.name, transfer)
        self.streamed = dict(plan)
        self.transfer = transfer
        self.per_forward = {name: sum(ring.nbytes) for name, ring in zip(plan, self.rings, strict=True)}
        self.host_bytes = sum(chunk.numel() for chunk in self.rings[0].chunks) if self.rings else 0

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        for ring in self.rings:
            ring.check()
        self.receipt.notes["streamed_blocks"] = self.streamed
        self.receipt.notes["transfer"] = self.transfer
        self.receipt.notes["bytes_per_forward"] = self.per_forward
        self.receipt.notes["host_bytes"] = self.host_bytes

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


def ring_plan(model: Any, resident_blocks: int, plugin: str = "block_ring") -> dict[str, list[int]]:
    """denoiser name -> positions of its streamed blocks when `resident_blocks` stay (ValueError naming `plugin`'s
    option if it has fewer)."""
    plan = {}
    for name in model.family.denoisers:
        denoiser = getattr(model.pipeline, name, None)
        if denoiser is None:
            continue
        count = len(model.family.blocks(denoiser))
        if resident_blocks > count:
            raise ValueError(
                f"{plugin}.resident_blocks: {resident_blocks} is more than {name}'s {count} blocks; "
                f"allowed: 0 to {count}"
            )
        plan[name] = streamed_positions(count, count - resident_blocks)
    return plan


def _prepare(model: Any, options: dict[str, Any], device: torch.device, transfer: str = AS_STORED):
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    spec = FP8_SPEC if transfer == FP8 else SPEC
    plan = ring_plan(model, options["resident_blocks"], spec.name)
    check_resident(model, plan, device, spec.name)
    return lambda: _Installed(spec, options, model, plan, device, transfer)


SPEC = Spec(
    name="block_ring",
    contract="bitwise",
    summary="K denoiser blocks resident, the rest streamed per forward from pinned host memory with prefetch",
    prepare_fn=_prepare,
    config=BlockRingConfig,
    touches=("denoiser.weights_device",),
    order=85,
)
FP8_SPEC = Spec(
    name="fp8_ring",
    contract="approximate",
    summary="block_ring whose streamed blocks' Linear weights move as row-wise FP8 (half the bytes), dequantized "
    "on the device",
    prepare_fn=lambda model, options, device: _prepare(model, options, device, FP8),
    config=BlockRingConfig,
    touches=("denoiser.weights_device",),
    order=85,
)
SPECS = (SPEC, FP8_SPEC)
