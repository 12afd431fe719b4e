"""cache-dit's DBCache as a plugin (contract: approximate): the first `Fn_compute_blocks` blocks always
run; while their residual changes less than `residual_diff_threshold` the middle blocks are skipped and
cached residuals used, and the last `Bn_compute_blocks` always run (github.com/vipshop/cache-dit).

Needs the optional package (`pip install 'vflash-workbench[cache-dit]'`, cache-dit==1.5.3).
`cache_dit.enable_cache` patches the pipeline: while installed, the pipeline *class's* `__call__` is
wrapped (cache-dit restores it on `disable_cache`), so other instances of the same pipeline class see
the wrapper too. Its config fixes `num_inference_steps`, so the cache is re-enabled at `begin_request`
when the step count changes. Receipts come from `cache_dit.summary` after each request: `cached_steps`
(cond + CFG branch steps whose middle blocks were skipped, proof) and `executed_steps`.

Refused on LTX-2: with diffusers 0.42.1 cache-dit 1.5.3's patched LTX-2 transformer forward rejects the
pipeline's `sigma` argument. `residual_diff_threshold=0` caches nothing and equals dense bit for bit.

Experts (Wan2.2): cache-dit's Wan adapter gives each expert's block list its own cache context, so its state and
its step counts (`max_warmup_steps`) are per expert already; the receipt's counts are split by expert (`experts`),
matched through the context name cache-dit gives each block list (`<name>_<hash(id(blocks))>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.base import Handle, Knob, Spec, drop_restored_forwards, option
from workbench.models import experts

NAME = "cache_dit"
EXTRA = "pip install 'vflash-workbench[cache-dit]' (cache-dit==1.5.3)"


def _cache_dit():
    try:
        import cache_dit
    except ImportError as error:
        raise RuntimeError(f"{NAME}: needs the cache-dit package: {EXTRA}: {error}") from None
    return cache_dit


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], model: Any, steps: int):
        super().__init__(spec, options, proof=("cached_steps",))
        self.cache_dit = _cache_dit()
        self.pipe = model.pipeline
        named = experts.named_denoisers(model)
        self.denoisers = [denoiser for _, denoiser in named]
        # cache-dit's context name suffix of each expert's block list -> the expert (only where there are two)
        self.experts = {f"_{hash(id(d.blocks))}": name for name, d in named if len(named) > 1}
        # disable_cache re-registers the block list (changing module order) and leaves counters behind
        self.children = [dict(d._modules) for d in self.denoisers]
        self.attributes = [{name: set(m.__dict__) for name, m in d.named_modules()} for d in self.denoisers]
        self.steps = None
        try:
            self._enable(steps)
        except Exception:
            self._remove()
            raise

    def _enable(self, steps: int) -> None:
        options = self.options
        config = self.cache_dit.DBCacheConfig(
            Fn_compute_blocks=options["Fn_compute_blocks"],
            Bn_compute_blocks=options["Bn_compute_blocks"],
            max_warmup_steps=options["max_warmup_steps"],
            residual_diff_threshold=options["residual_diff_threshold"],
            num_inference_steps=steps,
        )
        self.cache_dit.enable_cache(self.pipe, cache_config=config)
        self.steps = steps

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        if steps <= self.options["max_warmup_steps"]:
            raise ValueError(
                f"{NAME}.max_warmup_steps: {self.options['max_warmup_steps']} warm-up steps leave nothing to cache "
                f"in a {steps}-step request; lower it below {steps}"
            )
        if steps != self.steps:
            self._disable()
            self._enable(steps)

    def end_request(self, request_id: int) -> None:
        seen = set()
        for stats in self.cache_dit.summary(self.pipe, details=False, logging=False):
            name = stats.cache_options.get("name")
            if name in seen:  # summary lists each cached block list once per context manager lookup
                continue
            seen.add(name)
            expert = next((e for suffix, e in self.experts.items() if str(name).endswith(suffix)), None)
            self.receipt.count("cached_steps", len(stats.cached_steps) + len(stats.cfg_cached_steps), expert)
            self.receipt.count("executed_steps", int(stats.accumulated_executed_steps), expert)

    def _disable(self) -> None:
        if self.steps is not None:
            self.cache_dit.disable_cache(self.pipe)
            self.steps = None
        for denoiser, children, attributes in zip(self.denoisers, self.children, self.attributes, strict=True):
            denoiser._modules.clear()
            denoiser._modules.update(children)
            for name, module in denoiser.named_modules():
                for key in set(module.__dict__) - attributes.get(name, set()) - {"_diffusers_hook"}:
                    del module.__dict__[key]
            drop_restored_forwards(denoiser)

    def _remove(self) -> None:
        self._disable()


@dataclass(frozen=True)
class CacheDiTConfig:
    """cache_dit's options (cache-dit's DBCache names)."""

    Fn_compute_blocks: int = option(1, minimum=1, help="first blocks always computed (the change probe)")
    Bn_compute_blocks: int = option(0, minimum=0, help="last blocks always computed")
    max_warmup_steps: int = option(2, minimum=0, help="first steps always computed")
    residual_diff_threshold: float = option(0.08, minimum=0.0, help="relative residual change allowed")


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    _cache_dit()
    fn, bn = options["Fn_compute_blocks"], options["Bn_compute_blocks"]
    for denoiser in model.denoisers():
        blocks = model.family.blocks(denoiser)
        if fn + bn > len(blocks):
            raise ValueError(
                f"{NAME}.Fn_compute_blocks: Fn_compute_blocks={fn} + Bn_compute_blocks={bn} exceeds the "
                f"{len(blocks)} blocks of {type(denoiser).__name__}"
            )
    steps = int(model.defaults.get("steps", options["max_warmup_steps"] + 1))
    return lambda: _Installed(SPEC, options, model, steps)


SPEC = Spec(
    name=NAME,
    contract="approximate",
    summary="cache-dit DBCache: skip middle blocks while the first blocks' residual barely changes",
    prepare_fn=_prepare,
    config=CacheDiTConfig,
    knob=Knob("residual_diff_threshold", 0.0, 0.5),
    group="feature_cache",
    touches=("denoiser.forward",),
    order=80,
)
SPECS = (SPEC,)
