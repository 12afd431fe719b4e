"""Shared by the benchmark scripts: the JSON envelope every results file carries."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import torch

from workbench import Request, environment


def envelope(what: str, shape: dict[str, Any], arms: dict[str, Any], ratios: dict[str, Any], notes: str) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    described = environment.describe(device)
    return {
        "what": what,
        "device": described["device"],
        "torch": torch.__version__,
        "triton": described["versions"].get("triton"),
        "diffusers": described["versions"].get("diffusers"),
        "commit": os.environ.get("WORKBENCH_COMMIT") or described["git"]["commit"],
        "date": datetime.date.today().isoformat(),
        "shape": shape,
        "arms": arms,
        "ratios": ratios,
        "notes": notes,
    }


def write(record: dict, name: str) -> Path:
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['date']}-{name}.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    print(f"wrote {path}")
    return path


def wan_1_3b_request(steps: int) -> Request:
    """The request every Wan2.1-1.3B-shaped measurement uses: 480x832, 81 frames (32,760 tokens), CFG 5."""
    return Request(
        "a red circle moves left over a blue floor",
        seed=42,
        frames=81,
        height=480,
        width=832,
        steps=steps,
        guidance=5.0,
    )
