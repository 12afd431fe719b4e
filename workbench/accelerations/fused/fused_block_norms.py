"""Block norms, residual adds and AdaLN glue as a few Triton kernels (contract: reduction). Wan and MiniMax-H3.

What it removes is the pointwise glue a block still runs with `fused_block_ops`: torch's fp32 LayerNorms, the
bf16 -> fp32 copies around them, the modulations, casts and residual adds, and torch's q/k RMSNorms (each a full
pass over the residual stream). Each `WanTransformerBlock` gets an instance-level forward that is diffusers 0.42.x's
forward with:

- norm1 + modulation: one `layernorm_modulate` reading bf16 x (no fp32 copy of the residual stream);
- attn1 run here as `WanAttnProcessor` runs self-attention (`workbench.models.fused.wan.self_attention`), with
  norm_q/norm_k and the rotary step as one `qk_norm_rope` kernel each for q and k;
- both gated residuals `(x.float() + y * gate).type_as(x)` as `gated_residual` (torch's rounding);
- norm2 (affine FP32LayerNorm) as `layernorm_modulate` with weight and bias (an Identity norm2 passes x itself,
  which is what `Identity(x.float()).type_as(x)` returns);
- `x + attn2_output` fused into norm3's call (`add_layernorm_modulate`): it writes the new residual stream (bit-equal
  to torch's add) and the modulated norm. attn2, the FFN and the projections are the block's own modules.

Why `reduction`, not `rounding`: the LayerNorm and RMSNorm row statistics are summed in another order than torch's
(kernels/layernorm_modulate.py, kernels/qk_norm_rope.py), so a normed value can differ by about an ulp of its dtype,
and those differences travel through attention and the FFN. Bounds tested on the CPU interpreter
(tests/accelerations/fused/test_fused_block_norms.py): one block vs a float64 run of the stock block, the fused block's
max-abs and relative-L2 errors are at most 2x the stock block's own (bf16 or fp32) plus a small floor; a whole
tiny-wan request stays within a stated relative-L2 of the stock request. On a GPU its speed and distance to stock are
measured inside the exact-fast profile (`python -m benchmarks run forward-wan`, docs/measurements.md).

MiniMax-H3 (`MiniMaxH3TransformerBlock`): fused_block_ops' H3 forward (in-dtype modulation and gated residuals with
the per-row AdaLN index, torch's rounding) plus the attention's q/k RMSNorm + rotate-half rotary as one
`head_norm_rope` kernel each (`QKNormRope`), in place of two RMSNorm launches, eight concatenation copies and the
pointwise passes of the rotary per block. Both forwards are the families' (`Family.fused.norms`, in
workbench/models/fused/wan.py and h3.py). `python -m benchmarks run forward-h3` measures it at the 33.1B model's
52,648 rows (exact-fast and block_sparse+norms arms). Its norms' sums of squares are summed in another order than
torch's (kernels/head_norm_rope.py): `reduction` as for Wan.

Fail closed: on CPU the kernels need `TRITON_INTERPRET=1` (RuntimeError at prepare); a block whose forward another
plugin replaced (e.g. fused_block_ops, which also touches `blocks.forward`) is refused. A call the kernels cannot
take (grad mode, another dtype or shape, replaced or hooked norms, another attn1 processor) runs the stock code for
that piece and is counted under `fallbacks` with its reason.
Receipts: `blocks_fused`, `layernorm_modulate_calls`, `qk_norm_rope_calls`, `gated_residual_calls` (and
`rope_calls` when q/k fall back to torch's RMSNorm and the rotary kernel); H3 also `adaln_modulate_calls`.
No options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.base import Handle, Spec
from workbench.accelerations.fused.blocks import fused_blocks, triton_unusable

NAME = "fused_block_norms"
PROOF = ("layernorm_modulate_calls", "qk_norm_rope_calls", "gated_residual_calls")


class _Installed(Handle):
    def __init__(
        self, spec: Spec, options: dict[str, Any], fused: Any, blocks: list[torch.nn.Module], device: torch.device
    ):
        super().__init__(spec, options, proof=PROOF)
        # counted from inside a block a user may torch.compile: fixed keys count as tensors there (Receipt)
        self.receipt.traceable(device, counters=(*PROOF, "blocks_fused", "rope_calls", "adaln_modulate_calls"))
        self.blocks = blocks
        self.checked: dict = {}  # per-handle state the family forwards share (H3: the last AdaLN index checked)
        self.undo: list = []  # what the family forwards installed besides themselves (H3: the q/k norm forwards)
        for block in blocks:
            block.forward, undo = fused.norms(block, self.receipt, self.checked)
            if undo is not None:
                self.undo.append(undo)

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.checked.clear()

    def end_request(self, request_id: int) -> None:
        self.checked.clear()

    def _remove(self) -> None:
        self.checked.clear()
        for undo in self.undo:
            undo()
        for block in self.blocks:
            del block.forward


@dataclass(frozen=True)
class FusedBlockNormsConfig:
    """fused_block_norms takes no options."""


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    fused = model.family.fused
    blocks = fused_blocks(NAME, model, device)
    for block in blocks:
        reason = fused.norms_check(block)
        if reason is not None:
            raise RuntimeError(f"{NAME}: a {type(block).__name__}'s {reason}; another plugin changed it?")
    return lambda: _Installed(SPEC, options, fused, blocks, device)


def _requires(family: Any) -> str | None:
    if family.fused is None or family.fused.norms is None:
        return "no fused_block_norms forward is wired for its blocks"
    return None


SPEC = Spec(
    name=NAME,
    contract="reduction",
    summary="block norms (+ residual add, modulation), q/k RMSNorm + rotary and gated residuals as Triton kernels",
    prepare_fn=_prepare,
    config=FusedBlockNormsConfig,
    requires=_requires,
    touches=("blocks.forward", "attention.qk_norms"),
    order=40,
    unusable=triton_unusable,
)
SPECS = (SPEC,)
