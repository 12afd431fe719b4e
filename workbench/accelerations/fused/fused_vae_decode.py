"""The family's VAE decode with each convolution's padded input in a buffer, optionally channels-last and with the
norm + SiLU as one kernel (contract: bitwise with the default options, reduction with either of the other levers).

The family's path (`Family.vae_decode`: for Wan `workbench.models.fused.wan_vae`, for LTX-2
`workbench.models.fused.ltx2_vae`, sharing `workbench.models.fused.vae_decode`) replaces the VAE's `_decode`. A stock
Wan VAE decode runs the whole decoder once per latent frame, each of its ~30 causal 3x3x3 convolutions copying its
input twice (cat with the cached frames, then pad); LTX-2's decodes the clip at once, each convolution copying its
input twice too (cat with the repeated edge frames, then the reflect pad). Each is preceded by a norm + SiLU of five to
seven elementwise passes, and cuDNN transposes NCDHW activations for its NDHWC kernels. Options, one per lever, each
with its contract:

- `conv_cache` "buffer" (default): each convolution reads a preallocated buffer whose interior the norm + SiLU
  writes into and whose border (Wan: zeros and the two cached frames; LTX-2: the repeated frames and the reflected
  rows and columns) is filled from there; "stock": diffusers' cat + pad. Both `bitwise`.
- `channels_last` (default off): convolution weights and activations in channels_last_3d. `reduction`: other cuDNN
  algorithms, other summation orders (the norms too).
- `norm` "torch" (default) or "triton": the residual blocks' and the head's RMS norm + SiLU as one kernel of
  kernels/rms_norm_silu.py (Wan: `rms_norm_silu`; LTX-2: `pixel_norm_silu`). `reduction`: its sum of squares is
  summed in another order, so an element is torch's or an ulp or two of the dtype away before the next convolution;
  those differences travel through the decoder.

The contract a handle reports (`report()["contract"]`) is that of its options: `bitwise` unless channels_last or the
Triton norm is on; the registry's `contract` is the weaker, `reduction`, whose bound is `REL_L2_BOUND` (the relative
L2 against the stock decode, per dtype; a reduction handle reports it as `rel_l2_bound`). Held on the CPU by
tests/accelerations/fused/test_fused_vae_decode.py: the default options are `torch.equal` to the stock decode on
tiny-wan and tiny-ltx2 in a request and on wider VAEs (bf16 and fp32); channels_last and the Triton norm stay within
the bound. On a GPU the benchmark scenario `vae-decode` reports each option's speed and error
against the stock decode at each family's real shape.

Fail closed: a family without a decode path, a VAE it does not cover (Wan2.2-TI2V; a timestep-conditioned or
noise-injecting LTX decoder), a decoder with offload hooks or an already replaced decode raise RuntimeError at
prepare; the Triton norm on a CPU needs TRITON_INTERPRET=1. A tiled (or framewise) decode and grad mode run
diffusers' own decode, counted under `fallbacks`.
Receipts: `decodes`, `latent_frames`, `buffered_convs` (buffer mode), `norm_silu_kernel_calls` (Triton norm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.base import Handle, Spec, option
from workbench.accelerations.fused.blocks import triton_unusable

NAME = "fused_vae_decode"
REL_L2_BOUND = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # a reduction option set's decode against stock's


def contract_of(options: dict[str, Any]) -> str:
    """`bitwise` for the buffer/stock cache alone; `reduction` once channels_last or the Triton norm is on."""
    return "reduction" if options["channels_last"] or options["norm"] == "triton" else "bitwise"


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], model: Any):
        super().__init__(spec, options, proof=("decodes",))
        self.dtype = model.pipeline.vae.dtype
        self.remove = model.family.vae_decode.install(model.pipeline.vae, options, self.receipt)

    def report(self) -> dict[str, Any]:
        contract = contract_of(self.options)
        bound = REL_L2_BOUND.get(self.dtype) if contract == "reduction" else None
        return {**super().report(), "contract": contract} | ({"rel_l2_bound": bound} if bound is not None else {})

    def _remove(self) -> None:
        self.remove()


@dataclass(frozen=True)
class FusedVaeDecodeConfig:
    """fused_vae_decode's options: one per lever (module docstring)."""

    conv_cache: str = option(
        "buffer", allowed=("buffer", "stock"), help="buffer: padded conv buffers, no cat/pad copies; stock: cat + pad"
    )
    channels_last: bool = option(False, help="channels_last_3d weights and activations (contract: reduction)")
    norm: str = option(
        "torch", allowed=("torch", "triton"), help="triton: RMS norm + SiLU as one kernel (contract: reduction)"
    )


def model_problem(model: Any) -> str | None:
    """Why `model`'s VAE cannot take the family's decode path (none wired, no `vae`, a VAE it does not cover), or
    None."""
    if model.family.vae_decode is None:
        return _requires(model.family)
    vae = getattr(model.pipeline, "vae", None)
    return "the pipeline has no `vae`" if vae is None else model.family.vae_decode.check(vae)


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    if (reason := model_problem(model)) is not None:
        raise RuntimeError(f"{NAME}: {reason}")
    if options["norm"] == "triton" and (why := triton_unusable(device)) is not None:
        raise RuntimeError(f"{NAME}: norm='triton' {why}; or use norm='torch'")
    return lambda: _Installed(SPEC, options, model)


def _requires(family: Any) -> str | None:
    return None if family.vae_decode is not None else "no fast VAE decode path is wired for its VAE"


SPEC = Spec(
    name=NAME,
    contract="reduction",
    summary="VAE decode (Wan, LTX-2) with padded conv buffers, optional channels-last and norm+SiLU kernel",
    prepare_fn=_prepare,
    config=FusedVaeDecodeConfig,
    model_problem=model_problem,
    requires=_requires,
    touches=("vae.decode",),
    order=40,
)
SPECS = (SPEC,)
