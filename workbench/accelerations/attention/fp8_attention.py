"""fp8_attention: a family's self-attention through the own low-bit attention kernels (contract: approximate).

The kernel (`workbench.kernels.fp8_attention`) quantizes q and the mean-smoothed k per 128-token block to int8
(`qk="int8"`, the plugin's default) or e4m3 (`qk="e4m3"`, the kernel functions' default), runs Q.K^T as an INT8 dot
with int32 accumulation or an FP8 dot with fp32 accumulation, the online softmax in fp32, and P.V in FP8
(`pv="fp8"`), INT8 (`pv="int8"`: P scaled to each key tile's row max, int32 accumulation) or bf16 (`pv="bf16"`).
Every key stays in the softmax: it is dense attention at lower precision, not sparse.

Why int8 is the plugin's default Q.K^T: both take one byte an element and run on Hopper's tensor cores at the same
rate, and int8's 127 uniform levels a block lose less than e4m3's 3 mantissa bits on q and smoothed k: against bf16
dense attention int8 Q.K^T has the lower error at every P.V precision, on iid inputs and on q/k with a shared channel
offset and outlier channels. For P.V the same holds: int8 P (127 levels from each tile's row max) and int8 v (per
channel) lose less than e4m3's 3 mantissa bits on P and v, so pv="int8" has a lower error than pv="fp8" (and bf16
P.V a lower one still) on the same inputs. The measured errors are the record's (`arms[*].rel_l2_vs_dense` in
benchmarks/results/fp8-attention.json); tests/kernels/test_fp8_attention.py holds the bounds. pv="fp8" stays the
default because it is the faster call: each tile's int8 P.V is folded into O in fp32 (a conversion and a multiply-add
per accumulator value), which an e4m3 P.V accumulates in the dot itself (the `fp8-attention` scenario times both
pairs).

The calls reach it the way `block_sparse`'s do (`sparse_routing`): the stock processor computes q/k/v and only the
self-attention modules the family adapter names are routed (Wan `attn1`, LTX-2 video `attn1`, H3's packed joint
`attn`); cross-attention, LTX-2's audio stream and everything else run the untouched backend, or the one a
dense-backend plugin installed with it chose (flash4_attention on the exact-fast profile: `sparse_routing`). The
same family rules hold: `protect_prefix` ("family" by default) gives the first query rows of each call the backend's
dense attention in the model's dtype, which on H3 are the text, conditioning and audio rows (so audio queries stay
bf16); 0 sends every query through FP8. `dense_steps` / `dense_blocks` keep the first steps / blocks dense;
`per_expert` counts `dense_steps` within each Wan2.2 expert.

Receipts: `fp8_calls` (calls the kernel served), `dense_calls` (split into `dense_step_calls` and
`dense_block_calls`), `protected_rows`, fallbacks (a perturbed pass whose processor skipped attention),
`notes["pv"]` and `notes["qk"]`; `sparse_calls` is the router's name for the same calls as `fp8_calls`.

Head dims 32, 64 and 128 run as they are, others up to 128 zero-padded to the next (demo-av: 48 -> 64).

Which kernel: the Triton kernel, except on sm_90 (H100/H200) with pv="fp8" or "int8" at head dim 128 when the CuTe
DSL is installed (nvidia-cutlass-dsl, the `flash4` extra): there the CuTe kernel (`kernels.fp8_attention_sm90`,
FlashAttention-3's warp-specialized schedule) runs the same steps, its row sums taken from the P.V dot (P as rounded
to e4m3 or int8; `kernels.fp8_attention.sm90_kernel`). `notes["path"]` says which.

On a CPU outside the Triton interpreter the kernel's torch reference serves the calls (the same quantization and
maths in fp32, `kernels.fp8_attention.reference`); `notes["path"]` names the path taken.

Fail closed (RuntimeError with the reason): a CUDA device below sm_89 (no e4m3 tensor cores), head dim > 128, a dtype
other than bfloat16/float32, a family without routable self-attention, or a routed call with a mask / causal /
context-parallel layout; never a silent dense run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.attention.sparse_kernels import CUTE, KERNEL, kernel_attend, path
from workbench.accelerations.attention.sparse_routing import (
    FAMILY,
    ROUTED,
    ROUTED_ORDER,
    Call,
    RoutedHandle,
    Router,
    RowsOption,
    Settings,
    needs_self_attention,
)
from workbench.accelerations.base import Knob, Spec, option
from workbench.kernels import _runtime
from workbench.kernels._runtime import MAX_HEAD_DIM
from workbench.kernels.fp8_attention import DTYPES, PV_MODES, QK_MODES, fp8_attention, reference, sm90_serves
from workbench.models import experts

NAME = "fp8_attention"
PRECISIONS = ("qk", "pv")  # the options fp8_attend reads from Settings.extra


@dataclass(frozen=True)
class Fp8AttentionConfig:
    """fp8_attention's options: the Q.K^T and P.V precisions and the dense exceptions the sparse plugins also take."""

    qk: str = option("int8", allowed=QK_MODES, help="Q.K^T in INT8 (closer to dense) or FP8 e4m3")
    pv: str = option("fp8", allowed=PV_MODES, help="P.V in FP8 (fastest kernel), INT8 or bf16 (closest to dense)")
    dense_steps: int = option(0, minimum=0, help="first denoising steps run dense")
    dense_blocks: int = option(0, minimum=0, help="first transformer blocks run dense")
    protect_prefix: int | str = option(
        FAMILY, cls=RowsOption, help="first query rows take dense attention; 'family': text/conditioning/audio"
    )
    per_expert: bool = option(True, help=experts.PER_EXPERT_HELP)


def unusable(device: torch.device) -> str | None:
    """Why the kernel cannot run on `device` here, or None."""
    if device.type not in ("cpu", "cuda"):
        return f"the kernel runs on cuda (its torch reference on cpu), not {device}"
    return _runtime.fp8_problem(device)


def fp8_attend(call: Call) -> tuple[torch.Tensor, None]:
    """`kernel_attend` with the low-bit kernel at the setting's `extra` precisions (`PRECISIONS`), counted as
    `fp8_calls`."""
    extra = call.settings.extra
    out, _ = kernel_attend(
        call, NAME, fp8_attention, reference, (MAX_HEAD_DIM, DTYPES), call.kwargs.get("scale"), extra["pv"],
        qk=extra["qk"],
    )  # fmt: skip
    call.router.receipt.count("fp8_calls", expert=call.router.expert)
    return out, None


class _Installed(RoutedHandle):
    def __init__(self, spec: Spec, options: dict[str, Any], router: Router, path: str):
        super().__init__(spec, options, router)
        self.receipt.proof = ("fp8_calls",)
        self.path = path

    def report(self) -> dict[str, Any]:
        self.receipt.notes["path"] = self.path
        self.receipt.notes["pv"] = self.options["pv"]
        self.receipt.notes["qk"] = self.options["qk"]
        return super().report()


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    reason = unusable(device)
    if reason is not None:
        raise RuntimeError(f"{NAME}: {reason}")
    settings = Settings.from_options(options, extra=PRECISIONS)
    router = Router(NAME, model, None, fp8_attend, lambda rows: settings, options["per_expert"])
    router.check_modules(MAX_HEAD_DIM, DTYPES)
    kernel_path = path(device)
    if kernel_path == KERNEL and sm90_serves(options["pv"], device):
        kernel_path = f"{CUTE} at head dim 128, {KERNEL} at others"
    return lambda: _Installed(SPEC, options, router, kernel_path)


SPEC = Spec(
    name=NAME,
    contract="approximate",
    summary="self-attention through own low-bit attention kernels (INT8/FP8 Q.K^T, smoothed keys; Wan, LTX-2, H3)",
    prepare_fn=_prepare,
    config=Fp8AttentionConfig,
    requires=needs_self_attention,
    # the processors and dispatcher entry it routes (after a dense backend's, which serves the other calls), and
    # the blocks' compiled call (compiling over routed processors is not verified), as block_sparse
    touches=(ROUTED, "blocks.compiled_call"),
    order=ROUTED_ORDER,
    # calibration: the fewest first steps kept dense (SageAttention-style warm-up) inside the budget; 8 dense is the
    # least aggressive tried, 0 (every step low-bit) the most
    knob=Knob("dense_steps", 8, 0, integer=True),
    unusable=unusable,
    capabilities=(89, 90, 100),  # e4m3 tensor cores: Ada, Hopper, Blackwell
)
SPECS = (SPEC,)
