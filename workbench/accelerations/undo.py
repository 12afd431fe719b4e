"""All-or-nothing mutation of a loaded model: a snapshot taken before a plugin's activation (or uninstall) and put
back if it raises part-way.

What a snapshot holds (references only; nothing is copied but lists of references, so it costs no tensor memory):
- every `torch.nn.Module` of the pipeline's components: its attribute dict (instance-level `forward`, `processor`,
  `_compiled_call_impl`, flags) and, in place, the containers in it (`_parameters`, `_buffers`, `_modules`, the torch
  hook dicts), plus each parameter's and buffer's data binding (`param.data = ...`, as `Module.to` does);
- plain objects reachable from those modules through attributes and containers, `DEPTH` levels down (attention
  processors, diffusers' `HookRegistry`, its hooks and function references);
- the pipeline object, the pipeline's class and every module's class (a patched `__call__` or `forward`), and the
  shared state in `SHARED` (diffusers' attention-backend registry).

`Snapshot.restore()` puts every recorded attribute, container item and data binding back by identity, then checks
that every one is identical to the snapshot and returns what is not (empty: restored). Outside its reach: in-place
edits of tensor contents and state outside the objects above; a plugin that needs either must undo it itself.
"""

from __future__ import annotations

import functools
import types
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from diffusers.models.attention_dispatch import _AttentionBackendRegistry

DEPTH = 3  # levels of plain objects followed below a module
SHARED: tuple[Any, ...] = (_AttentionBackendRegistry,)  # process-wide state that plugins swap entries of
_NOT_PLAIN = (
    torch.nn.Module,
    torch.Tensor,
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    functools.partial,
)
_CONTAINERS = (dict, list, set)
_WIDE = 10_000  # a container with more items is recorded but its items are not followed


class UndoFailed(RuntimeError):
    """A mutation raised and the snapshot could not be put back: the model is in an unknown state."""


def _plain(value: Any) -> bool:
    if isinstance(value, _NOT_PLAIN):
        return False
    try:
        return isinstance(vars(value), dict)
    except TypeError:  # no instance dict (slots, builtins)
        return False


def _items(container: Any) -> list[Any]:
    return list(container.items()) if isinstance(container, dict) else list(container)


def _same(a: list[Any], b: list[Any]) -> bool:
    """Item lists equal by identity (dict items compare key by equality, value by identity)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y) == 2:
            if x[0] != y[0] or x[1] is not y[1]:
                return False
        elif x is not y:
            return False
    return True


class Snapshot:
    """The state of `model`'s objects (module docstring) at construction; `restore()` puts it back."""

    def __init__(self, model: Any):
        self.attributes: list[tuple[Any, dict[str, Any]]] = []  # (object, its attribute dict then)
        self.containers: list[tuple[Any, list[Any]]] = []  # (container, its items then)
        self.bindings: list[tuple[torch.Tensor, torch.Tensor]] = []  # (parameter or buffer, its data then)
        self._seen: set[int] = set()
        pipeline = model.pipeline
        modules = _modules(pipeline)
        for target in (*SHARED, type(pipeline), *{type(m): None for m in modules}):
            self._record(target, depth=DEPTH)  # a class: its own attributes and containers, nothing below
        self._record(pipeline, depth=DEPTH)
        for module in modules:
            self._record(module, depth=0)
            for tensor in (*module._parameters.values(), *module._buffers.values()):
                if tensor is not None:
                    self.bindings.append((tensor, tensor.data))

    def _record(self, obj: Any, depth: int) -> None:
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        attributes = dict(vars(obj))
        self.attributes.append((obj, attributes))
        for value in attributes.values():
            self._follow(value, depth)

    def _follow(self, value: Any, depth: int) -> None:
        if isinstance(value, _CONTAINERS):
            if id(value) in self._seen:
                return
            self._seen.add(id(value))
            items = _items(value)
            self.containers.append((value, items))
            if depth < DEPTH and len(items) <= _WIDE:
                for item in items:
                    for part in item if isinstance(value, dict) else (item,):
                        self._follow(part, depth)
        elif depth < DEPTH and _plain(value):
            self._record(value, depth + 1)

    def restore(self) -> list[str]:
        """Put every recorded container item, attribute and data binding back; returns what still differs."""
        for container, items in self.containers:
            if not _same(_items(container), items):
                _refill(container, items)
        for obj, attributes in self.attributes:
            current = vars(obj)
            for name in [n for n in current if n not in attributes]:
                _set(obj, name, None, delete=True)
            for name, value in attributes.items():
                if current.get(name, _MISSING) is not value:
                    _set(obj, name, value)
        for tensor, data in self.bindings:
            if not _bound(tensor, data):
                tensor.data = data
        return self.differences()

    def differences(self) -> list[str]:
        """What is not identical to the snapshot, one line each."""
        found = []
        for container, items in self.containers:
            if not _same(_items(container), items):
                found.append(f"a {type(container).__name__} of {len(items)} items changed")
        for obj, attributes in self.attributes:
            current = vars(obj)
            changed = sorted(n for n in {*current, *attributes} if current.get(n, _MISSING) is not attributes.get(n))
            if changed:
                found.append(f"{type(obj).__name__} attributes {changed}")
        found += [
            f"a {type(t).__name__} of shape {tuple(t.shape)} rebound" for t, d in self.bindings if not _bound(t, d)
        ]
        return found


_MISSING = object()


def _bound(tensor: torch.Tensor, data: torch.Tensor) -> bool:
    return (
        tensor.data_ptr() == data.data_ptr()
        and tensor.dtype == data.dtype
        and tensor.device == data.device
        and tensor.shape == data.shape
        and tensor.stride() == data.stride()
    )


def _refill(container: Any, items: list[Any]) -> None:
    """Put `items` back into `container` in place (others hold it: torch's hook handles, diffusers' registries)."""
    if isinstance(container, dict):  # the base class's methods: a FrozenDict refuses its own
        base = OrderedDict if isinstance(container, OrderedDict) else dict  # dict's would break an OrderedDict
        base.clear(container)
        for key, value in items:
            base.__setitem__(container, key, value)
    elif isinstance(container, list):
        container[:] = items
    else:
        container.clear()
        container.update(items)


def _set(obj: Any, name: str, value: Any, delete: bool = False) -> None:
    """Set or delete one attribute without the object's own `__setattr__` (a module's would re-register it)."""
    if isinstance(obj, type):
        (type.__delattr__(obj, name) if delete else type.__setattr__(obj, name, value))
    elif delete:
        del vars(obj)[name]
    else:
        vars(obj)[name] = value


def _modules(pipeline: Any) -> list[torch.nn.Module]:
    """Every module of the pipeline's components, each once."""
    found: dict[int, torch.nn.Module] = {}
    components = getattr(pipeline, "components", None)
    for component in (*vars(pipeline).values(), *(components.values() if isinstance(components, dict) else ())):
        if isinstance(component, torch.nn.Module):
            for module in component.modules():
                found.setdefault(id(module), module)
    return list(found.values())


@contextmanager
def all_or_nothing(model: Any, what: str) -> Iterator[None]:
    """Run the body; if it raises, put `model` back as it was before the body and re-raise. If it cannot be put
    back, raise `UndoFailed` naming `what` and what still differs."""
    snapshot = Snapshot(model)
    try:
        yield
    except BaseException as error:
        try:
            left = snapshot.restore()
        except Exception as undo_error:
            left = [f"restoring raised {undo_error!r}"]
        if left:
            raise UndoFailed(
                f"{what} raised {error!r} and could not be undone; the model is in an unknown state "
                f"({'; '.join(left[:5])}); open a new session"
            ) from error
        raise
