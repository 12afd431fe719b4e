"""Paired speed-up statistics and the verdict that turns quality, execution and timing into one word."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import numpy as np

Verdict = Literal["qualified", "measured_quality_tradeoff", "rejected_quality", "not_executed", "no_speed_claim"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
MIN_PAIRS = 3
_BOOT_CHUNK = 1000  # bootstrap resamples drawn per batch, to bound memory for long runs


@dataclass(frozen=True)
class RatioCI:
    """Speed-up (baseline / candidate seconds) over paired rounds: its median and a bootstrap CI of the median.

    `ratios` are per round, in round order; `low`/`high` bound the `confidence` interval (percentile method).
    """

    median: float
    low: float
    high: float
    ratios: tuple[float, ...]
    confidence: float
    n_boot: int
    seed: int

    @property
    def n_pairs(self) -> int:
        return len(self.ratios)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratios": list(self.ratios), "n_pairs": self.n_pairs}


def paired_ratio_ci(
    baseline_seconds: Sequence[float],
    candidate_seconds: Sequence[float],
    n_boot: int = 10000,
    seed: int = 0,
    confidence: float = 0.95,
) -> RatioCI:
    """Median per-round speed-up and its bootstrap CI (default 95 %) over rounds.

    Round i pairs baseline_seconds[i] with candidate_seconds[i] (measured back to back, A/B/A), so the
    ratio cancels drift shared by both arms; resampling whole rounds keeps that pairing. A ratio > 1 means
    the candidate is faster. Needs >= 3 pairs of positive finite times (ValueError otherwise); `seed`
    makes the interval reproducible.
    """
    baseline = np.asarray(baseline_seconds, dtype=np.float64)
    candidate = np.asarray(candidate_seconds, dtype=np.float64)
    if baseline.ndim != 1 or candidate.ndim != 1 or baseline.shape != candidate.shape:
        raise ValueError(
            f"seconds: baseline and candidate must be flat and paired, got {baseline.shape} vs {candidate.shape}"
        )
    if len(baseline) < MIN_PAIRS:
        raise ValueError(f"seconds: need at least {MIN_PAIRS} paired rounds, got {len(baseline)}")
    for name, values in (("baseline_seconds", baseline), ("candidate_seconds", candidate)):
        if not (np.isfinite(values).all() and (values > 0).all()):
            raise ValueError(f"{name}: every time must be a finite number > 0, got {values.tolist()}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot: must be an integer >= 1, got {n_boot!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence!r}")
    ratios = baseline / candidate
    rng = np.random.default_rng(seed)
    rounds = len(ratios)
    medians = []
    for start in range(0, n_boot, _BOOT_CHUNK):
        picks = rng.integers(0, rounds, size=(min(_BOOT_CHUNK, n_boot - start), rounds))  # (batch, rounds)
        medians.append(np.median(ratios[picks], axis=1))
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(np.concatenate(medians), [tail, 100 - tail])
    return RatioCI(
        median=float(np.median(ratios)),
        low=float(low),
        high=float(high),
        ratios=tuple(float(r) for r in ratios),
        confidence=confidence,
        n_boot=n_boot,
        seed=seed,
    )


def verdict(
    *,
    within_budget: bool,
    finite: bool,
    executed: bool,
    ci: RatioCI | None,
    device_type: str,
    gpu_clean: bool,
) -> tuple[Verdict, str]:
    """The qualification verdict and a one-line reason, decided in this order (first match wins):

    1. `not_executed`: the candidate's receipts show nothing ran, so its output and time are the baseline's;
       neither quality nor speed says anything about the candidate.
    2. `rejected_quality` when any output is non-finite, whatever `within_budget` says: broken output is
       never in budget and never gives a speed claim.
    3. A speed claim stands only with a CI whose low end is > 1, a CUDA device (`device_type` "cuda" or
       "cuda:N": CPU times say nothing about the GPU product) and `gpu_clean` (no throttling and no other
       process on the GPU while timing). `ci` is None when nothing was timed (a quality-only run).
    4. Outside the budget: `measured_quality_tradeoff` when a speed claim stands (a named trade of quality
       for speed, never a recommendation), else `rejected_quality`.
    5. Inside the budget: `qualified` when a speed claim stands, else `no_speed_claim`.
    """
    if not executed:
        return "not_executed", "the candidate's receipts show none of its work ran; nothing was measured"
    if not finite:
        return "rejected_quality", "non-finite output: outside any budget and never a speed claim"
    blocker = _speed_blocker(ci, device_type, gpu_clean)
    if not within_budget:
        if blocker is None:
            return "measured_quality_tradeoff", f"quality outside the budget; speed-up {_ci_text(ci)}"
        return "rejected_quality", f"quality outside the budget; no speed claim: {blocker}"
    if blocker is None:
        return "qualified", f"quality within the budget; speed-up {_ci_text(ci)}"
    return "no_speed_claim", f"quality within the budget; no speed claim: {blocker}"


def _speed_blocker(ci: RatioCI | None, device_type: str, gpu_clean: bool) -> str | None:
    """Why no speed claim can be made, or None when one can."""
    if ci is None:
        return "not timed"
    if device_type.split(":")[0] != "cuda":
        return f"timed on {device_type!r}; speed claims need a CUDA device"
    if not gpu_clean:
        return "the GPU was throttled or shared during timing"
    if ci.high < 1:
        return f"the candidate is slower: speed-up {_ci_text(ci)} lies below 1"
    if not ci.low > 1:
        return f"speed-up {_ci_text(ci)} does not exclude 1"
    return None


def _ci_text(ci: RatioCI) -> str:
    return f"median {ci.median:.3f}x, CI{ci.confidence * 100:g} [{ci.low:.3f}, {ci.high:.3f}] over {ci.n_pairs} pairs"
