"""Carrying out a memory plan (`workbench.memory_plan.MemoryPlan`) on a loaded model: the session's memory budget.

`Residency.arrange(model, plan, device)` starts from a model whose weights are in host memory and moves only what
the plan keeps resident to the device: on CUDA the cap is set first (`torch.cuda.set_per_process_memory_fraction`),
so a plan that is wrong fails with out-of-memory, never by borrowing memory the planned card lacks. Then:

- offloaded components (text encoder, VAE, ...): one diffusers `ModuleGroup` each, holding pinned host copies. At
  the start of a stage (`enter_stage`, called by the session's stage probes) the offloaded components that stage runs
  come onto the device and the other offloaded ones go back to host; the denoise stage sends them all back, and so
  does the end of every request (`end_request`), so each request starts from the same state. Going back costs no
  copy: the pinned host copy is still the weights (nothing writes them).
- the denoisers' streamed blocks: a block ring (`ring.rings_for`) with the plan's positions; its device slots are
  allocated here, under the cap.
- tiled video decode: diffusers' `vae.enable_tiling()` where the plan says so.

On the CPU the moves are no-ops (one memory) and the cap is not enforced; the schedule runs the same and the receipt
counts it: `component_onloads`, `component_bytes_moved`, and the ring's (`blocks_streamed`, `bytes_moved`, ...). Contract
bitwise for the residency itself; a tiled decode is not bit-equal to an untiled one, and the plan says which it is.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.hooks.group_offloading import ModuleGroup

from workbench.accelerations.base import Receipt
from workbench.accelerations.memory.ring import Ring, check_resident, module_bytes, rings_for, tensors_of


class Residency:
    """A model arranged on a device under a plan; one per session."""

    def __init__(self, model: Any, plan: Any, device: torch.device, budget: Any):
        self.model, self.plan, self.device, self.budget = model, plan, device, budget
        self.stages = {stage: set(names) for stage, names in model.family.stage_components.items()}
        self.receipt = Receipt(proof=("component_onloads", "blocks_streamed"))
        self.groups: dict[str, ModuleGroup] = {}
        self.on_device: set[str] = set()
        self.rings: list[Ring] = []
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @classmethod
    def arrange(cls, model: Any, plan: Any, device: torch.device, budget: Any) -> Residency:
        """Cap the device (CUDA), move what stays resident, install the ring, offload the rest. `budget` (the
        `MemoryBudget` planned from) is kept to check later requests against the plan."""
        if device.type == "cuda":
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            total = torch.cuda.get_device_properties(device).total_memory
            if plan.cap > total:
                raise ValueError(f"memory: the cap {plan.cap} bytes is above {device}'s {total} bytes")
            torch.cuda.set_per_process_memory_fraction(plan.cap / total, device)
        residency = cls(model, plan, device, budget)
        pipeline, family = model.pipeline, model.family
        stream = residency.stream
        for name, component in pipeline.components.items():
            if not isinstance(component, torch.nn.Module):
                continue
            if name in plan.offloaded:
                residency.groups[name] = ModuleGroup(
                    modules=[component],
                    offload_device=torch.device("cpu"),
                    onload_device=device,
                    offload_leader=component,
                    onload_leader=component,
                    non_blocking=stream is not None,
                    stream=stream,
                )
                residency.groups[name].offload_()  # to its pinned copy (the original host tensor is freed)
            elif name in plan.streamed_blocks:
                streamed = {id(t) for i in plan.streamed_blocks[name] for t in tensors_of(family.blocks(component)[i])}
                for tensor in tensors_of(component):
                    if id(tensor) not in streamed:
                        tensor.data = tensor.data.to(device)
            else:
                component.to(device)
        if plan.tiled_decode:
            pipeline.vae.enable_tiling()
        if any(plan.streamed_blocks.values()):
            positions = {name: list(p) for name, p in plan.streamed_blocks.items()}
            check_resident(model, positions, device)
            residency.rings = rings_for(model, positions, device, residency.receipt)
        if stream is not None:
            torch.cuda.synchronize(device)
        return residency

    def begin_request(self) -> None:
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
            self.receipt.count("component_bytes_moved", module_bytes(self.groups[name].modules[0]))
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

    def report(self) -> dict[str, Any]:
        """The receipt for the Result (`receipts["memory_residency"]`): component and ring counters together."""
        return {"contract": "bitwise", "options": {"offloaded": list(self.plan.offloaded)}, **self.receipt.to_dict()}
