"""Choose the dense attention kernel through diffusers' dispatcher (contract: reduction).

Another kernel computes the same softmax attention with a different reduction order. The receipt
counts calls that reached the chosen backend's function, so a configured-but-bypassed backend shows.
The count runs inside each transformer block, so it goes through `Receipt.count`: under
regional_compile a Python counter would be guarded on its value and every call would recompile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers.models.attention_dispatch import (
    AttentionBackendName,
    _AttentionBackendRegistry,
    _check_attention_backend_requirements,
)

from workbench.accelerations.attention.backend_swap import BackendSwap
from workbench.accelerations.base import Spec, option

ALIASES = {"cudnn": "_native_cudnn", "math": "_native_math", "efficient": "_native_efficient"}
# Hub backends download kernels at first use; this workbench never reaches the network.
BACKENDS = tuple(
    sorted(
        b.value
        for b in AttentionBackendName
        if not b.value.endswith("_hub") and b.value in _AttentionBackendRegistry._backends
    )
)
CUDA_ONLY = ("cudnn", "flash", "efficient", "sage", "xformers", "aiter", "npu", "xla")


@dataclass(frozen=True)
class AttentionBackendConfig:
    """attention_backend's options."""

    backend: str = option("native", allowed=tuple(ALIASES) + BACKENDS, help="diffusers backend name or alias")


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    backend = ALIASES.get(options["backend"], options["backend"])
    if device.type != "cuda" and any(tag in backend for tag in CUDA_ONLY):
        raise RuntimeError(
            f"attention_backend.backend={options['backend']!r} needs CUDA; this session runs on {device}"
        )
    try:
        _check_attention_backend_requirements(AttentionBackendName(backend))
    except RuntimeError as error:
        raise RuntimeError(f"attention_backend.backend={options['backend']!r} cannot run here: {error}") from error
    modules = model.denoisers()
    return lambda: BackendSwap(SPEC, options, modules, backend, device)


SPEC = Spec(
    name="attention_backend",
    contract="reduction",
    summary="dense attention through a chosen diffusers backend (cuDNN, flash, flex, math, ...)",
    prepare_fn=_prepare,
    config=AttentionBackendConfig,
    touches=("attention_processor.backend",),
    order=20,
)
SPECS = (SPEC,)
