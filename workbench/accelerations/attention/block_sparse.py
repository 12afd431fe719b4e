"""block_sparse: a family's self-attention through the own Triton block-sparse kernel (contract: approximate).

The kernel (`workbench.kernels.block_sparse_attention`) routes 64-token blocks Sol-style: exact where a key
block's proxy score beats `mean + tau * std`, on the diagonal band and in the sink range; every other block
enters the same online softmax as one mean pseudo-key weighted by its length. The calls reach it through
diffusers' attention dispatcher (`sparse_routing`): the stock processor computes q/k/v, and only the
self-attention modules the family adapter names are routed (Wan `attn1`, LTX-2 video `attn1`, H3's packed
joint `attn`); cross-attention and everything else run the untouched backend.

Options: `tau` (higher: fewer exact blocks); `sink_tokens` (rows whose key blocks stay exact: "family" takes
the family's text / conditioning / audio prefix of each call, 0 for Wan and LTX-2 video, the
`[text | conditioning | audio]` rows for H3; or a fixed count); `dense_steps` (first denoising steps dense:
the pipeline's cache-context step index, or without one the count of denoiser calls in the request);
`dense_blocks` (first transformer blocks dense); `protect_prefix` (the first query rows take dense attention
and only the rest keep the sparse output; "family" protects the non-video prefix, as the seed's Sol path does).

Receipts: `sparse_calls`, `dense_calls` (split into `dense_step_calls` and `dense_block_calls`),
`protected_rows`, `notes["mean_density"]` (fraction of exact block pairs over the sparse calls) and
`notes["prefix_rows"]`.

Fail closed: head dim != 128, a dtype other than bfloat16/float32, a family without routable self-attention, a
CPU without `TRITON_INTERPRET=1`, or a routed call with a mask / causal / context-parallel layout is a
RuntimeError; never a silent dense run.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.accelerations.attention.sparse_routing import Call, Router, Settings, sparse_options
from workbench.accelerations.base import Handle, Spec
from workbench.kernels._runtime import interpreting
from workbench.kernels.block_sparse_attention import DTYPES, HEAD_DIM, block_sparse_attention


def attend(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel on the dispatcher's (B, T, H, D) tensors, read as (B, H, T, D) views without a copy."""
    q, k, v = call.qkv
    if q.shape[-1] != HEAD_DIM or q.dtype not in DTYPES:
        raise RuntimeError(
            f"block_sparse: attention of head dim {q.shape[-1]} in {q.dtype} reached the kernel; "
            f"it supports head dim {HEAD_DIM} in {[str(d) for d in DTYPES]}"
        )
    settings = call.settings
    out, density = block_sparse_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), settings.tau, call.rows(settings.sink_tokens),
        scale=call.kwargs.get("scale"), return_density=True,
    )  # fmt: skip
    return out.transpose(1, 2), density


def check_device(name: str, device: torch.device) -> None:
    if device.type == "cpu" and not interpreting():
        raise RuntimeError(f"{name}: the Triton kernel on CPU needs TRITON_INTERPRET=1 (or a CUDA device)")


class RoutedHandle(Handle):
    """An installed Router; its notes (mean density) join the receipt when reported."""

    def __init__(self, spec: Spec, options: dict[str, Any], router: Router):
        super().__init__(spec, options, proof=("sparse_calls",))
        self.router = router
        router.receipt = self.receipt
        router.install()

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.router.reset()

    def report(self) -> dict[str, Any]:
        self.receipt.notes.update(self.router.notes())
        return super().report()

    def _remove(self) -> None:
        self.router.remove()


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    check_device("block_sparse", device)
    settings = Settings.from_options(options)
    router = Router("block_sparse", model, None, attend, lambda rows: settings)
    router.check_modules(HEAD_DIM, DTYPES)
    return lambda: RoutedHandle(SPEC, options, router)


SPEC = Spec(
    name="block_sparse",
    contract="approximate",
    summary="self-attention through an own Triton block-sparse kernel with Sol-style routing (Wan, LTX-2, H3)",
    prepare_fn=_prepare,
    options=sparse_options(default_tau=0.0),
    families=("wan", "ltx2", "h3"),
    # The dispatcher entry it replaces; and the blocks' compiled call, because compiling over the routed
    # processors is not verified (the seed's Sol path refuses compile too).
    touches=("attention_processor.backend", "blocks.compiled_call"),
    order=20,
)
SPECS = (SPEC,)
