import math

import numpy as np
import pytest

from workbench.quality import Budget
from workbench.quality.budget import AUDIO_LIMITS

AT_LIMIT = {"latent_rel_l2": 0.03, "psnr_db": 33.0, "min_ssim": 0.98, "audio_snr_db": 20.0, "lsd_db": 2.0}
AT_LIMIT |= {"spectral_cosine": 0.98, "rms_ratio_error": 0.1}
# the next float beyond each limit, on its failing side
BEYOND = {
    "latent_rel_l2": math.nextafter(0.03, math.inf),
    "psnr_db": math.nextafter(33.0, -math.inf),
    "min_ssim": math.nextafter(0.98, -math.inf),
    "audio_snr_db": math.nextafter(20.0, -math.inf),
    "lsd_db": math.nextafter(2.0, math.inf),
    "spectral_cosine": math.nextafter(0.98, -math.inf),
    "rms_ratio_error": math.nextafter(0.1, math.inf),
}


def test_budget_defaults_are_the_seeds():
    assert Budget().to_dict() == {
        "latent_rel_l2": 0.03,
        "psnr_db": 33.0,
        "min_ssim": 0.98,
        "audio_snr_db": None,
        "lsd_db": None,
        "spectral_cosine": None,
        "rms_ratio_error": None,
    }
    audio = Budget().with_audio().to_dict()
    assert {k: audio[k] for k in AUDIO_LIMITS} == AUDIO_LIMITS and Budget(lsd_db=1.0).with_audio().lsd_db == 1.0


def test_budget_exactly_at_limit_passes_and_just_beyond_fails():
    budget = Budget().with_audio()
    assert budget.failures(AT_LIMIT) == [] and budget.spent(AT_LIMIT) == pytest.approx(1.0)
    for name, value in BEYOND.items():
        failures = budget.failures({**AT_LIMIT, name: value})
        assert len(failures) == 1 and failures[0].startswith(f"{name}: ")
        assert f"{AT_LIMIT[name]:g}" in failures[0]
        assert budget.spent({**AT_LIMIT, name: value}) > 1.0


def test_budget_spent_scales_with_the_error_amplitude(rng):
    """Halving every error (rel-L2, 1 - SSIM, 1 - cosine, LSD, RMS error; +6.02 dB of PSNR and SNR) halves `spent`."""
    budget = Budget().with_audio()
    share = float(rng.uniform(0.05, 0.95))
    measured = {
        "latent_rel_l2": 0.03 * share,
        "psnr_db": 33.0 - 20 * math.log10(share),
        "min_ssim": 1 - 0.02 * share,
        "audio_snr_db": 20.0 - 20 * math.log10(share),
        "lsd_db": 2.0 * share,
        "spectral_cosine": 1 - 0.02 * share,
        "rms_ratio_error": 0.1 * share,
    }
    assert budget.spent(measured) == pytest.approx(share)
    worse = {**measured, "psnr_db": measured["psnr_db"] - 20 * math.log10(1.5)}  # PSNR error 1.5x larger
    assert budget.spent(worse) == pytest.approx(1.5 * share)
    assert budget.spent({**measured, "psnr_db": math.inf, "min_ssim": 1.0}) == pytest.approx(share)
    assert budget.spent({**measured, "lsd_db": None}) == math.inf and Budget().spent({}) == math.inf


def test_budget_unmeasured_or_nan_metric_fails_and_none_limit_is_not_checked():
    budget = Budget()
    assert budget.failures({**AT_LIMIT, "latent_rel_l2": None}) == ["latent_rel_l2: not measured, limit <= 0.03"]
    assert budget.failures({**AT_LIMIT, "psnr_db": math.nan}) == ["psnr_db: nan dB outside limit >= 33 dB"]
    assert Budget(latent_rel_l2=None).failures({**AT_LIMIT, "latent_rel_l2": None}) == []
    assert budget.failures({**AT_LIMIT, "psnr_db": math.inf}) == []


def test_budget_bad_values_raise_naming_the_field():
    with pytest.raises(ValueError, match="unknown field.*'psnr'"):
        Budget.from_dict({"psnr": 30})
    for name in AT_LIMIT:
        with pytest.raises(ValueError, match=f"^{name}: "):
            Budget(**{name: -1.0})
    with pytest.raises(ValueError, match="^min_ssim: "):
        Budget(min_ssim=1.5)
    with pytest.raises(ValueError, match="^psnr_db: "):
        Budget(psnr_db=math.nan)
    with pytest.raises(ValueError, match="^latent_rel_l2: "):
        Budget(latent_rel_l2=True)
    with pytest.raises(ValueError, match=r"^psnr_db: must be a finite number >= 0 or None, got <an integer of"):
        Budget(psnr_db=10**400)  # past any float: a ValueError, not an OverflowError
    for refused in (np.float32("nan"), np.bool_(True), "30"):
        with pytest.raises(ValueError, match=r"^psnr_db: must be a finite number >= 0 or None, got "):
            Budget(psnr_db=refused)


@pytest.mark.parametrize("limit", [np.float32(30), np.int64(30), np.float64(30), 30])
def test_budget_takes_a_numpy_number_as_the_python_float_it_holds(limit):
    budget = Budget(psnr_db=limit)
    assert type(budget.psnr_db) is float and budget.psnr_db == 30.0  # a record of it is plain JSON


def test_budget_round_trips_through_dict():
    budget = Budget(psnr_db=30, audio_snr_db=15.5)
    assert Budget.from_dict(budget.to_dict()) == budget
    assert Budget.from_dict({}) == Budget()


def test_budget_describe_names_each_set_limit_with_its_direction_and_unit():
    assert Budget().describe() == "latent_rel_l2 <= 0.03, psnr_db >= 33 dB, min_ssim >= 0.98"
    assert "rms_ratio_error <= 0.1" in Budget().with_audio().describe()
    assert Budget(None, None, None).describe() == "no limits"


def test_budget_from_dict_refuses_what_is_not_an_object():
    with pytest.raises(ValueError, match="budget: expected an object of limit -> value, got str"):
        Budget.from_dict("x")
