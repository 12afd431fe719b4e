"""Progress bars that stay readable: plain text, in a terminal and in a notebook alike.

A notebook widget bar (tqdm.notebook, what `tqdm.auto` picks in a kernel) lives only as long as its
kernel: a saved notebook reopened later shows "Error displaying widget: model not found" where it was,
and an offline HTML export shows nothing. Outside a kernel the bar is text on stdout (not tqdm's
default stderr, which is for warnings and errors) redrawn by carriage returns. Inside a kernel each
redraw would be a stream message of its own, and a headless run (papermill) keeps every one as an
output line; there the bar is one text/plain display output updated in place (`update_display_data`),
so a live notebook redraws it and a saved or executed notebook keeps one line, the last.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm.std import tqdm

T = TypeVar("T")


def progress(
    iterable: Iterable[T] | None = None, total: int | None = None, desc: str = "", enabled: bool = True
) -> tqdm:
    """A text bar over `iterable` (or `total` manual `update`s), shown once it has run 0.5 s.

    Off when `enabled` is False or the environment sets `TQDM_DISABLE` (CI does, so executed notebooks
    stay free of bars). Usable as an iterator and as a context manager, like any tqdm.
    """
    disabled = not enabled or bool(os.environ.get("TQDM_DISABLE"))
    file = _DisplayLine() if _in_kernel() else sys.stdout
    return tqdm(iterable, total=total, desc=desc, file=file, disable=disabled, delay=0.5, ncols=90, leave=True)


def _in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (not a terminal IPython or a plain interpreter). A kernel has
    IPython imported already, so a plain interpreter never pays for importing it here."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in shell.config


class _DisplayLine:
    """A file for tqdm in a kernel: the latest line written (the text after the last carriage return or
    newline) shown as one text/plain display output, created on the first flush and updated in place."""

    encoding = "utf-8"  # tqdm draws unicode blocks only on a file that says so

    def __init__(self) -> None:
        self.line = ""
        self._shown = ""
        self._handle = None

    def write(self, text: str) -> int:
        segments = [segment.rstrip() for segment in text.replace("\n", "\r").split("\r")]
        self.line = next((segment for segment in reversed(segments) if segment), self.line)
        return len(text)

    def flush(self) -> None:
        from IPython.display import display

        if self.line == self._shown:
            return
        bundle = {"text/plain": self.line}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
        self._shown = self.line


@contextmanager
def library_bars_off() -> Iterator[None]:
    """Silence diffusers' and transformers' own loading bars ("Loading pipeline components", "Loading
    weights") for the block, then restore their previous state.

    Loading from local files takes a second or two, and those bars come from `tqdm.auto`: in a kernel
    they are widgets that ignore TQDM_DISABLE and read "model not found" once the notebook is reopened.
    """
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    libraries = [lib for lib in (diffusers_logging, transformers_logging) if lib.is_progress_bar_enabled()]
    for lib in libraries:
        lib.disable_progress_bar()
    try:
        yield
    finally:
        for lib in libraries:
            lib.enable_progress_bar()
