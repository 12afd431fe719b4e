"""Transformer-block glue through Triton kernels that keep torch's rounding boundaries (contract: rounding).

Each supported block gets an instance-level `forward` that is diffusers 0.42.x's own forward op for op, except
that its pointwise AdaLN glue runs as Triton kernels that round where torch rounds. The forwards are the families'
(`Family.fused.ops`, in workbench/models/fused/):

- Wan (`WanTransformerBlock`, fused/wan.py): the modulation `(norm(x.float()) * (1 + scale) + shift).type_as(x)`
  and the gated residuals `(x.float() + y * gate).type_as(x)` (fp32 arithmetic, one cast: `adaln_modulate`,
  `gated_residual`); with `rope` on, attn1's rotary step on q and k as `qk_norm_rope.rope_only`, after diffusers'
  own `norm_q`/`norm_k` (the fused RMSNorm+RoPE kernel is a `reduction`, so the RMSNorm stays torch's).
- LTX-2 (`LTX2VideoTransformerBlock`, fused/ltx2.py), video and audio streams: `norm(x) * (1 + scale) + shift`
  and `x + y * gate` on same-dtype tensors, every op rounded to that dtype (`*_in_dtype` kernels), for the
  self-attention, a2v/v2a cross-attention, feed-forward and (LTX-2.3) text cross-attention modulations.
- MiniMax-H3 (`MiniMaxH3TransformerBlock`, fused/h3.py): the same in-dtype forms with the per-row
  (timestep, modality) table lookup done inside the kernels.
Everything else (norms, attention, FFNs, plain residual adds) is the block's own submodules, in the same order.

What is proven where:
- CPU, Triton interpreter (CI): tests compare every fused block with the stock block by `torch.equal` on fresh
  random inputs (bf16 and fp32, several shapes) and whole tiny-model requests (tiny-wan, tiny-ltx2, tiny-h3, bf16
  and fp32) with and without the plugin (tests/accelerations/fused/test_fused_block_ops*.py).
- GPU (kernels compiled with FP fusion off): `python -m benchmarks run forward-wan`'s `bit-equal` arm (this plugin
  with adaln_precompute and cross_kv_cache, the rotary kernel included) checks `torch.equal` to stock on a
  Wan2.1-1.3B-shaped forward (docs/measurements.md). The LTX-2 and H3 blocks (the in-dtype kernels) have no GPU
  check yet: on a GPU they are **unverified**.

Options: `rope` = "auto" (the rotary kernel where the family has one wired: Wan), "on" (the same, and a
RuntimeError at prepare for a family without one: LTX-2, H3), "off" (torch's rotary).

Fail closed: on CPU the kernels need `TRITON_INTERPRET=1` (a RuntimeError at prepare says so). A call the kernels
cannot take (another dtype, grad mode, a shape the block does not normally see, another plugin's attention
processor for the rotary step) runs the stock code for that piece and is counted under `fallbacks` with its reason.
Receipts: `blocks_fused`, `adaln_modulate_calls`, `gated_residual_calls`, `rope_calls`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.base import Handle, Spec, option
from workbench.accelerations.fused.blocks import fused_blocks, triton_unusable


class _Installed(Handle):
    def __init__(
        self, spec: Spec, options: dict[str, Any], fused: Any, blocks: list[torch.nn.Module], device: torch.device
    ):
        super().__init__(spec, options, proof=("adaln_modulate_calls", "gated_residual_calls", "rope_calls"))
        # the block forwards count from inside a block a user may torch.compile: fixed keys count as tensors
        # there (Receipt docstring); a fallback's reason names its shapes, so a fallback under compile runs eagerly
        self.receipt.traceable(device, counters=(*self.receipt.proof, "blocks_fused"))
        self.blocks = blocks
        self.shared: dict = {}  # per-handle state the family forwards share (H3: the last checked index)
        for block in blocks:
            block.forward = fused.ops(block, self.receipt, options, self.shared)

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.shared.clear()

    def end_request(self, request_id: int) -> None:
        self.shared.clear()

    def _remove(self) -> None:
        self.shared.clear()
        for block in self.blocks:
            del block.forward


@dataclass(frozen=True)
class FusedBlockOpsConfig:
    """fused_block_ops' options."""

    rope: str = option(
        "auto",
        allowed=("auto", "on", "off"),
        help="rotary step of self-attention as a kernel: auto = where wired (Wan), on = required, off = torch",
    )


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    family = model.family
    if options["rope"] == "on" and not family.fused.rope:
        raise RuntimeError(
            f"fused_block_ops.rope='on': {family.name}'s blocks ({list(family.block_classes)}) have no rotary kernel "
            "wired; use rope='auto' or 'off'"
        )
    blocks = fused_blocks(SPEC.name, model, device)
    return lambda: _Installed(SPEC, options, family.fused, blocks, device)


def _requires(family: Any) -> str | None:
    return None if family.fused is not None else "no fused block forwards are wired for its blocks"


SPEC = Spec(
    name="fused_block_ops",
    contract="rounding",
    summary="AdaLN modulation, gated residuals (and Wan's rotary step) of each block as Triton kernels with torch's rounding",
    prepare_fn=_prepare,
    config=FusedBlockOpsConfig,
    requires=_requires,
    touches=("blocks.forward",),
    order=40,
    unusable=triton_unusable,
)
SPECS = (SPEC,)
