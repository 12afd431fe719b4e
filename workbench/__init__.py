"""Vflash Workbench: a resident diffusion session, toggled accelerations, measured evidence."""

from workbench.request import Request
from workbench.result import Result
from workbench.session import Session

__all__ = ["Request", "Result", "Session"]
