"""A generation request: validated on construction, completed from the model's defaults when generated."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.models.family import Family

KEYFRAME_HELP = "a PIL.Image.Image or a uint8 numpy array of shape (H, W, 3)"


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
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError(f"prompt: must be a non-empty string, got {self.prompt!r}")
        if not isinstance(self.negative_prompt, str):
            raise ValueError(f"negative_prompt: must be a string, got {type(self.negative_prompt).__name__}")
        _check_int("seed", self.seed, minimum=0)
        for name in ("frames", "height", "width", "steps", "fps"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1)
        if self.guidance is not None and (
            isinstance(self.guidance, bool) or not isinstance(self.guidance, int | float) or self.guidance < 0
        ):
            raise ValueError(f"guidance: must be a number >= 0, got {self.guidance!r}")
        for name in ("image", "last_image"):
            value = getattr(self, name)
            if value is not None and not _is_keyframe(value):
                raise ValueError(f"{name}: must be {KEYFRAME_HELP}, got {type(value).__name__}")

    def resolved(self, family: Family, defaults: dict[str, Any]) -> Request:
        """This request with defaults filled in, checked against what the family's VAE and modes accept."""
        filled = {k: (v if (v := getattr(self, k)) is not None else defaults.get(k)) for k in defaults}
        request = dataclasses.replace(self, **filled, mode=self.mode or family.modes[0])
        if request.mode not in family.modes:
            raise ValueError(f"mode: {request.mode!r} is not supported by {family.name}; allowed: {family.modes}")
        if not family.frames_allowed(request.frames):
            allowed = f"{family.frame_step}*n + {family.frame_offset}"
            raise ValueError(f"frames: {request.frames} is not accepted by the {family.name} VAE; allowed: {allowed}")
        for name in ("height", "width"):
            if getattr(request, name) % family.size_multiple:
                raise ValueError(
                    f"{name}: {getattr(request, name)} must be a multiple of {family.size_multiple} for {family.name}"
                )
        for name in ("image", "last_image"):
            if getattr(request, name) is not None and request.mode in ("t2v", "t2va"):
                raise ValueError(f"{name}: mode {request.mode!r} takes no keyframe; allowed modes: {family.modes}")
        check = getattr(family, "check_request", None)  # a family's own rules (keyframes per mode, ranges)
        if check is not None:
            check(request)
        return request

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form; keyframes are described by shape, not embedded."""
        out = dataclasses.asdict(self)
        for name in ("image", "last_image"):
            if (value := getattr(self, name)) is not None:
                out[name] = {"shape": list(np.asarray(value).shape)}
        return out


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def _is_keyframe(value: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with scikit-image and matplotlib
        Image = None
    if Image is not None and isinstance(value, Image.Image):
        return True
    return isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 3 and value.shape[2] == 3
