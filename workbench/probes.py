"""Per-request stage probes on a diffusers pipeline: installed before the call, removed after it.

The pipeline's own `__call__` runs untouched; probes only observe which component call is running,
so the session adds measurement without changing what diffusers computes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from workbench.telemetry import Telemetry


@contextmanager
def stage_probes(
    model: Any, telemetry: Telemetry, on_stage: Callable[[str], None] | None = None
) -> Iterator[Callable[[Any, int, Any, dict[str, Any]], dict[str, Any]]]:
    """Install the family's probes plus denoise-step probes; yields the step-end callback to pass on.

    `on_stage(stage)` runs at the start of every probed call, inside the stage (its time and peak count there) and
    before the call computes: the memory residency brings the stage's offloaded components onto the device there.

    The callback's `__self__` keeps what the denoiser produced: `latents`, the video latents of the last step end, and
    `audio_latents`, the first argument of the audio_decode stage's probed method (the audio VAE's `decode`), since a
    pipeline's step-end callback may not carry them (LTX-2's does not); each the latest seen, None until then."""
    pipe = model.pipeline
    entered = on_stage or (lambda stage: None)
    denoise = _DenoiseClock(pipe, telemetry, entered)
    undo: list[Callable[[], None]] = []
    try:
        for stage, attribute, method in model.family.stage_probes:
            target = _component(pipe, attribute)
            if target is None:
                continue
            if method is None:
                undo += _probe_forward(target, stage, telemetry, entered)
            else:
                seen = denoise.on_audio_decode if stage == "audio_decode" else None
                undo.append(_probe_method(target, method, stage, telemetry, entered, seen))
        for module in model.denoisers():
            undo.append(module.register_forward_pre_hook(denoise.on_forward).remove)
        yield denoise.on_step_end
    finally:
        for remove in reversed(undo):
            remove()


def stage_modules(model: Any) -> list[torch.nn.Module]:
    """The submodules of the components the family's stage probes watch (a VAE's decoder, its blocks and
    convolutions; a vocoder's layers; a text encoder's), each once, without the components themselves and without
    anything inside a denoiser. A stop checkpoint on each lets a request end within one block of a decode rather
    than when the decode does."""
    targets = [_component(model.pipeline, attribute) for _, attribute, _ in model.family.stage_probes]
    components = [t for t in targets if isinstance(t, torch.nn.Module)]  # not a pipeline method (encode_prompt)
    skip = {id(t) for t in components} | {id(m) for denoiser in model.denoisers() for m in denoiser.modules()}
    seen: dict[int, torch.nn.Module] = {}
    for component in components:
        for module in component.modules():
            if id(module) not in skip:
                seen.setdefault(id(module), module)
    return list(seen.values())


def _component(pipe: Any, attribute: str) -> Any:
    """`attribute` names a pipeline component, "" for the pipeline, or a dotted path to a submodule of one."""
    target = pipe
    for name in attribute.split(".") if attribute else ():
        target = getattr(target, name, None)
        if target is None:
            return None
    return target


def _probe_method(
    target: Any,
    name: str,
    stage: str,
    telemetry: Telemetry,
    entered: Callable[[str], None],
    seen: Callable[[tuple[Any, ...]], None] | None = None,
) -> Callable[[], None]:
    """Wrap `target.name` (an instance attribute, removed by the returned undo) to time it as `stage`; `seen(args)`,
    when given, receives each call's positional arguments before it runs."""
    original = getattr(target, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        telemetry.end("denoise")  # decoding starts where denoising ended
        if seen is not None:
            seen(args)
        with telemetry.stage(stage):
            entered(stage)
            return original(*args, **kwargs)

    target.__dict__[name] = timed
    return lambda: target.__dict__.pop(name, None)


def _probe_forward(
    module: Any, stage: str, telemetry: Telemetry, entered: Callable[[str], None]
) -> list[Callable[[], None]]:
    def begin(*_: Any) -> None:
        telemetry.begin(stage)
        entered(stage)

    before = module.register_forward_pre_hook(begin)
    after = module.register_forward_hook(lambda *_: telemetry.end(stage))
    return [before.remove, after.remove]


class _DenoiseClock:
    """Opens `denoise` at the first transformer call and closes one step per scheduler step."""

    def __init__(self, pipe: Any, telemetry: Telemetry, entered: Callable[[str], None]):
        self.pipe = pipe
        self.telemetry = telemetry
        self.entered = entered
        self.step_start: Any = None
        self.latents: Any = None
        self.audio_latents: Any = None

    def on_forward(self, *_: Any) -> None:
        if self.step_start is None:
            self.telemetry.begin("denoise")
            self.entered("denoise")
            self.step_start = self.telemetry.marker()

    def on_step_end(self, pipe: Any, index: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        if self.step_start is not None:
            end = self.telemetry.step(index, self.step_start)
            self.step_start = end
        self.latents = tensors.get("latents")
        return {}

    def on_audio_decode(self, args: tuple[Any, ...]) -> None:
        """The audio VAE's decode is called with the denoiser's audio latents first."""
        if args and isinstance(args[0], torch.Tensor):
            self.audio_latents = args[0]
