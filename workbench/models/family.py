"""What the session needs to know about a model family, and the strict local loader they share."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


def _no_prefix(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return 0


@dataclass(frozen=True)
class SelfAttention:
    """Where a family's self-attention over the video sequence sits, and which of its rows are not video.

    Sparse-attention plugins route exactly these modules and take their sink / protected rows from here,
    so what they need about a model comes from its family adapter, not from the plugin:

    - `modules(denoiser)`: the attention modules (diffusers `Attention`-like, with a `processor`) whose queries
      and keys are the rows of one sequence holding the target video, one per transformer block, in block order.
    - `prefix_rows(args, kwargs)`: from the arguments of one denoiser forward, how many leading rows of that
      sequence are text / conditioning / audio (the rest, to the end, is target video). Families whose
      self-attention holds video rows only (text and images enter through cross-attention) return 0.
    - `layout`: one line for people on where the non-video rows sit.
    """

    modules: Callable[[torch.nn.Module], list[torch.nn.Module]] = field(repr=False)
    prefix_rows: Callable[[tuple[Any, ...], dict[str, Any]], int] = field(default=_no_prefix, repr=False)
    layout: str = ""


def block_arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, index: int) -> Any:
    """Argument `name` of a module call, given by keyword or at position `index`."""
    return kwargs[name] if name in kwargs else args[index]


@dataclass(frozen=True)
class TeaCache:
    """What TeaCache (`workbench.accelerations.caching.teacache`) needs of a family.

    - `indicator(block, args, kwargs)`: from the arguments of the FIRST block's forward, that block's
      self-attention input (the timestep-modulated norm of the hidden states), computed as the block computes it.
      TeaCache accumulates its relative L1 change between steps.
    - `coefficients`: rescale polynomials fitted on this family, name -> coefficients, highest power first
      (numpy.poly1d order), each with its source in the family module. Empty: only the raw change (`"none"`).
    """

    indicator: Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any]], torch.Tensor] = field(repr=False)
    coefficients: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class FusedBlocks:
    """The family's transformer-block forwards with the workbench's pointwise kernels (`workbench.models.fused`).

    - `ops(block, receipt, options, shared)` -> an instance-level forward for fused_block_ops (contract rounding):
      AdaLN modulation and gated residuals as kernels with torch's rounding. `options` are the plugin's (`rope`);
      `shared` is one dict per installed handle, cleared at each request's start and end.
    - `rope`: `ops` runs the self-attention's rotary step as a kernel (fused_block_ops' `rope` option).
    - `norms(block, receipt, shared)` -> (forward, undo or None) for fused_block_norms (contract reduction): the
      norms, q/k RMSNorm + rotary and residuals as kernels; `undo()` removes what the forward installed besides
      itself. None: not wired for this family.
    - `norms_check(block)`: why a block cannot take `norms` now (another plugin changed it), or None; at prepare.
    Every forward takes a call its kernels cannot run the stock way, counted under the receipt's fallbacks.
    """

    ops: Callable[[torch.nn.Module, Any, dict[str, Any], dict], Callable[..., Any]] = field(repr=False)
    rope: bool = False
    norms: Callable[[torch.nn.Module, Any, dict], tuple[Callable[..., Any], Callable[[], None] | None]] | None = field(
        default=None, repr=False
    )
    norms_check: Callable[[torch.nn.Module], str | None] = field(default=lambda block: None, repr=False)


@dataclass(frozen=True)
class Family:
    """A diffusers pipeline family: request defaults, the geometry rules its VAE imposes, its stages.

    `frame_step` and `frame_offset` say which frame counts the VAE takes (`frames % step == offset`);
    `size_multiple` is the pixel multiple for height and width.

    What plugins ask of a family (they hold no family tables; a new family fills these in and the plugins follow):
    - `block_classes`: the transformer block classes; `blocks(denoiser)` lists those blocks in order.
    - `streams`: the denoiser forward's inputs that one step transforms, in output order (video; then audio).
    - `block_streams`: the same streams as a block's forward takes them, (name, position), in output order.
    - `text_cross_attention`: child names of the attention modules that attend to the (step-invariant) text.
    - `self_attention`: which attention modules sparse attention may route and where the non-video rows sit
      (rotary and q/k are the processor's own; None: the family offers none).
    - `teacache`: TeaCache's indicator and the rescale coefficients fitted on this family (None: not wired).
    - `fused`: the block forwards the fused-kernel plugins install (None: not wired).
    - `timestep_embedder`: the denoiser attribute of a Wan-style `WanTimeTextImageEmbedding` (adaln_precompute).
    - `unsupported`: plugin name -> why this family cannot take it, for what the structure above does not say
      (a diffusers processor that ignores fused weights, a third-party package that rejects the pipeline).
    - `exact_fast`: the `exact-fast` profile of this family: (plugin, options) in install order (`profiles`).
    """

    name: str
    pipeline_class: str
    defaults: dict[str, Any]
    frame_step: int
    frame_offset: int
    size_multiple: int
    has_audio: bool
    modes: tuple[str, ...] = ("t2v",)
    denoisers: tuple[str, ...] = ("transformer",)
    block_classes: tuple[str, ...] = ()
    # (stage, component attribute or "" for the pipeline, method name or None for the module's forward)
    stage_probes: tuple[tuple[str, str, str | None], ...] = ()
    call_kwargs: Callable[..., dict[str, Any]] = field(default=lambda request: {}, repr=False)
    runner: Callable[..., tuple[Any, Any]] = field(default=None, repr=False)
    self_attention: SelfAttention | None = None
    streams: tuple[str, ...] = ("hidden_states",)
    block_streams: tuple[tuple[str, int], ...] = (("hidden_states", 0),)
    text_cross_attention: tuple[str, ...] = ()
    teacache: TeaCache | None = None
    fused: FusedBlocks | None = None
    timestep_embedder: str | None = None
    unsupported: Mapping[str, str] = field(default_factory=dict)
    exact_fast: tuple[tuple[str, dict[str, Any]], ...] = ()

    def __post_init__(self) -> None:
        if self.runner is None:
            object.__setattr__(self, "runner", run_standard_pipeline)

    def blocks(self, denoiser: torch.nn.Module) -> list[torch.nn.Module]:
        """The denoiser's transformer blocks (modules of a `block_classes` class), in module order."""
        return [module for module in denoiser.modules() if type(module).__name__ in self.block_classes]

    def frames_allowed(self, frames: int) -> bool:
        return frames >= 1 and frames % self.frame_step == self.frame_offset


WORKBENCH_FILE = "workbench.json"  # optional: request defaults and pipeline kwargs saved with a model


def run_standard_pipeline(pipeline: Any, kwargs: dict[str, Any], generator: Any, on_step_end: Any) -> tuple:
    """Call a classic diffusers pipeline; returns float frames (T, H, W, 3) in [0, 1] and audio (C, N) or None.

    A family whose pipeline is called differently (a modular pipeline) supplies its own `runner` with
    the same signature; `on_step_end(pipeline, index, timestep, tensors)` must be called after every
    denoising step with the latents in `tensors["latents"]`.
    """
    output = pipeline(
        **kwargs,
        generator=generator,
        output_type="np",
        callback_on_step_end=on_step_end,
        callback_on_step_end_tensor_inputs=["latents"],
    )
    audio = getattr(output, "audio", None)
    return output.frames[0], None if audio is None else audio[0]


SAFE_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")
UNSAFE_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def load_pipeline(path: str | Path, expected_class: str, dtype: torch.dtype = torch.float32) -> Any:
    """Load a local diffusers-format directory component by component, safetensors only, strictly.

    Loading each component ourselves (rather than `DiffusionPipeline.from_pretrained`) lets us refuse
    pickled weights and turn missing, unexpected or mis-shaped tensors into an error naming the file,
    where the libraries would only log a warning and initialise the missing part randomly.
    """
    root = Path(path)
    index_file = root / "model_index.json"
    if not root.is_dir():
        raise ValueError(f"model path {str(root)!r} is not a directory")
    if not index_file.is_file():
        raise ValueError(f"model path {str(root)!r} has no model_index.json (not a diffusers-format directory)")
    index = json.loads(index_file.read_text())
    if index.get("_class_name") != expected_class:
        raise ValueError(f"{index_file}: _class_name is {index.get('_class_name')!r}, expected {expected_class!r}")

    components: dict[str, Any] = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list):
            if not name.startswith("_"):
                components[name] = spec  # plain config values such as boundary_ratio
            continue
        library, class_name = spec
        if library is None or class_name is None:
            components[name] = None
            continue
        components[name] = _load_component(root / name, library, class_name, dtype)

    pipeline_cls = getattr(importlib.import_module("diffusers"), expected_class)
    return pipeline_cls(**components)


def _import_class(library: str, class_name: str) -> Any:
    """model_index.json names either a top-level library or a diffusers pipeline module (`ltx2`)."""
    for module_name in (library, f"diffusers.pipelines.{library}"):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        if hasattr(module, class_name):
            return getattr(module, class_name)
    raise ValueError(f"model_index.json: class {class_name!r} from library {library!r} cannot be imported")


def _load_component(folder: Path, library: str, class_name: str, dtype: torch.dtype) -> Any:
    if not folder.is_dir():
        raise ValueError(f"component folder {folder} is missing (named in model_index.json)")
    cls = _import_class(library, class_name)
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        return cls.from_pretrained(folder, local_files_only=True)  # tokenizer, scheduler, processor

    files = [p.name for p in folder.iterdir()]
    unsafe = [f for f in files if f.endswith(UNSAFE_WEIGHT_SUFFIXES)]
    if unsafe:
        raise ValueError(f"{folder}: pickled weights {unsafe} are refused; convert them to safetensors")
    if not any(f.endswith(SAFE_WEIGHT_SUFFIXES) for f in files):
        raise ValueError(f"{folder}: no safetensors weights found")
    try:
        model, info = cls.from_pretrained(
            folder, torch_dtype=dtype, use_safetensors=True, local_files_only=True, output_loading_info=True
        )
    except (OSError, RuntimeError, ValueError) as error:  # the libraries' messages omit which folder
        raise ValueError(f"{folder}: {error}") from error
    problems = {k: v for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if (v := info.get(k))}
    if problems:
        raise ValueError(f"{folder}: weights do not match the config: {problems}")
    return model.eval()


def read_workbench_file(root: Path, family: Family) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (defaults, call_overrides) stored beside a checkpoint, or the family's defaults when absent."""
    path = Path(root) / WORKBENCH_FILE
    if not path.is_file():
        return dict(family.defaults), {}
    stored = json.loads(path.read_text())
    unknown = set(stored) - {"defaults", "call_overrides"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: defaults, call_overrides")
    bad = set(stored.get("defaults", {})) - set(family.defaults)
    if bad:
        raise ValueError(f"{path}: defaults {sorted(bad)} are not request fields; allowed: {sorted(family.defaults)}")
    return {**family.defaults, **stored.get("defaults", {})}, dict(stored.get("call_overrides", {}))
