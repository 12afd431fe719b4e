"""The acceleration toggle panel: one row per registered plugin, generated from the registry."""

from __future__ import annotations

import html
import sys
from typing import Any

import ipywidgets

from workbench import Session
from workbench.accelerations import available
from workbench.accelerations.base import Option, Spec

from ._common import ErrorBox

CONTRACT_COLORS = {
    "bitwise": "#2e7d32",  # element-for-element equal
    "rounding": "#00838f",  # same rounding boundaries
    "reduction": "#ef6c00",  # reduction order may differ
    "approximate": "#c62828",  # a named quality trade
}
_BADGE = "display:inline-block;padding:1px 8px;border-radius:9px;color:white;font-size:11px;background:{color}"
_INT_LIMIT = 2**53 - 1  # the largest integer a browser's Number holds exactly
_FLOAT_LIMIT = sys.float_info.max


def contract_badge(contract: str) -> str:
    """The contract as a coloured HTML pill (green bitwise ... red approximate)."""
    color = CONTRACT_COLORS.get(contract, "#616161")
    return f'<span class="vflash-contract vflash-contract-{html.escape(contract)}" style="{_BADGE.format(color=color)}">{html.escape(contract)}</span>'


class OptionInput:
    """One option's input widget and the conversion of what it holds back to an option value.

    Dropdown when `allowed` is set, Checkbox for bool, BoundedFloatText/BoundedIntText with the option's
    range for numbers, Text for anything else. A `required` number has no sensible starting value, so it
    is a Text that starts empty (a number box cannot be empty): left empty, `session.accelerate` names it.
    `value()` is None when the input is empty, so the option is left to its default.
    """

    def __init__(self, plugin: str, option: Option, value: Any = None):
        self.plugin, self.option = plugin, option
        kinds = option.kind if isinstance(option.kind, tuple) else (option.kind,)
        start = value if value is not None else (None if option.required else option.default)
        style = {"description_width": "initial"}
        tooltip = option.help or None
        if option.allowed is not None:
            choices = list(option.allowed)
            self.widget = ipywidgets.Dropdown(
                options=choices, value=start if start in choices else None, description=option.name, style=style
            )
            self.parse = lambda raw: raw
        elif bool in kinds:
            self.widget = ipywidgets.Checkbox(value=bool(start), description=option.name, indent=False)
            self.parse = lambda raw: bool(raw)
        elif (int in kinds or float in kinds) and isinstance(start, int | float):  # "family" of int|str: Text
            number = float if float in kinds else int
            limit = _FLOAT_LIMIT if number is float else _INT_LIMIT
            box = ipywidgets.BoundedFloatText if number is float else ipywidgets.BoundedIntText
            low = option.minimum if option.minimum is not None else -limit
            high = option.maximum if option.maximum is not None else limit
            self.widget = box(
                value=number(start), min=number(low), max=number(high), description=option.name, style=style
            )
            self.parse = number
        else:
            placeholder = "/".join(k.__name__ for k in kinds) + (" (required)" if option.required else "")
            self.widget = ipywidgets.Text(
                value="" if start is None else str(start), placeholder=placeholder, description=option.name, style=style
            )
            self.parse = self._parse_text
        if tooltip:
            self.widget.tooltip = tooltip

    def value(self) -> Any:
        raw = self.widget.value
        if raw is None or raw == "":
            return None
        return self.parse(raw)

    def _parse_text(self, text: str) -> Any:
        kinds = self.option.kind if isinstance(self.option.kind, tuple) else (self.option.kind,)
        for kind in (int, float, str):  # the narrowest type the option accepts that parses
            if kind in kinds:
                try:
                    return kind(text.strip()) if kind is not str else text
                except ValueError:
                    continue
        names = "/".join(k.__name__ for k in kinds)
        raise ValueError(f"{self.plugin}.{self.option.name}: expected {names}, got {text!r}")


class AccelerationRow(ipywidgets.HBox):
    """Enable checkbox, contract badge, one input per option, and a note when the session cannot run it."""

    def __init__(self, spec: Spec, options: dict[str, Any] | None = None):
        self.spec = spec
        self.enabled = ipywidgets.Checkbox(value=options is not None, description=spec.name, indent=False)
        self.enabled.add_class("vflash-enable")
        self.badge = ipywidgets.HTML(contract_badge(spec.contract), tooltip=spec.summary)
        given = options or {}
        self.inputs = {o.name: OptionInput(spec.name, o, given.get(o.name)) for o in spec.options}
        self.note = ipywidgets.HTML()
        super().__init__(
            [self.enabled, self.badge, *(i.widget for i in self.inputs.values()), self.note],
            layout=ipywidgets.Layout(align_items="center", grid_gap="8px"),
        )
        self.add_class("vflash-acceleration-row")

    def options(self) -> dict[str, Any]:
        """The options as entered; empty inputs are left out, so the plugin's default (or its error) applies."""
        return {name: v for name, i in self.inputs.items() if (v := i.value()) is not None}


class AccelerationPanel(ipywidgets.VBox):
    """Toggle the registered accelerations of a session: a new plugin gets its row with no UI code.

    Rows start from what the session has installed, so approximate plugins (every plugin, in fact) start
    off on a fresh session. `apply()` installs the checked set through `session.accelerate`, which is all
    or nothing: a bad option (`ValueError`) or one this machine cannot run (`RuntimeError`) shows in the
    error box and the session keeps what it had.
    """

    def __init__(self, session: Session | None = None):
        self.specs = available()
        self.session: Session | None = None
        self.rows: dict[str, AccelerationRow] = {}
        self.rows_box = ipywidgets.VBox()
        self.apply_button = ipywidgets.Button(description="apply", icon="check", button_style="primary")
        self.clear_button = ipywidgets.Button(description="remove all", icon="times")
        self.installed = ipywidgets.HTML("no session")
        self.errors = ErrorBox()
        title = ipywidgets.HTML(
            "<b>Accelerations</b> (contract: " + " ".join(map(contract_badge, CONTRACT_COLORS)) + ")"
        )
        buttons = ipywidgets.HBox([self.apply_button, self.clear_button])
        super().__init__([title, self.rows_box, buttons, self.installed, self.errors])
        self.add_class("vflash-acceleration-panel")
        self.apply_button.on_click(lambda _: self.apply())
        self.clear_button.on_click(lambda _: self.remove_all())
        self.bind(session)

    def bind(self, session: Session | None) -> None:
        """Show `session`'s plugins and state (rebuilds the rows from the registry and what it has installed)."""
        self.session = session
        installed = session.accelerations if session is not None else {}
        self.rows = {name: AccelerationRow(spec, installed.get(name)) for name, spec in self.specs.items()}
        for name, row in self.rows.items():
            row.note.value = self._note(self.specs[name])
        self.rows_box.children = list(self.rows.values())
        self.errors.clear()
        self._show_installed()

    def enable(self, name: str, on: bool = True, **options: Any) -> None:
        """Check (or uncheck) `name`'s row and fill in `options`; nothing is installed until `apply()`."""
        if name not in self.rows:
            raise ValueError(f"acceleration: {name!r} is not registered; allowed: {sorted(self.rows)}")
        row = self.rows[name]
        unknown = sorted(set(options) - set(row.inputs))
        if unknown:
            raise ValueError(f"{name}: unknown option(s) {unknown}; allowed: {sorted(row.inputs)}")
        row.enabled.value = on
        for key, value in options.items():
            widget = row.inputs[key].widget
            if isinstance(widget, ipywidgets.Text):  # a required number starts as text
                value = "" if value is None else str(value)
            widget.value = value

    def config(self) -> dict[str, dict[str, Any]]:
        """{name: options} of the checked rows; an input that does not parse is a ValueError naming it."""
        return {name: row.options() for name, row in self.rows.items() if row.enabled.value}

    def apply(self) -> dict[str, dict[str, Any]] | None:
        """Install the checked set; returns what is installed, or None when it failed (see the error box)."""
        self.errors.clear()
        if self.session is None:
            self.errors.show("apply", RuntimeError("no session: open one first"))
            return None
        try:
            installed = self.session.accelerate(self.config())
        except (ValueError, RuntimeError) as error:
            self.errors.show("apply", error)
            self._show_installed()
            return None
        self._show_installed()
        return installed

    def remove_all(self) -> dict[str, dict[str, Any]] | None:
        for row in self.rows.values():
            row.enabled.value = False
        return self.apply()

    def _show_installed(self) -> None:
        if self.session is None:
            self.installed.value = "no session"
            return
        installed = self.session.accelerations
        if not installed:
            self.installed.value = "installed: nothing (stock diffusers)"
            return
        items = [
            f"{contract_badge(self.specs[name].contract) if name in self.specs else ''} <code>{html.escape(name)}</code> "
            f"{html.escape(str(options)) if options else ''}"
            for name, options in installed.items()
        ]
        self.installed.value = "installed: " + "; ".join(items)

    def _note(self, spec: Spec) -> str:
        """Why this session cannot run `spec`, if it cannot (applying it anyway shows the RuntimeError)."""
        if self.session is None:
            return ""
        problems = []
        if self.session.device.type not in spec.devices:
            problems.append(f"needs {'/'.join(spec.devices)}")
        if spec.families is not None and self.session.family.name not in spec.families:
            problems.append(f"supports {'/'.join(spec.families)}")
        if not problems:
            return f'<span style="color:#757575;font-size:11px">{html.escape(spec.summary)}</span>'
        return (
            f'<span style="color:#a94442;font-size:11px">not on this session: {html.escape("; ".join(problems))}</span>'
        )
