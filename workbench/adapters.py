"""LoRA adapters fused into a session's denoiser weights through diffusers' own loader.

`Session.open(..., adapters=[Adapter(...)])` and `session.load_adapters([...])` take `Adapter` specs. Loading goes
through the pipeline's `load_lora_weights` (diffusers converts the known LoRA formats; for Wan2.2 with
`load_into_transformer_2=True` for an adapter aimed at the low-noise expert), from a local `.safetensors` file only.
Each targeted denoiser then activates its adapters at their scales (`set_adapters`), merges them into its weights
(`fuse_lora`, with peft's NaN check) and drops the LoRA layers (`unload_lora`): what stays is the model's own module
graph with changed weights, so every acceleration installs on the fused weights as on any checkpoint (quantization
after fusion). Unfusing does not subtract the deltas back (that rounds): the weights of every layer an adapter
touched are copied to host memory before fusing and copied back by `Fused.restore()`, so the state dict is restored
bit for bit. Memory: that copy is the touched weights of the targeted experts, in their dtype, on the host.

Few-step settings. The safetensors header's `__metadata__` may name the request settings an adapter was distilled
for; these keys are read (values are strings, as safetensors stores them):
- `steps` or `num_inference_steps`: an int, becomes the session's default `Request.steps`;
- `guidance` or `guidance_scale`: a number, the default `Request.guidance`;
- `shift` or `flow_shift`: a number, set on the pipeline's scheduler (its `shift` or `flow_shift` config) while the
  adapters are fused, and put back by `restore()`.
A request that sets `steps` or `guidance` itself keeps its own; two adapters naming different values are refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.request import shown

TARGETS = ("transformer", "transformer_2", "both")
EXTRA = "pip install 'vflash-workbench[lora]' (peft>=0.17)"
METADATA_KEYS = {
    "steps": ("steps", "num_inference_steps"),
    "guidance": ("guidance", "guidance_scale"),
    "shift": ("shift", "flow_shift"),
}
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_SCALE = 100.0
# Set on a denoiser holding fused adapters (their names) and on a scheduler their metadata shifted, until `restore()`:
# what a session dropped without close() leaves fused shows in `Session.open`'s check of a reused model.
FUSED_MARK = "_workbench_fused_adapters"


@dataclass(frozen=True)
class Adapter:
    """One LoRA file to fuse: `path` a local `.safetensors` file; `scale` its strength (negative allowed, finite,
    |scale| <= 100); `target` the denoiser it goes into ("transformer", Wan2.2's "transformer_2", or "both");
    `name` how receipts and metadata name it (letters, digits, `_.-`; default: the file's stem). ValueError naming
    the field, the value and what is allowed."""

    path: str | os.PathLike
    scale: float = 1.0
    target: str = "transformer"
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str | os.PathLike):
            raise ValueError(f"adapter.path: {shown(self.path)}; allowed: a str or pathlib.Path to a .safetensors file")
        path = Path(self.path)
        if path.suffix != ".safetensors" or not path.is_file():
            raise ValueError(f"adapter.path: {str(path)!r} is not an existing .safetensors file")
        scale = self.scale
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
            raise ValueError(f"adapter.scale: {shown(scale)}; allowed: a finite number in [-{MAX_SCALE}, {MAX_SCALE}]")
        if abs(scale) > MAX_SCALE:
            raise ValueError(f"adapter.scale: {scale!r}; allowed: a finite number in [-{MAX_SCALE}, {MAX_SCALE}]")
        if self.target not in TARGETS:
            raise ValueError(f"adapter.target: {shown(self.target)}; allowed: {list(TARGETS)}")
        name = path.stem if self.name is None else self.name
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"adapter.name: {shown(name)}; allowed: 1-64 letters, digits, '_', '.', '-'")
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "scale", float(scale))
        object.__setattr__(self, "name", name)

    def experts(self, available: list[str]) -> list[str]:
        """The denoiser attributes this adapter goes into; ValueError when the model lacks one."""
        wanted = ["transformer", "transformer_2"] if self.target == "both" else [self.target]
        missing = [w for w in wanted if w not in available]
        if missing:
            raise ValueError(
                f"adapter.target: {self.target!r} needs {missing}, which this model lacks; allowed: "
                f"{[t for t in TARGETS if t in available or (t == 'both' and len(available) > 1)]}"
            )
        return wanted

    def settings(self) -> dict[str, float | int]:
        """The request settings the file's metadata names (module docstring), parsed."""
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(self.path), "pt") as weights:
                metadata = weights.metadata() or {}
        except SafetensorError as error:
            raise ValueError(f"adapter.path: {str(self.path)!r} is not a valid safetensors file ({error})") from error
        found: dict[str, float | int] = {}
        for setting, keys in METADATA_KEYS.items():
            for key in (k for k in keys if k in metadata):
                kind = int if setting == "steps" else float
                try:
                    value = kind(metadata[key])
                except ValueError:
                    raise ValueError(
                        f"adapter {self.name!r}: metadata {key}={metadata[key]!r} in {self.path} is not "
                        f"{'an integer' if kind is int else 'a number'}"
                    ) from None
                if found.setdefault(setting, value) != value:
                    raise ValueError(f"adapter {self.name!r}: metadata names {setting} twice with different values")
        return found

    def describe(self) -> dict[str, Any]:
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        return {"name": self.name, "path": str(self.path), "sha256": digest, "scale": self.scale, "target": self.target}


def parse(adapters: Any) -> list[Adapter]:
    """A list of `Adapter`s (or dicts of its fields) checked, names unique; ValueError naming the entry."""
    if not isinstance(adapters, list | tuple):
        raise ValueError(f"adapters: {shown(adapters)}; allowed: a list of workbench.Adapter")
    parsed = []
    for index, item in enumerate(adapters):
        if isinstance(item, dict):
            try:
                item = Adapter(**item)
            except TypeError as error:
                raise ValueError(f"adapters[{index}]: {error}; fields: path, scale, target, name") from None
        if not isinstance(item, Adapter):
            raise ValueError(f"adapters[{index}]: {shown(item)}; allowed: a workbench.Adapter or a dict of its fields")
        parsed.append(item)
    names = [a.name for a in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"adapter.name: {names} repeats a name; give each adapter its own")
    return parsed


@dataclass
class Fused:
    """Adapters fused into a model: `defaults` the request settings their metadata names (steps, guidance),
    `records` what `Result.metadata["adapters"]` says of each (name, path, sha256, scale, target) and of the
    metadata settings, `restore()` puts the model back exactly (weights copied back, scheduler put back)."""

    model: Any
    adapters: list[Adapter]
    defaults: dict[str, Any]
    saved: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict, repr=False)  # (expert, param) -> copy
    scheduler: Any = None  # the pipeline's scheduler before a metadata shift replaced it
    records: tuple[dict[str, Any], ...] = ()

    def restore(self) -> None:
        """Copy every saved weight back and put the scheduler back: the state dict is what it was before fusing, and
        no denoiser carries `FUSED_MARK`."""
        with torch.no_grad():
            for (expert, name), tensor in self.saved.items():
                getattr(self.model.pipeline, expert).get_parameter(name).copy_(tensor)
        for expert in {expert for expert, _ in self.saved}:
            vars(getattr(self.model.pipeline, expert)).pop(FUSED_MARK, None)
        if self.scheduler is not None:
            self.model.pipeline.scheduler = self.scheduler
        self.saved.clear()


def fuse(model: Any, adapters: list[Adapter]) -> Fused:
    """Load `adapters` into `model` (a LoadedModel) with diffusers' loader and fuse them (module docstring). All or
    nothing: if any step raises, the model is put back before the error propagates. RuntimeError when peft is
    missing or the pipeline has no LoRA loader; ValueError for a target the model lacks or conflicting metadata."""
    from workbench.models.experts import named_denoisers

    pipe = model.pipeline
    if not hasattr(pipe, "load_lora_weights"):
        raise RuntimeError(f"adapters: {type(pipe).__name__} ({model.family.name}) has no diffusers LoRA loader")
    try:
        import peft  # noqa: F401
    except ImportError as error:
        raise RuntimeError(f"adapters: loading LoRA needs the peft package: {EXTRA}: {error}") from None
    available = [name for name, _ in named_denoisers(model)]
    targets = {a.name: a.experts(available) for a in adapters}
    defaults: dict[str, Any] = {}
    for adapter in adapters:
        for setting, value in adapter.settings().items():
            if defaults.setdefault(setting, value) != value:
                raise ValueError(f"adapters: {adapter.name!r} names {setting}={value}, another {defaults[setting]}")
    records = tuple({**a.describe(), "settings": a.settings()} for a in adapters)
    shift = defaults.pop("shift", None)
    fused = Fused(model, list(adapters), defaults, records=records)
    try:
        with _no_torchao_probe():
            _load(pipe, adapters, targets)
        for adapter in adapters:
            for expert in targets[adapter.name]:
                _check_landed(adapter, expert, getattr(pipe, expert))
        for expert in available:
            names = [a.name for a in adapters if expert in targets[a.name]]
            if names:
                _fuse_into(fused, expert, names, [a.scale for a in adapters if a.name in names])
        if shift is not None:
            fused.scheduler = pipe.scheduler
            pipe.scheduler = _shifted(pipe.scheduler, shift)
    except BaseException:
        for expert in available:
            if getattr(getattr(pipe, expert), "peft_config", None):
                getattr(pipe, expert).unload_lora()
        fused.restore()
        raise
    return fused


def _load(pipe: Any, adapters: list[Adapter], targets: dict[str, list[str]]) -> None:
    """Each adapter into each of its experts through the pipeline's diffusers LoRA loader, from its local file."""
    for adapter in adapters:
        for expert in targets[adapter.name]:
            try:
                pipe.load_lora_weights(
                    str(adapter.path.parent),
                    weight_name=adapter.path.name,
                    adapter_name=adapter.name,
                    local_files_only=True,
                    **({"load_into_transformer_2": True} if expert == "transformer_2" else {}),
                )
            except ValueError as error:  # diffusers' own words (not a LoRA file, keys it cannot map), with the adapter
                raise ValueError(f"adapters: {adapter.name!r} ({adapter.path}) into {expert}: {error}") from error


def _check_landed(adapter: Adapter, expert: str, denoiser: torch.nn.Module) -> None:
    """ValueError unless `adapter` wrapped at least one layer of `denoiser`. diffusers' loader only warns when no key
    of the file maps to the denoiser (keys of a text encoder, or without the prefix it looks for): the fused result
    would then be the model's own, recorded as adapted."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    wrapped = adapter.name in (getattr(denoiser, "peft_config", None) or {}) and any(
        any(adapter.name in getattr(module, layer, {}) for layer in module.adapter_layer_names)
        for module in denoiser.modules()
        if isinstance(module, BaseTunerLayer)
    )
    if not wrapped:
        raise ValueError(
            f"adapters: {adapter.name!r} ({adapter.path}) into {expert}: no layer of {expert} took its weights; "
            f"its keys start with {_key_prefixes(adapter.path)}; allowed: LoRA keys diffusers maps to the "
            f"{type(denoiser).__name__} (e.g. 'transformer.<module>.lora_A.weight')"
        )


def _key_prefixes(path: Path, shown_at_most: int = 4) -> list[str]:
    """The distinct first dotted components of the tensor names in safetensors file `path`, sorted, at most
    `shown_at_most` of them."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as weights:
        return sorted({key.split(".", 1)[0] for key in weights.keys()})[:shown_at_most]


@contextlib.contextmanager
def _no_torchao_probe() -> Iterator[None]:
    """peft asks, per wrapped layer, whether torchao is installed to detect torchao-quantized weights, importing it
    (which prints its C-extension failures, see `workbench._quiet_imports`). Adapters are fused before any plugin
    installs, so no weight is a torchao tensor here: while torchao is not imported, the probe answers False."""
    if "torchao" in sys.modules:
        yield
        return
    modules = [importlib.import_module(m) for m in ("peft.tuners.lora.torchao", "peft.utils.quantization_utils")]
    real = [module.is_torchao_available for module in modules]
    for module in modules:
        module.is_torchao_available = lambda: False
    try:
        yield
    finally:
        for module, probe in zip(modules, real, strict=True):
            module.is_torchao_available = probe


def _fuse_into(fused: Fused, expert: str, names: list[str], scales: list[float]) -> None:
    """Save the touched weights of `expert`, merge its adapters at their scales, drop the LoRA layers."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    denoiser = getattr(fused.model.pipeline, expert)
    for path, module in denoiser.named_modules():
        if isinstance(module, BaseTunerLayer):
            base = module.get_base_layer()
            for param, tensor in base.named_parameters(recurse=False):
                original = f"{path}.{param}"  # the name it has again once the LoRA layer is dropped
                fused.saved[(expert, original)] = tensor.detach().to("cpu", copy=True)
    denoiser.set_adapters(names, weights=scales)
    denoiser.fuse_lora(lora_scale=1.0, safe_fusing=True, adapter_names=names)
    denoiser.unload_lora()
    setattr(denoiser, FUSED_MARK, tuple(names))


def _shifted(scheduler: Any, shift: float) -> Any:
    """A copy of `scheduler` with its flow shift set to `shift` and `FUSED_MARK` naming it; RuntimeError when it has
    none."""
    key = next((k for k in ("flow_shift", "shift") if k in scheduler.config), None)
    if key is None:
        raise RuntimeError(f"adapters: metadata names shift={shift} but {type(scheduler).__name__} has no flow shift")
    shifted = type(scheduler).from_config({**scheduler.config, key: shift})
    setattr(shifted, FUSED_MARK, (f"shift={shift}",))
    return shifted
