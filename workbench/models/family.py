"""What the session needs to know about a model family, and the strict local loader they share."""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
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
class VaeDecode:
    """The family's own decode path for its VAE (`workbench.models.fused.<family>_vae`), installed by fused_vae_decode.

    - `check(vae)`: why this VAE cannot take it now (another class or configuration, hooks, a replaced decode), or None.
    - `install(vae, options, receipt)` -> `remove()`: replaces the VAE's decode with the path for the plugin's options
      (`conv_cache`, `channels_last`, `norm`), counting into `receipt`; `remove()` puts back what it changed.
    """

    check: Callable[[Any], str | None] = field(repr=False)
    install: Callable[[Any, dict[str, Any], Any], Callable[[], None]] = field(repr=False)


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
    - `vae_decode`: the VAE decode path fused_vae_decode installs (None: not wired).
    - `timestep_embedder`: the denoiser attribute of a Wan-style `WanTimeTextImageEmbedding` (adaln_precompute).
    - `unsupported`: plugin name -> why this family cannot take it, for what the structure above does not say
      (a diffusers processor that ignores fused weights, a third-party package that rejects the pipeline).
    - `exact_fast`: the `exact-fast` profile of this family: (plugin, options) in install order (`profiles`).
    - `expert_schedule(pipeline, steps)`: which of `denoisers` runs each step of a `steps`-step request, as the
      pipeline will switch them (Wan2.2's boundary); None: the first denoiser runs every step
      (`workbench.models.experts`).

    What the memory planner asks (`workbench.memory_plan`):
    - `stage_components`: stage -> the pipeline components it runs besides the denoisers (what may be offloaded to
      host between its stages).
    - `denoise_shape(request)`: (rows, forwards) of a resolved request: the tokens one denoiser forward processes
      (CFG batch included) and the denoiser forwards per request.
    - `denoise_held`: dotted names of the denoiser's submodules whose output its forward keeps referenced while the
      blocks run (one row of their `out_features` per row, at their weights' element size), beyond the residual
      stream the blocks pass on: MiniMax-H3 keeps its float32 video embedding (`proj_in`'s output) to the end.
    - `text_layers`: the dotted path, inside the text encoder, of its decoder layers' list (the layers a plan may
      stream through the ring during text_encode; `text_blocks`); None: its layers do not stream.
    - `text_forwards(request)`: how many times a resolved request runs that layer stack (a negative prompt encoded
      apart is a second forward): each forward moves the streamed layers once.

    What the loader reads (`load_components`):
    - `components`: component name -> {(library, class name) as a model index spells it: the class}. The only
      classes a model folder may name; the loader never imports a name it reads from a file.
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
    vae_decode: VaeDecode | None = None
    timestep_embedder: str | None = None
    unsupported: Mapping[str, str] = field(default_factory=dict)
    exact_fast: tuple[tuple[str, dict[str, Any]], ...] = ()
    stage_components: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    denoise_shape: Callable[[Any], tuple[int, int]] = field(default=lambda request: (0, 0), repr=False)
    denoise_held: tuple[str, ...] = ()
    expert_schedule: Callable[[Any, int], tuple[str, ...]] | None = field(default=None, repr=False)
    text_layers: str | None = None
    text_forwards: Callable[[Any], int] = field(default=lambda request: 1, repr=False)
    components: Mapping[str, Mapping[tuple[str, str], type]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.runner is None:
            object.__setattr__(self, "runner", run_standard_pipeline)

    def blocks(self, denoiser: torch.nn.Module) -> list[torch.nn.Module]:
        """The denoiser's transformer blocks (modules of a `block_classes` class), in module order."""
        return [module for module in denoiser.modules() if type(module).__name__ in self.block_classes]

    def text_blocks(self, text_encoder: torch.nn.Module) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
        """(the module whose forward runs them, the text encoder's decoder layers in order) at `text_layers`;
        RuntimeError when the family names none or the text encoder has no such list (another class)."""
        owner: Any = text_encoder
        path = (self.text_layers or "").split(".")
        for name in path[:-1]:
            owner = getattr(owner, name, None)
        layers = getattr(owner, path[-1], None) if self.text_layers else None
        if not isinstance(layers, torch.nn.ModuleList) or not isinstance(owner, torch.nn.Module):
            raise RuntimeError(
                f"{self.name}: the text encoder {type(text_encoder).__name__} has no layer list at "
                f"{self.text_layers!r}, so its layers cannot stream"
            )
        return owner, list(layers)

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


# The strict local loader. Every name a model folder holds is data, never code: component classes come from the
# family's `components` table (classes the family module already imported), every path must resolve inside the
# model folder, weights are read from safetensors only, and size-setting config fields are bounded before anything
# is built. Each refusal is a ValueError naming the file, the component or field, the value and what is allowed.

SAFE_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")
UNSAFE_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".msgpack", ".h5")
COMPONENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Config files of a component folder whose numbers are checked against CONFIG_MAXIMA (tokenizer files are not
# configs: their vocabularies map arbitrary token strings to ids).
CHECKED_CONFIGS = ("config.json", "scheduler_config.json")

# Documented maxima of the config fields that set sizes (anywhere in a component's config.json or
# scheduler_config.json, nested configs and lists included). Each is about 10x the largest value in the released
# checkpoints of the three families (Wan2.1/2.2 14B with UMT5-XXL, LTX-2 with Gemma-3 12B, MiniMax-H3 33B with
# Qwen3-VL): enough head-room for any real model, small enough that a hostile config is refused before a module is
# built (10^6 layers or an FFN of 4e9 would otherwise start allocating).
_LAYERS, _HEADS, _HEAD_DIM, _WIDTH, _FFN = 1_000, 1_024, 4_096, 65_536, 262_144
CONFIG_MAXIMA: dict[str, int] = {
    # layer / block counts (largest released: 64)
    **dict.fromkeys(
        (
            "num_layers",
            "num_hidden_layers",
            "num_decoder_layers",
            "num_refiner_layers",
            "num_single_layers",
            "decoder_num_layers",
            "video_connector_num_layers",
            "audio_connector_num_layers",
            "depth",
            "num_res_blocks",
            "layers_per_block",
            "decoder_layers_per_block",
        ),
        _LAYERS,
    ),
    # attention heads (largest released: 64)
    **dict.fromkeys(
        (
            "num_attention_heads",
            "num_heads",
            "num_key_value_heads",
            "audio_num_attention_heads",
            "decoder_num_attention_heads",
            "video_connector_num_attention_heads",
            "audio_connector_num_attention_heads",
        ),
        _HEADS,
    ),
    # per-head width (largest released: 256)
    **dict.fromkeys(
        (
            "attention_head_dim",
            "head_dim",
            "d_kv",
            "audio_attention_head_dim",
            "decoder_attention_head_dim",
            "video_connector_attention_head_dim",
            "audio_connector_attention_head_dim",
        ),
        _HEAD_DIM,
    ),
    # model widths and channel counts (largest released: 5120)
    **dict.fromkeys(
        (
            "hidden_size",
            "d_model",
            "text_dim",
            "caption_channels",
            "cross_attention_dim",
            "audio_cross_attention_dim",
            "out_hidden_size",
            "freq_dim",
            "time_embed_dim",
            "time_embed_hidden_dim",
            "video_hidden_dim",
            "audio_hidden_dim",
            "in_channels",
            "out_channels",
            "audio_in_channels",
            "audio_out_channels",
            "latent_channels",
            "latent_dim",
            "z_dim",
            "base_dim",
            "base_channels",
            "hidden_channels",
            "block_out_channels",
            "decoder_block_out_channels",
            "encoder_dim",
            "decoder_dim",
        ),
        _WIDTH,
    ),
    # feed-forward widths (largest released: 25600)
    **dict.fromkeys(("intermediate_size", "ffn_dim", "d_ff"), _FFN),
    "vocab_size": 2_621_440,  # Gemma-3: 262,208
    "max_position_embeddings": 2_621_440,  # Qwen3-VL: 262,144
    "num_position_embeddings": 65_536,  # Qwen3-VL vision: 2,304
    "rope_max_seq_len": 16_384,  # Wan: 1,024 (its rotary table is built at this length)
    "num_train_timesteps": 10_000,  # every released scheduler: 1,000
}


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path`; a ValueError naming the file when it is not strict JSON holding an object."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        data = json.loads(path.read_text(), parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # RecursionError: nested too deep to parse
        raise ValueError(f"{what} {path}: not valid JSON ({error})") from error
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def _confines(root: Path) -> tuple[Path, ...]:
    """Where the files of a model folder may resolve: the folder itself, and for a Hugging Face cache snapshot
    (`models--ORG--NAME/snapshots/REV`, whose files are links into the repository's `blobs/`) that `blobs/`."""
    resolved = root.resolve()
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        return resolved, resolved.parent.parent / "blobs"
    return (resolved,)


def _check_inside(path: Path, confines: tuple[Path, ...], what: str) -> None:
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop (RuntimeError before Python 3.13, OSError after)
        raise ValueError(f"{what} {path} does not resolve ({error}); component files must be plain files") from error
    if not any(resolved.is_relative_to(c) for c in confines):
        raise ValueError(
            f"{what} {path} resolves to {resolved}, outside the model directory {confines[0]}; "
            "component folders and files (symlinks included) must stay inside it"
        )


def component_class(table: Mapping[str, Mapping[tuple[str, str], type]], index_file: Path, name: str, spec: Any) -> Any:
    """The class a model index names for component `name`, looked up in the family's table, never imported.

    `spec` is `[library, class, ...]` (classic indexes have two entries, modular ones add a loading spec, which is
    ignored: components are always read from the folder `name` inside the model directory). ValueError naming the
    component, the class and the allowed ones for anything the table does not list.
    """
    if not COMPONENT_NAME.fullmatch(name):
        raise ValueError(
            f"{index_file}: component key {name!r} is not a plain folder name (letters, digits, underscores); "
            "paths such as '../x' or '/abs' are refused"
        )
    if not (isinstance(spec, list) and len(spec) >= 2 and all(isinstance(s, str) for s in spec[:2])):
        raise ValueError(f"{index_file}: component {name!r} is {spec!r}; expected [library, class]")
    library, class_name = spec[0], spec[1]
    allowed = table.get(name)
    if allowed is None:
        raise ValueError(
            f"{index_file}: component {name!r} ({library}.{class_name}) is not one this family takes; "
            f"allowed components: {sorted(table)}"
        )
    if (library, class_name) not in allowed:
        choices = ", ".join(f"{lib}.{cls}" for lib, cls in allowed)
        raise ValueError(
            f"{index_file}: component {name!r} names class {library}.{class_name}, which is not allowed; "
            f"allowed: {choices}"
        )
    return allowed[(library, class_name)]


def check_config_sizes(config: Any, path: Path, prefix: str = "") -> None:
    """Refuse a config whose size-setting fields (CONFIG_MAXIMA) exceed their maximum, are negative or are not
    ints (null is left to the library's default), or that holds a non-finite number, with a ValueError naming the
    file and the field. Nested objects and lists are walked."""
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for key, value in items:
        field_name = f"{prefix}{key}" if isinstance(config, dict) else f"{prefix[:-1]}[{key}]"
        if isinstance(value, dict | list):
            check_config_sizes(value, path, f"{field_name}.")
            continue
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{path}: field {field_name} is {value!r}; config numbers must be finite")
        name = key if isinstance(config, dict) else prefix[:-1].rsplit(".", 1)[-1]
        maximum = CONFIG_MAXIMA.get(name)
        if maximum is None or value is None:
            continue
        allowed = f"allowed 0..{maximum} (workbench.models.family.CONFIG_MAXIMA, about 10x the largest released model)"
        if is_number and not 0 <= value <= maximum:
            raise ValueError(f"{path}: field {field_name} is {value!r}; {allowed}")
        if not is_number or isinstance(value, float):
            raise ValueError(
                f"{path}: field {field_name} is {value!r}; {allowed}: expected an int, got {type(value).__name__}"
            )


def component_folder(root: Path, name: str, index_file: Path) -> Path:
    """The folder of component `name`, checked: it exists, and it and every file under it resolve inside the model
    directory; none holds pickled weights; every config is within CONFIG_MAXIMA."""
    folder = root / name
    confines = _confines(root)
    if not folder.is_dir():
        raise ValueError(f"component folder {folder} is missing (named in {index_file.name})")
    _check_inside(folder, confines[:1], "component folder")
    files = sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    for file in files:
        _check_inside(file, confines, "component file")
    unsafe = [str(f.relative_to(folder)) for f in files if f.name.endswith(UNSAFE_WEIGHT_SUFFIXES)]
    if unsafe:
        raise ValueError(f"{folder}: pickled weights {unsafe} are refused; convert them to safetensors")
    for file in files:
        if file.parent == folder and file.name in CHECKED_CONFIGS:
            check_config_sizes(read_json(file, "config"), file)
    return folder


def _check_safetensors(folder: Path) -> None:
    """The folder holds safetensors weights, and a shard index names only shards inside the folder."""
    files = [p for p in folder.iterdir() if p.name.endswith(SAFE_WEIGHT_SUFFIXES)]
    if not files:
        raise ValueError(f"{folder}: no safetensors weights found")
    for index in (p for p in files if p.name.endswith(".index.json")):
        weight_map = read_json(index, "shard index").get("weight_map", {})
        shards = set(weight_map.values()) if isinstance(weight_map, dict) else {weight_map}
        for shard in shards:
            if not (isinstance(shard, str) and COMPONENT_NAME.fullmatch(shard.removesuffix(".safetensors"))):
                raise ValueError(f"{index}: shard {shard!r} is not a plain .safetensors file name in {folder}")


def stored_parameters(folder: Path) -> int:
    """Elements in the safetensors files of `folder`, read from their headers (no tensor data is read); a
    ValueError naming the file when a header is not valid safetensors."""
    from safetensors import SafetensorError, safe_open

    total = 0
    for file in folder.glob("*.safetensors"):
        try:
            with safe_open(str(file), "pt") as weights:
                total += sum(math.prod(weights.get_slice(key).get_shape()) for key in weights.keys())
        except SafetensorError as error:
            raise ValueError(f"{file}: not a valid safetensors file ({error})") from error
    return total


def _meta_build(cls: type, folder: Path) -> torch.nn.Module:
    """`cls` (a diffusers or transformers module class) built from `folder`'s config on the meta device, its
    weights' initialisation skipped (moot there); the libraries' errors pass through."""
    from transformers.initialization import no_init_weights

    with torch.device("meta"), no_init_weights():
        if hasattr(cls, "config_class"):  # transformers
            return cls._from_config(cls.config_class.from_pretrained(folder, local_files_only=True))
        return cls.from_config(cls.load_config(folder, local_files_only=True))  # diffusers


def check_implied_size(cls: type, folder: Path) -> torch.nn.Module | None:
    """Refuse a module config that implies far more parameters than its weight files hold; returns the module it
    built on the meta device (None when it could not), which `shapes_only` loading keeps.

    The module is built from its config on the meta device (no memory is allocated) and its parameter and buffer
    elements are counted; a config implying more than twice the stored elements plus 2^20 (tied and computed
    tensors are not stored) is refused with a ValueError naming the config file, before the libraries build it for
    real: a combination of in-range fields (CONFIG_MAXIMA) can still describe a model of terabytes. A config the
    meta device cannot build is left to `from_pretrained`, which reports it.
    """
    try:
        model = _meta_build(cls, folder)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, OSError):
        return None
    implied = sum(t.numel() for t in itertools.chain(model.parameters(), model.buffers()))
    stored = stored_parameters(folder)
    if implied > 2 * stored + 2**20:
        raise ValueError(
            f"{folder / 'config.json'}: the config implies {implied:,} parameters but the weights hold {stored:,}; "
            "a config must describe the weights beside it"
        )
    return model


_SHAPES_ONLY = contextvars.ContextVar("shapes_only", default=False)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Inside, `load_component` builds each module from its config on the meta device, cast as `from_pretrained(
    torch_dtype=...)` casts, and reads no weight: a model directory's shapes and dtypes at no memory, which is what
    the memory planner needs to refuse a cap before a checkpoint loads (`Session.open(memory=...)`). Tokenizers,
    schedulers and processors load as usual (they hold no weights)."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def _as_loaded(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A module built on the meta device from its config, tied and cast as `from_pretrained(torch_dtype=dtype)`
    leaves one."""
    from transformers import PreTrainedModel

    from workbench.model_sizes import cast_like_from_pretrained

    if isinstance(model, PreTrainedModel):
        model.tie_weights()
    cast_like_from_pretrained(model, dtype)
    return model.eval()


def load_component(root: Path, name: str, cls: Any, dtype: torch.dtype, index_file: Path) -> Any:
    """Load component `name` of the model directory `root` as `cls` (from the family's table), strictly.

    Modules are read from safetensors only (`use_safetensors=True`, and a folder holding pickled files is refused
    first), and missing, unexpected or mis-shaped tensors are an error naming the folder, where the libraries would
    only log a warning and initialise the missing part randomly. Tokenizers, schedulers and processors are read from
    their JSON / tokenizer files by `cls.from_pretrained`, offline. Under `shapes_only` a module is built on the
    meta device from its config instead (the same checks first).
    """
    folder = component_folder(root, name, index_file)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        try:
            return cls.from_pretrained(folder, local_files_only=True)
        except (OSError, TypeError, ValueError, KeyError) as error:
            raise ValueError(f"{folder}: {type(error).__name__}: {error}") from error
    _check_safetensors(folder)
    meta = check_implied_size(cls, folder)
    if _SHAPES_ONLY.get():
        if meta is None:
            raise ValueError(f"{folder}: its config does not build on the meta device")
        return _as_loaded(meta, dtype)
    try:
        model, info = cls.from_pretrained(
            folder, torch_dtype=dtype, use_safetensors=True, local_files_only=True, output_loading_info=True
        )
    except (OSError, RuntimeError, ValueError, TypeError, KeyError) as error:  # the libraries' messages omit the folder
        raise ValueError(f"{folder}: {error}") from error
    problems = {k: v for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if (v := info.get(k))}
    if problems:
        raise ValueError(f"{folder}: weights do not match the config: {problems}")
    return model.eval()


def read_model_index(root: str | Path, file_name: str) -> tuple[Path, dict[str, Any]]:
    """The checked path and contents of a model directory's index (`model_index.json` or a modular one)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"model path {str(root)!r} is not a directory")
    index_file = root / file_name
    if not index_file.is_file():
        raise ValueError(f"model path {str(root)!r} has no {file_name} (not a diffusers-format directory)")
    _check_inside(index_file, _confines(root), "model index")
    return index_file, read_json(index_file, "model index")


def load_components(
    root: str | Path,
    index_file: Path,
    index: Mapping[str, Any],
    family: Family,
    dtype: torch.dtype,
    skip: tuple[str, ...] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(components, config values) of a model index: every `[library, class, ...]` entry's class is checked
    against `family.components` before anything is loaded, then each is loaded strictly; `[null, null]` entries
    are None. Entries in `skip` are checked but not loaded. Plain values (`boundary_ratio`) are returned apart;
    they must be JSON scalars."""
    root = Path(root)
    classes: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for name, spec in index.items():
        if name.startswith("_"):
            continue
        if isinstance(spec, list) and len(spec) >= 2 and spec[0] is None and spec[1] is None:
            classes[name] = None
        elif isinstance(spec, list) or name in family.components:
            classes[name] = component_class(family.components, index_file, name, spec)
        elif spec is None or isinstance(spec, str | bool) or (isinstance(spec, int | float) and math.isfinite(spec)):
            config[name] = spec
        else:
            raise ValueError(f"{index_file}: {name} is {spec!r}; a config value must be a finite number, text or bool")
    components = {
        name: None if cls is None else load_component(root, name, cls, dtype, index_file)
        for name, cls in classes.items()
        if name not in skip
    }
    return components, config


def load_pipeline(path: str | Path, family: Family, pipeline_cls: type, dtype: torch.dtype = torch.float32) -> Any:
    """Load a local diffusers-format directory component by component (`load_components`) into `pipeline_cls`."""
    index_file, index = read_model_index(path, "model_index.json")
    if index.get("_class_name") != family.pipeline_class:
        raise ValueError(
            f"{index_file}: _class_name is {index.get('_class_name')!r}, expected {family.pipeline_class!r}"
        )
    components, config = load_components(path, index_file, index, family, dtype)
    try:
        return pipeline_cls(**components, **config)
    except TypeError as error:
        raise ValueError(f"{index_file}: {pipeline_cls.__name__} does not take these entries: {error}") from error


# Pipeline kwargs the runner sets itself (`run_standard_pipeline`, the modular runner): never from call_overrides.
RUNNER_KWARGS = ("generator", "output_type", "callback_on_step_end", "callback_on_step_end_tensor_inputs")
REQUEST_FIELDS = (
    "prompt",
    "negative_prompt",
    "seed",
    "frames",
    "height",
    "width",
    "steps",
    "guidance",
    "fps",
    "mode",
    "image",
    "last_image",
)


def request_kwargs(family: Family) -> dict[str, str]:
    """Pipeline kwarg -> the Request field it comes from, for every kwarg `family.call_kwargs` derives from a
    request (found by calling it on a probe whose fields hold distinct numbers)."""
    probe = {name: 1_000_001 + i for i, name in enumerate(REQUEST_FIELDS)}
    field_of = {value: name for name, value in probe.items()}
    kwargs = family.call_kwargs(SimpleNamespace(**probe))
    return {key: field_of.get(value, "?") if isinstance(value, int | float) else "?" for key, value in kwargs.items()}


@dataclass(frozen=True)
class OverrideRule:
    """What one call_overrides value may be: a number of `kind` (int, or float which takes ints too; bools are
    refused) in [low, high]; with `max_items`, a list of at most that many such numbers instead; with `nullable`,
    also null (the pipeline's own `None`)."""

    kind: type[int] | type[float]
    low: float
    high: float
    nullable: bool = False
    max_items: int | None = None

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if self.max_items is None:
            return self._number(value)
        return isinstance(value, list) and len(value) <= self.max_items and all(map(self._number, value))

    def _number(self, value: Any) -> bool:
        kinds = int if self.kind is int else int | float
        if isinstance(value, bool) or not isinstance(value, kinds):
            return False
        return self.low <= value <= self.high  # NaN and the infinities compare out of range

    def describe(self) -> str:
        number = (
            f"an int in [{self.low}, {self.high}]"
            if self.kind is int
            else f"a finite number in [{self.low}, {self.high}]"
        )
        if self.max_items is not None:
            number = f"a list of at most {self.max_items} items, each {number}"
        return f"null or {number}" if self.nullable else number


_TEXT_TOKENS = OverrideRule(int, 1, 10_240)  # about 10x the largest pipeline default (LTX-2: 1,024; Wan: 512)
_SCALE = OverrideRule(float, 0.0, 100.0)  # a guidance-like scale, bounded as Request.guidance is
_RESCALE = OverrideRule(float, 0.0, 1.0)  # a guidance rescale: the fraction of the rescaled prediction
_SCALE_OR_NULL = OverrideRule(float, 0.0, 100.0, nullable=True)
_RESCALE_OR_NULL = OverrideRule(float, 0.0, 1.0, nullable=True)
_BLOCKS = OverrideRule(int, 0, _LAYERS - 1, nullable=True, max_items=_LAYERS)  # transformer block indices
# The pipeline kwargs a checkpoint's call_overrides may set, per pipeline class (`Family.pipeline_class`), each with
# the values it takes: the kwargs the shipped and tiny models store (text length; LTX-2's auxiliary guidance
# passes), all of them kwargs of the pipeline's call. Anything else is refused at load, never passed to diffusers.
CALL_OVERRIDES: dict[str, dict[str, OverrideRule]] = {
    "WanPipeline": {"max_sequence_length": _TEXT_TOKENS},
    "LTX2Pipeline": {
        "max_sequence_length": _TEXT_TOKENS,
        "stg_scale": _SCALE,
        "modality_scale": _SCALE,
        "guidance_rescale": _RESCALE,
        "audio_guidance_scale": _SCALE_OR_NULL,
        "audio_stg_scale": _SCALE_OR_NULL,
        "audio_modality_scale": _SCALE_OR_NULL,
        "audio_guidance_rescale": _RESCALE_OR_NULL,
        "spatio_temporal_guidance_blocks": _BLOCKS,
    },
    "MiniMaxH3ModularPipeline": {},
}


def check_call_overrides(family: Family, overrides: Mapping[str, Any], where: str) -> None:
    """call_overrides may add the pipeline kwargs `CALL_OVERRIDES` lists for the family's pipeline, each value as its
    rule allows, but not replace what the request sets (steps, guidance, sizes, ...) or what the runner sets: those
    would run something other than what the Result's request records. ValueError naming the key (and the request
    field to use instead, or the allowed keys, or the allowed values)."""
    from workbench.request import shown  # not at the top: workbench.request imports this module

    if not isinstance(overrides, Mapping) or not all(isinstance(k, str) for k in overrides):
        raise ValueError(f"{where}: call_overrides must be an object of pipeline kwargs, got {shown(overrides)}")
    from_request = request_kwargs(family)
    rules = CALL_OVERRIDES.get(family.pipeline_class, {})
    for key, value in overrides.items():
        if key in from_request:
            raise ValueError(
                f"{where}: call_overrides.{key} would replace what the request sets (Request.{from_request[key]}); "
                f"set it through the request or the model's defaults instead"
            )
        if key in RUNNER_KWARGS:
            raise ValueError(f"{where}: call_overrides.{key} is set by the workbench's runner; not allowed: {key}")
        if key not in rules:
            raise ValueError(
                f"{where}: call_overrides.{key} is not a kwarg the workbench lets a checkpoint set for "
                f"{family.pipeline_class}; allowed: {sorted(rules) or 'none'}"
            )
        if not rules[key].accepts(value):
            raise ValueError(f"{where}: call_overrides.{key} is {shown(value)}; allowed: {rules[key].describe()}")


def read_workbench_file(root: Path, family: Family) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (defaults, call_overrides) stored beside a checkpoint, or the family's defaults when absent.

    `defaults` fill request fields (and so are recorded with the request) and must make a request the family
    accepts (`Request.resolved`); `call_overrides` are extra pipeline kwargs (recorded in
    `Result.metadata["call_overrides"]`) and may not replace a request-derived kwarg. Each refusal is a ValueError
    naming the file and the field (`workbench.json: defaults.frames: -1 ...`).
    """
    path = Path(root) / WORKBENCH_FILE
    if not path.is_file():
        return dict(family.defaults), {}
    _check_inside(path, _confines(Path(root)), "workbench file")
    stored = read_json(path, "workbench file")
    unknown = set(stored) - {"defaults", "call_overrides"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: defaults, call_overrides")
    defaults, overrides = stored.get("defaults", {}), stored.get("call_overrides", {})
    if not isinstance(defaults, dict):
        raise ValueError(f"{path}: defaults must be an object of request fields, got {defaults!r}")
    bad = set(defaults) - set(family.defaults)
    if bad:
        raise ValueError(f"{path}: defaults {sorted(bad)} are not request fields; allowed: {sorted(family.defaults)}")
    check_call_overrides(family, overrides, str(path))
    merged = {**family.defaults, **defaults}
    from workbench.request import Request  # request.py imports this module

    try:  # a value a request would refuse is named here, not at the first generate with no file to blame
        Request("the stored defaults").resolved(family, merged)
    except ValueError as error:
        raise ValueError(f"{path}: defaults.{error}") from None
    return merged, dict(overrides)
