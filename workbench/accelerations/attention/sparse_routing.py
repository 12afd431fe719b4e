"""Routing a family's self-attention to a sparse kernel through diffusers' attention dispatcher.

Shared by `block_sparse`, `sol_attn` and `attention_policy`; not a plugin itself (it registers no Spec).

How it works, and why this way: the family adapter (`Family.self_attention`) names the self-attention module of
every block and, per denoiser call, how many leading rows are text / conditioning / audio. Each named module's
processor is wrapped by `_Routed`, which decides per call (a dense step? a dense block? a setting for this
many video rows?). For a sparse call it marks the call in a context variable and runs the ORIGINAL processor,
which computes q, k, v (projections, q/k norms, rotary) exactly as stock diffusers does and calls
`dispatch_attention_fn`. The registry entry of the backend that processor resolves to is replaced by a shim
that runs the plugin's kernel for the marked call and the original backend function for every other call
(cross-attention, the H3 text refiner, unrouted modules). The plugin therefore supplies only the attention, for
every family, and q/k/v never drift from diffusers'. `uninstall` puts back the processors, the registry
entries and the step hooks exactly. A dense-backend plugin installed with it (attention_backend, flash4_attention)
installs first (`ROUTED_ORDER`): its function is the entry the shim wraps, so it serves every call not routed (on
the exact-fast profile, FA4 keeps the cross-attention while the routed plugin takes the self-attention).

Fail closed: a routed call that carries a mask or dropout, is causal, runs under context parallelism, is not
self-attention, or never reaches the shim (its backend changed after install) raises RuntimeError; the only
call let through dense is one whose processor itself skipped attention (LTX-2's fully perturbed STG pass),
which is counted under `fallbacks`.

Experts (Wan2.2, `workbench.models.experts`): a step hook on each denoiser tells the router which expert runs the
call. With `per_expert` (the default) `dense_steps` counts within each expert's run of steps, so the low-noise
expert's first steps after the switch run dense too; `per_expert=False` counts over the whole request. On Wan2.2
the counts are split by expert in the receipt (`experts`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

from workbench.accelerations.attention.backend_swap import unsupported_call
from workbench.accelerations.base import Handle, Option, Receipt, Spec, drop_restored_forwards, option
from workbench.models import experts
from workbench.request import shown

STEP_HOOK = "workbench_sparse_routing_step"
# What a routing plugin's Spec declares: the resource it mutates (the processors it wraps and the registry entry it
# shims) and the install order after the dense-backend plugins (attention_backend, flash4_attention: order 20), so
# that such a plugin's backend is the one the shim hands every call the router does not take.
ROUTED = "attention_processor.routed"
ROUTED_ORDER = 25
FAMILY = "family"  # sink_tokens / protect_prefix: take the rows from the family adapter, per call
# Counted inside the blocks' attention, so through Receipt.count (compile-safe).
COUNTERS = (
    "sparse_calls",
    "protected_rows",
    "dense_calls",
    "unqualified_calls",
    "dense_step_calls",
    "dense_block_calls",
)
PERTURBED = "processor skipped attention (perturbed pass)"


@dataclass(frozen=True)
class Settings:
    """One routed setting. `sink_tokens` / `protect_prefix` are a row count or "family" (the family's
    non-video prefix of each call). `tau` and `sink_tokens` are the sparse routing's (a kernel that routes nothing,
    fp8_attention's, leaves them at their defaults). `extra` holds kernel-specific options (sol_attn's
    `thresh_type`)."""

    tau: float = 0.0
    sink_tokens: int | str = FAMILY
    dense_steps: int = 0
    dense_blocks: int = 0
    protect_prefix: int | str = FAMILY
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: dict[str, Any], extra: tuple[str, ...] = ()) -> Settings:
        """The setting of a plugin's validated options: the fields above that it declares, and its `extra` ones."""
        names = ("tau", "sink_tokens", "dense_steps", "dense_blocks", "protect_prefix")
        return cls(**{n: options[n] for n in names if n in options}, extra={n: options[n] for n in extra})


def needs_self_attention(family: Any) -> str | None:
    """`Spec.requires` of the sparse plugins: why a family offers no self-attention to route, or None."""
    return None if family.self_attention is not None else "it names no self-attention that can be routed"


class RowsOption(Option):
    """An option that is a row count >= 0 or "family" (the family adapter's non-video prefix rows)."""

    def check(self, plugin: str, value: Any) -> Any:
        if isinstance(value, str) and value == FAMILY:
            return value
        try:
            return Option(self.name, int, self.default, minimum=0).check(plugin, value)
        except ValueError:
            raise ValueError(f"{plugin}.{self.name}: {shown(value)}; allowed: an int >= 0 or {FAMILY!r}") from None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "type": ["int", "str"], "allowed": [FAMILY, "int >= 0"]}


TAU_HELP = "exact where a block's score > mean + tau*std; higher: sparser"


@dataclass(frozen=True)
class SparseAttentionConfig:
    """The options every sparse-attention plugin takes: tau, sink_tokens, dense steps/blocks, prefix.
    Each plugin subclasses it with its own `tau` default (and its own options after these)."""

    tau: float = option(0.0, help=TAU_HELP)
    sink_tokens: int | str = option(
        FAMILY, cls=RowsOption, help="first rows whose key blocks stay exact; 'family': its text/audio"
    )
    dense_steps: int = option(0, minimum=0, help="first denoising steps run dense")
    dense_blocks: int = option(0, minimum=0, help="first transformer blocks run dense")
    protect_prefix: int | str = option(
        FAMILY, cls=RowsOption, help="first query rows take dense attention; 'family': non-video"
    )
    per_expert: bool = option(True, help=experts.PER_EXPERT_HELP)


@dataclass
class Call:
    """One routed attention call. `kwargs` are the dispatcher's (query/key/value (B, T, H, D)), set by the shim."""

    router: Router
    settings: Settings
    block: int
    prefix: int
    kwargs: dict[str, Any] | None = None
    backend_fn: Callable[..., torch.Tensor] | None = None

    @property
    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.kwargs["query"], self.kwargs["key"], self.kwargs["value"]

    def rows(self, value: int | str) -> int:
        """A sink / protect setting as a row count within this sequence."""
        rows = self.prefix if value == FAMILY else value
        return min(rows, self.kwargs["query"].shape[1])


# (the value is the call the shim should serve; None outside a routed call)
_CURRENT: contextvars.ContextVar[Call | None] = contextvars.ContextVar("workbench_sparse_call", default=None)


def _shim(backend_fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def shim(**kwargs: Any) -> torch.Tensor:
        call = _CURRENT.get()
        if call is None or call.kwargs is not None:  # not a routed call, or its one attention already ran
            return backend_fn(**kwargs)
        call.kwargs, call.backend_fn = kwargs, backend_fn
        return call.router.run(call)

    shim.workbench_sparse_original = backend_fn
    return shim


class _Routed:
    """Wraps one self-attention module's processor; attribute reads and writes go to the original."""

    def __init__(self, original: Any, router: Router, block: int):
        object.__setattr__(self, "original", original)
        object.__setattr__(self, "router", router)
        object.__setattr__(self, "block", block)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)

    def __setattr__(self, name: str, value: Any) -> None:  # set_attention_backend, context parallel, ...
        setattr(self.original, name, value)

    def __call__(self, attn: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self.routing(hidden_states.shape[1], kwargs):
            return self.original(attn, hidden_states, *args, **kwargs)

    @contextmanager
    def routing(self, rows: int, kwargs: dict[str, Any] | None = None) -> Iterator[None]:
        """The body computes this module's self-attention of `rows` rows through `dispatch_attention_fn` (the original
        processor, or a fused block forward doing what it does); the router decides the call and, when it takes it,
        the shim serves the body's one dispatcher call. `kwargs`: the processor call's (perturbation flags)."""
        router = self.router
        settings = router.decide(self.block, rows)
        if settings is None:
            yield
            return
        call = Call(router, settings, self.block, router.prefix)
        token = _CURRENT.set(call)
        try:
            yield
        finally:
            _CURRENT.reset(token)
        if call.kwargs is None:
            kwargs = kwargs or {}
            if kwargs.get("perturbation_mask") is not None or kwargs.get("all_perturbed"):
                router.receipt.count_fallback(PERTURBED)
            else:
                raise RuntimeError(
                    f"{router.name}: block {self.block}'s self-attention did not reach the sparse kernel (its "
                    "attention backend changed after install?); reinstall the plugin"
                )


def unrouted(processor: Any) -> Any:
    """The processor a router's wrapper runs (`processor` itself when it is not wrapped)."""
    return processor.original if isinstance(processor, _Routed) else processor


def routing(processor: Any, rows: int) -> AbstractContextManager[None]:
    """For a fused block forward that runs a self-attention processor's work itself (`unrouted(processor)`'s
    projections, norms, rotary and its one `dispatch_attention_fn` call): the router's decision around that work
    when `processor` is a router's wrapper, as `_Routed.__call__` makes it; nothing otherwise."""
    return processor.routing(rows) if isinstance(processor, _Routed) else nullcontext()


@dataclass
class _NoState(BaseState):
    def reset(self) -> None:
        pass


class _StepHook(ModelHook):
    """On each denoiser: the expert and step of each call (cache-context step index, else the call count; per expert
    when the router counts so) and the prefix."""

    _is_stateful = True

    def __init__(self, router: Router, expert: str):
        super().__init__()
        self.router, self.expert = router, expert
        self.state_manager = StateManager(_NoState)

    def reset_state(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        context = self.state_manager._context
        router = self.router
        index = context.step_index if context is not None else None
        if router.schedule is None:  # outside a request (a bare forward, as the forward scenarios time): call count
            router.step = router.calls if index is None else index
        else:
            router.step, _ = router.schedule.counted(self.expert, index, router.calls, None, router.per_expert)
            router.expert = router.schedule.label(self.expert)
        router.calls += 1
        router.prefix = router.prefix_rows(args, kwargs)
        return self.fn_ref.original_forward(*args, **kwargs)


# attend(call) -> (output (B, T, H, D), density as a 0-dim tensor or None when the kernel does not report it); the
# output is the attend's own tensor: the router writes the protected rows into it
Attend = Callable[[Call], tuple[torch.Tensor, torch.Tensor | None]]


class Router:
    """Routes one model's self-attention. `settings_for(video_rows)` gives the Settings for a call of that
    many target-video rows, or None to run it dense (counted as `unqualified_calls`). Built at prepare time
    (it only reads the model); `install` mutates, `remove` restores. `receipt` may be given later (the
    plugin's handle owns it) but must be set before `install`. `per_expert`: count `dense_steps` within each expert's
    run of steps (module docstring); `reset(steps)` at each request's start reads the expert schedule the step hooks
    count by (a forward outside a request counts the denoiser's calls)."""

    def __init__(
        self,
        name: str,
        model: Any,
        receipt: Receipt | None,
        attend: Attend,
        settings_for: Callable[[int], Settings | None],
        per_expert: bool = True,
    ):
        spec = model.family.self_attention
        if spec is None:
            raise RuntimeError(f"{name}: family {model.family.name!r} names no self-attention that can be routed")
        self.name, self.receipt, self.attend, self.settings_for = name, receipt, attend, settings_for
        self.prefix_rows = spec.prefix_rows
        self.model, self.per_expert = model, per_expert
        self.named = experts.named_denoisers(model)
        self.denoisers = [denoiser for _, denoiser in self.named]
        self.schedule: experts.Schedule | None = None
        self.expert: str | None = None  # the running expert's receipt label (None: a single-expert model)
        self.modules = [(d, i, m) for d in self.denoisers for i, m in enumerate(spec.modules(d))]
        self.step = self.calls = self.prefix = 0
        self.density_sum: torch.Tensor | float = 0.0
        self.density_calls = 0
        self._processors: list[tuple[torch.nn.Module, Any]] = []
        self._backends: dict[AttentionBackendName, Callable[..., torch.Tensor]] = {}

    def check_modules(self, max_head_dim: int, dtypes: tuple[torch.dtype, ...]) -> None:
        """RuntimeError unless every routed module's head dim is at most `max_head_dim` and its q projection one of
        `dtypes`."""
        for _, index, module in self.modules:
            weight = module.to_q.weight
            dim = weight.shape[0] // module.heads
            if dim > max_head_dim:
                raise RuntimeError(
                    f"{self.name}: the kernel supports head dims up to {max_head_dim}; block {index} has {dim}"
                )
            if weight.dtype not in dtypes:
                allowed = [str(d) for d in dtypes]
                raise RuntimeError(f"{self.name}: the kernel runs {allowed}; block {index} is {weight.dtype}")

    def install(self) -> None:
        if self.receipt is None:
            raise RuntimeError(f"{self.name}: the router has no receipt to count into")
        names = [name for name, _ in self.named] if len(self.named) > 1 else []
        self.receipt.traceable(self.denoisers[0].device, counters=COUNTERS, fallbacks=(PERTURBED,), experts=names)
        for _, _, module in self.modules:
            name = _backend_of(module.processor)
            current = _AttentionBackendRegistry._backends[name]
            if name not in self._backends and hasattr(current, "workbench_sparse_original"):
                raise RuntimeError(f"{self.name}: attention backend {name.value} is already routed by another plugin")
            self._backends.setdefault(name, current)
        try:
            for expert, denoiser in self.named:
                HookRegistry.check_if_exists_or_initialize(denoiser).register_hook(_StepHook(self, expert), STEP_HOOK)
            for _, index, module in self.modules:
                self._processors.append((module, module.processor))
                module.processor = _Routed(module.processor, self, index)
            for name, backend_fn in self._backends.items():
                _AttentionBackendRegistry._backends[name] = _shim(backend_fn)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for name, backend_fn in self._backends.items():
            _AttentionBackendRegistry._backends[name] = backend_fn
        for module, processor in reversed(self._processors):
            module.processor = processor
        for denoiser in self.denoisers:
            registry = HookRegistry.check_if_exists_or_initialize(denoiser)
            if registry.get_hook(STEP_HOOK) is not None:
                registry.remove_hook(STEP_HOOK, recurse=False)
            drop_restored_forwards(denoiser)
        self._processors, self._backends = [], {}

    def reset(self, steps: int) -> None:
        """Start a request of `steps` steps: counts back to 0, the expert schedule read for it."""
        self.schedule = experts.schedule(self.model, steps)
        self.expert = None
        self.step = self.calls = self.prefix = 0
        self.density_sum, self.density_calls = 0.0, 0

    def decide(self, block: int, rows: int) -> Settings | None:
        """The Settings for a sparse call, or None after counting why this one runs dense."""
        self.receipt.notes["prefix_rows"] = self.prefix
        seen = self.receipt.notes.setdefault("video_tokens", [])  # the sizes routed: what a registry entry names
        if rows - self.prefix not in seen:
            seen.append(rows - self.prefix)
        settings = self.settings_for(rows - self.prefix)
        reason = None
        if settings is None:
            reason = "unqualified_calls"
        elif self.step < settings.dense_steps:
            reason = "dense_step_calls"
        elif block < settings.dense_blocks:
            reason = "dense_block_calls"
        if reason is None:
            return settings
        self.receipt.count("dense_calls", expert=self.expert)
        self.receipt.count(reason, expert=self.expert)
        return None

    def run(self, call: Call) -> torch.Tensor:
        """The shim's sparse path: check the layout, run the kernel, give protected rows dense attention."""
        kwargs = call.kwargs
        q, k, v = call.qkv
        problems = unsupported_call(kwargs)
        if not q.shape == k.shape == v.shape:
            problems.append(f"q {tuple(q.shape)} / k {tuple(k.shape)} / v {tuple(v.shape)}")
        if problems:
            raise RuntimeError(f"{self.name}: routed self-attention has {', '.join(problems)}; the kernel runs none")
        out, density = self.attend(call)  # (B, T, H, D), the kernel's own fresh tensor
        rows = call.rows(call.settings.protect_prefix)
        if rows:  # written over the kernel's rows in place (no copy of the whole output)
            out[:, :rows] = call.backend_fn(**{**kwargs, "query": q[:, :rows]})
            self.receipt.count("protected_rows", rows, expert=self.expert)
        self.receipt.count("sparse_calls", expert=self.expert)
        if density is not None:
            self.density_sum = self.density_sum + density.detach()
            self.density_calls += 1
        return out

    def notes(self) -> dict[str, Any]:
        """Per-request notes read at report time (one host sync for the density, none per call)."""
        if not self.density_calls:
            return {}
        return {"mean_density": float(self.density_sum) / self.density_calls}


def _backend_of(processor: Any) -> AttentionBackendName:
    """The registry name `dispatch_attention_fn` resolves for this processor (its own, else the active one)."""
    backend = getattr(processor, "_attention_backend", None) or _AttentionBackendRegistry._active_backend
    return backend if isinstance(backend, AttentionBackendName) else AttentionBackendName(backend)


class RoutedHandle(Handle):
    """An installed Router; its notes (mean density) join the receipt when reported."""

    def __init__(self, spec: Spec, options: dict[str, Any], router: Router):
        super().__init__(spec, options, proof=("sparse_calls",))
        self.router = router
        router.receipt = self.receipt
        router.install()

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.router.reset(steps)

    def report(self) -> dict[str, Any]:
        self.receipt.notes.update(self.router.notes())
        return super().report()

    def _remove(self) -> None:
        self.router.remove()
