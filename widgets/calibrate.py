"""The calibration panel: a quality budget as the control, a calibrate action, the Pareto plot, and "apply"."""

from __future__ import annotations

import html
import json

import ipywidgets
from IPython.display import HTML

from workbench import Session
from workbench.evidence import calibrate as cal
from workbench.evidence.harness import default_budget
from workbench.plots import figure_png, png_figure_html
from workbench.profiles import profile
from workbench.quality import Budget
from workbench.request import Request

from ._common import ACCENT_COLOR, ALERT_COLOR, GOOD_COLOR, ErrorBox, StaticCopy

_LIMIT_HELP = {
    "latent_rel_l2": "latent rel-L2 <=",
    "psnr_db": "PSNR dB >=",
    "min_ssim": "min SSIM >=",
    "audio_snr_db": "audio SNR dB >=",
    "lsd_db": "log-spectral dist. dB <=",
    "spectral_cosine": "spectral cosine >=",
    "rms_ratio_error": "|RMS ratio - 1| <=",
}


MARGINS = (0.1, 1.0)  # the margin slider's range
TRIES = (2, 12)  # the tries-per-knob slider's range
BASES = ("exact-fast", "stock")  # the profiles the panel can install underneath


class CalibrationPanel(StaticCopy, ipywidgets.VBox):
    """Budget limits (the session's default budget shown; untick a limit to leave it unchecked), the plugins to
    calibrate (one: its knob is searched; several: a greedy stack), the profile underneath (`exact-fast` by default,
    as the command line's `--base-profile`; what this machine cannot run of it is left out), margin and tries per
    knob (the controls start at `budget`, `plugins`, `base`, `margin` and `max_evals`, so a panel shown beside a
    result calibrated in code searches as that result did; a value the controls cannot hold is a ValueError naming
    it); "calibrate" runs
    `workbench.evidence.calibrate` on `calibration` and confirms on `test` (each finished step shows in the panel as it
    comes: the value tried, the share of the budget it spent, the confirmations' verdicts);
    the result shows as status, the Pareto plot (knee circled, cliff crossed) and the setting; "apply" installs the
    setting into the session, and only a confirmed one. `result` holds the last `Calibration` or `Stack`."""

    def __init__(
        self,
        session: Session,
        calibration: list[Request],
        test: list[Request],
        plugins: list[str] | None = None,
        budget: Budget | None = None,
        margin: float = cal.MARGIN,
        max_evals: int = cal.MAX_EVALS,
        base: str = "exact-fast",
    ):
        low, high = MARGINS
        if isinstance(margin, bool) or not isinstance(margin, int | float) or not low <= margin <= high:
            raise ValueError(f"margin: {margin!r}; allowed: {low} to {high} (the panel's slider)")
        low, high = TRIES
        if isinstance(max_evals, bool) or not isinstance(max_evals, int) or not low <= max_evals <= high:
            raise ValueError(f"max_evals: {max_evals!r}; allowed: an int from {low} to {high} (the panel's slider)")
        if base not in BASES:
            raise ValueError(f"base: {base!r}; allowed: {', '.join(map(repr, BASES))}")
        self.session, self.calibration, self.test = session, calibration, test
        self.result: cal.Calibration | cal.Stack | None = None
        budget = budget or default_budget(session)
        style = {"description_width": "170px"}
        self.limits: dict[str, tuple[ipywidgets.Checkbox, ipywidgets.FloatText]] = {}
        rows = []
        for name, value in budget.to_dict().items():
            use = ipywidgets.Checkbox(value=value is not None, indent=False, layout={"width": "24px"})
            box = ipywidgets.FloatText(
                value=0.0 if value is None else value, description=_LIMIT_HELP[name], style=style, step=None
            )
            box.layout.width = "300px"
            self.limits[name] = (use, box)
            rows.append(ipywidgets.HBox([use, box]))
        choices = cal.calibratable()
        self.plugins = ipywidgets.SelectMultiple(
            options=choices, value=tuple(p for p in (plugins or ["easycache"]) if p in choices), rows=len(choices),
            description="plugins", style={"description_width": "60px"},
        )  # fmt: skip
        self.base = ipywidgets.ToggleButtons(
            options=list(BASES), value=base, description="underneath",
            style={"description_width": "70px", "button_width": "90px"},
        )  # fmt: skip
        self.margin = ipywidgets.FloatSlider(
            value=margin, min=MARGINS[0], max=MARGINS[1], step=0.05, description="margin"
        )
        self.evals = ipywidgets.IntSlider(value=max_evals, min=TRIES[0], max=TRIES[1], description="tries / knob")
        self.run_button = ipywidgets.Button(description="calibrate", button_style="primary", icon="search")
        self.apply_button = ipywidgets.Button(description="apply", disabled=True, icon="check")
        self.status = ipywidgets.HTML()
        self.steps = ipywidgets.HTML(layout=ipywidgets.Layout(display="none"))
        self.plot = ipywidgets.Image(format="png", layout=ipywidgets.Layout(display="none", max_width="720px"))
        self.setting = ipywidgets.HTML()
        self.error = ErrorBox()
        self.run_button.on_click(lambda _: self.run())
        self.apply_button.on_click(lambda _: self.apply())
        controls = ipywidgets.VBox([self.plugins, self.base, self.margin, self.evals])
        super().__init__(
            [
                ipywidgets.HTML("<b>quality budget</b> (against the stock dense output of the same request)"),
                ipywidgets.HBox([ipywidgets.VBox(rows), controls]),
                ipywidgets.HBox([self.run_button, self.apply_button]),
                self.error,
                self.steps,
                self.status,
                self.plot,
                self.setting,
            ]
        )
        self.add_class("vflash-calibration")

    def budget(self) -> Budget:
        """The budget the controls describe (a bad limit is a ValueError naming it)."""
        values = {name: (box.value if use.value else None) for name, (use, box) in self.limits.items()}
        return Budget.from_dict(values)

    def run(self) -> cal.Calibration | cal.Stack | None:
        """Calibrate with the controls' settings; the panel shows the outcome (or the error) and returns it."""
        self.error.clear()
        self.apply_button.disabled = True
        with self.error.catching("calibrate"):
            plugins = list(self.plugins.value)
            if not plugins:
                raise ValueError("plugins: choose at least one plugin to calibrate")
            options = {"margin": self.margin.value, "max_evals": self.evals.value, "progress": False}
            options["base"] = profile(
                self.base.value, self.session.model.family.name, self.session.device, self.session.model
            )
            options["on_step"] = self._step
            self.steps.value, self.steps.layout.display = "", None
            self.status.value = "running: stock references first ..."
            self.run_button.disabled = True
            try:
                if len(plugins) == 1:
                    result = cal.calibrate(
                        self.session, self.calibration, self.test, plugins[0], self.budget(), **options
                    )
                else:
                    result = cal.stack(self.session, self.calibration, self.test, plugins, self.budget(), **options)
            finally:
                self.run_button.disabled = False
            self.show(result)
            return result
        return None

    def _step(self, text: str) -> None:
        """One finished step, newest first under the running status (the last 8 kept)."""
        lines = [f"<div>{html.escape(text)}</div>", *self.steps.value.split("\n")[:7]]
        self.steps.value = "\n".join(line for line in lines if line)

    def show(self, result: cal.Calibration | cal.Stack) -> None:
        """Display a finished calibration or stack (also one loaded from elsewhere); it becomes the static copy of the
        panel's displays."""
        self.result = result
        colour = {
            "calibrated": GOOD_COLOR,
            "quality_confirmed": ACCENT_COLOR,
        }.get(result.status, ALERT_COLOR)
        self.status.value = (
            f"<span style='color:{colour};font-weight:bold'>{html.escape(result.status)}</span>: "
            f"{html.escape(result.reason)}"
        )
        self.plot.value = figure_png(cal.pareto_figure(result))
        self.plot.layout.display = None
        self.setting.value = (  # named, and as JSON (as the reports write it), not a bare Python repr under the plot
            f"<p><b>setting</b> (what <i>apply</i> installs): <code>{html.escape(json.dumps(result.config))}</code></p>"
            if result.config
            else ""
        )
        self.apply_button.disabled = result.status not in ("calibrated", "quality_confirmed")
        self.refresh_static()

    def static(self) -> HTML:
        """The panel's outcome as it stands, as self-contained HTML: the budget, the status, the Pareto plot and the
        setting (the controls need a running kernel); before a run, the budget alone."""
        limits = ", ".join(
            f"{_LIMIT_HELP[name]} {box.value:g}" for name, (use, box) in self.limits.items() if use.value
        )
        plot = png_figure_html(self.plot.value, "Pareto plot of the calibration") if self.plot.value else ""
        parts = [
            f"<p><b>quality budget</b>: {html.escape(limits) or 'no limit'}</p>",
            self.error.value,
            self.status.value,
        ]
        return HTML(f'<div class="vflash-calibration-static">{"".join(parts)}{plot}{self.setting.value}</div>')

    def apply(self) -> dict:
        """Install the confirmed setting into the session; returns what `Session.accelerate` installed (name ->
        options with defaults filled in)."""
        if self.result is None or self.result.status not in ("calibrated", "quality_confirmed"):
            raise RuntimeError("apply: no confirmed setting to install; calibrate first")
        installed = self.session.accelerate(dict(self.result.config))
        self.status.value += f"<br>installed: {html.escape(', '.join(installed))}"
        return installed
