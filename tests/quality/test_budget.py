import math

import pytest

from workbench.quality import Budget

AT_LIMIT = {"latent_rel_l2": 0.03, "psnr_db": 33.0, "min_ssim": 0.98, "audio_snr_db": 20.0, "lsd_db": 2.0}
# the next float beyond each limit, on its failing side
BEYOND = {
    "latent_rel_l2": math.nextafter(0.03, math.inf),
    "psnr_db": math.nextafter(33.0, -math.inf),
    "min_ssim": math.nextafter(0.98, -math.inf),
    "audio_snr_db": math.nextafter(20.0, -math.inf),
    "lsd_db": math.nextafter(2.0, math.inf),
}


def test_budget_defaults_are_the_seeds():
    assert Budget().to_dict() == {
        "latent_rel_l2": 0.03,
        "psnr_db": 33.0,
        "min_ssim": 0.98,
        "audio_snr_db": None,
        "lsd_db": None,
    }


def test_budget_exactly_at_limit_passes_and_just_beyond_fails():
    budget = Budget(audio_snr_db=20.0, lsd_db=2.0)
    assert budget.failures(AT_LIMIT) == []
    for name, value in BEYOND.items():
        failures = budget.failures({**AT_LIMIT, name: value})
        assert len(failures) == 1 and failures[0].startswith(f"{name}: ")
        assert f"{AT_LIMIT[name]:g}" in failures[0]


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


def test_budget_round_trips_through_dict():
    budget = Budget(psnr_db=30, audio_snr_db=15.5)
    assert Budget.from_dict(budget.to_dict()) == budget
    assert Budget.from_dict({}) == Budget()
