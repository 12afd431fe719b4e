"""sol_attn: self-attention through NVIDIA's Sol-Attn package, when installed (contract: approximate).

The adapter routes the same modules as `block_sparse` (the family adapter's self-attention, through diffusers'
dispatcher; see `sparse_routing`) with the same options, but the attention is `sol_attn.sol_attn` from the
`sol-attn` package. It adds `thresh_type` (the package's "diag" or "exact" threshold) and `backend`: which
backend the package must pick on this device ("cute": its CuTe DSL kernel for this GPU's architecture, the
default; "triton": its Triton kernel). A mismatch is refused, never run on something else.

What this adapter assumes, and what was verified: it was written from the public interface of sol-attn 0.5.0
(NVlabs/Sana, `techniques/sparse_backends`): `sol_attn.sol_attn(q, k, v, *, scale, tau, thresh_type,
kv_splits, sink_tokens, sink_start)` on contiguous bfloat16 (B, T, H, 128) CUDA tensors, non-causal, forward
only, one exact KV sink range `[sink_start, sink_start + sink_tokens)` (omitting `sink_start` would put it at
the END of the sequence, so the adapter always passes `sink_start=0`: the families' non-video rows are a
prefix), and `sol_attn.get_sol_attn_backend(device)`, which names the backend a call would use
("cute_sm89" / "cute_sm90" / "cute_sm100" / "cute_sm120", else "triton"). The package is not installed where
this was written and no GPU has run this adapter: the tested paths are the refusals (package missing, entry
points missing, no CUDA, backend mismatch) and the argument mapping against a stand-in module. A real Sol-Attn
call is unverified until run on a GPU with the package installed (how to install it: the README, section
"Accelerations", "Optional extras").

Receipts: `sparse_calls`, `dense_calls` (dense steps / blocks), `protected_rows`, `notes["backend"]` and
`notes["package_version"]`; the package reports no density.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.attention.sol_package import OPTIONS, router_for
from workbench.accelerations.attention.sparse_routing import (
    ROUTED,
    ROUTED_ORDER,
    TAU_HELP,
    RoutedHandle,
    Settings,
    SparseAttentionConfig,
    needs_self_attention,
)
from workbench.accelerations.base import Spec, option


@dataclass(frozen=True)
class SolAttnConfig(SparseAttentionConfig):
    """sol_attn's options: the sparse-attention options (`tau` 1 by default) and the package's own two."""

    tau: float = option(1.0, help=TAU_HELP)
    thresh_type: str = option("diag", allowed=("diag", "exact"), help="the package's routing threshold")
    backend: str = option("cute", allowed=("cute", "triton"), help="the package backend this device must use")


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    settings = Settings.from_options(options, extra=OPTIONS)
    router = router_for(model, device, options, lambda rows: settings)
    return lambda: RoutedHandle(SPEC, options, router)


SPEC = Spec(
    name="sol_attn",
    contract="approximate",
    summary="self-attention through NVIDIA's sol-attn package (optional; refused when missing or mismatched)",
    prepare_fn=_prepare,
    config=SolAttnConfig,
    requires=needs_self_attention,
    touches=(ROUTED, "blocks.compiled_call"),
    order=ROUTED_ORDER,
)
SPECS = (SPEC,)
