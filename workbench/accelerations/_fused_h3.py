"""fused_block_ops for `MiniMaxH3TransformerBlock` (diffusers 0.42.x); see fused_block_ops.py for the contract.

H3's block modulates per row of its packed sequence: `norm(x) * (1.0 + scale.index_select(0, idx)) +
shift.index_select(0, idx)` and `residual + gate.index_select(0, idx) * out`, where the (timesteps * 3, C) tables
come from the block's `adaln_proj` in the block stack's dtype and `norm1`/`norm2` (torch's RMSNorm) return x's
dtype. These run as the in-dtype kernels with the index read in the kernel, so the six (S, C) gathers per block
are never materialised; the rounding is torch's (each op to the common dtype). `adaln_proj`, the norms, the
attention (with its partial rotate-half rotary) and the SwiGLU FFN are the block's own modules.

Index range: the kernels do not bounds-check `adaln_indices` (torch's `index_select` does). The indices are
checked here against the table once per distinct index tensor (one device sync per denoiser call, not per
block); out-of-range indices run the stock forward, which raises as it would without the plugin.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.accelerations._fused_ops import InDtypeOps, block_reason


def forward_for(block: torch.nn.Module, receipt: Any, options: dict[str, Any], checked: dict) -> Any:
    """An instance-level forward for one MiniMaxH3TransformerBlock. `checked` is shared by the handle's blocks: the
    last index tensor seen, the table rows it was checked against, and whether its values were in range."""
    stock = type(block).forward.__get__(block)
    ops = InDtypeOps(receipt)

    def in_range(index: torch.Tensor, rows: int) -> bool:
        # keyed by identity while a reference is held (an address or version key is unsafe: the allocator reuses
        # addresses, and inference tensors have no version counter)
        if checked.get("index") is not index or checked.get("rows") != rows:
            ok = bool(index.numel() == 0 or (index.min() >= 0 and index.max() < rows))
            checked.update(index=index, rows=rows, ok=ok)
        return checked["ok"]

    def forward(
        hidden_states: torch.Tensor,
        temb: torch.Tensor,
        adaln_indices: torch.Tensor,
        rotary_emb: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        reason = block_reason(block, hidden_states)
        if reason is not None:
            receipt.count_fallback(reason)
            return stock(hidden_states, temb, adaln_indices, rotary_emb, attention_mask)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaln_proj(temb)
        if not in_range(adaln_indices, shift_msa.shape[0]):
            receipt.count_fallback("adaln_indices out of range of the modulation table")
            return stock(hidden_states, temb, adaln_indices, rotary_emb, attention_mask)

        residual = hidden_states
        norm_hidden_states = ops.modulate(block.norm1(hidden_states), scale_msa, shift_msa, adaln_indices)
        attn_output = block.attn(norm_hidden_states, rotary_emb, attention_mask)
        hidden_states = ops.residual(residual, attn_output, gate_msa, adaln_indices)

        residual = hidden_states
        norm_hidden_states = ops.modulate(block.norm2(hidden_states), scale_mlp, shift_mlp, adaln_indices)
        ff_output = block.ff(norm_hidden_states)
        hidden_states = ops.residual(residual, ff_output, gate_mlp, adaln_indices)
        receipt.count("blocks_fused")
        return hidden_states

    return forward
