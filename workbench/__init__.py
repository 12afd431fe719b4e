"""Vflash Workbench: a resident diffusion session, toggled accelerations, measured evidence.

The public names below import on first use, so `import workbench` (and the CLI's `--help` and argument errors) does
not load torch's model libraries. Every package whose modules import diffusers or transformers (`models`,
`accelerations`, `training`, and `model_sizes`) first calls `_quiet_imports.defer_torchao()`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.adapters import Adapter
    from workbench.request import Request
    from workbench.result import Result
    from workbench.session import RequestStopped, Session

_HOMES = {
    "Adapter": "workbench.adapters",
    "Request": "workbench.request",
    "RequestStopped": "workbench.session",
    "Result": "workbench.result",
    "Session": "workbench.session",
}
__all__ = ["Adapter", "Request", "RequestStopped", "Result", "Session"]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name not in _HOMES:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
