"""Installing a set of accelerations: all of it or none of it."""

from __future__ import annotations

from typing import Any

import torch

from workbench.accelerations.base import Handle, Prepared, Spec
from workbench.accelerations.undo import UndoFailed
from workbench.request import shown


def plan(registry: dict[str, Spec], model: Any, config: dict[str, Any], device: torch.device) -> list[Prepared]:
    """Validate, then prepare each plugin against the model as it is now; nothing is mutated."""
    return [spec.prepare(model, options, device) for spec, options in validate(registry, model, config, device)]


def validate(
    registry: dict[str, Spec], model: Any, config: dict[str, Any], device: torch.device
) -> list[tuple[Spec, dict[str, Any]]]:
    """Every option, then conflicts, then capabilities; returns (spec, options) in installation order.

    Options and conflicts are checked before capabilities so a bad option or a set that can never be installed
    together is a ValueError on any machine, and a good set this machine cannot run is a RuntimeError.
    """
    chosen = check_options(registry, config)
    for spec, _ in chosen:
        spec.check_capabilities(model, device)
    return chosen


def check_options(registry: dict[str, Spec], config: Any) -> list[tuple[Spec, dict[str, Any]]]:
    """What needs no model: the config's form, the plugins' names and options, and conflicts between them (ValueError
    naming the first problem); returns (spec, options with defaults) in installation order. A caller that loads a
    model later (the CLI) checks here first, so a bad option costs no load."""
    check_config(config)
    unknown = sorted(set(config) - set(registry))
    if unknown:
        raise ValueError(f"accelerations: unknown {unknown}; available: {sorted(registry)}")
    chosen = sorted((registry[name] for name in config), key=lambda spec: (spec.order, spec.name))
    options = {spec.name: spec.validate(config[spec.name]) for spec in chosen}
    _check_conflicts(chosen, options)
    return [(spec, options[spec.name]) for spec in chosen]


def check_config(config: Any) -> None:
    """An accelerations config is a dict keyed by plugin name (str); ValueError naming the first key that is not.
    Each plugin's options (a dict, its options dataclass or None) are checked by its `Spec.validate`."""
    if not isinstance(config, dict):
        raise ValueError(f"accelerations: expected a dict of name -> options, got {type(config).__name__}")
    for name in config:
        if not isinstance(name, str):
            raise ValueError(f"accelerations: key {shown(name)} ({type(name).__name__}); allowed: plugin names (str)")


def _check_conflicts(chosen: list[Spec], options: dict[str, dict[str, Any]]) -> None:
    groups: dict[str, str] = {}
    resources: dict[str, str] = {}
    for spec in chosen:
        if spec.group is not None:
            if spec.group in groups:
                raise ValueError(
                    f"accelerations: {groups[spec.group]!r} and {spec.name!r} are both {spec.group} plugins; "
                    "install at most one"
                )
            groups[spec.group] = spec.name
        extra = spec.touches_with(options[spec.name]) if spec.touches_with is not None else ()
        for resource in (*spec.touches, *extra):
            if resource in resources:
                raise ValueError(
                    f"accelerations: {resources[resource]!r} and {spec.name!r} both modify {resource}; "
                    "they cannot be installed together"
                )
            resources[resource] = spec.name


def activate(prepared: list[Prepared], handles: list[Handle]) -> None:
    """Activate in order, appending each handle to `handles` (the caller's record of what is installed).

    A plugin's own activation is all or nothing (`Prepared.activate`); if one fails, the ones activated here are
    uninstalled in reverse order and the error re-raised. `handles` holds exactly what is installed at every
    point, also when that rollback itself fails (see `uninstall`).
    """
    start = len(handles)
    try:
        for item in prepared:
            handles.append(item.activate())
    except BaseException as error:
        try:
            uninstall(handles, keep=start)
        except BaseException as rollback:
            raise rollback from error
        raise


def uninstall(handles: list[Handle], keep: int = 0) -> None:
    """Uninstall `handles[keep:]` in reverse order, removing each from `handles` once it is removed.

    Stops at the first that fails: its uninstall is all or nothing (`Handle.uninstall`), so it stays installed
    and fully so, with the ones before it; RuntimeError names it, what stays installed and what was removed
    (`UndoFailed` when the failed uninstall could not be undone either).
    """
    removed = []
    while len(handles) > keep:
        handle = handles[-1]
        try:
            handle.uninstall()
        except Exception as error:
            installed = [h.spec.name for h in handles]
            unknown = isinstance(error, UndoFailed)
            state = (
                "the model is in an unknown state; open a new session"
                if unknown
                else f"it is still installed as before the attempt; installed now: {installed}"
            )
            raise (UndoFailed if unknown else RuntimeError)(
                f"accelerations: could not uninstall {handle.spec.name!r} ({error!r}); {state}"
                + (f"; removed: {removed}" if removed else "")
            ) from error
        handles.pop()
        removed.append(handle.spec.name)
