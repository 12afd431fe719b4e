"""The plugin contract: typed options with validation, capabilities, an activated handle, and receipts.

Life cycle (seed 004): `Spec.prepare(model, options)` validates and mutates nothing and returns a
`Prepared`; `Prepared.activate()` mutates and returns a `Handle`; `Handle.uninstall()` restores the
model exactly. Both are all or nothing (`workbench.accelerations.undo`): one that raises part-way leaves the
model as it was before the call. Receipts count what actually ran in a request: installed is not executed.

Options: each plugin module declares a frozen dataclass `<Name>Config` whose fields are made with `option(...)`
(default, allowed values, range, required, help; the type is the field's annotation), as diffusers'
`FirstBlockCacheConfig` or torchao's quantization configs. Its `Spec(config=...)` derives `Spec.options` (the
`Option`s the panel, the CLI and the profiles read) from it, and `Spec.validate` / `Spec.parse` take either a
dict of option values or an instance of that dataclass:

    session.accelerate({"easycache": EasyCacheConfig(threshold=0.05)})  # same as {"easycache": {"threshold": 0.05}}
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import types
import typing
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from workbench.accelerations.undo import all_or_nothing
from workbench.request import shown

CONTRACTS = ("bitwise", "rounding", "reduction", "approximate")


INT64 = (-(2**63), 2**63 - 1)  # what an int option holds without its own range: a record's JSON reader and torch


@dataclass(frozen=True)
class Option:
    """One plugin option: its type, default and allowed values or range.

    `check` takes numpy scalars as the Python values they hold (so records serialise), refuses bools where a number
    is meant, NaN always and +-inf unless `allow_inf` (a plugin that needs "no limit" declares it), and an int
    outside `minimum`/`maximum` or, without them, outside a signed 64-bit integer. A list option (`list[str]`,
    `list[float]`) checks each item against `items`, the same way (numpy scalars taken, bools and NaN/inf refused)."""

    name: str
    kind: type | tuple[type, ...]
    default: Any
    allowed: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    required: bool = False
    help: str = ""
    allow_inf: bool = False
    items: type | None = None

    def check(self, plugin: str, value: Any) -> Any:
        where = f"{plugin}.{self.name}"
        if value is None and self.required:
            raise ValueError(f"{where}: required; give it explicitly")
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        if isinstance(value, np.generic):  # numpy scalars: the Python value they hold
            value = value.item()
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:
                raise ValueError(f"{where}: {shown(value)} is not allowed; allowed: {self._allowed(float)}") from None
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = "/".join(k.__name__ for k in kinds)
            raise ValueError(f"{where}: expected {names}, got {type(value).__name__} {shown(value)}")
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value) and not self.allow_inf):
            raise ValueError(f"{where}: {value!r} is not allowed; allowed: {self._allowed(float)}")
        if isinstance(value, list) and self.items is not None:  # each item checked as an option of its own
            value = [Option(f"{self.name}[{i}]", self.items, None).check(plugin, v) for i, v in enumerate(value)]
        if self.allowed is not None and value not in self.allowed:
            raise ValueError(f"{where}: {shown(value)} is not allowed; allowed: {list(self.allowed)}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = int if isinstance(value, int) else float
            low, high = self._bounds(number)
            if value < low:
                raise ValueError(
                    f"{where}: {shown(value)} is below the minimum {low}; allowed: {self._allowed(number)}"
                )
            if value > high:
                raise ValueError(
                    f"{where}: {shown(value)} is above the maximum {high}; allowed: {self._allowed(number)}"
                )
        return value

    def _bounds(self, kind: type) -> tuple[float, float]:
        """The range a number of `kind` (int or float) must lie in: the declared one, else int64 / unbounded."""
        low, high = INT64 if kind is int else (-math.inf, math.inf)
        return (low if self.minimum is None else self.minimum, high if self.maximum is None else self.maximum)

    def _allowed(self, kind: type) -> str:
        low, high = self._bounds(kind)
        if kind is int:
            return f"integers in [{low}, {high}]"
        return f"{'numbers (inf allowed, NaN not)' if self.allow_inf else 'finite numbers'} in [{low}, {high}]"

    def describe(self) -> dict[str, Any]:
        return {
            "type": self.kind.__name__ if isinstance(self.kind, type) else [k.__name__ for k in self.kind],
            "default": self.default,
            "allowed": None if self.allowed is None else list(self.allowed),
            "minimum": self.minimum,
            "maximum": self.maximum,
            "required": self.required,
            "help": self.help,
        }


_OPTION = "workbench_option"  # the dataclass field metadata key that holds an option's declaration


def option(
    default: Any = None,
    *,
    allowed: tuple[Any, ...] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    required: bool = False,
    help: str = "",
    kind: type | tuple[type, ...] | None = None,
    cls: type[Option] = Option,
    allow_inf: bool = False,
) -> Any:
    """A field of a plugin's options dataclass, carrying its `Option` metadata. The option's type is the field's
    annotation (`float`, `int | str`, `list[str] | None`; a `required` field's `| None` only marks it unset)
    unless `kind` is given; `cls` is an `Option` subclass with its own check (sparse_routing's `RowsOption`).
    `allow_inf`: a float option also takes +-inf (NaN never). A list or dict default is copied for each instance.
    TypeError for a bound that is not a finite number or a minimum above the maximum (a plugin's mistake)."""
    for bound in (minimum, maximum):
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound)
        ):
            raise TypeError(f"option(): minimum/maximum must be finite numbers or None, got {bound!r}")
    if minimum is not None and maximum is not None and minimum > maximum:
        raise TypeError(f"option(): minimum {minimum} is above maximum {maximum}")
    declaration = {
        "allowed": allowed,
        "minimum": minimum,
        "maximum": maximum,
        "required": required,
        "help": help,
        "kind": kind,
        "cls": cls,
        "allow_inf": allow_inf,
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.copy(default), metadata={_OPTION: declaration})
    return field(default=default, metadata={_OPTION: declaration})


def _kind(hint: Any, required: bool) -> type | tuple[type, ...]:
    """The runtime type(s) an annotation allows: `list[str]` -> list, `int | str` -> (int, str)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = tuple(typing.get_origin(arg) or arg for arg in typing.get_args(hint))
        if required:
            kinds = tuple(k for k in kinds if k is not type(None))
        return kinds[0] if len(kinds) == 1 else kinds
    return typing.get_origin(hint) or hint


def _items(hint: Any) -> type | None:
    """The item type of a list annotation (`list[str] | None` -> str), else None."""
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is list and typing.get_args(arg):
            return typing.get_args(arg)[0]
    return None


def options_of(config: type) -> tuple[Option, ...]:
    """The `Option`s of an options dataclass, in field order; TypeError for a field not made with `option(...)` or
    a default its own check refuses (NaN, out of range), so a plugin's mistake shows when its module is imported."""
    hints = typing.get_type_hints(config)
    found = []
    for f in dataclasses.fields(config):
        declared = f.metadata.get(_OPTION)
        if declared is None:
            raise TypeError(f"{config.__name__}.{f.name}: declare plugin options with option(...)")
        declared = dict(declared)
        cls, kind = declared.pop("cls"), declared.pop("kind")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        declared_option = cls(
            f.name, kind or _kind(hints[f.name], declared["required"]), default, **declared, items=_items(hints[f.name])
        )
        if not (declared_option.required and default is None):
            try:
                declared_option.check(config.__name__, default)
            except ValueError as error:
                raise TypeError(f"{config.__name__}.{f.name}: the default fails its own check ({error})") from None
        found.append(declared_option)
    return tuple(found)


@dataclass
class Receipt:
    """What a plugin did in one request. `executed` is true only if a counter in `proof` is non-zero.

    Code that can run inside a compiled region (a transformer block under regional_compile or a user's
    torch.compile) counts with `count` / `count_fallback`, never `counters[key] += 1`: dynamo guards on
    the value of a Python int the traced code changes, so every call would recompile (with
    fullgraph=True: FailOnRecompileLimitHit). While compiling, a count is an in-place add on a 0-dim
    int64 tensor made at install time by `traceable`; dynamo lifts it as a graph input and guards its
    dtype, device and shape, not its value. Reading the receipt (`executed`, `to_dict`) folds those in.

    Split by expert (Wan2.2, `workbench.models.experts`): a count given `expert=` is added to the total and to that
    expert's share (`to_dict()["experts"][expert]`), so the shares of a counter sum to its total when every count
    of it names its expert. Decisions given `expert=` are kept under `"<expert>/<branch>"`.
    """

    proof: tuple[str, ...]
    counters: Counter = field(default_factory=Counter)
    fallbacks: Counter = field(default_factory=Counter)  # reason -> count
    notes: dict[str, Any] = field(default_factory=dict)
    traced_counters: dict[str, torch.Tensor] = field(default_factory=dict)  # key -> count made in compiled code
    traced_fallbacks: dict[str, torch.Tensor] = field(default_factory=dict)  # reason -> count made in compiled code
    expert_counters: Counter = field(default_factory=Counter)  # "expert/key" -> the expert's share of counters[key]

    @property
    def executed(self) -> bool:
        self.fold()
        return any(self.counters[key] > 0 for key in self.proof)

    def traceable(
        self,
        device: torch.device,
        counters: Iterable[str] = (),
        fallbacks: Iterable[str] = (),
        experts: Iterable[str] = (),
    ) -> None:
        """Make the tensors that counts in compiled code add to, on the device the model runs on (and, for each of
        `experts`, its share of every counter). At install time: a tensor made while tracing would belong to the
        graph, not to this receipt."""
        counters = tuple(counters)
        counters += tuple(f"{expert}/{key}" for expert in experts for key in counters)
        for tensors, keys in ((self.traced_counters, counters), (self.traced_fallbacks, fallbacks)):
            for key in keys:
                tensors[key] = torch.zeros((), dtype=torch.int64, device=device)
                torch._dynamo.mark_static_address(tensors[key])  # reduce-overhead: CUDA graphs may mutate it

    def count(self, key: str, n: int = 1, expert: str | None = None) -> None:
        """`counters[key] += n` (and the expert's share), also inside compiled code (see the class docstring)."""
        _add(self.counters, self.traced_counters, key, n)
        if expert is not None:
            _add(self.expert_counters, self.traced_counters, f"{expert}/{key}", n)

    def count_fallback(self, reason: str) -> None:
        """`fallbacks[reason] += 1`, also inside compiled code (see the class docstring)."""
        _add(self.fallbacks, self.traced_fallbacks, reason, 1)

    def fold(self) -> None:
        """Move the counts made in compiled code into `counters` / `fallbacks` (one host read per tensor)."""
        for python, tensors in ((self.counters, self.traced_counters), (self.fallbacks, self.traced_fallbacks)):
            for key, tensor in tensors.items():
                if value := int(tensor):
                    (self.expert_counters if "/" in key and python is self.counters else python)[key] += value
                    tensor.zero_()

    def record_decision(self, branch: str, decision: str, expert: str | None = None) -> None:
        """A feature cache's step: computed (C) or reused (R), counted and kept as a per-branch sequence (CCRRC);
        with `expert`, counted in its share too and kept under `"<expert>/<branch>"`."""
        self.count("reused" if decision == "R" else "computed", expert=expert)
        decisions = self.notes.setdefault("decisions", {})
        key = branch if expert is None else f"{expert}/{branch}"
        decisions[key] = decisions.get(key, "") + decision

    def by_expert(self) -> dict[str, dict[str, int]]:
        """Each expert's share of the counters, {expert: {key: count}} (empty on a single-expert model)."""
        self.fold()
        shares: dict[str, dict[str, int]] = {}
        for key, value in sorted(self.expert_counters.items()):
            expert, counter = key.split("/", 1)
            shares.setdefault(expert, {})[counter] = int(value)
        return shares

    def reset(self) -> None:
        self.expert_counters.clear()
        self.counters.clear()
        self.fallbacks.clear()
        self.notes.clear()
        for tensor in (*self.traced_counters.values(), *self.traced_fallbacks.values()):
            tensor.zero_()

    def to_dict(self) -> dict[str, Any]:
        executed = self.executed  # folds the counts made in compiled code in first
        return {
            "executed": executed,
            **{key: int(value) for key, value in sorted(self.counters.items())},
            "fallbacks": dict(self.fallbacks),
            **({"experts": shares} if (shares := self.by_expert()) else {}),
            **({"notes": dict(self.notes)} if self.notes else {}),
        }


def _add(python: Counter, tensors: dict[str, torch.Tensor], key: str, n: int) -> None:
    if not torch.compiler.is_compiling():
        python[key] += n
        return
    if key not in tensors:  # fullgraph=True reports this; otherwise dynamo runs the count eagerly
        raise RuntimeError(f"receipt count {key!r} ran in compiled code without a tensor from Receipt.traceable")
    tensors[key].add_(n)


class Handle:
    """An installed plugin. Subclasses undo their mutation in `_remove` and may keep request state."""

    def __init__(self, spec: Spec, options: dict[str, Any], proof: tuple[str, ...]):
        self.spec = spec
        self.options = options
        self.receipt = Receipt(proof)
        self.installed = True
        self.model: Any = None  # the LoadedModel it changed, set by `Prepared.activate`: uninstall is guarded on it

    def begin_request(self, request_id: int, steps: int) -> None:
        """Called before each request; per-request state starts empty."""
        self.receipt.reset()

    def end_request(self, request_id: int) -> None:
        """Called after each request, on success and on exception: release per-request state."""

    def uninstall(self) -> None:
        """Undo the plugin's mutation. All or nothing: if `_remove` raises, the model is put back as it was before
        the attempt (the plugin still installed, `installed` still true) and the error re-raised; if it cannot be
        put back, `undo.UndoFailed` says so."""
        if self.installed:
            if self.model is None:
                self._remove()
            else:
                with all_or_nothing(self.model, f"{self.spec.name}: uninstall"):
                    self._remove()
            self.installed = False

    def _remove(self) -> None:
        raise NotImplementedError

    def report(self) -> dict[str, Any]:
        return {"contract": self.spec.contract, "options": self.options, **self.receipt.to_dict()}


@dataclass(frozen=True)
class Prepared:
    """A validated plan: nothing has changed yet; `activate()` makes the change by calling `make`."""

    spec: Spec
    options: dict[str, Any]
    make: Callable[[], Handle]
    model: Any  # the LoadedModel `make` changes

    def activate(self) -> Handle:
        """Make the change, all or nothing: if the plugin's activation raises part-way, everything it had changed
        (module attributes and forwards, hooks, processors, registries; `undo.Snapshot` says what is covered) is
        put back before the error propagates, so the model is as it was; `undo.UndoFailed` if it cannot be."""
        with all_or_nothing(self.model, f"{self.spec.name}: activation"):
            handle = self.make()
        handle.model = self.model
        return handle


@dataclass(frozen=True)
class Knob:
    """The option a calibration searches (`workbench.evidence.calibrate`): from `low` (least aggressive, the
    closest to dense) to `high` (most aggressive searched; never beyond), on a linear or log scale. `low` may be
    above `high` where a smaller value is the more aggressive (fp8_attention's dense_steps). Moving towards `high`
    is assumed to trade quality for speed monotonically; the search records every point it tried, so a
    non-monotone stretch shows in the record. `integer`: only whole values (linear scale), so a search between
    neighbours ends."""

    option: str
    low: float
    high: float
    scale: str = "linear"
    integer: bool = False

    def __post_init__(self) -> None:
        if self.scale not in ("linear", "log"):
            raise ValueError(f"{self.option}: scale {self.scale!r}; allowed: 'linear', 'log'")
        if self.low == self.high or (self.scale == "log" and min(self.low, self.high) <= 0):
            raise ValueError(
                f"{self.option}: low {self.low!r} and high {self.high!r} must differ (and be > 0 on a log scale)"
            )
        if self.integer and (self.scale == "log" or int(self.low) != self.low or int(self.high) != self.high):
            raise ValueError(f"{self.option}: an integer knob is linear with whole low and high")

    def between(self, a: float, b: float) -> float | None:
        """The midpoint of `a` and `b` on this knob's scale; for an integer knob the whole value strictly between
        them nearest it, or None when they are neighbours (nothing left to try)."""
        if not self.integer:
            return (a * b) ** 0.5 if self.scale == "log" else (a + b) / 2
        if abs(a - b) <= 1:
            return None
        return int(math.floor((a + b) / 2)) if a < b else int(math.ceil((a + b) / 2))


@dataclass(frozen=True)
class Spec:
    """A registered acceleration.

    `group`: at most one plugin per group may be installed (two feature caches would fight over the
    same skipped work). `touches`: the model resources a plugin mutates; two plugins touching the same
    resource conflict. `touches_with`: optional, the resources it mutates only under some options (options ->
    resources), added to `touches` for the conflict check. `order`: installation order, so a set does not depend on
    dict order. `unusable`: optional, why this machine cannot run the plugin on a device (a package missing, another
    GPU), or None; profiles read it to leave such a plugin out, and `check_capabilities` refuses it (so a qualification,
    sweep or search names it before its first run).
    `model_problem`: optional, why a loaded model cannot take the plugin (a component it does not cover), or None;
    profiles given the model read it the same way.

    `config`: the plugin's options dataclass (module docstring); `options` are derived from it. `joint`: optional,
    what the options must satisfy together (ValueError naming the option), checked by `validate` with the options
    themselves, so before any model loads.

    Families are asked, never listed here: `requires(family)` says why a family lacks what the plugin needs (no
    streams, no text cross-attention, no fused forwards wired), or None; a family may also name the plugin in its
    `unsupported`. `families` is derived from the registered families (None: every family takes it).
    """

    name: str
    contract: str
    summary: str
    prepare_fn: Callable[[Any, dict[str, Any], torch.device], Callable[[], Handle]]
    config: type | None = None
    options: tuple[Option, ...] = ()
    devices: tuple[str, ...] = ("cpu", "cuda")
    requires: Callable[[Any], str | None] | None = None
    group: str | None = None
    touches: tuple[str, ...] = ()
    touches_with: Callable[[dict[str, Any]], tuple[str, ...]] | None = None
    order: int = 50
    unusable: Callable[[torch.device], str | None] | None = None
    model_problem: Callable[[Any], str | None] | None = None
    kind: str = ""  # the subpackage it lives in (attention, caching, ...); set by the registry
    knob: Knob | None = None  # approximate plugins: the option calibration searches
    capabilities: tuple[int, ...] | None = None  # CUDA compute capabilities it runs on (90 = sm_90); None: any
    joint: Callable[[dict[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        if self.contract not in CONTRACTS:
            raise ValueError(f"{self.name}: contract {self.contract!r}; allowed: {CONTRACTS}")
        if self.config is not None:
            object.__setattr__(self, "options", options_of(self.config))
        if self.knob is not None and self.knob.option not in {o.name for o in self.options}:
            raise ValueError(f"{self.name}: knob {self.knob.option!r} is not one of its options")

    def validate(self, options: Any) -> dict[str, Any]:
        """Options with defaults filled in, from a dict of option values or an instance of `config`; unknown
        names and bad values raise ValueError naming them."""
        if options is None:
            options = {}
        if self.config is not None and isinstance(options, self.config):
            options = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
        if not isinstance(options, dict):
            expected = "a dict" if self.config is None else f"a dict or {self.config.__name__}"
            raise ValueError(f"{self.name}: options must be {expected}, got {type(options).__name__}")
        known = {o.name: o for o in self.options}
        unknown = sorted(map(shown, (name for name in options if not isinstance(name, str) or name not in known)))
        if unknown:
            raise ValueError(f"{self.name}: unknown option(s) [{', '.join(unknown)}]; allowed: {sorted(known)}")
        checked = {name: o.check(self.name, options.get(name, o.default)) for name, o in known.items()}
        if self.joint is not None:
            self.joint(checked)
        return checked

    def check_capabilities(self, model: Any, device: torch.device) -> None:
        """A valid request this machine or model cannot run is a RuntimeError naming what is missing."""
        if device.type not in self.devices:
            raise RuntimeError(f"{self.name}: needs a device of type {self.devices}; this session runs on {device}")
        reason = self.refusal(model.family)
        if reason is not None:
            raise RuntimeError(f"{self.name}: supports families {self.families}, not {model.family.name!r} ({reason})")
        if self.unusable is not None and (reason := self.unusable(device)) is not None:
            raise RuntimeError(f"{self.name}: {reason}")

    def refusal(self, family: Any) -> str | None:
        """Why `family` (a `workbench.models.family.Family`) cannot take this plugin, or None."""
        reason = family.unsupported.get(self.name)
        if reason is None and self.requires is not None:
            reason = self.requires(family)
        return reason

    @property
    def families(self) -> tuple[str, ...] | None:
        """The registered families that take this plugin, in registration order; None when every one does."""
        from workbench.models import families

        registered = families()
        taking = tuple(name for name, family in registered.items() if self.refusal(family) is None)
        return None if len(taking) == len(registered) else taking

    def parse(self, options: Any) -> Any:
        """The validated options as an instance of `config` (a dict when the plugin declares none)."""
        values = self.validate(options)
        return values if self.config is None else self.config(**values)

    def prepare(self, model: Any, options: Any, device: torch.device) -> Prepared:
        """Validate `options` through the options dataclass, then prepare: nothing is mutated yet."""
        options = self.validate(options)
        return Prepared(self, options, self.prepare_fn(model, options, device), model)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "contract": self.contract,
            "summary": self.summary,
            "options": {o.name: o.describe() for o in self.options},
            "devices": list(self.devices),
            "families": None if self.families is None else list(self.families),
            "group": self.group,
        }


OWN_COPY = "workbench_own_copy"  # set on a forward that computes from weight copies of its own: the plugin's name


def own_copy(forward: Callable[..., Any], plugin: str) -> Callable[..., Any]:
    """`forward` (an instance-level forward `plugin` installs on a module) marked as computing from weight copies of
    its own, not from its module's parameters: a plugin that moves the parameters elsewhere (a block ring,
    offloading) would move weights it never reads, so such a plugin refuses it (`own_copy_forwards`)."""
    setattr(forward, OWN_COPY, plugin)
    return forward


def own_copy_forwards(modules: dict[str, torch.nn.Module]) -> dict[str, list[str]]:
    """The plugins whose `own_copy` forwards are installed in `modules` (name -> module), each with the layers that
    carry one ("name: path"). Forwards that call their module's own weights (a cache's wrapper, diffusers' hooks)
    are not marked and not listed."""
    found: dict[str, list[str]] = {}
    for name, module in modules.items():
        for path, layer in module.named_modules():
            plugin = getattr(layer.__dict__.get("forward"), OWN_COPY, None)
            if plugin is not None:
                found.setdefault(plugin, []).append(f"{name}: {path}")
    return found


def refuse_own_copy_forwards(plugin: str, modules: dict[str, torch.nn.Module]) -> None:
    """RuntimeError naming `plugin` (which moves the weights of `modules`), the plugins of `own_copy_forwards(modules)`
    and a few of their layers, if there are any."""
    if found := own_copy_forwards(modules):
        owners = " and ".join(sorted(found))
        layers = [layer for owner in sorted(found) for layer in found[owner]]
        shown = ", ".join(layers[:3]) + (f", ... ({len(layers)} layers)" if len(layers) > 3 else "")
        raise RuntimeError(
            f"{plugin}: {owners}'s forwards on layers it moves ({shown}) compute from weight copies of their own, "
            f"not from the weights {plugin} moves; install {plugin} without {owners}"
        )


def drop_restored_forwards(root: torch.nn.Module) -> None:
    """diffusers' hook registry restores a module's forward as an instance attribute bound to the
    class method; remove those so an uninstalled model is the original object graph again."""
    for module in root.modules():
        forward = module.__dict__.get("forward")
        if forward is not None and getattr(forward, "__func__", None) is type(module).forward:
            del module.forward


def fingerprint(module: torch.nn.Module) -> dict[str, Any]:
    """What uninstall must restore: a hash of the state dict, every module's type, and any hooks or
    instance-level forward overrides left behind."""
    digest = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{key}|{data.dtype}|{tuple(data.shape)}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    leftovers = []
    for name, sub in module.named_modules():
        registry = getattr(sub, "_diffusers_hook", None)
        if sub._forward_hooks or sub._forward_pre_hooks or "forward" in sub.__dict__:
            leftovers.append(f"{name or '<root>'}: torch hook or forward override")
        if registry is not None and registry.hooks:
            leftovers.append(f"{name or '<root>'}: diffusers hooks {list(registry.hooks)}")
        if getattr(sub, "_compiled_call_impl", None) is not None:
            leftovers.append(f"{name or '<root>'}: compiled")
    return {
        "state_dict_sha256": digest.hexdigest(),
        "module_types": tuple((name, type(sub).__qualname__) for name, sub in module.named_modules()),
        "leftovers": tuple(leftovers),
    }
