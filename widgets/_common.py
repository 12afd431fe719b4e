"""Pieces the widgets share: an in-widget error box, label checks, and crisp upscaling of small frames."""

from __future__ import annotations

import html
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import ipywidgets
import numpy as np

from workbench.progress import progress as text_progress

T = TypeVar("T")

_ERROR_STYLE = (
    "border:1px solid #d9534f;background:#fdf2f2;color:#a94442;padding:6px 10px;"
    "border-radius:4px;font-family:monospace;white-space:pre-wrap"
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


def check_labels(labels: tuple[str, str]) -> tuple[str, str]:
    if len(labels) != 2 or not all(isinstance(label, str) and label for label in labels):
        raise ValueError(f"labels: expected two non-empty strings, got {labels!r}")
    return labels[0], labels[1]


def upscale(image: np.ndarray, factor: int) -> np.ndarray:
    """Repeat each pixel of an (H, W, ...) image `factor` x `factor` times.

    Nearest-neighbour on purpose: a smoothed enlargement would hide exactly the pixel differences an
    A/B view is for.
    """
    return image if factor == 1 else image.repeat(factor, axis=0).repeat(factor, axis=1)


def progress(items: Iterable[T], total: int, desc: str) -> Iterable[T]:
    """`workbench.progress.progress`: a text bar (a widget bar reads "model not found" once the notebook is
    reopened) that honours TQDM_DISABLE (CI sets it) and shows only after 0.5 s."""
    return text_progress(items, total=total, desc=desc)
