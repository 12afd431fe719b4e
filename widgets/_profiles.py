"""A profile as a one-click preset: its button, and what it installs on a session and what it leaves out, and why."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets

from workbench import Session
from workbench.profiles import profile_plan

from ._common import ALERT_COLOR, INFO_BUTTON, MUTED_COLOR


class ProfileRow(ipywidgets.HBox):
    """A profile's one-click button and what it installs on this session and what it leaves out, and why."""

    def __init__(self, name: str):
        self.name = name
        self.button = ipywidgets.Button(
            description=name,
            button_style="" if name == "stock" else "info",
            style={} if name == "stock" else INFO_BUTTON,
            layout=ipywidgets.Layout(width="auto"),
        )
        self.button.add_class("vflash-profile")
        self.plan = ipywidgets.HTML(layout=ipywidgets.Layout(flex="1 1 0", min_width="0"))
        super().__init__([self.button, self.plan], layout=ipywidgets.Layout(align_items="center"))
        self.config: dict[str, dict[str, Any]] | None = None
        self.left_out: dict[str, str] = {}

    def show(self, session: Session | None) -> None:
        """Work out the profile for `session` (its family and device) and say what it does here."""
        self.config, self.left_out = None, {}
        if session is None:
            self._say("open a model to see what it installs")
            return
        try:
            self.config, self.left_out = profile_plan(self.name, session.family.name, session.device, session.model)
        except (ValueError, RuntimeError) as error:
            self._say(f"not available here: {error}", color=ALERT_COLOR)
            return
        installs = ", ".join(f"<code>{html.escape(p)}</code>" for p in self.config) or "nothing (stock diffusers)"
        text = f"installs {installs}"
        if self.left_out:
            reasons = "; ".join(
                f"<code>{html.escape(p)}</code> ({html.escape(why)})" for p, why in self.left_out.items()
            )
            text += f'; <span style="color:{ALERT_COLOR}">left out here:</span> {reasons}'
        self._say(text, raw=True)

    def _say(self, text: str, color: str = MUTED_COLOR, raw: bool = False) -> None:
        self.button.disabled = self.config is None
        body = text if raw else html.escape(text)
        self.plan.value = f'<div style="font-size:12px;line-height:16px;color:{color};white-space:normal">{body}</div>'
