"""Vflash Workbench: a resident diffusion session, toggled accelerations, measured evidence."""

from workbench._quiet_imports import defer_torchao

defer_torchao()  # before anything imports a diffusers model: see workbench/_quiet_imports.py

from workbench.adapters import Adapter  # noqa: E402
from workbench.request import Request  # noqa: E402
from workbench.result import Result  # noqa: E402
from workbench.session import RequestStopped, Session  # noqa: E402

__all__ = ["Adapter", "Request", "RequestStopped", "Result", "Session"]
