"""Pieces the widgets share: an in-widget error box, a static copy in every display, label checks, and crisp
upscaling of small frames."""

from __future__ import annotations

import html
import io
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import ipywidgets
import numpy as np
import PIL.Image
from IPython.display import HTML, display, update_display

# Colours follow JupyterLab's theme (light or dark) through its CSS variables; the fallback after the comma is the
# light colour, which shows where no Jupyter CSS is loaded (a static HTML export, a notebook viewer).
MUTED_COLOR = "var(--jp-ui-font-color2, #757575)"  # secondary text: hints, summaries, counts, table heads
ALERT_COLOR = "var(--jp-error-color1, #a94442)"  # red words: not here, left out, failed, lost, a required field's star
ACCENT_COLOR = "var(--jp-content-link-color, #4e79a7)"  # a state in progress or a confirmed setting
GOOD_COLOR = "var(--jp-success-color0, #2e7d32)"  # a setting that met its budget
# ipywidgets' "info" button is Lab's `--jp-info-color1` under the theme's inverse text: 3.5 contrast in the light theme,
# under WCAG's 4.5. Its darker `--jp-info-color0` clears 4.5 in both themes under that same text. ("success" has no
# such shade in both themes, so the main action is "primary", which clears it as Lab draws it.)
INFO_BUTTON = {"button_color": "var(--jp-info-color0, #006064)"}
# The error box: Lab's own error-output background (light red in a light theme, dark red in a dark one) under the
# theme's text colour; no Jupyter CSS: today's red text on pale red.
_ERROR_STYLE = (
    "border:1px solid var(--jp-error-color1, #d9534f);background:var(--jp-rendermime-error-background, #fdf2f2);"
    "color:var(--jp-ui-font-color1, #a94442);padding:6px 10px;border-radius:4px;font-family:monospace;"
    "white-space:pre-wrap"
)


class ErrorBox(ipywidgets.HTML):
    """Shows a failure inside the widget that hit it.

    Callbacks of a widget run in the kernel's comm handler (or a request thread), where a traceback
    lands in the log console, not under the cell: the user would see a control that silently stopped.
    """

    def show(self, where: str, error: BaseException) -> None:
        self.value = f'<div style="{_ERROR_STYLE}"><b>{html.escape(where)} failed:</b> {html.escape(repr(error))}</div>'

    def clear(self) -> None:
        self.value = ""

    @contextmanager
    def catching(self, where: str) -> Iterator[None]:
        """Run a block; on an exception show it here and carry on (the widget stays usable)."""
        try:
            yield
        except Exception as error:
            self.show(where, error)


def figure_image(**layout: str) -> ipywidgets.Image:
    """A PNG image widget for a drawn figure, shown at the figure's own pixel size (smaller only in a narrower box).

    A VBox stretches each child to its width (flex `align-items: stretch`), which would enlarge a figure to the
    width of the window, blurring its text and growing its height with it; `align_self` keeps the image's own width.
    `layout`: further Layout settings (e.g. `display="none"`)."""
    return ipywidgets.Image(format="png", layout=ipywidgets.Layout(align_self="flex-start", **layout))


FIGURE_MARGIN_PX = 2  # an ipywidgets Image's margin (--jp-widgets-margin), above and below


def png_height(png: bytes) -> int:
    """The pixel height of a PNG image."""
    with PIL.Image.open(io.BytesIO(png)) as image:
        return image.height


STATIC_COPY_MAX_BYTES = 8 * 2**20  # a display's static copy above this is left out (the notebook file keeps it)


class StaticCopy:
    """A widget with a static copy of what it shows (`static()`: self-contained HTML, no JavaScript).

    Its display carries that copy as text/html beside the widget view. A front end with the widget manager
    (JupyterLab, Notebook 7, VS Code) draws the widget: the view outranks HTML there. One without it shows the copy
    where it would show the widget's repr: a notebook viewer, an nbconvert HTML export of a notebook saved without
    widget state (JupyterLab's default; papermill saves it, so the README's export of an executed notebook clears it).
    A copy over STATIC_COPY_MAX_BYTES, or one that fails to build, is replaced by a one-line note saying so; the
    widget itself still displays.

    In a kernel every display of one widget is a display_data output under the widget's own display id, and
    `refresh_static()` replaces the copy in all of them (an `update_display_data`, which JupyterLab and nbclient apply
    to earlier cells too, from any thread), so a saved notebook shows the widget as it last stood rather than as it was
    displayed. JupyterLab routes the update through the page's record of which execution showed the display id: after
    a reload, or in a second tab, it drops the update, and the saved copy stays as it was.
    A widget refreshes after the actions that change what it shows (a request, a new pair), never per control move:
    JupyterLab draws the view again for each update.
    Mix in before the ipywidgets class: `class ABPlayer(StaticCopy, ipywidgets.VBox)`.
    """

    _static_display_id: str | None = None  # set by the first display

    def static(self) -> HTML:
        raise NotImplementedError

    def _ipython_display_(self) -> None:
        """IPython's hook for `display(widget)` and a cell ending in the widget: one display_data output (view and
        copy) under this widget's display id."""
        bundle = self._repr_mimebundle_()
        if bundle is None:  # a closed widget displays nothing
            return
        self._static_display_id = self._static_display_id or uuid.uuid4().hex
        display(bundle, raw=True, display_id=self._static_display_id)

    def refresh_static(self) -> None:
        """Replace the static copy in every output that displayed this widget with the current one (nothing before
        the widget is displayed, or once it is closed)."""
        if self._static_display_id is None:
            return
        bundle = self._repr_mimebundle_()
        if bundle is not None:
            update_display(bundle, raw=True, display_id=self._static_display_id)

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        bundle = super()._repr_mimebundle_(**kwargs)  # type: ignore[misc]
        if bundle is None:
            return None
        name = type(self).__name__
        try:
            copy = self.static().data
        except Exception as error:  # never let the copy stop the widget from showing
            copy = f"<p><i>{name}: no static copy ({html.escape(repr(error))})</i></p>"
        size = len(copy.encode())
        if size > STATIC_COPY_MAX_BYTES:
            copy = (
                f"<p><i>{name}: its static copy ({size / 2**20:.1f} MiB) is over {STATIC_COPY_MAX_BYTES // 2**20} MiB "
                "and left out of this output; display(widget.static()) keeps it.</i></p>"
            )
        return {**bundle, "text/html": copy}


def check_labels(labels: tuple[str, str]) -> tuple[str, str]:
    """`labels` as a pair of non-empty strings (a tuple or list of two); anything else is a ValueError naming
    `labels`."""
    if not isinstance(labels, tuple | list) or len(labels) != 2 or not all(isinstance(x, str) and x for x in labels):
        raise ValueError(f"labels: expected two non-empty strings, got {labels!r}")
    return labels[0], labels[1]


def upscale(image: np.ndarray, factor: int) -> np.ndarray:
    """Repeat each pixel of an (H, W, ...) image `factor` x `factor` times.

    Nearest-neighbour on purpose: a smoothed enlargement would hide exactly the pixel differences an
    A/B view is for.
    """
    return image if factor == 1 else image.repeat(factor, axis=0).repeat(factor, axis=1)
