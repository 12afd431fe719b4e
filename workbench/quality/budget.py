"""The quality budget a candidate must stay inside to be called the same product as its reference."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# field -> (direction, unit): "max" limits pass when value <= limit, "min" limits when value >= limit
_LIMITS = {
    "latent_rel_l2": ("max", ""),
    "psnr_db": ("min", " dB"),
    "min_ssim": ("min", ""),
    "audio_snr_db": ("min", " dB"),
    "lsd_db": ("max", " dB"),
}


@dataclass(frozen=True)
class Budget:
    """Limits on the metrics of `workbench.quality.compare`; a limit of None is not checked.

    The defaults are the seeds' budget: latent relative L2 <= 0.03, PSNR >= 33 dB, minimum per-frame
    SSIM >= 0.98. `psnr_db` applies to the whole-clip PSNR (`video_psnr`: mean squared error over all
    frames, then dB); a single bad frame is caught by `min_ssim`, which applies to the worst frame.
    Audio is not checked by default (`audio_snr_db`, `lsd_db` = None): the seeds name no audio budget.
    A limit is inclusive: a value exactly at the limit passes. A set limit whose metric could not be
    measured (no latents, no audio) is a failure, never a silent pass.
    """

    latent_rel_l2: float | None = 0.03
    psnr_db: float | None = 33.0
    min_ssim: float | None = 0.98
    audio_snr_db: float | None = None
    lsd_db: float | None = None

    def __post_init__(self) -> None:
        for name in _LIMITS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number >= 0 or None, got {value!r}")
        if self.min_ssim is not None and self.min_ssim > 1:
            raise ValueError(f"min_ssim: must be <= 1 (SSIM never exceeds 1), got {self.min_ssim!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        """Build from a dict such as `to_dict` wrote; an unknown key is a ValueError naming it."""
        unknown = sorted(set(data) - set(_LIMITS))
        if unknown:
            raise ValueError(f"budget: unknown field(s) {unknown}; allowed: {list(_LIMITS)}")
        return cls(**data)

    def to_dict(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)

    def failures(self, measured: dict[str, float | None]) -> list[str]:
        """One message per limit that `measured` (field -> value, None = not measured) does not meet.

        NaN never meets a limit. Each message names the metric, the value and the limit.
        """
        problems = []
        for name, (direction, unit) in _LIMITS.items():
            limit = getattr(self, name)
            if limit is None:
                continue
            value = measured.get(name)
            bound = f"{'<=' if direction == 'max' else '>='} {limit:g}{unit}"
            if value is None:
                problems.append(f"{name}: not measured, limit {bound}")
            elif not (value <= limit if direction == "max" else value >= limit):
                problems.append(f"{name}: {value:.6g}{unit} outside limit {bound}")
        return problems
