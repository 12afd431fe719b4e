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
and only the rest keep the sparse output; "family" protects the non-video prefix, as the seed's Sol path does);
`per_expert` (Wan2.2: `dense_steps` counted within each expert's run of steps, `sparse_routing`); `precision`
("exact" by default: the exact blocks in the model's dtype; "int8" / "e4m3": the exact blocks through fp8_attention's
quantized tile, Q.K^T in INT8 or FP8 on mean-smoothed keys) and `pv` (P.V of those blocks in FP8, INT8 or bf16). The
contract is approximate either way (results say exact=False); a low precision adds fp8_attention's quantization error
to the routing's and needs FP8 tensor cores (sm_89+).

Receipts: `sparse_calls`, `dense_calls` (split into `dense_step_calls` and `dense_block_calls`),
`protected_rows`, `notes["mean_density"]` (fraction of exact block pairs over the sparse calls),
`notes["prefix_rows"]`, and with a low precision `notes["precision"]` (e.g. "int8, pv fp8").

Head dims 32, 64 and 128 run as they are, others up to 128 zero-padded to the next (demo-av: 48 -> 64).

Which kernel: the Triton kernel, except on sm_90 (H100/H200) for a low precision whose (precision, pv) pair the CuTe
kernel serves (`kernels.block_sparse_attend.SM90_PAIRS`) on bf16 calls at head dim 128 when the CuTe DSL is installed
(the `flash4` extra): there `kernels.fp8_attention_sm90` runs the whole sparse attention. On a CPU outside the Triton
interpreter the kernel's torch reference serves the calls (the same routing and maths in fp32, `sparse_kernels`).
`notes["path"]` names the path.

Fail closed: head dim > 128, a dtype other than bfloat16/float32, a family without routable self-attention, a low
precision on a GPU below sm_89, or a routed call with a mask / causal / context-parallel layout is a RuntimeError;
never a silent dense run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.attention.sparse_kernels import CUTE, KERNEL, LOW_PRECISION, block_sparse_attend, path
from workbench.accelerations.attention.sparse_routing import (
    ROUTED,
    ROUTED_ORDER,
    TAU_HELP,
    RoutedHandle,
    Router,
    Settings,
    SparseAttentionConfig,
    needs_self_attention,
)
from workbench.accelerations.base import Knob, Spec, option
from workbench.kernels import _runtime
from workbench.kernels.block_sparse_attend import sm90_serves
from workbench.kernels.block_sparse_attention import DTYPES, MAX_HEAD_DIM, PRECISIONS
from workbench.kernels.fp8_attention import PV_MODES


@dataclass(frozen=True)
class BlockSparseConfig(SparseAttentionConfig):
    """block_sparse's options: the sparse-attention options, with `tau` 0 (exact above the blocks' mean score)."""

    tau: float = option(0.0, help=TAU_HELP)
    precision: str = option("exact", allowed=PRECISIONS, help="exact blocks in the model's dtype, or INT8/FP8 Q.K^T")
    pv: str = option("fp8", allowed=PV_MODES, help="P.V of low-precision exact blocks: FP8, INT8 or bf16")


class _Installed(RoutedHandle):
    def __init__(self, spec: Spec, options: dict[str, Any], router: Router, path: str):
        super().__init__(spec, options, router)
        self.path = path

    def report(self) -> dict[str, Any]:
        self.receipt.notes["path"] = self.path
        if self.options["precision"] != "exact":  # the default's receipt stays as it was
            self.receipt.notes["precision"] = f"{self.options['precision']}, pv {self.options['pv']}"
        return super().report()


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    if options["precision"] != "exact":
        _runtime.check_fp8("block_sparse", device)
    settings = Settings.from_options(options, extra=LOW_PRECISION)
    router = Router("block_sparse", model, None, block_sparse_attend, lambda rows: settings, options["per_expert"])
    router.check_modules(MAX_HEAD_DIM, DTYPES)
    kernel_path = path(device)
    if kernel_path == KERNEL and sm90_serves(options["precision"], options["pv"], device):
        kernel_path = f"{CUTE} for bf16 at head dim 128, {KERNEL} otherwise"
    return lambda: _Installed(SPEC, options, router, kernel_path)


SPEC = Spec(
    name="block_sparse",
    contract="approximate",
    summary="self-attention through an own Triton block-sparse kernel with Sol-style routing (Wan, LTX-2, H3)",
    prepare_fn=_prepare,
    config=BlockSparseConfig,
    knob=Knob("tau", -1.0, 3.0),
    requires=needs_self_attention,
    # The processors and dispatcher entry it routes (after a dense backend's, which serves the other calls); and
    # the blocks' compiled call, because compiling over the routed processors is not verified (the seed's Sol path
    # refuses compile too).
    touches=(ROUTED, "blocks.compiled_call"),
    order=ROUTED_ORDER,
)
SPECS = (SPEC,)
