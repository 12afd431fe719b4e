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
from collections.abc import Iterable
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
