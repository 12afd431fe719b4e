"""A resident session: one diffusers pipeline loaded once, many measured requests against it."""

from __future__ import annotations

import gc
import itertools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from workbench import adapters as lora
from workbench import environment
from workbench.accelerations import REGISTRY, install
from workbench.accelerations.attention.sparse_routing import unrouted
from workbench.accelerations.base import Handle
from workbench.accelerations.memory.residency import Residency, cap_holder
from workbench.accelerations.undo import UndoFailed
from workbench.memory_estimate import estimate_activation
from workbench.memory_plan import MemoryBudget, MemoryPlan, check_request, gib, outside_for, plan_for
from workbench.models import preview, resolve
from workbench.models.loaded import LoadedModel, own_aligned_storage
from workbench.probes import stage_modules, stage_probes
from workbench.progress import library_bars_off
from workbench.progress import progress as progress_bar
from workbench.request import MAX_SEED, Request, flag, integer, shown
from workbench.result import Result
from workbench.telemetry import Event, Telemetry, maybe_sampler, summarize_samples

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The sessions that hold their model: added when made, dropped by close() and when collected. A model one of them
# holds is refused by another `Session.open`: its accelerations, adapters and requests would act on both.
_HOLDERS: weakref.WeakSet[Session] = weakref.WeakSet()


class RequestStopped(KeyboardInterrupt):
    """`Session.generate` ended early by `Session.stop()`. The session stays usable: the request's per-request state
    was undone as for any interrupted request. A KeyboardInterrupt, so it is handled as Ctrl-C is: code that records
    a failing case (`except Exception`) lets it through, and an evidence run ends as an interrupted one does.
    `where` says where it stopped ("before video_decode", "in denoise", "in video_decode"); `steps_done` of `steps`
    denoise steps ran."""

    def __init__(self, request_id: int, where: str, steps_done: int, steps: int):
        self.request_id, self.where, self.steps_done, self.steps = request_id, where, steps_done, steps
        super().__init__(
            f"request {request_id} stopped by Session.stop() {where}, {steps_done} of {steps} denoise steps done; "
            "the session is usable"
        )

    def __reduce__(self) -> tuple[type, tuple[int, str, int, int]]:  # pickles (Ray) with its fields
        return RequestStopped, (self.request_id, self.where, self.steps_done, self.steps)


class Session:
    """Holds one model resident on one device and runs one request at a time.

    Subscribers (`subscribe`) receive telemetry `Event`s on the thread that runs the request.
    """

    def __init__(self, model: LoadedModel, device: torch.device, dtype: torch.dtype, init_seconds: float):
        self.model = model
        self.device = device
        self.dtype = dtype
        self.init_seconds = init_seconds
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[Event], None]] = []
        self._request_ids = itertools.count(1)
        self.active_request: int | None = None
        self._stop_request: int | None = None  # the request `stop()` asked to end (ids are never reused)
        self._handles: list[Handle] = []  # installed, in installation order
        self._unknown_state: str | None = None  # why a failed change could not be undone
        self.residency: Residency | None = None  # the memory budget's arrangement (`open(..., memory=...)`)
        self._adapters: lora.Fused | None = None  # LoRA adapters fused into the weights (`load_adapters`)
        self.closed = False  # `close()`: the model let go of, every call refused
        _HOLDERS.add(self)

    @classmethod
    def open(
        cls,
        model: str | Path | LoadedModel,
        device: str = "auto",
        dtype: str | torch.dtype | None = None,
        seed: int = 0,
        accelerations: dict[str, Any] | None = None,
        memory: str | int | MemoryBudget | None = None,
        adapters: list[lora.Adapter] | None = None,
    ) -> Session:
        """Load `model` (a name such as `tiny-ltx2`, a local diffusers directory, or a LoadedModel) once.

        `device` is `auto`, `cpu`, `cuda` or `cuda:N`; `dtype` defaults to bfloat16 on CUDA, float32 on CPU.
        A LoadedModel is moved to `device` and runs in its own dtype (`dtype` None, or the same: a ValueError names
        the model's otherwise); one another open session holds (its accelerations and adapters would act on both),
        or that carries hooks, instance-level methods or changed attention processors (what a session dropped
        without `close()` leaves installed) is refused. A model `close()` let go of opens again.
        `accelerations` is installed after loading (see `accelerate`), after `adapters` are fused (`load_adapters`);
        their form, the plugins' names and options, and the adapter specs are checked before the model is loaded.
        `memory`: a device memory cap ("48GiB", "24GB", bytes, or a `MemoryBudget`). The model is planned from its
        shapes first (a checkpoint's modules built from their configs on the meta device: `family.shapes_only`), so
        a cap no plan meets is a ValueError naming the smallest that fits before any weight is read; then it is built
        in host memory, planned (`workbench.memory_plan`; `session.memory_plan` says the plan) and only then
        arranged on the device.
        """
        if isinstance(model, str) and not model.strip() or not isinstance(model, str | os.PathLike | LoadedModel):
            raise ValueError(
                f"model: {shown(model)} ({type(model).__name__}); allowed: a model name such as 'tiny-wan', "
                "a local diffusers directory (str or pathlib.Path), or a LoadedModel"
            )
        seed = integer("seed", seed, 0, MAX_SEED)
        if accelerations is not None:
            install.check_options(REGISTRY, accelerations)  # what needs no model; capabilities are checked after
            if memory is not None:
                _check_no_placing(accelerations)
        specs = [] if adapters is None else lora.parse(adapters)
        budget = None if memory is None else MemoryBudget.of(memory)
        start = time.perf_counter()
        torch_device = environment.device(device)
        torch_dtype = _dtype(dtype, torch_device)
        if isinstance(model, LoadedModel):
            _check_reusable(model)
            torch_dtype = _own_dtype(model, None if dtype is None else torch_dtype, torch_device)
        if torch_device.type == "cuda":
            _warn_if_capped(torch_device, replacing=budget is not None)
        if isinstance(model, LoadedModel):
            loaded = model
        else:
            if budget is not None:
                _plan_from_shapes(model, seed, torch_dtype, budget, torch_device)  # no plan meets the cap: refused
            build_on = torch_device if budget is None else torch.device("cpu")  # a budget plans before moving
            with library_bars_off():
                loaded = resolve(model, seed=seed, dtype=torch_dtype, device=build_on)
        residency = None
        if torch_device.type == "cpu":  # computed where they are: a checkpoint's weights off the file's mapping
            own_aligned_storage(loaded.pipeline)
        if budget is None:
            # a diffusers pipeline warns that float16 "cannot run" on a CPU; torch's CPU runs it, and so does the workbench
            quiet = {} if isinstance(loaded.pipeline, torch.nn.Module) else {"silence_dtype_warnings": True}
            loaded.pipeline.to(device=torch_device, **quiet)
        else:
            planned = (budget.request or Request("memory plan")).resolved(loaded.family, loaded.defaults)
            plan = plan_for(loaded, budget, planned, outside_for(torch_device))
            residency = Residency.arrange(loaded, plan, torch_device, budget)
        if torch_device.type == "cuda":
            torch.cuda.synchronize(torch_device)
        session = cls(loaded, torch_device, torch_dtype, time.perf_counter() - start)
        session.residency = residency
        if specs:
            session.load_adapters(specs)
        if accelerations:
            session.accelerate(accelerations)
        return session

    @property
    def family(self) -> Any:
        self._check_usable()
        return self.model.family

    @property
    def memory_plan(self) -> MemoryPlan | None:
        """The plan of `open(..., memory=...)` (print it to read it), or None without a budget."""
        return None if self.residency is None else self.residency.plan

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call `callback(event)` for every telemetry event of later requests; returns an unsubscribe."""
        if not callable(callback):
            raise ValueError(f"callback: {shown(callback)} is not callable; allowed: a function taking one Event")
        self._check_usable()
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def stop(self) -> int | None:
        """Ask the running request to stop at its next checkpoint: the start of a stage (text_encode, denoise,
        video_decode, ...), of a denoiser forward (one classifier-free-guidance pass of a step) or of any module call
        inside a stage's component (a decoder block, a vocoder layer: a decode ends within one block). Its `generate`
        then raises `RequestStopped`, and subscribers receive a request_failed event with `stopped=True`. Returns the
        request's id, or None when none runs (nothing is kept for a later request). Safe from any thread: the
        dashboard's stop button calls it while the request runs on another."""
        request_id = self.active_request
        if request_id is not None:
            self._stop_request = request_id
        return request_id

    @property
    def accelerations(self) -> dict[str, dict[str, Any]]:
        """What is installed now, {name: options with defaults filled in}. Read from the installed handles, so it
        stays true after a failed install, a failed uninstall and an interrupted request."""
        return {handle.spec.name: handle.options for handle in self._handles}

    def accelerate(self, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Replace the installed accelerations with `config` ({name: options}); `{}` removes them all.

        All or nothing: every option, capability and conflict is checked before anything changes; a plugin
        whose own activation fails part-way is undone first, then the ones already activated are removed and
        the previous set is put back, so the model is as it was. A plugin whose uninstall fails stays installed
        (its uninstall is undone) and the error names it; the ones removed before it are put back. If a change
        cannot be undone, the session refuses further work (`RuntimeError` naming why). Refused while a request
        runs. Returns what is installed.
        """
        install.check_config(config)  # before the lock: a bad config is a ValueError even mid-request
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(f"accelerate: refused while request {self.active_request} runs")
        try:
            self._check_usable()
            if self.residency is not None:
                _check_no_placing(config)
            install.validate(REGISTRY, self.model, config, self.device)  # bad config: nothing touched
            previous = self.accelerations
            try:
                try:
                    install.uninstall(self._handles)
                    install.activate(install.plan(REGISTRY, self.model, config, self.device), self._handles)
                except BaseException:
                    if set(self.accelerations) <= set(previous):  # the new set is gone: put the old one back whole
                        missing = {name: o for name, o in previous.items() if name not in self.accelerations}
                        install.activate(install.plan(REGISTRY, self.model, missing, self.device), self._handles)
                    raise
            except UndoFailed as error:
                self._unknown_state = str(error)
                raise
            return self.accelerations
        finally:
            self._lock.release()

    def load_adapters(self, adapters: list[lora.Adapter]) -> list[dict[str, Any]]:
        """Fuse LoRA `adapters` into the weights in place of any fused before (`[]`: back to the model's own weights,
        bit for bit); see `workbench.adapters`. The installed accelerations come off first and go back on over the
        new weights (a quantization quantizes the fused weights). Their metadata's steps / guidance become the
        defaults of requests that leave them out. Refused while a request runs. Returns what is fused.

        All or nothing: when the new adapters fail to fuse (a file that is not a LoRA, a target the model lacks), the
        ones fused before are fused again, so the weights and request defaults are as they were; if even that fails,
        the session refuses further work (`RuntimeError` naming why)."""
        specs = lora.parse(adapters)  # bad specs: nothing touched
        installed = self.accelerations
        self.accelerate({})  # refused while a request runs
        try:
            if not self._lock.acquire(blocking=False):
                raise RuntimeError(f"load_adapters: refused while request {self.active_request} runs")
            try:
                self._replace_adapters(specs)
            finally:
                self._lock.release()
        finally:
            self.accelerate(installed)
        return list(self._adapters.records) if self._adapters else []

    def _replace_adapters(self, specs: list[lora.Adapter]) -> None:
        """Fuse `specs` in place of the fused adapters; on failure the previous ones are fused back before the error
        propagates (`lora.fuse` leaves the model's own weights when it fails)."""
        previous = self._adapters
        if previous is not None:
            previous.restore()
            self._adapters = None
        try:
            if specs:
                self._adapters = lora.fuse(self.model, specs)
        except BaseException:
            if previous is not None:
                try:
                    self._adapters = lora.fuse(self.model, previous.adapters)
                except Exception as undo:
                    self._unknown_state = f"load_adapters: the previous adapters could not be fused back ({undo})"
            raise

    def close(self) -> None:
        """Let go of the model and the device: the accelerations removed, fused adapters taken back out of the weights
        (the model's own weights, bit for bit), a memory budget's cap lifted, the session's
        references dropped and the device cache emptied, so the device memory is free once nothing else holds the
        model (a model arranged under a budget stays as arranged: open it again by name rather than reusing it).
        Every later call is refused; closing again does nothing. Refused while a request runs."""
        if self.closed:
            return
        if self._handles and self._unknown_state is None:
            self.accelerate({})
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(f"close: refused while request {self.active_request} runs")
        try:
            if self._adapters is not None and self._unknown_state is None:
                self._adapters.restore()
            if self.residency is not None and self.residency.lift_cap is not None:
                self.residency.lift_cap()
            self.model, self.residency, self._handles, self._adapters = None, None, [], None
            self.closed = True
            _HOLDERS.discard(self)
        finally:
            self._lock.release()
        gc.collect()  # the model's hooks and rings hold it in reference cycles
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _check_usable(self) -> None:
        if self.closed:
            raise RuntimeError("session: closed; open a new one")
        if self._unknown_state is not None:
            raise RuntimeError(f"session: the model is in an unknown state ({self._unknown_state})")

    @property
    def _holds_model(self) -> bool:
        """Whether this session holds its model: open, and not dismantled from its memory arrangement (whose
        `Residency.dismantle` gives the model back resident, for a new session to open)."""
        return not self.closed and not (self.residency is not None and self.residency.dismantled)

    def resolve(self, request: Request) -> Request:
        """`request` with this model's defaults filled in and checked against its family (ValueError if not)."""
        self._check_usable()
        return self.model.resolve(request, self._adapters.defaults if self._adapters else None)

    def generate(
        self, request: Request, progress: bool = True, allow_non_finite: bool = False, trace: bool = False
    ) -> Result:
        """Run one request end to end and return frames, audio, latents, timings, memory and metadata.

        A request whose estimated activation peak (`memory_estimate.estimate_activation`, the largest stage's)
        alone is more than the device has free is a ValueError naming its size, the stage and both amounts before
        anything runs (on the CPU it would end the process out of memory); a session with a memory plan checks the
        request against the plan instead.

        Non-finite numbers fail the request: the final latents and the audio latents the audio VAE decodes (stage
        `denoise`), the decoded frames (`video_decode`) and the decoded audio (`audio_decode`) are each checked once,
        and the first stage with a NaN or inf raises `RuntimeError` naming it, how many values and the request.
        With `allow_non_finite=True` the Result is returned with `finite=False` and `metadata["non_finite"]` saying
        which stages; evidence refuses such a result.

        `stop()` (from another thread) ends the request early with `RequestStopped`; an exception or an interrupt
        mid-request leaves the model, the accelerations and their state as they were.

        `trace=True` runs the request under torch.profiler (`workbench.trace`): `Result.trace` is its Chrome trace
        (gzip JSON, stages and denoise steps as named ranges; `save` writes it as `<name>.trace.json.gz`) and
        `metadata["trace"]` the operators (CUDA: kernels) with the most self time. The profiler slows every
        operator, so the result says `metadata["traced"]`; its outputs are the untraced request's.
        """
        progress, trace = flag("progress", progress), flag("trace", trace)
        allow_non_finite = flag("allow_non_finite", allow_non_finite)
        if not isinstance(request, Request):
            raise ValueError(f"request: expected a workbench.Request, got {type(request).__name__}")
        self._check_usable()
        request = self.resolve(request)
        if self.residency is not None:
            check_request(self.model, self.residency.plan, self.residency.budget, request)
        if not self._lock.acquire(blocking=False):
            running = self.active_request
            busy = (
                "busy (changing accelerations or another request)"
                if running is None
                else f"busy with request {running}"
            )
            raise RuntimeError(f"session is {busy}; one request at a time")
        try:
            if self.residency is None:
                _check_free_memory(self.model, self.device, request)
            request_id = next(self._request_ids)
            self.active_request = request_id
            return self._run(request, request_id, progress, allow_non_finite, trace)
        finally:
            self.active_request = None
            self._lock.release()
            if self.device.type == "cuda":  # cycles holding device tensors go before the cache is emptied
                gc.collect()
                torch.cuda.empty_cache()

    def _run(self, request: Request, request_id: int, progress: bool, allow_non_finite: bool, trace: bool) -> Result:
        """`_execute` under the request's telemetry; a request that raises ends with a request_failed event."""
        pipe = self.model.pipeline
        # diffusers' own bar is a tqdm.auto widget in a kernel, "model not found" once the notebook is reopened
        pipe.progress_bar = lambda iterable=None, total=None: progress_bar(iterable, total, "denoise steps", progress)
        telemetry = Telemetry(self.device, self._subscribers)
        try:
            return self._execute(request, request_id, allow_non_finite, telemetry, trace)
        except BaseException as error:
            telemetry.fail(error, stopped=isinstance(error, RequestStopped))
            raise

    def _execute(
        self, request: Request, request_id: int, allow_non_finite: bool, telemetry: Telemetry, trace: bool
    ) -> Result:
        """The request itself: per-request state begun and ended, the probes and the stop checkpoints installed
        around the family's runner, the outputs checked, the Result assembled."""
        pipe = self.model.pipeline
        kwargs = {**self.family.call_kwargs(request), **self.model.call_overrides}
        residency = self.residency
        checkpoint = self._checkpoint(request_id, request.steps, telemetry)
        current = "text_encode"  # the stage begun last: a stop inside a component's module call names it

        def on_stage(stage: str) -> None:
            nonlocal current
            current = stage
            checkpoint(f"before {stage}")
            if residency is not None:
                residency.enter_stage(stage)

        with ExitStack() as stack:
            if residency is not None:
                residency.begin_request()
                stack.callback(residency.end_request)
            for handle in self._handles:
                handle.begin_request(request_id, request.steps)
                stack.callback(handle.end_request, request_id)
            sampler = None
            if self.device.type == "cuda":
                sampler = stack.enter_context(maybe_sampler(self.device, telemetry))
            on_step_end = stack.enter_context(stage_probes(self.model, telemetry, on_stage))
            for module in self.model.denoisers():
                hook = module.register_forward_pre_hook(lambda *_: checkpoint("in denoise"))
                stack.callback(hook.remove)
            for module in stage_modules(self.model):  # a decode stops within one block, not when it ends
                hook = module.register_forward_pre_hook(lambda *_: checkpoint(f"in {current}"))
                stack.callback(hook.remove)
            tracer = None
            if trace:
                from workbench.trace import RequestTrace

                tracer = stack.enter_context(RequestTrace(self.device, request.steps))
                telemetry.subscribers.append(tracer.on_event)
            clock = on_step_end.__self__
            generator = torch.Generator("cpu").manual_seed(request.seed)
            with torch.inference_mode():
                frames, audio = self.family.runner(pipe, kwargs, generator, on_step_end)
            total = telemetry.finish()
            samples = sampler.samples if sampler is not None else []
        outputs = (
            ("denoise", "latents", clock.latents),
            ("denoise", "audio latents", clock.audio_latents),
            ("video_decode", "frames", frames),
            ("audio_decode", "audio", audio),
        )
        non_finite = _non_finite(outputs)
        if non_finite and not allow_non_finite:
            installed = f"; accelerations: {sorted(self.accelerations)}" if self._handles else ""
            raise RuntimeError(
                f"{non_finite[0]}; the request: {_describe(request)}{installed} "
                "(generate(..., allow_non_finite=True) returns it marked finite=False)"
            )
        receipts = {handle.spec.name: handle.report() for handle in self._handles}
        if residency is not None:
            receipts["memory_residency"] = residency.report()
        timings = dict(telemetry.timings)
        timings["other"] = max(0.0, total - sum(timings.values()))
        timings["total"] = total
        metadata = {
            "request_id": request_id,
            "model": self.model.name,
            "family": self.family.name,
            "dtype": str(self.dtype).removeprefix("torch."),
            "init_seconds": self.init_seconds,
            "request": request.to_dict(),
            "call_overrides": dict(self.model.call_overrides),  # pipeline kwargs added to the request's
            "accelerations": dict(self.accelerations),
            **({"memory_plan": residency.plan.to_dict()} if residency is not None else {}),
            **({"adapters": list(self._adapters.records)} if self._adapters else {}),
            "nvml": summarize_samples(samples),
            "subscriber_errors": telemetry.subscriber_errors,
            "subscriber_seconds": telemetry.subscriber_seconds,  # left out of the CPU's timings (workbench.telemetry)
            **({"traced": True, "trace": tracer.summary()} if tracer is not None else {}),
            **({"non_finite": non_finite} if non_finite else {}),
            **environment.describe(self.device),
        }
        return Result(
            frames=_to_uint8(np.nan_to_num(frames, nan=0.0) if non_finite else frames),  # NaN: black, said so
            audio=None
            if audio is None
            else np.nan_to_num(audio.float().cpu().numpy(), nan=0.0, posinf=1.0, neginf=-1.0),  # NaN: silence, said so
            sample_rate=self._sample_rate() if audio is not None else None,
            fps=request.fps,
            latents=None if clock.latents is None else clock.latents.detach().float().cpu(),
            timings=timings,
            memory=dict(telemetry.memory),
            receipts=receipts,
            exact=not any(r["contract"] == "approximate" and r["executed"] for r in receipts.values()),
            finite=not non_finite,
            metadata=metadata,
            events=list(telemetry.events),
            step_seconds=telemetry.step_seconds(),
            trace=None if tracer is None else tracer.chrome_trace(),
        )

    def _checkpoint(self, request_id: int, steps: int, telemetry: Telemetry) -> Callable[[str], None]:
        """A check to call where request `request_id` may stop: raises RequestStopped once `stop()` asked for it."""

        def check(where: str) -> None:
            if self._stop_request == request_id:
                raise RequestStopped(request_id, where, len(telemetry.steps), steps)

        return check

    def _sample_rate(self) -> int:
        vocoder = getattr(self.model.pipeline, "vocoder", None)
        if vocoder is None:  # the audio VAE emits the waveform itself (MiniMax-H3's modular pipeline)
            return int(self.model.pipeline.audio_sampling_rate)
        return int(vocoder.config.output_sampling_rate)

    def __repr__(self) -> str:
        if self.closed:
            return f"Session(closed, device={self.device})"
        return (
            f"Session(model={self.model.name!r}, family={self.family.name!r}, device={self.device}, "
            f"dtype={self.dtype}, init={self.init_seconds:.2f}s)"
        )


def _check_no_placing(config: dict[str, Any]) -> None:
    """ValueError when `config` names plugins that move the denoiser's weights, which a memory plan places."""
    placing = [name for name in config if "denoiser.weights_device" in getattr(REGISTRY.get(name), "touches", ())]
    if placing:
        raise ValueError(
            f"accelerations: {placing} move the denoiser's weights, which this session's memory plan places; "
            "open a session without memory=... to use them"
        )


def _check_reusable(model: LoadedModel) -> None:
    """ValueError when `model` (a LoadedModel given to `Session.open`) is held by an open session, or carries what
    one left installed (`_leftovers`)."""
    if _holder(model) is not None:
        gc.collect()  # a session dropped without close() lets go of the model when collected
    holder = _holder(model)
    if holder is not None:
        raise ValueError(
            f"model: {model.name!r} is held by an open session ({holder!r}); allowed: a model no open session "
            "holds: close() that session first, or open the model by name for a separate copy"
        )
    leftovers = _leftovers(model)
    if leftovers:
        listed = "; ".join(leftovers[:4]) + (f"; and {len(leftovers) - 4} more" if len(leftovers) > 4 else "")
        raise ValueError(
            f"model: {model.name!r} carries what was installed on it and never removed ({listed}); allowed: a model "
            "without hooks, instance-level methods or changed attention processors: close() a session rather than "
            "dropping it, or open the model by name for a fresh copy"
        )


def _holder(model: LoadedModel) -> Session | None:
    """The open session holding `model`'s pipeline, or None."""
    return next((s for s in _HOLDERS if s._holds_model and s.model.pipeline is model.pipeline), None)


def _leftovers(model: LoadedModel) -> list[str]:
    """What is installed on `model`'s module components beyond their classes' own code, one line per module: torch
    hooks of the workbench's code (not the libraries' own: torch's weight norm, transformers' output capture),
    diffusers hooks, instance-level methods (a `forward` or `_decode` set on the module; the class's own method bound
    back, as diffusers restores a forward, does not count), a compiled call, an attention processor wrapped by a
    router or given its own attention backend, LoRA adapters fused into the weights and a scheduler their metadata
    replaced (`adapters.FUSED_MARK`). A plugin or a memory arrangement leaves these while installed;
    `Session.close()` removes them. The markers `accelerations.base.fingerprint` lists as leftovers, without its hash
    of every weight (which reads the whole model), and the instance methods and processors it does not see."""
    pipeline = model.pipeline
    components = (
        {"pipeline": pipeline}
        if isinstance(pipeline, torch.nn.Module)
        else {name: c for name, c in pipeline.components.items() if isinstance(c, torch.nn.Module)}
    )
    found = []
    for name, component in components.items():
        for path, module in component.named_modules(prefix=name):
            registry = getattr(module, "_diffusers_hook", None)
            methods = [key for key, value in vars(module).items() if _overrides(module, key, value)]
            processor = getattr(module, "processor", None)
            kinds = []
            if any(map(_workbench_code, (*module._forward_pre_hooks.values(), *module._forward_hooks.values()))):
                kinds.append("workbench torch hooks")
            if registry is not None and registry.hooks:
                kinds.append(f"diffusers hooks {list(registry.hooks)}")
            if methods:
                kinds.append(f"instance {', '.join(methods)}")
            if getattr(module, "_compiled_call_impl", None) is not None:
                kinds.append("compiled")
            if processor is not None and unrouted(processor) is not processor:
                kinds.append("a routed attention processor")
            if processor is not None and vars(unrouted(processor)).get("_attention_backend") is not None:
                kinds.append("an attention backend set")
            if lora.FUSED_MARK in vars(module):
                kinds.append(f"LoRA adapters {list(vars(module)[lora.FUSED_MARK])} fused into its weights")
            if kinds:
                found.append(f"{path}: {', '.join(kinds)}")
    shifted = getattr(getattr(pipeline, "scheduler", None), lora.FUSED_MARK, None)
    if shifted is not None:
        found.append(f"scheduler: replaced by an adapter's metadata ({', '.join(shifted)})")
    return found


def _workbench_code(code: Any) -> bool:
    """Whether `code` (a function, a bound method, a callable object or a functools.partial of one) is the
    workbench's."""
    module = getattr(getattr(code, "func", code), "__module__", None)
    return isinstance(module, str) and module.startswith("workbench.")


def _overrides(module: torch.nn.Module, key: str, value: Any) -> bool:
    """Whether instance attribute `key` = `value` replaces a method of `module`'s class with other code (not the
    class's own method bound to `module`)."""
    own = getattr(type(module), key, None)
    if not callable(value) or not callable(own):
        return False
    return not (getattr(value, "__self__", None) is module and getattr(value, "__func__", None) is own)


def _own_dtype(model: LoadedModel, requested: torch.dtype | None, device: torch.device) -> torch.dtype:
    """The dtype `model`'s denoisers hold most of their floating-point weights in (a bfloat16 model keeps its
    `_keep_in_fp32_modules` in float32), which a session over it records (`requested`, else `device`'s default, for
    denoisers without any); ValueError when `requested` (None: the model's own) is another, or when it is none
    `DTYPES` names."""
    counts: dict[torch.dtype, int] = {}
    for denoiser in model.denoisers():
        for weight in denoiser.parameters():
            if weight.is_floating_point():
                counts[weight.dtype] = counts.get(weight.dtype, 0) + weight.numel()
    own = max(counts, key=counts.get) if counts else _dtype(requested, device)
    name = str(own).removeprefix("torch.")
    if own not in DTYPES.values():
        raise ValueError(f"model: {model.name!r} holds its denoiser weights in {name}; allowed: {sorted(DTYPES)}")
    if requested is not None and requested != own:
        raise ValueError(
            f"dtype: {str(requested).removeprefix('torch.')!r}, but model {model.name!r} holds its weights in "
            f"{name}; allowed: {name!r} or None for this model (a model is run in its own dtype: build it in another, "
            "e.g. resolve(name, dtype=...), to run it so)"
        )
    return own


def _free_bytes(device: torch.device) -> int:
    """What `device` has free for a request's activations: the host's available memory on the CPU; on CUDA the
    device's free memory plus the blocks torch's allocator holds cached, which it reuses without asking CUDA."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return psutil.virtual_memory().available


def _check_free_memory(model: LoadedModel, device: torch.device, request: Request) -> None:
    """ValueError naming `request`'s size when its largest estimated stage activation peak (an upper bound by
    `memory_estimate`'s formulas; the weights already hold their memory) alone is more than `device` has free: such
    a request would run out of memory part-way (on the CPU the process is killed)."""
    estimate, _ = estimate_activation(model, request)
    stage, peak = max(estimate.items(), key=lambda item: item[1])
    free = _free_bytes(device)
    if peak > free:
        raise ValueError(
            f"request: frames={request.frames}, height={request.height}, width={request.width}: its {stage} needs "
            f"about {gib(peak)} of activations (estimated), more than the {gib(free)} {device} has free; allowed: "
            "a request that fits: fewer frames or a smaller height and width, or a session opened with "
            "memory=MemoryBudget(cap, request=<this request>), whose plan may tile the decode"
        )


def _warn_if_capped(device: torch.device, replacing: bool) -> None:
    """Warn when an open session's memory budget caps `device`: the cap is the process's (one per device), so a new
    session runs under it, or (`replacing`) its own cap replaces it for both."""
    if cap_holder(device) is not None:
        gc.collect()  # a session dropped without close() lifts its cap when collected
    cap = cap_holder(device)
    if cap is None:
        return
    effect = (
        "this session's cap replaces it for both"
        if replacing
        else "this session runs under it (close() that session to give this one the whole device)"
    )
    warnings.warn(
        f"{device} is capped at {gib(cap)} by an open session's memory budget; the cap is the process's, one per "
        f"device: {effect}",
        stacklevel=3,
    )


def _non_finite(outputs: tuple[tuple[str, str, Any], ...]) -> list[str]:
    """For each (stage, name, tensor or array or None) holding a NaN or inf: one line naming the stage and the count.
    One `isfinite(...).all()` per output; the values are counted only when one is not finite."""
    found = []
    for stage, name, values in outputs:
        if values is None:
            continue
        finite = torch.isfinite(values) if isinstance(values, torch.Tensor) else np.isfinite(values)
        if not bool(finite.all()):
            bad, total = int((~finite).sum()), finite.numel() if isinstance(finite, torch.Tensor) else finite.size
            found.append(f"{stage} produced non-finite {name} ({bad} of {total} values NaN/inf)")
    return found


def _describe(request: Request) -> str:
    """The numeric settings of a request, for an error message."""
    fields = ("guidance", "steps", "seed", "frames", "height", "width", "fps", "mode")
    return ", ".join(f"{name}={getattr(request, name)!r}" for name in fields)


def _to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] to uint8, rounding (not truncating) so mid-grey stays mid-grey."""
    return np.clip(np.rint(frames * 255.0), 0, 255).astype(np.uint8)


def _dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype: {dtype!r}; allowed: {sorted(DTYPES)}")


def _plan_from_shapes(
    model: str | os.PathLike, seed: int, dtype: torch.dtype, budget: MemoryBudget, device: torch.device
) -> MemoryPlan | None:
    """`model`'s memory plan under `budget` from its shapes alone (`models.preview`: a checkpoint's modules on the
    meta device, no weight read; a built-in model is built as usual, its weights are small or random); the planner's
    ValueError, naming the smallest cap that fits, when no plan meets it. None when the shapes cannot be built
    (the checkpoint's own load then reports what is wrong, or plans after the host build)."""
    try:
        shapes = preview(model, seed=seed, dtype=dtype)
    except ValueError:
        return None
    return plan_for(shapes, budget, shapes.resolve(budget.request or Request("memory plan")), outside_for(device))
