"""Training the shipped models (`workbench train-tiny`): preset av2 makes demo-av, preset demo-av makes demo-av-mini."""

from workbench._quiet_imports import defer_torchao

defer_torchao()  # before any diffusers model import: see workbench/_quiet_imports.py
