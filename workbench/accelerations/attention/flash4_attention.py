"""Dense attention through FlashAttention-4's CuTe-DSL kernels (`flash_attn.cute`, package `flash-attn-4`)
(contract: reduction).

Why: attention is the largest share of a Wan2.1-1.3B or MiniMax-H3 forward at video lengths, and FA4 ships a
Hopper (sm_90) forward written in NVIDIA's CuTe DSL (warp-specialised, TMA, FA3's design) that is faster than
diffusers' default there (SDPA picking cuDNN). `python -m benchmarks run fp8-attention` times it against cuDNN
per call at Wan2.1-1.3B's 32,760 x 12 heads, `forward-wan` and `forward-h3` in a forward (docs/measurements.md).
diffusers 0.42 reaches FA4 only through its hub backend, which downloads code; this plugin calls the locally
installed package instead.

How: every denoiser module's processors are pinned to diffusers' `native` backend, and that backend's registry
entry is replaced, for the plugin's lifetime, by a function that runs `flash_attn.cute.flash_attn_func` on the
dispatcher's (B, S, H, D) tensors (the layout FA4 takes, so no copy). Uninstall puts the entry and the processors'
backends back. The result differs from cuDNN's by accumulation order only (both fp32 accumulators over bf16 tiles).

Fail closed: the package missing, a CPU session, or a GPU other than sm_90/sm_100 is a RuntimeError at prepare (with
the install recipe); a call FA4 is not asked to take here (a mask, dropout, causal, an fp32 tensor, a context-
parallel config) raises instead of running another kernel. Receipt: `flash4_calls`.

Install (CUDA 13 images): `pip install "flash-attn-4[cu13]"` (pulls nvidia-cutlass-dsl, its cu13 libraries,
quack-kernels, apache-tvm-ffi); the extra `flash4` of this project pins the same.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.models.attention_dispatch import AttentionBackendName

from workbench.accelerations.attention.backend_swap import BackendSwap, unsupported_call
from workbench.accelerations.base import Spec

ARCHES = ((9, 0), (10, 0))  # FA4's forward kernels: Hopper and datacenter Blackwell
DTYPES = (torch.bfloat16, torch.float16)
INSTALL = 'pip install "flash-attn-4[cu13]"  (or the extra: pip install "vflash-workbench[flash4]")'


def load() -> Any:
    """`flash_attn.cute`, or a RuntimeError that says how to install it."""
    try:
        return importlib.import_module("flash_attn.cute")
    except Exception as error:  # ImportError, or the DSL failing to find its CUDA libraries
        raise RuntimeError(f"flash4_attention: `flash_attn.cute` is not importable ({error!r}); {INSTALL}") from error


def _refusal(kwargs: dict[str, Any]) -> str | None:
    """What in this dispatcher call FA4 is not asked to take (`unsupported_call`, an LSE, the dtypes), or None."""
    problems = unsupported_call(kwargs)
    if kwargs.get("return_lse"):
        problems.append("return_lse=True")
    dtypes = {kwargs[name].dtype for name in ("query", "key", "value")}
    if len(dtypes) != 1 or dtypes.pop() not in DTYPES:
        problems.append(f"q/k/v dtypes {[str(kwargs[n].dtype) for n in ('query', 'key', 'value')]}")
    return ", ".join(problems) or None


def attention_fn(flash: Any, receipt: Any) -> Any:
    """The registry function: FA4 on (B, S, H, D) q/k/v; anything it is not asked to take raises."""

    def run(**kwargs: Any) -> torch.Tensor:
        reason = _refusal(kwargs)
        if reason is not None:
            raise RuntimeError(f"flash4_attention: a call with {reason} (FA4 is installed for plain dense attention)")
        out, _ = flash.flash_attn_func(
            kwargs["query"], kwargs["key"], kwargs["value"], softmax_scale=kwargs.get("scale")
        )
        receipt.count("flash4_calls")
        return out

    return run


class _Installed(BackendSwap):
    COUNTER = "flash4_calls"

    def __init__(self, spec: Spec, options: dict[str, Any], modules: list[torch.nn.Module], flash: Any, device):
        self.flash = flash
        super().__init__(spec, options, modules, AttentionBackendName.NATIVE.value, device)

    def _function(self) -> Any:
        return attention_fn(self.flash, self.receipt)


def unusable(device: torch.device) -> str | None:
    """Why FA4 cannot run on `device` here (not CUDA, not installed, another GPU), or None."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"runs on a CUDA device; {device} is not one here"
    capability = torch.cuda.get_device_capability(device)
    if capability not in ARCHES:  # first: on such a card installing FA4 would not help
        return f"FA4's forward runs on sm_90/sm_100; {device} is sm_{capability[0]}{capability[1]}"
    if importlib.util.find_spec("flash_attn") is None or importlib.util.find_spec("flash_attn.cute") is None:
        return "`flash_attn.cute` is not installed"
    return None


@dataclass(frozen=True)
class Flash4AttentionConfig:
    """flash4_attention takes no options: FA4 runs every call it is asked to take."""


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    reason = unusable(device)
    if reason is not None:
        raise RuntimeError(f"flash4_attention: {reason}; {INSTALL}")
    flash = load()  # the import itself can still fail (the DSL's CUDA libraries)
    modules = model.denoisers()
    return lambda: _Installed(SPEC, options, modules, flash, device)


SPEC = Spec(
    name="flash4_attention",
    contract="reduction",
    summary="dense attention through FlashAttention-4's CuTe-DSL kernels (flash-attn-4, installed locally)",
    prepare_fn=_prepare,
    config=Flash4AttentionConfig,
    devices=("cuda",),
    touches=("attention_processor.backend",),
    order=20,
    unusable=unusable,
    capabilities=tuple(major * 10 + minor for major, minor in ARCHES),
)
SPECS = (SPEC,)
