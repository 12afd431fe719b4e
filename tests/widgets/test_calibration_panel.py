"""The calibration panel drives the real calibrate on demo-av-mini (tiny requests), shows the outcome, and applies only
a confirmed setting."""

import base64
import dataclasses
import html
import json
import re

import pytest

from workbench import Request, Session
from workbench.profiles import profile
from workbench.quality.budget import AUDIO_LIMITS
from workbench.widgets import CalibrationPanel

SIZE = {"frames": 9, "height": 32, "width": 32, "steps": 8}


def contrast_on_white(colour: str) -> float:
    """WCAG 2 contrast ratio of `#rrggbb` on white."""
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in channels]
    return 1.05 / (0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2] + 0.05)


@pytest.fixture(scope="module")
def demo():
    return Session.open("demo-av-mini", device="cpu")


def test_panel_shows_the_default_budget_with_audio_and_reads_edited_limits(demo):
    panel = CalibrationPanel(demo, [Request("a red circle moves left, low hum", seed=1, **SIZE)], [])
    budget = panel.budget()
    assert panel.base.value == "exact-fast"  # the exact plugins underneath, as the command line's default
    assert budget.psnr_db == 33.0 and {k: getattr(budget, k) for k in AUDIO_LIMITS} == AUDIO_LIMITS
    use, box = panel.limits["psnr_db"]
    box.value, panel.limits["lsd_db"][0].value = 28.5, False
    assert panel.budget().psnr_db == 28.5 and panel.budget().lsd_db is None
    panel.plugins.value = ()
    assert panel.run() is None and "choose at least one plugin" in panel.error.value
    with pytest.raises(RuntimeError, match="no confirmed setting"):
        panel.apply()


def test_panel_controls_start_at_the_given_settings_and_refuse_what_they_cannot_hold(demo):
    panel = CalibrationPanel(demo, [], [], margin=0.5, max_evals=4, base="stock")  # as a notebook's run searched
    assert (panel.margin.value, panel.evals.value, panel.base.value) == (0.5, 4, "stock")
    for field, value in [("margin", 1.5), ("max_evals", 20), ("max_evals", True), ("base", "fastest")]:
        with pytest.raises(ValueError, match=f"^{field}: "):
            CalibrationPanel(demo, [], [], **{field: value})  # a slider would clamp it silently


def test_panel_calibrates_shows_the_pareto_plot_and_applies_the_confirmed_setting(demo):
    """Over the exact-fast profile (what this CPU runs of it) the applied setting is that base plus the knee."""
    calibration = [Request("a red circle moves left, low hum", seed=2, **SIZE)]
    test = [Request("a blue square moves up, high beeps", seed=1_000_002, **SIZE)]
    panel = CalibrationPanel(demo, calibration, test, plugins=["easycache"])
    for name, (use, _) in panel.limits.items():
        use.value = name == "latent_rel_l2"
    panel.limits["latent_rel_l2"][1].value = 0.3
    panel.evals.value = 2
    result = panel.run()
    assert result is not None and panel.error.value == "", panel.error.value
    assert result.status == "quality_confirmed", (result.reason, result.points)
    assert "quality_confirmed" in panel.status.value
    # each step showed while it ran, newest first: two tried values, then the confirmation
    steps = panel.steps.value.split("\n")
    assert (
        len(steps) == 3 and "step 3: confirmed cross_kv_cache, easycache on seed 1000002: no_speed_claim" in steps[0]
    ), steps
    assert (
        "step 1: 0 with cross_kv_cache, easycache: spends 0 of the budget" in steps[2]
        and panel.steps.layout.display is None
    )
    assert bytes(panel.plot.value).startswith(b"\x89PNG") and panel.plot.layout.display is None
    copy = panel.static().data  # what an HTML export shows where the panel was: budget, verdict, plot, setting
    assert "latent rel-L2 &lt;= 0.3</p>" in copy and panel.status.value in copy and panel.setting.value in copy
    setting = html.escape(json.dumps(result.config))  # named, as JSON, not a bare Python repr under the plot
    assert f"<b>setting</b> (what <i>apply</i> installs): <code>{setting}</code>" in copy
    assert base64.b64encode(panel.plot.value).decode() in copy and copy == panel._repr_mimebundle_()["text/html"]
    for status in ("calibrated", "quality_confirmed", "no_setting"):  # an export has no Jupyter CSS: the fallbacks
        panel.show(dataclasses.replace(result, status=status))
        colours = re.findall(r"color:\s*(?:var\(--[\w-]+,\s*)?(#[0-9a-fA-F]{6})", panel.static().data)
        assert colours and all(contrast_on_white(c) >= 4.5 for c in colours), (status, colours)
    panel.show(result)
    assert not panel.apply_button.disabled
    try:
        installed = panel.apply()
        base = profile("exact-fast", demo.model.family.name, demo.device)
        assert base and result.base == base and set(installed) == {*base, "easycache"}
        assert installed["easycache"]["threshold"] == result.knee
    finally:
        demo.accelerate({})
