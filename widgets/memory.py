"""The dashboard's memory budget: the cap field, the plan it made, and each result's residency receipt.

    memory cap [ rtx4090-48gb v] [x] FP8 ring   <- empty: no cap; "48GiB", "24GB", "512MiB", bytes, or a card offered
    memory: a cap of ... the smallest cap that fits is 1.53 GiB (1642070000 bytes)   <- a refusal, at the field (red)

The cards offered are `workbench.cards.CARDS` (the seeds' 48 GB RTX 4090 and 20 GB RTX 3080, the common 24 GB
cards, data-centre cards); a card's name caps at its memory. The cap is used when the model is opened
(`Session.open(..., memory=cap)`); the plan is made then, before any weight moves, and shown as its text
(`str(session.memory_plan)`) until the next open. "FP8 ring" asks for `MemoryBudget(ring_transfer="fp8")`: the
blocks the plan streams move as row-wise FP8 (approximate: the results say exact=False). A value that does not parse,
FP8 without a cap and a cap the planner refuses are all shown at the field; none is a traceback.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets

from workbench.cards import CARDS
from workbench.memory_plan import MemoryBudget, MemoryPlan, gib

from ._common import ALERT_COLOR, MUTED_COLOR
from ._fields import INVALID_BACKGROUND

_MESSAGE = f"font-size:11px;line-height:14px;color:{ALERT_COLOR};white-space:normal;max-width:480px"
_BLOCK = (
    "font-family:monospace;font-size:12px;line-height:16px;white-space:pre-wrap;overflow-wrap:anywhere;"
    "margin:2px 0;padding:4px 8px;background:var(--jp-cell-editor-background, #f5f7fa);border-left:3px solid #4e79a7"
)
_CELL = "padding:1px 10px 1px 0;text-align:left;font-weight:normal"


def cap_text(cap: int) -> str:
    """A cap in bytes as the field shows it, exactly (whole GiB or MiB where it is one, else bytes)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if cap % size == 0:
            return f"{cap // size}{unit}"
    return str(cap)


class MemoryCapField(ipywidgets.VBox):
    """A device memory cap as text, and whether its ring moves FP8. `cap()`: None (empty: no cap), or what to pass as
    `Session.open(memory=...)` (the text, or a `MemoryBudget` with FP8 transfers); `error` holds the message shown at
    the field (a bad value, FP8 without a cap, or a refusal given to `refuse`), None while fine."""

    def __init__(self) -> None:
        self.error: str | None = None
        cards = "; ".join(f"{c.name}: {c.label}" for c in CARDS.values())
        self.widget = ipywidgets.Combobox(
            value="",
            options=list(CARDS),
            ensure_option=False,
            placeholder="no cap, e.g. 48GiB",
            description="memory cap",
            tooltip=f"device memory cap used when the model is opened; empty: no cap. Cards: {cards}",
            continuous_update=False,
            style={"description_width": "initial"},
            layout={"width": "250px"},
        )
        self.fp8 = ipywidgets.Checkbox(
            value=False,
            description="FP8 ring",
            indent=False,
            tooltip="streamed blocks move as row-wise FP8: half the bytes per forward; approximate (exact=False)",
            layout={"width": "90px"},
        )
        self.message = ipywidgets.HTML(layout={"display": "none"})
        row = ipywidgets.HBox([self.widget, self.fp8], layout={"align_items": "center"})
        super().__init__([row, self.message], layout={"min_width": "0"})
        self.add_class("vflash-memory-cap")
        self.widget.observe(lambda _: self.check(), "value")
        self.fp8.observe(lambda _: self.check(), "value")

    def cap(self) -> str | MemoryBudget | None:
        """The cap to open with, None for no cap; ValueError (`memory: ...`, also shown at the field) when bad."""
        if self.check() is not None:
            raise ValueError(self.error)
        text = self.widget.value.strip() or None
        if text is not None and self.fp8.value:
            return MemoryBudget(text, ring_transfer="fp8")
        return text

    def show_cap(self, cap: int) -> None:
        """Show the cap a session runs under: the text stays when it already means `cap` (a card's name)."""
        text = self.widget.value.strip()
        try:
            if text and MemoryBudget.of(text).cap_bytes == cap:
                return
        except ValueError:
            pass
        self.widget.value = cap_text(cap)

    def check(self) -> str | None:
        """Parse the value as `Session.open` will and mark the field; the message, or None when fine."""
        text = self.widget.value.strip()
        try:
            if text:
                MemoryBudget.of(text)
            elif self.fp8.value:
                raise ValueError("memory: FP8 ring transfers move the blocks a cap streams; type a cap, or untick FP8")
        except ValueError as error:
            self.refuse(str(error))
            return self.error
        self.refuse(None)
        return None

    def refuse(self, message: str | None) -> None:
        """Show `message` (a refusal of the cap, naming the smallest that fits) at the field; None clears it."""
        self.error = message
        self.message.value = "" if message is None else f'<div style="{_MESSAGE}">{html.escape(message)}</div>'
        self.message.layout.display = "none" if message is None else None
        self.widget.style.background = INVALID_BACKGROUND if message else None
        if message is None:
            self.remove_class("vflash-invalid")
        else:
            self.add_class("vflash-invalid")


def plan_html(plan: MemoryPlan | None) -> str:
    """The plan's text as a readable block ("" without a plan)."""
    return "" if plan is None else f'<div class="vflash-memory-plan" style="{_BLOCK}">{html.escape(str(plan))}</div>'


def residency_html(result: Any, label: str) -> str:
    """The memory receipt of a result made under a plan ("" otherwise): what the residency moved (ring blocks
    streamed, prefetched and late, bytes moved; the text encoder's streamed layers where it streams them; components
    brought on) and, per stage, the planned peak beside the allocated peak the result measured (none on a CPU)."""
    plan = result.metadata.get("memory_plan")
    receipt = result.receipts.get("memory_residency")
    if plan is None or receipt is None:
        return ""
    n = {key: receipt.get(key, 0) for key in ("blocks_streamed", "prefetched", "late", "bytes_moved")}
    text = {key: receipt.get("text_" + key, 0) for key in n}
    onloads, moved = receipt.get("component_onloads", 0), receipt.get("component_bytes_moved", 0)
    ran = "executed" if receipt.get("executed") else "nothing moved"
    lines = [
        f"<b>memory residency</b> of {html.escape(label)} under {html.escape(gib(plan['cap']))} ({ran}): "
        f"ring {n['blocks_streamed']} blocks streamed ({n['prefetched']} prefetched, {n['late']} late)"
        + (" as FP8 (approximate)" if receipt.get("contract") == "approximate" else "")
        + f", {html.escape(gib(n['bytes_moved']))} moved; "
        + (
            f"text encoder {text['blocks_streamed']} layers streamed ({text['prefetched']} prefetched, "
            f"{text['late']} late), {html.escape(gib(text['bytes_moved']))} moved; "
            if text["blocks_streamed"]
            else ""
        )
        + f"{onloads} component onloads, {html.escape(gib(moved))} moved"
    ]
    stages = [*plan["stage_peaks"], *(s for s in result.memory if s not in plan["stage_peaks"])]
    rows = "".join(
        f'<tr><td style="{_CELL}">{html.escape(stage)}</td>'
        f'<td style="{_CELL}">{_amount(plan["stage_peaks"].get(stage))}</td>'
        f'<td style="{_CELL}">{_amount(result.memory.get(stage))}</td></tr>'
        for stage in stages
    )
    head = "".join(
        f'<th style="{_CELL};color:{MUTED_COLOR}">{t}</th>' for t in ("stage", "planned peak", "allocated peak")
    )
    lines.append(f"<table><tr>{head}</tr>{rows}</table>")
    if not result.memory:
        lines.append(f'<span style="color:{MUTED_COLOR}">no allocated peaks: a CPU measures no device memory</span>')
    return f'<div class="vflash-memory-residency" style="font-size:12px">{"".join(lines)}</div>'


def _amount(value: int | None) -> str:
    return "–" if value is None else html.escape(gib(value))
