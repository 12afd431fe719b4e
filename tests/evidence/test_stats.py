import itertools

import numpy as np
import pytest

from workbench.evidence.stats import VERDICTS, RatioCI, paired_ratio_ci, verdict


def _timings(rng, ratio, rounds=20, noise=0.02):
    """Candidate times around 1 s and baseline = ratio * candidate * (1 +- e): the noise is symmetric in
    sign, so the median ratio is exactly `ratio` and the CI straddles it whatever the draw."""
    candidate = rng.uniform(0.8, 1.2, size=rounds)
    magnitudes = rng.uniform(0.001, noise, size=rounds // 2)
    signs = np.concatenate([magnitudes, -magnitudes])
    return ratio * candidate * (1 + rng.permutation(signs)), candidate


def test_paired_ratio_ci_recovers_a_known_speedup(rng):
    baseline, candidate = _timings(rng, 2.0)
    ci = paired_ratio_ci(baseline, candidate)
    assert ci.median == pytest.approx(2.0, rel=1e-12)
    assert ci.low < 2.0 < ci.high
    assert ci.low > 1.9 and ci.high < 2.1  # excludes 1 by far
    assert ci.n_pairs == 20 and len(ci.ratios) == 20 and ci.confidence == 0.95
    np.testing.assert_allclose(ci.ratios, baseline / candidate)


def test_paired_ratio_ci_no_speedup_crosses_one(rng):
    baseline, candidate = _timings(rng, 1.0, rounds=8, noise=0.05)
    ci = paired_ratio_ci(baseline, candidate)
    assert ci.low < 1.0 < ci.high


def test_paired_ratio_ci_is_reproducible_from_its_seed(rng):
    baseline, candidate = _timings(rng, 1.5, rounds=6)
    assert paired_ratio_ci(baseline, candidate, seed=3) == paired_ratio_ci(baseline, candidate, seed=3)
    # an n_boot that is not a multiple of the batch still draws exactly n_boot resamples
    assert paired_ratio_ci(baseline, candidate, n_boot=1234).n_boot == 1234


def test_paired_ratio_ci_covers_the_true_median_at_its_stated_confidence(rng):
    """500 sets of 10 rounds whose ratio is TRUTH * exp(e), e symmetric about 0, so the true median ratio is TRUTH.
    The 95 % percentile interval of the bootstrap median ends between the 2nd and 3rd smallest ratios and between
    the 8th and 9th, so it covers TRUTH with a probability between P(3 <= B <= 7) = 0.891 and P(2 <= B <= 8) =
    0.979, B ~ Bin(10, 1/2) counting the ratios below TRUTH; the band allows three standard deviations of 500 sets
    either side (a 50 % interval covers about half). The 50 % interval of the same resamples is strictly inside."""
    truth, sets, rounds = 1.5, 500, 10
    covered = 0
    for _ in range(sets):
        candidate = rng.uniform(0.8, 1.2, size=rounds)
        baseline = truth * candidate * np.exp(rng.normal(0.0, 0.05, size=rounds))
        seed = int(rng.integers(2**31))
        wide = paired_ratio_ci(baseline, candidate, n_boot=400, seed=seed)
        narrow = paired_ratio_ci(baseline, candidate, n_boot=400, seed=seed, confidence=0.5)
        assert wide.low < narrow.low < narrow.high < wide.high, (wide, narrow)
        covered += wide.low < truth < wide.high
    assert 0.85 <= covered / sets <= 0.995, covered


def test_paired_ratio_ci_three_pairs_is_the_minimum():
    ci = paired_ratio_ci([2.0, 4.0, 6.0], [1.0, 1.0, 1.0])
    assert ci.median == 4.0 and 2.0 <= ci.low <= ci.high <= 6.0
    with pytest.raises(ValueError, match="at least 3 paired rounds, got 2"):
        paired_ratio_ci([2.0, 4.0], [1.0, 1.0])


@pytest.mark.parametrize(
    ("baseline", "candidate", "field"),
    [
        ([1.0, 1.0, 1.0], [1.0, 1.0], "seconds"),
        ([1.0, 0.0, 1.0], [1.0, 1.0, 1.0], "baseline_seconds"),
        ([1.0, 1.0, 1.0], [1.0, float("nan"), 1.0], "candidate_seconds"),
    ],
)
def test_paired_ratio_ci_bad_timings_raise_naming_the_field(baseline, candidate, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        paired_ratio_ci(baseline, candidate)


def _ci(low, high, median=None):
    median = (low + high) / 2 if median is None else median
    return RatioCI(median=median, low=low, high=high, ratios=(median,) * 3, confidence=0.95, n_boot=100, seed=0)


FAST = _ci(1.2, 1.4)
GOOD = {"within_budget": True, "finite": True, "executed": True, "ci": FAST, "device_type": "cuda", "gpu_clean": True}


@pytest.mark.parametrize(
    ("change", "expected", "reason"),
    [
        ({}, "qualified", "within the budget; speed-up median 1.300x"),
        ({"device_type": "cuda:1"}, "qualified", "within the budget"),
        ({"within_budget": False}, "measured_quality_tradeoff", "outside the budget; speed-up"),
        ({"within_budget": False, "ci": _ci(0.9, 1.1)}, "rejected_quality", "does not exclude 1"),
        ({"within_budget": False, "ci": None}, "rejected_quality", "not timed"),
        ({"finite": False}, "rejected_quality", "non-finite"),
        ({"executed": False}, "not_executed", "none of its work ran"),
        ({"executed": False, "finite": False, "within_budget": False}, "not_executed", "none of its work ran"),
        ({"ci": _ci(0.95, 1.3)}, "no_speed_claim", "does not exclude 1"),
        ({"ci": _ci(1.0, 1.3)}, "no_speed_claim", "does not exclude 1"),
        ({"ci": _ci(0.80, 0.83)}, "no_speed_claim", "the candidate is slower"),
        ({"ci": None}, "no_speed_claim", "not timed"),
        ({"device_type": "cpu"}, "no_speed_claim", "timed on 'cpu'"),
        ({"gpu_clean": False}, "no_speed_claim", "throttled or shared"),
    ],
)
def test_verdict_each_outcome_and_its_precedence(change, expected, reason):
    name, why = verdict(**{**GOOD, **change})
    assert name == expected
    assert reason in why


def test_verdict_every_input_gives_a_known_verdict_and_nonfinite_never_claims_speed():
    seen = set()
    for within, finite, executed, ci, device, clean in itertools.product(
        (True, False), (True, False), (True, False), (FAST, _ci(0.9, 1.1), None), ("cuda", "cpu"), (True, False)
    ):
        name, _ = verdict(
            within_budget=within, finite=finite, executed=executed, ci=ci, device_type=device, gpu_clean=clean
        )
        seen.add(name)
        if not finite:
            assert name in ("rejected_quality", "not_executed")
    assert seen == set(VERDICTS)
