"""Progress bars that stay readable: plain text on stdout, in a terminal and in a notebook alike.

A notebook widget bar (tqdm.notebook, what `tqdm.auto` picks in a kernel) lives only as long as its
kernel: a saved notebook reopened later shows "Error displaying widget: model not found" where it was,
and an offline HTML export shows nothing. A text bar on stdout redraws in place while it runs (the
output area honours carriage returns) and is saved as its last line. stdout, not tqdm's default stderr:
a notebook's stderr is for warnings and errors.
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
    return tqdm(iterable, total=total, desc=desc, file=sys.stdout, disable=disabled, delay=0.5, ncols=90, leave=True)


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
