"""A generation request: validated on construction, completed from the model's defaults when generated.

Every field is checked for type, finiteness and size when a `Request` is made, before anything is allocated or
imported, and again once the model's defaults are filled in (`resolved`). A bad value raises `ValueError` whose
message starts with the field's name, then the value and what is allowed.

- Numbers: numpy integer and float scalars are taken as the Python numbers they hold (converted, so a record
  serialises to JSON); bools are refused where a number is meant; floats must be finite.
- Text: `prompt` (non-blank) and `negative_prompt` are `str` that encode as UTF-8 (no lone surrogates), at most
  MAX_PROMPT_CHARS characters.
- Keyframes (`image`, `last_image`): a PIL image in mode RGB, or a uint8 numpy array (H, W, 3); 1 <= H, W <=
  MAX_KEYFRAME_SIDE.

Size limits, checked before any allocation (the families' own defaults are far inside them: Wan 81x480x832,
LTX-2 121x512x768, MiniMax-H3 124-345 frames at 768x1344):
- MAX_FRAMES: 1025 is of the forms 4n + 1 (Wan), 8n + 1 (LTX-2) and 17n + 5 (H3); 42 s at 24 fps.
- MAX_SIDE: height and width, 4096 px (a multiple of every family's size multiple).
- MAX_STEPS: 1000, the default number of training timesteps of diffusers' flow-matching schedulers.
- MAX_FPS: 240, a frame rate for the written video (LTX-2 also conditions on it).
- MAX_GUIDANCE: 100; classifier-free guidance scales in use are about 1-20.
- MAX_VIDEO_ELEMENTS: 2**30 for frames x height x width, a bound on what the Result holds (its uint8 frames take 3
  bytes per element: 3 GiB at the limit); 121 frames of 3840x2160 fit. It is not what a request needs while it runs:
  a VAE decode's activations take far more per element, which `Session.generate` checks against the device's free
  memory before it starts (`memory_estimate.estimate_activation`).
- MAX_PROMPT_CHARS, MAX_KEYFRAME_SIDE: generous; text encoders truncate and pipelines resize keyframes far below.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.models.family import Family

KEYFRAME_FIELDS = ("image", "last_image")
KEYFRAME_HELP = "a PIL.Image.Image or a uint8 numpy array of shape (H, W, 3)"
KEYFRAME_MODES = ("RGB",)  # PIL modes a keyframe may have; anything else is converted by the caller, on purpose

MAX_SEED = 2**63 - 1  # a signed 64-bit integer: what torch.Generator.manual_seed and JSON readers hold exactly
MAX_FRAMES = 1025
MAX_SIDE = 4096
MAX_STEPS = 1000
MAX_FPS = 240
MAX_GUIDANCE = 100.0
MAX_VIDEO_ELEMENTS = 2**30
MAX_PROMPT_CHARS = 100_000
MAX_KEYFRAME_SIDE = 8192

# field -> (minimum, maximum) of the integer fields
INT_RANGES = {
    "seed": (0, MAX_SEED),
    "frames": (1, MAX_FRAMES),
    "height": (1, MAX_SIDE),
    "width": (1, MAX_SIDE),
    "steps": (1, MAX_STEPS),
    "fps": (1, MAX_FPS),
}


@dataclass(frozen=True)
class Request:
    """What to generate. Fields left as None take the model's defaults (see `resolved`)."""

    prompt: str
    negative_prompt: str = ""
    seed: int = 0
    frames: int | None = None
    height: int | None = None
    width: int | None = None
    steps: int | None = None
    guidance: float | None = None
    fps: int | None = None
    mode: str | None = None
    image: Any = None
    last_image: Any = None

    def __post_init__(self) -> None:
        _set = object.__setattr__  # frozen: the checked (converted) values replace what was given
        _set(self, "prompt", _text("prompt", self.prompt, required=True))
        _set(self, "negative_prompt", _text("negative_prompt", self.negative_prompt, required=False))
        for name, (low, high) in INT_RANGES.items():
            if name == "seed" or getattr(self, name) is not None:
                _set(self, name, integer(name, getattr(self, name), low, high))
        if self.guidance is not None:
            _set(self, "guidance", number("guidance", self.guidance, 0.0, MAX_GUIDANCE))
        if self.mode is not None:
            if not isinstance(self.mode, str) or not self.mode:
                raise ValueError(f"mode: must be a non-empty string (one of the model's modes), got {shown(self.mode)}")
            _set(self, "mode", str(self.mode))
        if None not in (self.frames, self.height, self.width):
            _check_video_size(self.frames, self.height, self.width)
        for name in KEYFRAME_FIELDS:
            if getattr(self, name) is not None:
                _check_keyframe(name, getattr(self, name))

    def __eq__(self, other: object) -> bool:
        """Field by field; keyframes by content (numpy arrays: same dtype, shape and pixels; PIL images: PIL's own
        comparison), never numpy's elementwise `==`."""
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    def __hash__(self) -> int:
        """Of every field but the keyframes (arrays and PIL images are unhashable): equal requests hash alike."""
        return hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in KEYFRAME_FIELDS))

    def resolved(self, family: Family, defaults: dict[str, Any]) -> Request:
        """This request with defaults filled in, checked against what the family's VAE and modes accept.

        The defaults go through the same checks as the fields of a new Request (a model's `workbench.json` is
        input too); a key that is not a Request field is refused."""
        if not isinstance(defaults, dict):
            raise ValueError(f"defaults: must be a dict of Request field -> value, got {type(defaults).__name__}")
        names = {f.name for f in dataclasses.fields(Request)} - {"prompt", *KEYFRAME_FIELDS}
        unknown = [k for k in defaults if not isinstance(k, str) or k not in names]
        if unknown:
            raise ValueError(f"defaults: unknown field(s) {shown(unknown)}; allowed: {sorted(names)}")
        filled = {k: (v if (v := getattr(self, k)) is not None else defaults[k]) for k in defaults}
        if self.mode is None:
            filled["mode"] = defaults.get("mode") if defaults.get("mode") is not None else family.modes[0]
        request = dataclasses.replace(self, **filled)  # __post_init__ checks the filled-in values
        if request.mode not in family.modes:
            raise ValueError(f"mode: {shown(request.mode)} is not supported by {family.name}; allowed: {family.modes}")
        for name in ("frames", "height", "width", "steps", "fps"):
            if getattr(request, name) is None:
                raise ValueError(f"{name}: not given and {family.name} has no default for it; give it explicitly")
        if not family.frames_allowed(request.frames):
            allowed = f"{family.frame_step}*n + {family.frame_offset}"
            raise ValueError(f"frames: {request.frames} is not accepted by the {family.name} VAE; allowed: {allowed}")
        for name in ("height", "width"):
            if getattr(request, name) % family.size_multiple:
                raise ValueError(
                    f"{name}: {getattr(request, name)} must be a multiple of {family.size_multiple} for {family.name}"
                )
        for name in KEYFRAME_FIELDS:
            if getattr(request, name) is not None and request.mode in ("t2v", "t2va"):
                raise ValueError(f"{name}: mode {request.mode!r} takes no keyframe; allowed modes: {family.modes}")
        check = getattr(family, "check_request", None)  # a family's own rules (keyframes per mode, ranges)
        if check is not None:
            check(request)
        return request

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form; keyframes are described by shape, not embedded."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # plain values; keyframes follow
        for name in KEYFRAME_FIELDS:
            if (value := getattr(self, name)) is not None:
                shape = value.shape if isinstance(value, np.ndarray) else (value.size[1], value.size[0], 3)  # PIL: RGB
                out[name] = {"shape": list(shape)}
        return out


def shown(value: Any, limit: int = 80) -> str:
    """`repr(value)` for an error message, cut to about `limit` characters; safe for ints too long to print."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 15]}...<{len(text)} chars>"


def integer(name: str, value: Any, minimum: int, maximum: int) -> int:
    """`value` as a Python int in [minimum, maximum]; numpy integers accepted, bools and floats refused."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        kind = type(value).__name__
        raise ValueError(f"{name}: must be an integer in [{minimum}, {maximum}], got {kind} {shown(value)}")
    value = int(value)
    if not minimum <= value <= maximum:
        raise ValueError(f"{name}: {shown(value)} is out of range; allowed: integers in [{minimum}, {maximum}]")
    return value


def number(name: str, value: Any, minimum: float, maximum: float) -> float:
    """`value` as a finite Python float in [minimum, maximum]; ints and numpy numbers accepted, bools refused."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        kind = type(value).__name__
        raise ValueError(f"{name}: must be a finite number in [{minimum}, {maximum}], got {kind} {shown(value)}")
    if isinstance(value, int | np.integer) and not minimum <= value <= maximum:  # before float(): 10**400 overflows
        raise ValueError(f"{name}: {shown(value)} is out of range; allowed: finite numbers in [{minimum}, {maximum}]")
    value = float(value)
    if not math.isfinite(value) or not minimum <= value <= maximum:
        raise ValueError(f"{name}: {value!r} is out of range; allowed: finite numbers in [{minimum}, {maximum}]")
    return value


def flag(name: str, value: Any) -> bool:
    """`value` as a Python bool; numpy bools accepted, anything else (1, "no", None) refused."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name}: expected a bool, got {type(value).__name__} {shown(value)}; allowed: True, False")
    return bool(value)


def _text(name: str, value: Any, required: bool) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name}: must be a string, got {type(value).__name__} {shown(value)}")
    value = str.__str__(value)  # a str subclass's own characters, checked and kept (never what its __str__ makes)
    if required and not any(ch.isprintable() and not ch.isspace() for ch in value):
        raise ValueError(f"{name}: must hold a visible character, got {shown(value)}")
    if len(value) > MAX_PROMPT_CHARS:
        raise ValueError(f"{name}: {len(value)} characters; allowed: at most {MAX_PROMPT_CHARS}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{name}: holds a lone surrogate {value[error.start]!r} at index {error.start} (a half of a UTF-16 pair, "
            "not a character); allowed: text that encodes as UTF-8"
        ) from None
    return value


def _same(a: Any, b: Any) -> bool:
    """Whether two field values are equal; numpy arrays by dtype, shape and content."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        arrays = isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
        return arrays and a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    return bool(a == b)


def _check_video_size(frames: int, height: int, width: int) -> None:
    elements = frames * height * width
    if elements > MAX_VIDEO_ELEMENTS:
        raise ValueError(
            f"frames: {frames} frames of {height}x{width} are {elements:,} video elements; allowed: at most "
            f"{MAX_VIDEO_ELEMENTS:,} (frames x height x width; e.g. 121 frames of 2160x3840)"
        )


def _check_keyframe(name: str, value: Any) -> None:
    image_module = sys.modules.get("PIL.Image")  # no PIL image can exist unless PIL is imported already
    if image_module is not None and isinstance(value, image_module.Image):
        if value.mode not in KEYFRAME_MODES:
            raise ValueError(
                f"{name}: a PIL image in mode {value.mode!r}; allowed modes: {list(KEYFRAME_MODES)} "
                f"(convert it yourself, e.g. image.convert('RGB'), so what is dropped is your choice)"
            )
        width, height = value.size
    elif isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 3 and value.shape[2] == 3:
        height, width = value.shape[:2]
    else:
        details = f" {value.dtype} {value.shape}" if isinstance(value, np.ndarray) else ""
        raise ValueError(f"{name}: must be {KEYFRAME_HELP}, got {type(value).__name__}{details}")
    if not (1 <= height <= MAX_KEYFRAME_SIDE and 1 <= width <= MAX_KEYFRAME_SIDE):
        raise ValueError(
            f"{name}: a {height}x{width} keyframe; allowed: height and width in [1, {MAX_KEYFRAME_SIDE}] pixels"
        )
