"""A static HTML report of a qualification record: tables, PNG plots and both arms' pilot MP4s as data
URIs, so the report opens offline and survives being mailed or exported (no script, nothing fetched).

Also what the other reports and the notebooks share: `page` and `Table` (HTML with a plain-text fallback)."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.environment import device_label
from workbench.plots import figure_png, frame_metric_curves, png_figure_html, round_times
from workbench.quality import Budget
from workbench.result import VISIBLE_SIDE, Result, receipts_text, video_style

# The verdicts that never carry a speed claim though a speed-up was timed (`stats.verdict`): the candidate did no work
# (`not_executed`), or quality outside the budget without one (`rejected_quality`) or inside it without one
# (`no_speed_claim`).
NO_SPEED_CLAIM = ("not_executed", "no_speed_claim", "rejected_quality")
# The audio limits' rows of a case, shown when the record's budget sets the limit (the verdict rests on them).
AUDIO_ROWS = {
    "audio_snr_db": "audio SNR dB",
    "lsd_db": "log-spectral distance dB",
    "spectral_cosine": "spectral cosine",
    "rms_ratio_error": "RMS ratio error",
}

# The reports' look: their wrapper's style and that of each element they style. A page scopes them to its wrapper in
# a <style> (`STYLE`): shown inside a notebook, a page must not restyle the notebook. A notebook gets `fragment`, which
# writes them into each element's style attribute: JupyterLab drops the <style> of an untrusted output.
WRAPPER_STYLE = "font-family:sans-serif;max-width:1200px"
ELEMENT_STYLES = {
    "td": "border:1px solid #ccc;padding:2px 6px;text-align:left",
    "th": "border:1px solid #ccc;padding:2px 6px;text-align:left",
    "table": "border-collapse:collapse;margin:0.5em 0",
    "figure": "display:inline-block;margin:0 12px 8px 0;vertical-align:top",
    "figcaption": "font-size:0.9em",
    "img": "max-width:100%",
}
STYLE = f".vflash-report{{{WRAPPER_STYLE}}}" + "".join(
    f".vflash-report {tag}{{{style}}}" for tag, style in ELEMENT_STYLES.items()
)
_BODY = "<body><div class='vflash-report'>"  # a page's content starts after this
_END = "</div></body></html>"  # and ends before this
_STYLED_TAG = re.compile(rf"<({'|'.join(ELEMENT_STYLES)})\b((?:[^>\"']|\"[^\"]*\"|'[^']*')*)>")  # attributes, quoted
_STYLE_ATTRIBUTE = re.compile(r"""\sstyle=(["'])(.*?)\1""")


def page(title: str, body: list[str]) -> str:
    """A whole static HTML document: `title`, the scoped style, and `body` inside a `.vflash-report` div."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head>{_BODY}{''.join(body)}{_END}"
    )


def fragment(document: str) -> str:
    """What a notebook shows of a report: the `.vflash-report` div of `document` (a page made by `page`) with its look
    in style attributes, so an untrusted output (JupyterLab drops <style>, and shows a <title> as a stray line of
    text) looks as the page does. No doctype, <html>, <head>, <title> or <style>; the body's content is unchanged
    but for each element `ELEMENT_STYLES` names, whose style attribute is the rule's declarations followed by its own
    (which win, as they do over the page's <style>). Anything but a page made by `page` is a ValueError."""
    if not (document.startswith("<!doctype html>") and _BODY in document and document.endswith(_END)):
        raise ValueError(
            f"document: expected a report page as `page` makes it (<!doctype html> ... {_BODY} ... {_END}), got "
            f"one starting {document[:40]!r}"
        )
    content = _STYLED_TAG.sub(_inline_style, document[document.index(_BODY) + len(_BODY) : -len(_END)])
    return f'<div class="vflash-report" style="{WRAPPER_STYLE}">{content}</div>'


def _inline_style(tag: re.Match) -> str:
    """A start tag of an element `ELEMENT_STYLES` names, with the rule's declarations first in its style attribute."""
    name, attributes = tag.group(1), tag.group(2)
    own = _STYLE_ATTRIBUTE.search(attributes)
    if own is None:
        return f'<{name} style="{ELEMENT_STYLES[name]}"{attributes}>'
    style = f"{ELEMENT_STYLES[name]};{own.group(2)}"
    return f'<{name}{attributes[: own.start()]} style="{style}"{attributes[own.end() :]}>'


def render(record: dict[str, Any], pilots: list[tuple[Result, Result] | None] | None) -> str:
    """The report page; with `pilots=None` (a record read back without its outputs) the videos are
    replaced by a note saying so, and a case whose pilots are None (a resumed run's case finished by an earlier
    process, whose kept outputs were not found) by a note saying that. A case whose candidate did not execute
    (`not_executed`) shows no speed-up anywhere: its timings measured something other than the candidate."""
    candidate = json.dumps(record["candidate"])
    title = f"Qualification: {record['verdict']} · {candidate} vs {json.dumps(record['baseline'])} on {record['model']}"
    parts = [
        f"<h1>Qualification: {html.escape(record['verdict'])}</h1>",
        Table(
            {
                "model": record["model"],
                "baseline": json.dumps(record["baseline"]),
                "candidate": candidate,
                "rounds": f"{record['rounds']} (timed A, B, A, ..., A after one warm-up run per arm)",
                "device": device_label(record["device"]),
                "commit": f"{record['git'].get('commit')} (dirty={record['git'].get('dirty')})",
                "budget": budget_text(record["budget"]),
            }
        ).html(),
    ]
    pairs = pilots if pilots is not None else [None] * len(record["cases"])
    missing = (
        "this report was rendered from the record alone"
        if pilots is None
        else "this case was finished by an earlier process of a resumed run (--resume), and its pilot outputs were "
        "not found beside the partial record; its record is"
    )
    for index, (case, pair) in enumerate(zip(record["cases"], pairs, strict=True)):
        parts += _case(index, case, pair, record["budget"], missing)
    return page(title, parts)


def _case(
    index: int, case: dict[str, Any], pair: tuple[Result, Result] | None, budget: dict, missing: str
) -> list[str]:
    quality = case["quality"]
    rows = {
        "speed-up (median, CI95)": speedup_text(case),
        "warm-up seconds": ", ".join(f"{arm} {seconds:.4f}" for arm, seconds in case["warmup_seconds"].items()),
        "timed outputs match pilot": json.dumps(case["timed_outputs_match_pilot"]),
        "latent rel-L2": quality.get("latent_rel_l2"),
        "PSNR dB (clip / min frame)": f"{_cell(quality.get('psnr_db'))} / {_cell(quality.get('psnr_min_db'))}",
        "min-frame SSIM": quality.get("min_ssim"),
        **{label: quality.get(name) for name, label in AUDIO_ROWS.items() if budget.get(name) is not None},
        "budget failures": "; ".join(quality.get("failures", [])) or "none",
        "receipts": receipts_text(case["receipts"]),
    }
    parts = [
        f"<h2>Case {index}: {html.escape(case['request']['prompt'])} (seed {case['request']['seed']})</h2>",
        f"<p><b>{html.escape(case['verdict'])}</b>: {html.escape(case['reason'])}</p>",
        Table(rows).html(),
        "<h3>Timed rounds</h3>",
        _rounds_table(case),
        _png(round_times(case["baseline_seconds"], case["candidate_seconds"]), "per-round request time of both arms"),
    ]
    psnr, ssim = _floats(quality.get("psnr_per_frame")), _floats(quality.get("ssim_per_frame"))
    if psnr.size and psnr.shape == ssim.shape:
        parts.append("<h3>Per-frame quality of the candidate against the baseline</h3>")
        if np.isposinf(psnr).all():  # no curve to draw
            parts.append(f"<p>Every frame equals the baseline's ({psnr.size} of {psnr.size}): PSNR inf, SSIM 1.</p>")
        else:
            curves = frame_metric_curves(psnr, ssim, budget=budget)
            parts.append(_png(curves, "per-frame PSNR and SSIM with the budget's limits"))
    parts.append("<h3>Pilot outputs</h3>")
    if pair is None:
        parts.append(f"<p><i>Videos not embedded: {html.escape(missing)}.</i></p>")
    else:
        parts.append(video(pair[0], "baseline") + video(pair[1], "candidate"))
    return parts


def speedup_text(case: dict[str, Any]) -> str:
    """A case's speed-up as a reader should see it: none at all when the candidate did not execute, and marked as
    not a speed claim under a verdict that makes none (`NO_SPEED_CLAIM`)."""
    if case["verdict"] == "not_executed":
        return "none: the candidate did not execute, so its timings measure something else"
    speed = case["speedup"]
    text = f"{speed['median']:.4f} [{speed['low']:.4f}, {speed['high']:.4f}] (baseline / candidate time)"
    return text + ("; not a speed claim (see the verdict)" if case["verdict"] in NO_SPEED_CLAIM else "")


def budget_text(limits: dict[str, float | None]) -> str:
    """A record's budget (`Budget.to_dict()`) in words, as `Budget.describe` writes it: each set limit with its
    direction and unit ("latent_rel_l2 <= 0.03, psnr_db >= 33 dB"), "no limits" when none is set. A limit the
    record does not name was not set."""
    unset = dict.fromkeys(field.name for field in dataclasses.fields(Budget))
    return Budget.from_dict(unset | limits).describe()


def _rounds_table(case: dict[str, Any]) -> str:
    """Round r pairs candidate run B_r with the mean of the baseline runs either side, A_(r-1) and A_r."""
    a, b = case["baseline_seconds"], case["candidate_seconds"]
    show_ratio = case["verdict"] != "not_executed"
    columns = ["round", "baseline before (s)", "candidate (s)", "baseline after (s)"] + ["paired ratio"] * show_ratio
    rows = [
        (f"{r + 1}: A{r} B{r + 1} A{r + 1}", [f"{a[r]:.4f}", f"{seconds:.4f}", f"{a[r + 1]:.4f}"]
         + [f"{(a[r] + a[r + 1]) / 2 / seconds:.4f}"] * show_ratio)
        for r, seconds in enumerate(b)
    ]  # fmt: skip
    return Table(rows, columns).html()


def _floats(values: list[Any] | None) -> np.ndarray:
    """A per-frame metric list as written by `Comparison.to_dict` ("inf" strings, None for NaN)."""
    return np.array([np.nan if v is None else float(v) for v in values or []], dtype=np.float64)


def _png(figure: Any, alt: str) -> str:
    """The figure as a PNG data URI at `figure_png`'s dpi, with `alt` (escaped) as its alt text and caption. Shown at
    its natural size, an n-point font is n * dpi / 72 px tall on the page."""
    return png_figure_html(figure_png(figure), alt)


@dataclass(frozen=True)
class Table:
    """Rows of cells as a table: HTML in a notebook (`_repr_html_`) or a page (`html`), aligned plain text in a
    terminal or wherever HTML is not shown (`repr`).

    `rows` gives each row's heading and value, as a mapping or as (heading, value) pairs (kept as pairs, in order;
    headings may repeat). Without `columns` the value is the row's one cell and no header row is shown (a two-column
    table of heading and value); with `columns` (the header: the headings' column, then one name per cell) it is a
    sequence of `len(columns) - 1` cells, else ValueError naming the row. Floats show 4 significant digits, None an
    empty cell; HTML cells are escaped and align left by their own style (JupyterLab right-aligns the cells of
    rendered HTML with a rule more specific than a page's scoped one).
    """

    rows: Mapping[str, Any] | Sequence[tuple[str, Any]]
    columns: Sequence[str] = ()

    def __post_init__(self) -> None:
        pairs = tuple(self.rows.items() if isinstance(self.rows, Mapping) else self.rows)
        object.__setattr__(self, "rows", pairs)  # frozen: set once, here
        for heading, cells in pairs:
            if self.columns and len(cells) != len(self.columns) - 1:
                raise ValueError(f"row {heading!r}: {len(cells)} cells for {len(self.columns) - 1} columns")

    def html(self) -> str:
        """The table as one `<table>`: the header row (when `columns` is given) of `<th>`, then per row its heading
        as a `<th>` and its cells as `<td>`."""
        left = ' style="text-align:left"'
        head = "".join(f"<th{left}>{html.escape(name)}</th>" for name in self.columns)
        body = "".join(
            f"<tr><th{left}>{html.escape(heading)}</th>{''.join(f'<td{left}>{html.escape(c)}</td>' for c in cells)}</tr>"
            for heading, *cells in self._body()
        )
        return f"<table>{f'<tr>{head}</tr>' if head else ''}{body}</table>"

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        lines = [list(self.columns), *self._body()] if self.columns else self._body()
        widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))] if lines else []
        text = [
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines
        ]
        if self.columns:
            text.insert(1, "  ".join("-" * width for width in widths))  # a rule under the header
        return "\n".join(text)

    def _body(self) -> list[list[str]]:
        """Each row as text: its heading, then its cells."""
        return [[str(h), *map(_cell, cells if self.columns else [cells])] for h, cells in self.rows]


def _cell(value: Any) -> str:
    """A table cell's text: floats to 4 significant digits, None empty (nothing measured)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def video(result: Result, label: str) -> str:
    """The clip enlarged to >= VISIBLE_SIDE px (nearest-neighbour), captioned with its label and true size;
    `label` (any text, e.g. a candidate's JSON) is escaped in the tooltip and the caption."""
    data = base64.b64encode(result.mp4_bytes(min_side=VISIBLE_SIDE)).decode()
    frames, height, width = result.frames.shape[:3]
    caption = f"{label}: {width}x{height} px, {frames} frames @ {result.fps} fps"
    return (
        f'<figure><video controls loop title="{html.escape(label)}" style="{video_style(height, width)}" '
        f'src="data:video/mp4;base64,{data}"></video><figcaption>{html.escape(caption)}</figcaption></figure>'
    )
