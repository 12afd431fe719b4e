"""One plugin option as a labelled input field: a visible default or a required marker, and errors at the field.

A field is a small stacked cell, so several wrap side by side inside the panel's width:

    threshold* float ≥ 0         <- name, a red * when required, what it accepts (grey)
    [ 0.05          ]            <- Dropdown (allowed values), Checkbox (bool) or Text (anything else)
    -1 is below the minimum 0.0  <- only when the value is bad (red), and the input turns red

Numbers are Text on purpose: a bounded number box silently clamps a bad value, and an empty one cannot
exist, so neither "required, not given" nor "out of range" could be shown where it happened. Every value is
checked with the option's own `Option.check`, so the field says exactly what `session.accelerate` would.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets

from workbench.accelerations import Option

from ._common import ALERT_COLOR, MUTED_COLOR

INVALID_BACKGROUND = "var(--jp-rendermime-error-background, #fdecea)"  # under the input's own text colour
_LABEL = "font-size:11px;line-height:15px;white-space:nowrap"
_MESSAGE = f"font-size:11px;line-height:14px;color:{ALERT_COLOR};white-space:normal;max-width:240px"
_INPUT_WIDTH = "150px"


def kinds(option: Option) -> tuple[type, ...]:
    return option.kind if isinstance(option.kind, tuple) else (option.kind,)


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def accepts(option: Option) -> str:
    """What an option accepts, in a few characters: 'float ≥ 0', 'int 0–4', 'list: a, b', 'int/str'."""
    names = [k.__name__ for k in kinds(option) if k is not type(None)]
    text = "list: a, b" if names == ["list"] else "/".join(names)
    low, high = option.minimum, option.maximum
    if low is not None and high is not None:
        return f"{text} {_number(low)}–{_number(high)}"
    if low is not None:
        return f"{text} ≥ {_number(low)}"
    if high is not None:
        return f"{text} ≤ {_number(high)}"
    return text


def show_value(value: Any) -> str:
    """A value as the text a user would type for it (lists comma-separated)."""
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return _number(value) if isinstance(value, float) else str(value)


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


class OptionField(ipywidgets.VBox):
    """The input of one option of one plugin. `value()` is what to pass (None: leave it to the default)."""

    def __init__(self, plugin: str, option: Option, value: Any = None):
        self.plugin, self.option = plugin, option
        self.error: str | None = None  # the message shown at the field (set by `check`), None while the value is fine
        start = value if value is not None else option.default
        star = f' <b style="color:{ALERT_COLOR}" title="required">*</b>' if option.required else ""
        hint = (
            ""
            if option.allowed is not None
            else f' <span style="color:{MUTED_COLOR}">{html.escape(accepts(option))}</span>'
        )
        self.label = ipywidgets.HTML(
            f'<div style="{_LABEL}">{html.escape(option.name)}{star}{hint}</div>',
            tooltip=option.help or None,
            layout=ipywidgets.Layout(min_width="0", max_width="100%"),
        )
        size = ipywidgets.Layout(width=_INPUT_WIDTH)
        if option.allowed is not None:
            choices = list(option.allowed)
            self.widget: ipywidgets.ValueWidget = ipywidgets.Dropdown(
                options=choices, value=start if start in choices else None, layout=size
            )
        elif kinds(option) == (bool,):
            self.widget = ipywidgets.Checkbox(value=bool(start), indent=False, layout=size)
        else:
            placeholder = ("required: " if option.required else "") + accepts(option)
            self.widget = ipywidgets.Text(
                value=show_value(start), placeholder=placeholder, continuous_update=False, layout=size
            )
        if option.help:
            self.widget.tooltip = option.help
        self.message = ipywidgets.HTML(layout=ipywidgets.Layout(display="none"))
        super().__init__(
            [self.label, self.widget, self.message], layout=ipywidgets.Layout(margin="0 10px 2px 0", min_width="0")
        )
        self.add_class("vflash-option")
        self.widget.observe(lambda _: self.check(), "value")

    def set(self, value: Any) -> None:
        """Put `value` in the field as a user would (text for a Text field)."""
        self.widget.value = show_value(value) if isinstance(self.widget, ipywidgets.Text) else value

    def reset(self, value: Any = None) -> None:
        """Show `value` (None: the option's default) unmarked, as a fresh field would."""
        self.set(value if value is not None else self.option.default)
        self._mark(None)

    def value(self) -> Any:
        """The parsed value, or None when the field is empty; ValueError naming the option when it does not parse."""
        raw = self.widget.value
        if not isinstance(self.widget, ipywidgets.Text):
            return raw
        text = raw.strip()
        if not text:
            return None
        accepted = kinds(self.option)
        if list in accepted:
            return [_scalar(item.strip()) for item in text.split(",") if item.strip()]
        for kind in (int, float):  # the narrowest type the option accepts that parses
            if kind in accepted:
                try:
                    return kind(text)
                except ValueError:
                    continue
        if str in accepted:
            return text
        names = "/".join(k.__name__ for k in accepted)
        raise ValueError(f"{self.plugin}.{self.option.name}: expected {names}, got {text!r}")

    def check(self) -> str | None:
        """Check the value as the plugin will and mark the field; the message (naming the option), or None."""
        try:
            value = self.value()
            if value is None and self.option.required:
                raise ValueError(f"{self.plugin}.{self.option.name}: required; give {accepts(self.option)}")
            if value is not None:
                self.option.check(self.plugin, value)
        except ValueError as error:
            self._mark(str(error))
            return str(error)
        self._mark(None)
        return None

    def _mark(self, error: str | None) -> None:
        self.error = error
        prefix = f"{self.plugin}.{self.option.name}: "
        short = error[len(prefix) :] if error and error.startswith(prefix) else error
        self.message.value = "" if error is None else f'<div style="{_MESSAGE}">{html.escape(short)}</div>'
        self.message.layout.display = "none" if error is None else None
        if error is None:
            self.remove_class("vflash-invalid")
        else:
            self.add_class("vflash-invalid")
        if isinstance(self.widget, ipywidgets.Text):
            self.widget.style.background = INVALID_BACKGROUND if error else None
