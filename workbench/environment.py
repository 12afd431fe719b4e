"""Where a result came from: git revision, package versions, device."""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("vflash-workbench", "torch", "triton", "diffusers", "transformers", "av", "numpy")


def git_revision(root: Path | None = None) -> dict[str, Any]:
    """The code's commit and whether the tree had uncommitted changes: `WORKBENCH_COMMIT` when set (dirty None; a
    copy of a working tree sent to another machine may carry a stale .git, and its sender knows the commit), else
    the checkout's; None for both outside a checkout."""
    if given := os.environ.get("WORKBENCH_COMMIT"):
        return {"commit": given, "dirty": None}
    return _checkout_revision((root or Path(__file__).parent.parent).resolve())


@cache
def _checkout_revision(root: Path) -> dict[str, Any]:
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True, check=True, timeout=5
        ).stdout.strip()
        if Path(top).resolve() != root:
            # A snapshot (git archive) unpacked inside another checkout: that checkout's commit is not ours.
            raise subprocess.SubprocessError(f"{root} is not the top of the git work tree {top}")
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(dirty)}


def device(spec: str | torch.device = "auto") -> torch.device:
    """The torch device a user asked for: `auto` (CUDA when present, else CPU), `cpu`, `cuda` or `cuda:N`, as a str
    or a `torch.device`.

    ValueError for anything else, a CPU with an index (`cpu:7`) included (naming the allowed values); RuntimeError
    for CUDA on a machine without it, or an index past its last CUDA device.
    """
    if not isinstance(spec, str | torch.device):
        raise ValueError(f"device: {spec!r} ({type(spec).__name__}); allowed: auto, cpu, cuda, cuda:N")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(spec)
    except RuntimeError as error:
        raise ValueError(f"device: {spec!r} is not a device; allowed: auto, cpu, cuda, cuda:N") from error
    if chosen.type not in ("cpu", "cuda") or (chosen.type == "cpu" and chosen.index is not None):
        raise ValueError(f"device: {str(spec)!r}; allowed: auto, cpu, cuda, cuda:N")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device: {spec!r} requested but this machine has no CUDA device")
    if chosen.type == "cuda" and chosen.index is not None and chosen.index >= (count := torch.cuda.device_count()):
        raise RuntimeError(
            f"device: {str(spec)!r} requested but this machine has {count} CUDA device(s): cuda:0 to cuda:{count - 1}"
        )
    return chosen


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "type": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_bytes": props.total_memory,
            "cuda": torch.version.cuda,
        }
    return {
        "type": device.type,
        "name": platform.processor() or platform.machine(),
        "cpu": cpu_model_name(),
        "threads": torch.get_num_threads(),
    }


def cpu_model_name() -> str:
    """The CPU's marketing name ("AMD EPYC 9654 96-Core Processor"): /proc/cpuinfo's first 'model name'
    on Linux, else what `platform` knows, else the architecture ("x86_64")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_label(info: dict[str, Any]) -> str:
    """A recorded `device_info` as a reader names the device: "NVIDIA H200 (141 GiB)", or for a CPU
    "AMD EPYC 9654 96-Core Processor, 16 threads" ("1 thread"; records made before the model name was kept show the
    architecture)."""
    if info.get("type") == "cuda":
        memory = info.get("memory_bytes")
        return f"{info.get('name')}" + (f" ({memory / 2**30:.0f} GiB)" if memory else "")
    name = info.get("cpu") or info.get("name") or "unknown CPU"
    threads = info.get("threads")
    return f"{name}, {threads} thread{'s' * (threads != 1)}" if threads else str(name)


def describe(device: torch.device) -> dict[str, Any]:
    return {"git": git_revision(), "versions": versions(), "device": device_info(device)}
