"""The quality budget a candidate must stay inside to be called the same product as its reference."""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any

from workbench.request import number, shown

# field -> (direction, unit): "max" limits pass when value <= limit, "min" limits when value >= limit
_LIMITS = {
    "latent_rel_l2": ("max", ""),
    "psnr_db": ("min", " dB"),
    "min_ssim": ("min", ""),
    "audio_snr_db": ("min", " dB"),
    "lsd_db": ("max", " dB"),
    "spectral_cosine": ("min", ""),
    "rms_ratio_error": ("max", ""),
}
# The audio limits `Budget.with_audio()` fills in (the seeds name none; chosen so that a change a listener would
# notice fails: a waveform SNR under 20 dB, a log-spectral distance over 2 dB, a spectrum whose cosine to the
# reference drops under 0.98, a loudness off by more than 10 %).
AUDIO_LIMITS = {"audio_snr_db": 20.0, "lsd_db": 2.0, "spectral_cosine": 0.98, "rms_ratio_error": 0.1}


def default_for(has_audio: bool) -> Budget:
    """Every evidence command's budget unless told otherwise: the seeds' limits, with `AUDIO_LIMITS` for a model that
    makes sound."""
    return Budget().with_audio() if has_audio else Budget()


@dataclass(frozen=True)
class Budget:
    """Limits on the metrics of `workbench.quality.compare`; a limit of None is not checked.

    The defaults are the seeds' budget: latent relative L2 <= 0.03, PSNR >= 33 dB, minimum per-frame
    SSIM >= 0.98. `psnr_db` applies to the whole-clip PSNR (`video_psnr`: mean squared error over all
    frames, then dB); a single bad frame is caught by `min_ssim`, which applies to the worst frame.
    Audio is not checked by default (its limits are None): the seeds name no audio budget; `with_audio()` sets
    the stated `AUDIO_LIMITS` (waveform SNR, log-spectral distance, spectral cosine, RMS ratio off 1).
    A limit is inclusive: a value exactly at the limit passes. A set limit whose metric could not be
    measured (no latents, no audio) is a failure, never a silent pass. A limit is kept as a Python float (an int or
    a numpy number taken as the number it holds, so a record serialises to JSON).
    """

    latent_rel_l2: float | None = 0.03
    psnr_db: float | None = 33.0
    min_ssim: float | None = 0.98
    audio_snr_db: float | None = None
    lsd_db: float | None = None
    spectral_cosine: float | None = None
    rms_ratio_error: float | None = None

    def __post_init__(self) -> None:
        for name in _LIMITS:
            value = getattr(self, name)
            if value is None:
                continue
            try:  # an int past any float (10**400) is refused, not an OverflowError
                value = number(name, value, 0.0, sys.float_info.max)
            except ValueError:
                raise ValueError(f"{name}: must be a finite number >= 0 or None, got {shown(value)}") from None
            object.__setattr__(self, name, value)  # frozen: the checked (converted) value replaces what was given
        for name in ("min_ssim", "spectral_cosine"):
            if getattr(self, name) is not None and getattr(self, name) > 1:
                raise ValueError(f"{name}: must be <= 1 (it never exceeds 1), got {getattr(self, name)!r}")

    def with_audio(self) -> Budget:
        """This budget with `AUDIO_LIMITS` in place of each audio limit left unset."""
        return dataclasses.replace(self, **{k: v for k, v in AUDIO_LIMITS.items() if getattr(self, k) is None})

    def spent(self, measured: dict[str, float | None]) -> float:
        """The largest share of any set limit that `measured` uses, as an error amplitude: 0 is identical, 1 is
        exactly at a limit, above 1 outside it (inf when a set limit's metric is missing or NaN). So
        `spent <= 1` is `not failures(measured)`, and `spent <= m` is the budget with every error scaled by m:
        the margin a calibration keeps."""
        shares = [0.0]
        for name, (direction, unit) in _LIMITS.items():
            limit, value = getattr(self, name), measured.get(name)
            if limit is None:
                continue
            if value is None or math.isnan(value):
                return math.inf
            if direction == "max":  # a distance: value / limit
                error, room = value, limit
            elif unit:  # dB of an amplitude ratio (PSNR, SNR): 10**((limit - value) / 20)
                error, room = (0.0 if value == math.inf else 10 ** (-value / 20)), 10 ** (-limit / 20)
            else:  # a similarity up to 1 (SSIM, cosine): (1 - value) / (1 - limit)
                error, room = max(1.0 - value, 0.0), 1.0 - limit
            shares.append(error / room if room > 0 else (0.0 if error <= 0 else math.inf))
        return max(shares)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        """Build from a dict such as `to_dict` wrote; an unknown key is a ValueError naming it."""
        if not isinstance(data, dict):
            raise ValueError(f"budget: expected an object of limit -> value, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_LIMITS))
        if unknown:
            raise ValueError(f"budget: unknown field(s) {unknown}; allowed: {list(_LIMITS)}")
        return cls(**data)

    def to_dict(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """The set limits in words, e.g. "latent_rel_l2 <= 0.03, psnr_db >= 33 dB"; "no limits" when none is set."""
        return ", ".join(f"{name} {self.bound(name)}" for name in _LIMITS if getattr(self, name) is not None) or (
            "no limits"
        )

    def bound(self, name: str) -> str:
        """Limit `name` in words, its direction and unit: "<= 0.03", ">= 33 dB"."""
        direction, unit = _LIMITS[name]
        return f"{'<=' if direction == 'max' else '>='} {getattr(self, name):g}{unit}"

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
            bound = self.bound(name)
            if value is None:
                problems.append(f"{name}: not measured, limit {bound}")
            elif not (value <= limit if direction == "max" else value >= limit):
                problems.append(f"{name}: {value:.6g}{unit} outside limit {bound}")
        return problems
