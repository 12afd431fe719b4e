"""Model families and the names a user types: `tiny-wan`, `tiny-wan22`, `tiny-ltx2`, `tiny-h3`, `demo-av`,
`demo-av-mini`, or a local path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from workbench._quiet_imports import defer_torchao
from workbench.models.family import read_json
from workbench.models.loaded import LoadedModel, cast_components

defer_torchao()  # before any diffusers model import: see workbench/_quiet_imports.py

TINY_MODELS = ("tiny-wan", "tiny-wan22", "tiny-ltx2", "tiny-h3")
RANDOM_MODELS = ("random-wan-1.3b",)  # real shapes, random weights: for GPU timing only
# Trained checkpoints shipped inside the package, loaded through the same `load(path)` as any local directory, and
# the `workbench train-tiny --preset` that made each: demo-av (49 frames of 128x128 at 24 fps, stereo, rich captions)
# and demo-av-mini (9 frames of 64x64, the fastest trained model, for quick checks).
_HERE = Path(__file__).resolve().parent
SHIPPED_MODELS = {"demo-av": _HERE / "demo-av", "demo-av-mini": _HERE / "demo-av-mini"}
SHIPPED_PRESETS = {"demo-av": "av2", "demo-av-mini": "demo-av"}
PIPELINE_FAMILIES = {"WanPipeline": "wan", "LTX2Pipeline": "ltx2", "MiniMaxH3ModularPipeline": "h3"}
MODULAR_INDEX = "modular_model_index.json"  # modular pipelines (MiniMax-H3) name their components here


def families() -> dict[str, object]:
    """Every registered family by name (imports diffusers)."""
    from workbench.models import h3, ltx2, wan

    return {wan.FAMILY.name: wan.FAMILY, ltx2.FAMILY.name: ltx2.FAMILY, h3.FAMILY.name: h3.FAMILY}


def resolve(
    name: str | Path, seed: int = 0, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
) -> LoadedModel:
    """Build a model by name (cast like `from_pretrained(torch_dtype=dtype)`), or load a local directory."""
    from workbench.models import h3, ltx2, wan

    built: dict[str, Callable[[int], LoadedModel]] = {
        "tiny-wan": wan.tiny,
        "tiny-wan22": wan.tiny22,
        "tiny-ltx2": ltx2.tiny,
        "tiny-h3": h3.tiny,
        "random-wan-1.3b": lambda seed: wan.random_1_3b(seed, device=device),
    }
    if str(name) in built:
        model = built[str(name)](seed)
        cast_components(model.pipeline, dtype)
        return model
    path = shipped_path(str(name)) if str(name) in SHIPPED_MODELS else Path(name)
    try:
        is_dir = path.is_dir()
    except OSError:  # a name the file system cannot hold (too long) is no directory either
        is_dir = False
    if not is_dir:
        known = TINY_MODELS + RANDOM_MODELS + tuple(SHIPPED_MODELS)
        raise ValueError(f"model: {str(name)!r} is neither a known name {known} nor a local directory")
    index = path / "model_index.json"
    if not index.is_file() and (path / MODULAR_INDEX).is_file():
        index = path / MODULAR_INDEX
    if not index.is_file():
        raise ValueError(
            f"model: {str(path)!r} has no model_index.json (nor {MODULAR_INDEX}); a diffusers-format directory needs "
            "one naming its pipeline class (`_class_name`) and components, beside a folder per component"
        )
    class_name = read_json(index, "model index").get("_class_name")
    if not isinstance(class_name, str) or class_name not in PIPELINE_FAMILIES:
        raise ValueError(f"model: {index} names pipeline {class_name!r}; supported: {sorted(PIPELINE_FAMILIES)}")
    module = {"wan": wan, "ltx2": ltx2, "h3": h3}[PIPELINE_FAMILIES[class_name]]
    model = module.load(path, dtype=dtype)
    if str(name) in SHIPPED_MODELS:
        model.name = str(name)  # a shipped checkpoint goes by its name (`demo-av`), not by where it is installed
    return model


def preview(name: str | Path, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> LoadedModel:
    """Model `name` as `resolve` builds it, from its shapes alone: a checkpoint's modules built from their configs on
    the meta device (`family.shapes_only`: the same checks of its folder, no weight read), a built-in model built as
    usual (small, or on the meta device), as `Session.open` builds it to plan a memory cap. Its family and request
    defaults are the loaded model's, so a request can be resolved against it (`LoadedModel.resolve`) before the
    weights load: the CLI checks `generate`'s request so, and on the `--ray` driver every case before a worker
    starts. Its pipeline runs nothing. A ValueError where the shapes do not build (a config the meta device cannot
    build, which `from_pretrained` may still load)."""
    from workbench.models.family import shapes_only
    from workbench.progress import library_bars_off

    with library_bars_off(), shapes_only():
        return resolve(name, seed=seed, dtype=dtype, device="meta")


def shipped_path(name: str) -> Path:
    """The folder of a shipped checkpoint; a RuntimeError saying how to make it when it is not there."""
    path, preset = SHIPPED_MODELS[name], SHIPPED_PRESETS[name]
    if not (path / "model_index.json").is_file():
        raise RuntimeError(
            f"model: {name!r} is a shipped checkpoint but {path} holds no model_index.json; train it with "
            f"`workbench train-tiny --preset {preset} --out RUN --device cuda` and copy RUN/{preset} to {path}"
        )
    return path
