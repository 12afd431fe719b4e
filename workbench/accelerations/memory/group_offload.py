"""Block-level group offloading of the denoiser weights to CPU (contract: bitwise).

diffusers' `enable_group_offload(onload_device, offload_device="cpu", offload_type="block_level", ...)`
keeps each group of `num_blocks_per_group` transformer blocks in CPU memory and moves it to the GPU
just before it runs (with `use_stream`, the next group is prefetched on a side stream). Weights are
copied, not converted, so the output equals dense bit for bit; the trade is GPU memory for transfers.

Receipt: `onloads` and `offloads` count calls of each module group's `onload_`/`offload_` (wrapped
on the group objects diffusers creates; those objects are dropped on uninstall, so nothing on the
model is left wrapped). An onload is a real host-to-device copy of that group's weights.
Uninstall removes diffusers' group-offloading hooks, drops the forwards the hook registry restored,
moves the denoiser back to the session device, where it was before, and runs the garbage collector: the
hooks' reference cycles would otherwise keep the pinned host copies of the weights alive.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.hooks.group_offloading import (
    _GROUP_OFFLOADING,
    _LAYER_EXECUTION_TRACKER,
    _LAZY_PREFETCH_GROUP_OFFLOADING,
)
from diffusers.hooks.hooks import HookRegistry

from workbench.accelerations.base import Handle, Spec, drop_restored_forwards, option, refuse_own_copy_forwards

HOOK_NAMES = (_LAZY_PREFETCH_GROUP_OFFLOADING, _LAYER_EXECUTION_TRACKER, _GROUP_OFFLOADING)


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], denoisers: list[torch.nn.Module], device: torch.device):
        super().__init__(spec, options, proof=("onloads",))
        self.receipt.traceable(device, counters=("onloads", "offloads"))  # counted in the blocks' offload hooks
        self.denoisers = denoisers
        self.device = device
        refuse_own_copy_forwards(spec.name, {f"denoiser {i}": d for i, d in enumerate(denoisers)})
        try:
            for denoiser in denoisers:
                denoiser.enable_group_offload(
                    onload_device=device,
                    offload_device=torch.device("cpu"),
                    offload_type="block_level",
                    num_blocks_per_group=options["num_blocks_per_group"],
                    use_stream=options["use_stream"],
                )
            groups = {}
            for denoiser in denoisers:
                for module in denoiser.modules():
                    registry = getattr(module, "_diffusers_hook", None)
                    hook = None if registry is None else registry.get_hook(_GROUP_OFFLOADING)
                    if hook is not None:
                        groups[id(hook.group)] = hook.group
            if not groups:
                raise RuntimeError("group_offload: diffusers installed no group-offloading hooks")
            for group in groups.values():
                group.onload_ = self._counted(group.onload_, "onloads")
                group.offload_ = self._counted(group.offload_, "offloads")
            self.groups = len(groups)
        except Exception:
            self._remove()
            raise

    def _counted(self, method: Any, counter: str) -> Any:
        receipt = self.receipt

        def call() -> Any:
            receipt.count(counter)
            return method()

        return call

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.receipt.counters["groups"] = self.groups

    def _remove(self) -> None:
        for denoiser in self.denoisers:
            registry = HookRegistry.check_if_exists_or_initialize(denoiser)
            for name in HOOK_NAMES:
                registry.remove_hook(name, recurse=True)
            drop_restored_forwards(denoiser)
            denoiser.to(self.device)
        # diffusers' hooks and groups (and the receipt's wrappers above) hold each other in reference cycles, which
        # free only in a collector pass: until then the groups' pinned host copies of the weights (up to the whole
        # model) stay allocated, and a second install on top of them can exhaust host memory
        gc.collect()


@dataclass(frozen=True)
class GroupOffloadConfig:
    """group_offload's options."""

    num_blocks_per_group: int = option(1, minimum=1, help="transformer blocks moved together")
    use_stream: bool = option(True, help="prefetch the next group on a side CUDA stream")


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    if options["use_stream"] and options["num_blocks_per_group"] != 1:
        # diffusers would silently override it to 1; refuse instead of running something else
        raise ValueError("group_offload.num_blocks_per_group: must be 1 with use_stream=True (diffusers streams)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    denoisers = model.denoisers()
    for denoiser in denoisers:
        if not getattr(denoiser, "_supports_group_offloading", False):
            raise RuntimeError(f"group_offload: {type(denoiser).__name__} does not support group offloading")
        where = {p.device for p in denoiser.parameters()}
        if where != {device}:
            raise RuntimeError(f"group_offload: {type(denoiser).__name__} weights are on {where}, expected {device}")
    return lambda: _Installed(SPEC, options, denoisers, device)


SPEC = Spec(
    name="group_offload",
    contract="bitwise",
    summary="denoiser blocks kept in CPU memory and moved to the GPU group by group (diffusers group offloading)",
    prepare_fn=_prepare,
    config=GroupOffloadConfig,
    devices=("cuda",),
    touches=("denoiser.weights_device",),
    order=85,
)
SPECS = (SPEC,)
