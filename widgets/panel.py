"""The acceleration panel: every registered plugin, grouped by kind, one line each until it is switched on.

Layout (generated from the registry; a new plugin gets its line with no UI code):

    Accelerations   bitwise rounding reduction approximate          <- the contract legend
    [stock]       installs nothing (stock diffusers)               <- one-click profiles, with what they
    [exact-fast]  installs cross_kv_cache; left out here: ...         install here and what they leave out
    attention                          | caches
    [ ] attention_backend (reduction) dense attention thr... [v]   <- checkbox, name, contract, summary, expand
    [x] block_sparse (approximate) ...                             <- on: its option fields wrap below
        tau float  sink_tokens int/str  dense_steps int >= 0 ...
    ...                                | ...
    [apply] [remove all]  installed: ...
    (error box)

Groups follow the plugin's kind, `Spec.kind` (the subpackage of `workbench.accelerations` it lives in; a Spec made
outside the registry shows under "other"). The groups fill two columns that wrap
into one below ~860 px. Option fields are `OptionField`s: a bad or missing value is marked at its field and
`apply()` refuses to install anything until it is fixed.
"""

from __future__ import annotations

import html
import inspect
import re
from typing import Any

import ipywidgets

from workbench import Session
from workbench.accelerations import Spec, available
from workbench.profiles import PROFILES

from ._common import ALERT_COLOR, MUTED_COLOR, ErrorBox
from ._fields import OptionField, accepts, show_value
from ._profiles import ProfileRow

CONTRACT_COLORS = {
    "bitwise": "#2e7d32",  # element-for-element equal
    "rounding": "#00747f",  # same rounding boundaries
    "reduction": "#b85400",  # reduction order may differ
    "approximate": "#c62828",  # a named quality trade
}
CONTRACT_MEANINGS = {
    "bitwise": "output element-for-element equal to stock",
    "rounding": "same arithmetic and rounding boundaries as stock",
    "reduction": "same maths; GEMM/attention reduction order may differ",
    "approximate": "a named trade of quality for speed",
}
# Group titles in display order; a kind the registry reports that is not here is shown after them.
GROUPS = {
    "attention": "attention",
    "caching": "caches",
    "fused": "fused kernels",
    "quantization": "quantization",
    "memory": "memory",
    "parallel": "parallel",
    "compile": "compile",
    "other": "other",
}
_BADGE = "display:inline-block;padding:0 7px;border-radius:9px;color:white;font-size:11px;line-height:17px;background:{color}"
# `width:0;min-width:100%`: the text does not widen its flex container (its min-content width is 0), yet fills it.
_ONE_LINE = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;width:0;min-width:100%"
_GREY = f"color:{MUTED_COLOR};font-size:12px"
_RULE = "var(--jp-border-color2, #e0e0e0)"  # a group's underline, a description's left bar


def contract_badge(contract: str) -> str:
    """The contract as a coloured HTML pill (green bitwise ... red approximate), its meaning as a tooltip."""
    color = CONTRACT_COLORS.get(contract, "#616161")
    meaning = html.escape(CONTRACT_MEANINGS.get(contract, contract))
    return (
        f'<span class="vflash-contract vflash-contract-{html.escape(contract)}" title="{meaning}" '
        f'style="{_BADGE.format(color=color)}">{html.escape(contract)}</span>'
    )


def plugin_kind(spec: Spec) -> str:
    """The kind (group) of a plugin: `Spec.kind`, the registry's subpackage, or "other" for a Spec made elsewhere."""
    return spec.kind or "other"


def description_html(spec: Spec) -> str:
    """The full description of a plugin: its module's documentation, where it runs, and every option."""
    module = inspect.getmodule(spec.prepare_fn)
    doc = getattr(spec, "description", None) or (module.__doc__ if module is not None else None) or spec.summary
    paragraphs = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        text = html.escape(" ".join(line.strip() for line in block.splitlines()))
        paragraphs.append("<p style='margin:0 0 6px 0'>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", text) + "</p>")
    facts = [
        f"<b>contract</b> {html.escape(spec.contract)}: {html.escape(CONTRACT_MEANINGS.get(spec.contract, ''))}",
        f"<b>runs on</b> {html.escape('/'.join(spec.devices))}",
        f"<b>families</b> {html.escape('/'.join(spec.families)) if spec.families else 'all'}",
    ]
    if group := getattr(spec, "group", None):
        facts.append(f"<b>exclusive group</b> {html.escape(group)} (one plugin of it at a time)")
    options = "".join(
        f"<li><code>{html.escape(o.name)}</code> {html.escape(accepts(o))}, "
        + ("<b>required</b>" if o.required else f"default <code>{html.escape(show_value(o.default)) or 'none'}</code>")
        + (f" (one of {html.escape(', '.join(map(str, o.allowed)))})" if o.allowed is not None else "")
        + (f": {html.escape(o.help)}" if o.help else "")
        + "</li>"
        for o in spec.options
    )
    return (
        '<div class="vflash-description" style="font-size:12px;line-height:1.45;white-space:normal;'
        f'max-height:260px;overflow:auto;padding:4px 8px;border-left:3px solid {_RULE};margin:0 0 4px 24px">'
        + "".join(paragraphs)
        + "<p style='margin:0 0 4px 0'>"
        + " &middot; ".join(facts)
        + "</p>"
        + (f"<ul style='margin:0;padding-left:18px'>{options}</ul>" if options else "")
        + "</div>"
    )


def _column_layout() -> ipywidgets.Layout:
    return ipywidgets.Layout(flex="1 1 420px", min_width="0", margin="0 12px 0 0", overflow="visible")


class AccelerationRow(ipywidgets.VBox):
    """One plugin: a single line (checkbox, name, contract badge, one-line summary, expand) while it is off;
    its option fields below while it is on; its full description while expanded."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.enabled = ipywidgets.Checkbox(
            value=False, description=spec.name, indent=False, layout=ipywidgets.Layout(width="auto")
        )
        self.enabled.add_class("vflash-enable")
        self.badge = ipywidgets.HTML(contract_badge(spec.contract), layout=ipywidgets.Layout(flex="0 0 auto"))
        self.note = ipywidgets.HTML(layout=ipywidgets.Layout(flex="1 1 0", min_width="0"))
        self.show_note(None)
        self.more = ipywidgets.ToggleButton(
            value=False,
            icon="angle-down",
            tooltip="full description",
            layout=ipywidgets.Layout(width="28px", height="24px", padding="0", flex="0 0 auto"),
        )
        self.more.add_class("vflash-more")
        self.details = ipywidgets.HTML(layout=ipywidgets.Layout(display="none"))
        self._inputs: dict[str, OptionField] | None = None  # made on first use (`inputs`)
        self.options_box = ipywidgets.Box(
            layout=ipywidgets.Layout(display="flex", flex_flow="row wrap", margin="0 0 4px 24px", overflow="visible"),
        )
        self.options_box.add_class("vflash-options")
        line = ipywidgets.HBox(
            [self.enabled, self.badge, self.note, self.more],
            layout=ipywidgets.Layout(align_items="center", width="100%", overflow="hidden"),
        )
        line.add_class("vflash-line")
        super().__init__([line, self.details, self.options_box], layout=ipywidgets.Layout(overflow="visible"))
        self.add_class("vflash-acceleration-row")
        self.enabled.observe(lambda _: self._show_options(), "value")
        self.more.observe(lambda _: self._show_details(), "value")
        self._show_options()

    @property
    def inputs(self) -> dict[str, OptionField]:
        """The option fields by option name, made (at their defaults) the first time they are asked for: a row that
        stays off sends none of their ~10 widget models a field to the page, which a dashboard's 25 rows would
        otherwise multiply into ~800 for the browser to build before the panel draws."""
        if self._inputs is None:
            self._inputs = {o.name: OptionField(self.spec.name, o) for o in self.spec.options}
            self.options_box.children = list(self._inputs.values())
        return self._inputs

    def load(self, options: dict[str, Any] | None) -> None:
        """Show an installed plugin's `options` (checked), or None: unchecked, every field at its default."""
        if options is not None or self._inputs is not None:  # fields never made are at their defaults already
            for name, field in self.inputs.items():
                field.reset((options or {}).get(name))
        self.enabled.value = options is not None

    def show_note(self, problem: str | None) -> None:
        """The one-line summary; a reason this session cannot run the plugin goes in front of it, in red."""
        summary = html.escape(self.spec.summary)
        warning = f'<span style="color:{ALERT_COLOR}">not here: {html.escape(problem)}</span> ' if problem else ""
        self.note.value = f'<div style="{_ONE_LINE};{_GREY}" title="{summary}">{warning}{summary}</div>'

    def options(self) -> dict[str, Any]:
        """The options as entered; empty inputs are left out, so the plugin's default (or its error) applies."""
        return {name: v for name, field in self.inputs.items() if (v := field.value()) is not None}

    def check(self) -> list[str]:
        """Check every option field (each marks itself); the messages of the bad ones."""
        return [error for field in self.inputs.values() if (error := field.check()) is not None]

    def _show_options(self) -> None:
        self.options_box.layout.display = "flex" if self.enabled.value and self.spec.options and self.inputs else "none"

    def _show_details(self) -> None:
        if self.more.value and not self.details.value:
            self.details.value = description_html(self.spec)  # built on first expand: 20 docstrings add up
        self.details.layout.display = None if self.more.value else "none"
        self.more.icon = "angle-up" if self.more.value else "angle-down"


class AccelerationPanel(ipywidgets.VBox):
    """Toggle the registered accelerations of a session, by hand or through a profile.

    Rows start from what the session has installed, so approximate plugins (every plugin, in fact) start
    off on a fresh session. `apply()` first checks the option fields of the checked rows (a bad or missing
    value is marked at its field and nothing is installed), then installs the checked set through
    `session.accelerate`, which is all or nothing: a conflict (`ValueError`) or a plugin this machine cannot
    run (`RuntimeError`) shows in the error box and the session keeps what it had. `use_profile(name)` checks
    exactly the plugins of a profile (`workbench.profiles`) and applies them.
    """

    def __init__(self, session: Session | None = None):
        self.specs = available()
        self.session: Session | None = None
        # The rows are made once; `bind` only sets their values. (Rebuilding them per session left a generation of
        # ~400 widgets for the garbage collector to close while the page was still drawing the new one.)
        self.rows = {name: AccelerationRow(spec) for name, spec in self.specs.items()}
        self.groups: dict[str, list[str]] = {}
        for name, spec in self.specs.items():
            self.groups.setdefault(plugin_kind(spec), []).append(name)
        order = [kind for kind in GROUPS if kind in self.groups] + [k for k in self.groups if k not in GROUPS]
        self.groups = {kind: self.groups[kind] for kind in order}
        self.columns = ipywidgets.Box(
            self._columns(),
            layout=ipywidgets.Layout(
                display="flex", flex_flow="row wrap", align_items="flex-start", overflow="visible"
            ),
        )
        self.profiles = {name: ProfileRow(name) for name in PROFILES}
        for name, row in self.profiles.items():
            row.button.on_click(lambda _, name=name: self.use_profile(name))
        self.apply_button = ipywidgets.Button(description="apply", icon="check", button_style="primary")
        self.clear_button = ipywidgets.Button(description="remove all", icon="times")
        self.installed = ipywidgets.HTML("no session", layout=ipywidgets.Layout(flex="1 1 0", min_width="0"))
        self.errors = ErrorBox()
        legend = " ".join(map(contract_badge, CONTRACT_COLORS))
        title = ipywidgets.HTML(f"<b>Accelerations</b> &nbsp;<span style='font-size:12px'>contract: {legend}</span>")
        buttons = ipywidgets.HBox(
            [self.apply_button, self.clear_button, self.installed], layout=ipywidgets.Layout(align_items="center")
        )
        super().__init__(
            [title, *self.profiles.values(), self.columns, buttons, self.errors],
            layout=ipywidgets.Layout(overflow="visible"),
        )
        self.add_class("vflash-acceleration-panel")
        self.apply_button.on_click(lambda _: self.apply())
        self.clear_button.on_click(lambda _: self.remove_all())
        self.bind(session)

    def bind(self, session: Session | None) -> None:
        """Show `session`'s state: each row checked with its installed options, or unchecked at the defaults."""
        self.session = session
        installed = session.accelerations if session is not None else {}
        for name, row in self.rows.items():
            row.load(installed.get(name))
            row.show_note(self._problem(self.specs[name]))
        for row in self.profiles.values():
            row.show(session)
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
            row.inputs[key].set(value)

    def config(self) -> dict[str, dict[str, Any]]:
        """{name: options} of the checked rows; an input that does not parse is a ValueError naming it."""
        return {name: row.options() for name, row in self.rows.items() if row.enabled.value}

    def apply(self) -> dict[str, dict[str, Any]] | None:
        """Install the checked set; returns what is installed, or None when it failed (marked fields, error box)."""
        self.errors.clear()
        if self.session is None:
            self.errors.show("apply", RuntimeError("no session: open one first"))
            return None
        problems = [error for row in self.rows.values() if row.enabled.value for error in row.check()]
        if problems:
            marked = ValueError("; ".join(problems) + " (marked at the field; nothing was installed)")
            self.errors.show("apply", marked)
            self._show_installed()
            return None
        try:
            installed = self.session.accelerate(self.config())
        except (ValueError, RuntimeError) as error:
            self.errors.show("apply", error)
            self._show_installed()
            return None
        self._show_installed()
        return installed

    def use_profile(self, name: str) -> dict[str, dict[str, Any]] | None:
        """Check exactly the plugins profile `name` installs on this session (with its options) and apply."""
        if name not in self.profiles:
            raise ValueError(f"profile: {name!r} is unknown; allowed: {list(self.profiles)}")
        config = self.profiles[name].config
        if config is None:
            self.errors.show(f"profile {name}", RuntimeError(f"profile {name!r} is not available on this session"))
            return None
        for plugin, row in self.rows.items():
            row.enabled.value = plugin in config
            for key, value in config.get(plugin, {}).items():
                row.inputs[key].set(value)
        return self.apply()

    def remove_all(self) -> dict[str, dict[str, Any]] | None:
        for row in self.rows.values():
            row.enabled.value = False
        return self.apply()

    def _columns(self) -> list[ipywidgets.VBox]:
        """The groups in two columns of about equal length (in lines), order kept; they wrap to one when narrow."""
        sections = []
        for kind, names in self.groups.items():
            title = GROUPS.get(kind, kind)
            header = ipywidgets.HTML(
                f'<div style="font-weight:600;font-size:12px;color:var(--jp-ui-font-color1, #424242);'
                f'border-bottom:1px solid {_RULE}">{html.escape(title)} '
                f'<span style="font-weight:400;color:{MUTED_COLOR}">{len(names)}</span></div>'
            )
            section = ipywidgets.VBox(
                [header, *(self.rows[n] for n in names)], layout=ipywidgets.Layout(overflow="visible")
            )
            section.add_class("vflash-group")
            section.add_class(f"vflash-group-{re.sub(r'[^a-z0-9]+', '-', kind.lower())}")
            sections.append((1 + len(names), section))
        total = sum(size for size, _ in sections)
        split, best, running = len(sections), total, 0
        for index, (size, _) in enumerate(sections):
            running += size
            if abs(total - 2 * running) < best:
                split, best = index + 1, abs(total - 2 * running)
        halves = [[s for _, s in sections[:split]], [s for _, s in sections[split:]]]
        return [ipywidgets.VBox(half, layout=_column_layout()) for half in halves if half]

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
        self.installed.value = f'<div style="white-space:normal">installed: {"; ".join(items)}</div>'

    def _problem(self, spec: Spec) -> str | None:
        """Why this session cannot run `spec`, if it cannot (applying it anyway shows the RuntimeError)."""
        if self.session is None:
            return None
        problems = []
        if self.session.device.type not in spec.devices:
            problems.append(f"needs {'/'.join(spec.devices)}")
        if spec.families is not None and self.session.family.name not in spec.families:
            problems.append(f"supports {'/'.join(spec.families)}")
        if not problems and spec.unusable is not None and (reason := spec.unusable(self.session.device)):
            problems.append(reason)  # a package or Triton's interpreter missing, a GPU too old
        return "; ".join(problems) or None
