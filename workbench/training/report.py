"""The record of a train-tiny run (`train.json`, in the benchmarks' format) and its loss curve (`loss.png`)."""

from __future__ import annotations

import datetime
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from matplotlib.figure import Figure

from workbench.training.model import FPS, SAMPLE_RATE, Spec

T = TypeVar("T")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def guarded(function: Callable[..., T], *args: Any, **kwargs: Any) -> T | dict[str, str]:
    """`function(...)`, or {"error": ...} (also printed with its traceback) when it raises."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - recorded and printed, never silent
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}"}


def record(
    config: Any, spec: Spec, state: dict[str, Any], environment: dict[str, Any], stages: Iterable[str]
) -> dict[str, Any]:
    """What ran (device, versions, commit, architecture), how long and how far (steps, seconds and plans per
    stage), and the losses. The caller adds evaluations and the `calls` rows."""
    versions = environment["versions"]
    history = state["history"]
    return {
        "what": f"train-tiny {config.preset}",
        "device": environment["device"],
        "torch": versions.get("torch"),
        "triton": versions.get("triton"),
        "diffusers": versions.get("diffusers"),
        "commit": environment["git"],
        "date": now(),
        "shape": {"frames": spec.frames, "height": spec.height, "width": spec.width, "fps": FPS}
        | {"sample_rate": SAMPLE_RATE},
        "spec": asdict(spec),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "stage": state["stage"],
        "steps": state["steps"],
        "seconds": state["seconds"],
        "plan_seconds": state["plan_seconds"],
        "final_loss": {s: next((h for h in reversed(history) if h["stage"] == s), None) for s in stages},
        "loss": history,
        "notes": "text encoder random-initialised and frozen; EMA weights exported; eval through Session.open(path); "
        "checkpoint compact (bf16 weights, int8 EMA difference, uint8 sqrt second moment)",
    }


def write_outputs(out: Path, run_record: dict[str, Any], stages: Iterable[str]) -> None:
    """`train.json` and `loss.png` in `out`, published as one set (`workbench.io.write_set`)."""
    from workbench.evidence.records import record_bytes
    from workbench.io import write_set
    from workbench.plots import figure_png

    png = figure_png(loss_figure(run_record["loss"], tuple(stages)))
    write_set(out, {"train.json": record_bytes(run_record), "loss.png": png})


def loss_figure(history: list[dict[str, Any]], stages: tuple[str, ...]) -> Figure:
    """Each stage's losses against that stage's step, log scale, one panel per stage (a loss only where logged)."""
    figure = Figure(figsize=(5 * len(stages), 3.6))
    for i, stage in enumerate(stages):
        axes = figure.add_subplot(1, len(stages), i + 1)
        rows = [h for h in history if h["stage"] == stage]
        keys = sorted({k for h in rows for k in h} - {"stage", "step"})
        for key in keys:
            points = [(h["step"], max(h[key], 1e-6)) for h in rows if key in h]  # ae_train may skip a loss
            axes.plot(*zip(*points, strict=True), label=key)
        axes.set_yscale("log")
        axes.set_title(stage)
        axes.set_xlabel("step")
        if keys:
            axes.legend(fontsize=7)
    figure.tight_layout()
    return figure
