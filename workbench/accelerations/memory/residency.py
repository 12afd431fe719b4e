"""Carrying out a memory plan (`workbench.memory_plan.MemoryPlan`) on a loaded model: the session's memory budget.

`Residency.arrange(model, plan, device)` starts from a model whose weights are in host memory and moves only what
the plan keeps resident to the device: on CUDA the cap is set first (`torch.cuda.set_per_process_memory_fraction`),
so a plan that is wrong fails with out-of-memory, never by borrowing memory the planned card lacks. Then:

- offloaded components (text encoder, VAE, ...): one diffusers `ModuleGroup` each, holding pinned host copies. At
  the start of a stage (`enter_stage`, called by the session's stage probes) the offloaded components that stage runs
  come onto the device and the other offloaded ones go back to host; the denoise stage sends them all back, and so
  does the end of every request (`end_request`), so each request starts from the same state. Going back costs no
  copy: the pinned host copy is still the weights (nothing writes them).
- the denoisers' streamed blocks and the text encoder's streamed layers: rings sharing one set of device slots
  (`ring.shared_rings`), allocated here, under the cap. The denoisers' blocks move as `plan.ring_transfer` says: with
  FP8 their weight matrices are held on the host only as FP8 (the originals dropped: half the host memory); the text
  encoder's layers always move as stored. An offloaded text encoder with streamed layers is offloaded
  less those layers (they come through the slots during text_encode, prefetched on a side stream).
- offloaded denoisers (`plan.denoisers_offloaded`): their non-streamed weights are a group like an offloaded
  component's, brought on at the denoise stage and sent back at the next stage and at the end of the request.
- tiled video decode: diffusers' `vae.enable_tiling()` where the plan says so.
- where diffusers makes its tensors: it infers the pipeline's execution device, and the device a component's inputs
  go to (`get_module_execution_device`), from where the weights are, which is the host for an offloaded component
  until its stage begins. `pin_device` fixes the pipeline's `_execution_device` and each offloaded component's
  `device` to the plan's device.

On the CPU the moves are no-ops (one memory) and the cap is not enforced; the schedule runs the same and the receipt
counts it: `component_onloads`, `component_bytes_moved` (offloaded components and denoisers), the denoisers' ring's
(`blocks_streamed`, `bytes_moved`, ...) and the text encoder's (`text_blocks_streamed`, `text_bytes_moved`, ...).
Contract bitwise for the residency itself, approximate when streamed blocks move as FP8 (`plan.approximate`; the
Result is then not exact); a tiled decode is not bit-equal to an untiled one, and the plan says which it is.

`dismantle()` undoes the arrangement (every weight back on the device, the cap lifted), so one process can compare a
capped request with the resident one on the same weights (with FP8 transfers, the streamed matrices come back
dequantized: their original values are gone); the session it served refuses requests afterwards.

The cap is the process's, one per device (torch's allocator has no other): the residency arranged last holds it
(`cap_holder`), and it is lifted when that residency is dismantled or garbage-collected, so a session dropped
without `close()` does not leave the device capped for the next one.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from diffusers.hooks.group_offloading import ModuleGroup

from workbench.accelerations.base import Receipt
from workbench.accelerations.memory.ring import (
    AS_STORED,
    Ring,
    Stream,
    check_resident,
    pin_on_host,
    shared_rings,
    tensors_of,
)
from workbench.memory_plan import LIBRARY_RESERVE

_CAPS: dict[int, tuple[int, object]] = {}  # CUDA device index -> (cap in bytes, the holder's token)


def cap_holder(device: torch.device) -> int | None:
    """The cap in bytes a live residency holds on CUDA `device` (this process's), or None."""
    index = torch.cuda.current_device() if device.index is None else device.index
    held = _CAPS.get(index)
    return None if held is None else held[0]


def hold_cap(holder: object, index: int, cap: int, total: int) -> weakref.finalize:
    """Cap CUDA device `index` at `cap` of its `total` bytes for `holder`, replacing any cap held before; returns the
    finalizer that lifts it (called, or run when `holder` is garbage-collected), which does nothing once another
    holder took the cap over.

    `cap` is the card's memory, so what the device spends outside this process's allocator counts against it: what
    it spends already (the CUDA context, other processes) and `LIBRARY_RESERVE` for what the libraries load later;
    the allocator may reserve only the rest. ValueError when that leaves nothing. The allocator's cached free blocks
    are released first: torch checks the cap only when it reserves new memory, so blocks cached before the cap would
    otherwise serve allocations past it."""
    _release_cached(index)
    outside = _outside_allocator(index)
    if outside + LIBRARY_RESERVE >= cap:
        raise ValueError(
            f"memory: cuda:{index} already spends {outside / 2**30:.2f} GiB outside this process's allocator (CUDA "
            f"context, other processes); with {LIBRARY_RESERVE / 2**30:.2f} GiB kept for the libraries' kernels "
            f"that leaves nothing of the cap of {cap / 2**30:.2f} GiB"
        )
    torch.cuda.set_per_process_memory_fraction((cap - outside - LIBRARY_RESERVE) / total, index)
    token = object()  # stands for the holder in the finalizer, which must not keep it alive
    _CAPS[index] = (cap, token)
    return weakref.finalize(holder, _lift_cap, index, token)


def _release_cached(index: int) -> None:
    """Return CUDA device `index`'s cached free blocks to the driver, once its queued work is done."""
    torch.cuda.synchronize(index)
    with torch.cuda.device(index):
        torch.cuda.empty_cache()


def _outside_allocator(index: int) -> int:
    """Bytes in use on CUDA device `index` that this process's caching allocator did not reserve."""
    free, total = torch.cuda.mem_get_info(index)
    return max(0, total - free - torch.cuda.memory_reserved(index))


def _lift_cap(index: int, token: object) -> None:
    """Lift the cap on device `index` if the holder `token` stands for still holds it."""
    if _CAPS.get(index, (None, None))[1] is token:
        del _CAPS[index]
        torch.cuda.set_per_process_memory_fraction(1.0, index)


def pin_device(obj: Any, attribute: str, device: torch.device) -> None:
    """Make `obj.<attribute>` (a property) return `device` whatever its weights are on: the instance's class becomes a
    subclass of its class (same name) with that one property replaced. Re-pinning replaces the device instead of
    stacking subclasses."""
    base = type(obj)
    base = base.__bases__[0] if getattr(base, "_pinned_device", False) else base
    body = {attribute: property(lambda self: device), "_pinned_device": True, "__module__": base.__module__}
    obj.__class__ = type(base.__name__, (base,), body)


def unpin_device(obj: Any) -> None:
    """Undo `pin_device`: `obj` is an instance of its own class again (nothing happens to an unpinned one)."""
    if getattr(type(obj), "_pinned_device", False):
        obj.__class__ = type(obj).__bases__[0]


class Residency:
    """A model arranged on a device under a plan; one per session."""

    def __init__(self, model: Any, plan: Any, device: torch.device, budget: Any):
        self.model, self.plan, self.device, self.budget = model, plan, device, budget
        self.stages = {stage: set(names) for stage, names in model.family.stage_components.items()}
        self.receipt = Receipt(proof=("component_onloads", "blocks_streamed", "text_blocks_streamed"))
        self.groups: dict[str, ModuleGroup] = {}
        self.group_bytes: dict[str, int] = {}
        self.on_device: set[str] = set()
        self.rings: list[Ring] = []
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.tiled = False  # tiling turned on by the plan (`dismantle` turns it off)
        self.pinned: list[torch.Tensor] = []  # on CUDA, the offloaded components' pinned host chunks (`_offload_group`)
        self.dismantled = False
        self.lift_cap: weakref.finalize | None = None  # on CUDA: lifts the cap while this residency holds it
        self.outside: dict[str, int] = {}  # bytes outside the allocator: at the cap, at the last request's end

    @classmethod
    def arrange(cls, model: Any, plan: Any, device: torch.device, budget: Any) -> Residency:
        """Cap the device (CUDA), move what stays resident, install the ring, offload the rest. `budget` (the
        `MemoryBudget` planned from) is kept to check later requests against the plan."""
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        residency = cls(model, plan, device, budget)
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            if plan.cap > total:
                raise ValueError(f"memory: the cap {plan.cap} bytes is above {device}'s {total} bytes")
            residency.lift_cap = hold_cap(residency, device.index, plan.cap, total)
            residency.outside["at_cap"] = _outside_allocator(device.index)
        pipeline, family = model.pipeline, model.family
        streams = []
        for name, positions in plan.streamed_blocks.items():
            if positions:
                blocks = family.blocks(getattr(pipeline, name))
                streams.append(Stream(getattr(pipeline, name), [blocks[i] for i in positions], "", plan.ring_transfer))
        if plan.streamed_text_layers:
            root, layers = family.text_blocks(pipeline.text_encoder)
            streams.append(Stream(root, [layers[i] for i in plan.streamed_text_layers], "text_", AS_STORED))
        streamed = {id(t) for stream in streams for block in stream.blocks for t in tensors_of(block)}
        for name, component in pipeline.components.items():
            if not isinstance(component, torch.nn.Module):
                continue
            if name in plan.offloaded or (plan.denoisers_offloaded and name in plan.streamed_blocks):
                residency._offload_group(name, component, streamed)
            else:
                for tensor in tensors_of(component):
                    if id(tensor) not in streamed:
                        tensor.data = tensor.data.to(device)
        if plan.tiled_decode and not pipeline.vae.use_tiling:
            pipeline.vae.enable_tiling()
            residency.tiled = True
        if plan.denoisers_offloaded:
            residency.stages["denoise"] = set(plan.streamed_blocks)
        elif any(plan.streamed_blocks.values()):
            check_resident(model, {name: list(p) for name, p in plan.streamed_blocks.items()}, device, "memory")
        if streams:
            residency.rings = shared_rings(streams, device, residency.receipt, "memory")
        pin_device(pipeline, "_execution_device", device)
        for name in residency.groups:
            pin_device(getattr(pipeline, name), "device", device)
        if residency.stream is not None:
            torch.cuda.synchronize(device)
        return residency

    def _offload_group(self, name: str, component: torch.nn.Module, streamed: set[int]) -> None:
        """`component`'s weights that do not stream become one diffusers `ModuleGroup` (pinned host copies), on host."""
        parameters = [p for p in component.parameters() if id(p) not in streamed]
        buffers = [b for b in component.buffers() if id(b) not in streamed]
        tensors = [*parameters, *buffers]
        # the group's pinned copies: chunks taken at their size (`ring.chunk_layout`); diffusers keeps an already
        # pinned tensor as its copy (its `pin_memory()` returns it)
        chunks = pin_on_host(tensors) if self.stream is not None else []
        self.groups[name] = ModuleGroup(
            modules=[],
            offload_device=torch.device("cpu"),
            onload_device=self.device,
            offload_leader=component,
            onload_leader=component,
            parameters=parameters,
            buffers=buffers,
            non_blocking=self.stream is not None,
            stream=self.stream,
        )
        self.groups[name].offload_()  # to its pinned copy (the original host tensor is freed)
        starts = {chunk.untyped_storage().data_ptr() for chunk in chunks}
        if any(t.untyped_storage().data_ptr() not in starts for t in tensors):
            chunks = []  # a diffusers or torch that copies them again: the group holds its own copies, ours go
        self.pinned += chunks
        self.group_bytes[name] = sum(t.numel() * t.element_size() for t in tensors)

    def begin_request(self) -> None:
        if self.dismantled:
            raise RuntimeError("memory: this session's memory arrangement was dismantled; open a new session")
        self.receipt.reset()
        for ring in self.rings:
            ring.check()

    def enter_stage(self, stage: str) -> None:
        """Before `stage` computes: its offloaded components on the device, the other offloaded ones on host."""
        wanted = self.stages.get(stage, set()) & set(self.groups)
        for name in sorted(self.on_device - wanted):
            self._offload(name)
        for name in sorted(wanted - self.on_device):
            self.groups[name].onload_()
            self.on_device.add(name)
            self.receipt.count("component_onloads")
            self.receipt.count("component_bytes_moved", self.group_bytes[name])
        if wanted and self.stream is not None:
            self.stream.synchronize()

    def _offload(self, name: str) -> None:
        self.groups[name].offload_()
        self.on_device.discard(name)

    def end_request(self) -> None:
        """Every offloaded component back on host and every streamed block released, also after an error."""
        for name in sorted(self.on_device):
            self._offload(name)
        for ring in self.rings:
            ring.release_all()
        if self.device.type == "cuda" and not self.dismantled:
            self.outside["request_end"] = _outside_allocator(self.device.index)

    def dismantle(self) -> None:
        """Undo `arrange`: the cap lifted first (the whole model comes back), every streamed and offloaded weight a
        plain tensor on the device again (fresh copies; the pinned host copies go back to torch's host cache), the
        rings' hooks and slots gone, the pinned devices and the tiled decode undone. The model is then as a session
        without a budget holds it, bit for bit, except that with FP8 transfers the streamed blocks' matrices are their
        dequantized FP8 copies; `begin_request` refuses from now on."""
        if self.lift_cap is not None:
            self.lift_cap()
        self.end_request()
        for ring in self.rings:
            ring.remove()
        for group in self.groups.values():
            for tensor in (*group.parameters, *group.buffers):
                tensor.data = tensor.data.to(self.device)
        if self.stream is not None:
            torch.cuda.synchronize(self.device)
        pipeline = self.model.pipeline
        if self.tiled:
            pipeline.vae.disable_tiling()
        unpin_device(pipeline)
        for name in self.groups:
            unpin_device(getattr(pipeline, name))
        self.rings, self.groups, self.on_device, self.pinned, self.dismantled = [], {}, set(), [], True

    def report(self) -> dict[str, Any]:
        """The receipt for the Result (`receipts["memory_residency"]`): component and ring counters together; contract
        approximate when streamed blocks move as FP8."""
        options = {
            "offloaded": list(self.plan.offloaded),
            "streamed_text_layers": list(self.plan.streamed_text_layers),
            "denoisers_offloaded": self.plan.denoisers_offloaded,
            "ring_transfer": self.plan.ring_transfer,
            "host_bytes": sum(c.numel() for c in (*self.pinned, *(self.rings[0].chunks if self.rings else ()))),
            **({"outside_allocator_bytes": dict(self.outside)} if self.outside else {}),
        }
        contract = "approximate" if self.plan.approximate else "bitwise"
        return {"contract": contract, "options": options, **self.receipt.to_dict()}
