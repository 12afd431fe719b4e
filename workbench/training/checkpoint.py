"""Resumable training state, compact enough to travel, written atomically; packing a run into capped parts.

A checkpoint is a folder: `weights.safetensors`, `optimizer.pt` (the current stage's optimizer and the batch
generator) and `state.json` (stage, steps, seconds, plans, loss history, calls). It is written under a
temporary name and swapped in by renames, so an interrupted run leaves the previous checkpoint whole.

Compact, because a GPU call carries it there and back within a fixed size (`save` documents the format):
weights in bfloat16 (tensors of fewer than SMALL values, such as norms, biases and latent statistics, stay
float32; a trainer rounds them once per call, far below one optimizer step; the autoencoders
are rounded for good when they freeze, so their stored copy is exact), the EMA as an int8 blockwise
difference from those weights, and of Adam's moments only the second (as sqrt, uint8 blockwise, rounded
up so a restored step is never larger than the saved one would have been); the first moment restarts at
zero and refills within ~10 steps (beta1 0.9). Per trained parameter that is 4 bytes instead of 16.
"""

from __future__ import annotations

import json
import math
import shutil
import tarfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

WEIGHTS, OPTIMIZER, STATE = "weights.safetensors", "optimizer.pt", "state.json"
BLOCK = 256  # values per quantisation scale
SMALL = 4096  # float tensors with fewer values are stored exactly


def stored(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as a checkpoint stores it: large float tensors rounded to bfloat16, the rest unchanged."""
    if tensor.is_floating_point() and tensor.numel() >= SMALL:
        return tensor.to(torch.bfloat16)
    return tensor


def quantise(values: torch.Tensor, signed: bool) -> dict[str, Any]:
    """Blockwise 8-bit code of `values`: int8 round-to-nearest (signed) or uint8 rounded up (non-negative).

    Dequantised error: at most half (signed) or one (unsigned, never below the value) step of
    max|block| / 127 (or / 255).
    """
    flat = values.detach().float().reshape(-1).cpu()
    padded = torch.nn.functional.pad(flat, (0, (-flat.numel()) % BLOCK)).reshape(-1, BLOCK)
    levels = 127.0 if signed else 255.0
    scale = (padded.abs().amax(dim=1, keepdim=True) / levels).clamp(min=1e-30)
    if signed:
        code = torch.round(padded / scale).clamp(-127, 127).to(torch.int8)
    else:
        code = torch.ceil(padded / scale).clamp(0, 255).to(torch.uint8)
    return {"code": code, "scale": scale.squeeze(1), "shape": list(values.shape)}


def dequantise(saved: dict[str, Any]) -> torch.Tensor:
    """float32 tensor of the shape `quantise` was given."""
    values = saved["code"].float() * saved["scale"][:, None]
    return values.reshape(-1)[: math.prod(saved["shape"])].reshape(saved["shape"])


def save(
    folder: Path,
    weights: dict[str, torch.Tensor],
    ema: dict[str, torch.Tensor],
    optimizer: dict[str, Any],
    state: dict[str, Any],
) -> Path:
    """Write a checkpoint folder atomically (tmp folder, then rename over the old one).

    `weights` (name -> tensor) are stored as `stored` makes them; `ema` (same names, a subset) as `ema.<name>.code`
    (int8) and `ema.<name>.scale` of its difference from the stored weight; `optimizer` is
    {"optimizer": an Adam state dict or None, ...anything small}, its moments reduced by `_compact`.
    """
    folder = Path(folder)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {k: stored(v.detach()).to("cpu", copy=True).contiguous() for k, v in weights.items()}
    for name, average in ema.items():
        code = quantise(average.detach().float().cpu() - tensors[name].float(), signed=True)
        tensors[f"ema.{name}.code"], tensors[f"ema.{name}.scale"] = code["code"], code["scale"]
    save_file(tensors, str(tmp / WEIGHTS))
    torch.save(optimizer | {"optimizer": _compact(optimizer.get("optimizer"))}, tmp / OPTIMIZER)
    (tmp / STATE).write_text(json.dumps(state, indent=1, allow_nan=False))
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def load(
    folder: Path,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any], dict[str, Any]] | None:
    """(weights, ema, optimizer, state) of the checkpoint in `folder` (floats as float32), or None when there is none.

    If a run stopped between the two renames of `save`, the previous checkpoint is still at `<folder>.old`.
    """
    folder = Path(folder)
    old = folder.with_name(folder.name + ".old")
    if not (folder / STATE).is_file() and (old / STATE).is_file():
        folder = old
    if not (folder / STATE).is_file():
        return None
    tensors = load_file(str(folder / WEIGHTS))
    weights = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items() if not k.startswith("ema.")}
    ema = {}
    for key in tensors:
        if key.startswith("ema.") and key.endswith(".code"):
            name = key[4:-5]
            delta = {"code": tensors[key], "scale": tensors[f"ema.{name}.scale"], "shape": list(weights[name].shape)}
            ema[name] = weights[name] + dequantise(delta)
    optimizer = torch.load(folder / OPTIMIZER, map_location="cpu", weights_only=True)
    optimizer["optimizer"] = _expand(optimizer.get("optimizer"))
    return weights, ema, optimizer, json.loads((folder / STATE).read_text())


def size_bytes(folder: Path) -> int:
    """Bytes of the checkpoint's files (what a GPU call carries)."""
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


def _compact(optimizer: dict[str, Any] | None) -> dict[str, Any] | None:
    """An Adam(W) state dict without first moments and with sqrt(second moments) quantised (see module doc)."""
    if optimizer is None:
        return None
    states = {}
    for index, entry in optimizer["state"].items():
        states[index] = {"step": entry["step"], "root_v": quantise(entry["exp_avg_sq"].sqrt(), signed=False)}
    return {"state": states, "param_groups": optimizer["param_groups"]}


def _expand(optimizer: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Adam(W) state dict `_compact` reduced: first moments zero, second moments from their roots."""
    if optimizer is None:
        return None
    states = {}
    for index, entry in optimizer["state"].items():
        root = dequantise(entry["root_v"])
        states[index] = {"step": entry["step"], "exp_avg": torch.zeros_like(root), "exp_avg_sq": root.square()}
    return {"state": states, "param_groups": optimizer["param_groups"]}


def pack(
    run: Path,
    destination: Path,
    part_mib: float = 15.0,
    loose: tuple[str, ...] = (),
    include: tuple[str, ...] | None = None,
) -> list[Path]:
    """Tar the entries `include` of `run` (all when None), split into parts of at most `part_mib` MiB in
    `destination`; copy the `loose` files of `run` beside them.

    For machines that return a few files of bounded size: `cat <name>.tar.part-* | tar x -C RUN` restores the
    entries into the run folder RUN.
    """
    run, destination = Path(run), Path(destination)
    if part_mib <= 0:
        raise ValueError(f"part_mib: must be > 0, got {part_mib}")
    destination.mkdir(parents=True, exist_ok=True)
    archive = destination / f".{run.name}.tar.tmp"
    names = sorted(p.name for p in run.iterdir()) if include is None else list(include)
    with tarfile.open(archive, "w") as tar:
        for name in names:
            if (run / name).exists():
                tar.add(run / name, arcname=name)
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
