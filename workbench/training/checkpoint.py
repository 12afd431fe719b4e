"""Resumable training state, written atomically, and packing a run folder into size-capped parts.

A checkpoint is a folder: `weights.safetensors` (every pipeline module's state dict, plus the EMA copies),
`optimizer.pt` (the current stage's optimizer, moments stored in bfloat16 to halve the size, and the batch
generator), `state.json` (stage, steps, seconds, loss history). It is written under a temporary name and
swapped in by renames, so an interrupted run leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

WEIGHTS, OPTIMIZER, STATE = "weights.safetensors", "optimizer.pt", "state.json"


def save(folder: Path, tensors: dict[str, torch.Tensor], optimizer: dict[str, Any], state: dict[str, Any]) -> Path:
    """Write a checkpoint folder atomically (tmp folder, then rename over the old one)."""
    folder = Path(folder)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS))
    torch.save(_shrink(optimizer), tmp / OPTIMIZER)
    (tmp / STATE).write_text(json.dumps(state, indent=1, allow_nan=False))
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def load(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]] | None:
    """(tensors, optimizer, state) of the checkpoint in `folder`, or None when there is none.

    If a run stopped between the two renames of `save`, the previous checkpoint is still at `<folder>.old`.
    """
    folder = Path(folder)
    old = folder.with_name(folder.name + ".old")
    if not (folder / STATE).is_file() and (old / STATE).is_file():
        folder = old
    if not (folder / STATE).is_file():
        return None
    tensors = load_file(str(folder / WEIGHTS))
    optimizer = torch.load(folder / OPTIMIZER, map_location="cpu", weights_only=True)
    return tensors, optimizer, json.loads((folder / STATE).read_text())


def _shrink(value: Any) -> Any:
    """Optimizer moments to bfloat16 (torch casts them back to the parameters' dtype on load)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu")
        return value.to(torch.bfloat16) if value.is_floating_point() and value.numel() > 1 else value
    if isinstance(value, dict):
        return {k: _shrink(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_shrink(v) for v in value)
    return value


def pack(run: Path, destination: Path, part_mib: float = 15.0, loose: tuple[str, ...] = ()) -> list[Path]:
    """Tar `run` and split it into parts of at most `part_mib` MiB in `destination`; copy `loose` files beside.

    For machines that return a few files of bounded size: `cat <name>.tar.part-* | tar x` restores the run.
    """
    run, destination = Path(run), Path(destination)
    if part_mib <= 0:
        raise ValueError(f"part_mib: must be > 0, got {part_mib}")
    destination.mkdir(parents=True, exist_ok=True)
    archive = destination / f".{run.name}.tar.tmp"
    with tarfile.open(archive, "w") as tar:
        tar.add(run, arcname=run.name)
    limit = int(part_mib * 2**20)
    parts = []
    with open(archive, "rb") as handle:
        index = 0
        while chunk := handle.read(limit):
            part = destination / f"{run.name}.tar.part-{index:02d}"
            part.write_bytes(chunk)
            parts.append(part)
            index += 1
    archive.unlink()
    for name in loose:
        if (run / name).is_file():
            shutil.copyfile(run / name, destination / name)
    return parts
