"""The FFN's tanh-GELU applied in the up-projection GEMM's epilogue (cuBLASLt), not as its own kernel (contract:
reduction).

diffusers' `GELU(approximate="tanh")` (Wan's and LTX-2's feed-forward) runs `proj(x)` (a bf16 GEMM writing
(T, ffn) to memory), then `F.gelu(..., "tanh")`, which reads that tensor back and writes it again: at the
Wan2.1-1.3B shape (32,760 x 8,960 bf16, 587 MB) that is 1.2 GB of extra traffic per block. `torch._addmm_activation(bias, x, W^T, use_gelu=True)` asks
cuBLASLt for the GEMM with a bias+GELU epilogue, so the activation is applied to the fp32 accumulator before the
one rounding to bf16.

Why `reduction` and not `rounding`: stock rounds the pre-activation to bf16 and then rounds the GELU again;
the epilogue rounds once, after the GELU. Outputs differ by about one bf16 ulp where they differ; it is part of
Wan's exact-fast profile, whose speed and distance to stock `python -m benchmarks run forward-wan` measures.

Fail closed: CUDA only. On a CPU torch's `_addmm_activation` applies the erf GELU, not the tanh one the model
asks for, so the plugin refuses there; on a GPU, activation first checks on a small random problem that the
epilogue computes the tanh GELU (closer to a float64 tanh-GELU than to the erf one, and within 2e-2 relative
L2) and raises if not. A call it cannot take (grad mode, weight and input dtypes differ, no bias) runs the stock
module and is counted under `fallbacks`. Receipt: `epilogue_calls`. Exclusive with selective_fp8 (both claim
`linear.weights`): the epilogue GEMM reads the up-projection's weight itself and would bypass an FP8 forward on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from workbench.accelerations.base import Handle, Spec

PROBE_BOUND = 2e-2  # relative L2 of the probe's epilogue output against a float64 tanh-GELU


def gelu_modules(model: Any) -> list[torch.nn.Module]:
    """The denoisers' diffusers `GELU` modules with the tanh approximation and a biased projection."""
    from diffusers.models.activations import GELU

    found = []
    for denoiser in model.denoisers():
        for module in denoiser.modules():
            if type(module) is GELU and module.approximate == "tanh" and module.proj.bias is not None:
                found.append(module)
    return found


def _reason(module: torch.nn.Module, x: torch.Tensor) -> str | None:
    weight = module.proj.weight
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return "grad mode"
    if x.dtype != weight.dtype or module.proj.bias.dtype != weight.dtype:
        return f"input {x.dtype} with weight {weight.dtype}"
    return None


def epilogue_forward(module: torch.nn.Module, receipt: Any) -> Any:
    """An instance-level forward for one `GELU`: `gelu(proj(x), "tanh")` as one GEMM with a GELU epilogue."""
    stock = type(module).forward.__get__(module)
    proj = module.proj

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        reason = _reason(module, hidden_states)
        if reason is not None:
            receipt.count_fallback(reason)
            return stock(hidden_states)
        rows = hidden_states.reshape(-1, proj.in_features)  # (T, in)
        out = torch._addmm_activation(proj.bias, rows, proj.weight.t(), use_gelu=True)  # (T, out)
        receipt.count("epilogue_calls")
        return out.view(*hidden_states.shape[:-1], proj.out_features)

    return forward


def probe(device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Relative L2 of the epilogue against float64 tanh- and erf-GELU on a random (256, 512) x (512, 384) problem."""
    g = torch.Generator(device).manual_seed(0)
    x, w, b = (torch.randn(*s, device=device, generator=g, dtype=dtype) for s in ((256, 512), (384, 512), (384,)))
    got = torch._addmm_activation(b, x, w.t(), use_gelu=True).double()
    pre = F.linear(x.double(), w.double(), b.double())

    def rel(want: torch.Tensor) -> float:
        return float((got - want).norm() / want.norm())

    return {"tanh": rel(F.gelu(pre, approximate="tanh")), "erf": rel(F.gelu(pre))}


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], modules: list[torch.nn.Module], device: torch.device):
        super().__init__(spec, options, proof=("epilogue_calls",))
        self.receipt.traceable(device, counters=("epilogue_calls",))  # counted inside blocks a user may compile
        self.modules = modules
        for module in modules:
            module.forward = epilogue_forward(module, self.receipt)

    def _remove(self) -> None:
        for module in self.modules:
            del module.forward


@dataclass(frozen=True)
class GeluEpilogueConfig:
    """gelu_epilogue takes no options."""


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    modules = gelu_modules(model)
    if not modules:
        raise RuntimeError(f"gelu_epilogue: no tanh-GELU feed-forward projections in {model.family.name}'s denoiser")
    taken = [m for m in modules if "forward" in m.__dict__]
    if taken:
        raise RuntimeError("gelu_epilogue: a GELU module already has its forward replaced by another plugin")
    errors = probe(device, modules[0].proj.weight.dtype)
    if not errors["tanh"] < min(PROBE_BOUND, errors["erf"]):
        raise RuntimeError(
            f"gelu_epilogue: torch._addmm_activation on {device} is not the tanh GELU within {PROBE_BOUND} "
            f"(relative L2 vs tanh {errors['tanh']:.2e}, vs erf {errors['erf']:.2e})"
        )
    return lambda: _Installed(SPEC, options, modules, device)


SPEC = Spec(
    name="gelu_epilogue",
    contract="reduction",
    summary="the FFN's tanh-GELU in the up-projection GEMM's cuBLASLt epilogue (one rounding instead of two)",
    prepare_fn=_prepare,
    config=GeluEpilogueConfig,
    devices=("cuda",),
    # linear.weights: the epilogue GEMM reads `proj.weight` itself, so a plugin that changes how Linear layers compute
    # (selective_fp8's FP8 forward) would silently never run on the up-projection; the two refuse each other instead
    touches=("ffn.activation", "linear.weights"),
    order=60,
)
SPECS = (SPEC,)
