"""fp8_attention: a family's self-attention through the own Triton FP8 attention kernel (contract: approximate).

The kernel (`workbench.kernels.fp8_attention`) quantizes q and the mean-smoothed k per 128-token block to e4m3,
runs Q.K^T as an FP8 dot with fp32 accumulation and the online softmax in fp32, and P.V in FP8 (`pv="fp8"`) or bf16
(`pv="bf16"`). Every key stays in the softmax: it is dense attention at lower precision, not sparse.

The calls reach it the way `block_sparse`'s do (`sparse_routing`): the stock processor computes q/k/v and only the
self-attention modules the family adapter names are routed (Wan `attn1`, LTX-2 video `attn1`, H3's packed joint
`attn`); cross-attention, LTX-2's audio stream and everything else run the untouched backend. The same family rules
hold: `protect_prefix` ("family" by default) gives the first query rows of each call the backend's dense attention
in the model's dtype, which on H3 are the text, conditioning and audio rows (so audio queries stay bf16); 0 sends
every query through FP8. `dense_steps` / `dense_blocks` keep the first steps / blocks dense; `per_expert` counts
`dense_steps` within each Wan2.2 expert.

Receipts: `fp8_calls` (calls the kernel served), `dense_calls` (split into `dense_step_calls` and
`dense_block_calls`), `protected_rows`, fallbacks (a perturbed pass whose processor skipped attention),
`notes["pv"]`; `sparse_calls` is the router's name for the same calls as `fp8_calls`.

Fail closed (RuntimeError with the reason): a CUDA device below sm_89 (no e4m3 tensor cores), a CPU without
`TRITON_INTERPRET=1`, head dim != 128, a dtype other than bfloat16/float32, a family without routable
self-attention, or a routed call with a mask / causal / context-parallel layout; never a silent dense run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.attention.sparse_routing import (
    FAMILY,
    Call,
    RoutedHandle,
    Router,
    RowsOption,
    Settings,
    needs_self_attention,
)
from workbench.accelerations.base import Spec, option
from workbench.kernels import _runtime
from workbench.kernels.fp8_attention import DTYPES, HEAD_DIM, PV_MODES, fp8_attention
from workbench.models import experts

NAME = "fp8_attention"


@dataclass(frozen=True)
class Fp8AttentionConfig:
    """fp8_attention's options: the P.V precision and the dense exceptions the sparse plugins also take."""

    pv: str = option("fp8", allowed=PV_MODES, help="P.V in FP8 (faster) or bf16 (closer to dense)")
    dense_steps: int = option(0, minimum=0, help="first denoising steps run dense")
    dense_blocks: int = option(0, minimum=0, help="first transformer blocks run dense")
    protect_prefix: int | str = option(
        FAMILY, cls=RowsOption, help="first query rows take dense attention; 'family': text/conditioning/audio"
    )
    per_expert: bool = option(True, help=experts.PER_EXPERT_HELP)


def unusable(device: torch.device) -> str | None:
    """Why the kernel cannot run on `device` here, or None."""
    if device.type == "cpu" and not _runtime.interpreting():
        return "the Triton kernel on CPU needs TRITON_INTERPRET=1 (or a CUDA device)"
    if device.type not in ("cpu", "cuda"):
        return f"the Triton kernel runs on cuda (or cpu under TRITON_INTERPRET=1), not {device}"
    number = _runtime.capability(device)
    if number is not None and number < 89:
        return f"FP8 (e4m3) attention needs compute capability 8.9 or newer (Ada, Hopper); {device} is sm_{number}"
    return None


def fp8_attend(call: Call) -> tuple[torch.Tensor, None]:
    """The kernel on the dispatcher's (B, T, H, D) tensors, read as (B, H, T, D) views without a copy; the output
    comes back in the same (B, T, H, D) layout."""
    q, k, v = call.qkv
    if q.shape[-1] != HEAD_DIM or q.dtype not in DTYPES:
        raise RuntimeError(
            f"{NAME}: attention of head dim {q.shape[-1]} in {q.dtype} reached the kernel; "
            f"it supports head dim {HEAD_DIM} in {[str(d) for d in DTYPES]}"
        )
    out = fp8_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), call.kwargs.get("scale"), call.settings.extra["pv"]
    )
    call.router.receipt.count("fp8_calls", expert=call.router.expert)
    return out.transpose(1, 2), None


class _Installed(RoutedHandle):
    def __init__(self, spec: Spec, options: dict[str, Any], router: Router):
        super().__init__(spec, options, router)
        self.receipt.proof = ("fp8_calls",)

    def report(self) -> dict[str, Any]:
        self.receipt.notes["pv"] = self.options["pv"]
        return super().report()


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    reason = unusable(device)
    if reason is not None:
        raise RuntimeError(f"{NAME}: {reason}")
    # Settings is the routing's value object: no routing here, so tau and sink_tokens are unused by this kernel
    settings = Settings(
        tau=0.0,
        sink_tokens=0,
        dense_steps=options["dense_steps"],
        dense_blocks=options["dense_blocks"],
        protect_prefix=options["protect_prefix"],
        extra={"pv": options["pv"]},
    )
    router = Router(NAME, model, None, fp8_attend, lambda rows: settings, options["per_expert"])
    router.check_modules(HEAD_DIM, DTYPES)
    return lambda: _Installed(SPEC, options, router)


SPEC = Spec(
    name=NAME,
    contract="approximate",
    summary="self-attention through an own Triton FP8 (e4m3) attention kernel with smoothed keys (Wan, LTX-2, H3)",
    prepare_fn=_prepare,
    config=Fp8AttentionConfig,
    requires=needs_self_attention,
    # the dispatcher entry it replaces, and the blocks' compiled call (compiling over routed processors is not
    # verified), as block_sparse
    touches=("attention_processor.backend", "blocks.compiled_call"),
    order=20,
    unusable=unusable,
    capabilities=(89, 90, 100),  # e4m3 tensor cores: Ada, Hopper, Blackwell
)
SPECS = (SPEC,)
