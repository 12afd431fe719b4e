"""fused_block_ops and fused_block_norms for `MiniMaxH3TransformerBlock` (diffusers 0.42.x); see those plugins for
the contracts.

H3's block modulates per row of its packed sequence: `norm(x) * (1.0 + scale.index_select(0, idx)) +
shift.index_select(0, idx)` and `residual + gate.index_select(0, idx) * out`, where the (timesteps * 3, C) tables
come from the block's `adaln_proj` in the block stack's dtype and `norm1`/`norm2` (torch's RMSNorm) return x's
dtype. These run as the in-dtype kernels with the index read in the kernel, so the six (S, C) gathers per block
are never materialised; the rounding is torch's (each op to the common dtype). `adaln_proj`, the norms, the
attention and the SwiGLU FFN are the block's own modules. fused_block_norms adds `QKNormRope`: the attention's
q/k RMSNorms also apply the rotary step, as one `head_norm_rope` kernel each.

Index range: the kernels do not bounds-check `adaln_indices` (torch's `index_select` does). The indices are
checked here against the table once per distinct index tensor (one device sync per denoiser call, not per
block); out-of-range indices run the stock forward, which raises as it would without the plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from workbench.models.family import FusedBlocks
from workbench.models.fused.guards import InDtypeOps, block_reason, hooked

NORMS = ("norm_q", "norm_k")


def _norm_reason(norm: torch.nn.Module, x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    """Why one q/k RMSNorm call cannot take the kernel (then torch's norm and diffusers' rotary run), or None."""
    from workbench.kernels.head_norm_rope import DTYPES

    cos, sin = tables
    d = x.shape[-1]
    if type(norm) is not torch.nn.RMSNorm or tuple(norm.normalized_shape) != (d,) or norm.weight is None:
        return f"{type(norm).__name__} over {tuple(getattr(norm, 'normalized_shape', ()))} is not an affine RMSNorm"
    if x.ndim != 4 or x.dtype not in DTYPES or norm.weight.dtype != x.dtype:
        return f"q/k of shape {tuple(x.shape)} in {x.dtype} with a {norm.weight.dtype} weight"
    rot = cos.shape[-1]
    if cos.dtype != torch.float32 or cos.shape != (x.shape[1], rot) or sin.shape != cos.shape or rot % 2 or rot > d:
        return f"rotary tables of shape {tuple(cos.shape)} {cos.dtype} for q/k {tuple(x.shape)}"
    if torch.is_grad_enabled() and (x.requires_grad or norm.weight.requires_grad):
        return "autograd: the kernels have no backward"
    return None


class QKNormRope:
    """One H3 attention module's q/k RMSNorms as `head_norm_rope` kernels that also apply the rotary step.

    The block calls its attention with `rotary_emb=None`, so the processor (the stock one, or a plugin's wrapper
    around it, e.g. block_sparse's router) skips its own rotary, and hands the tables to the norms through
    `tables` for that call. The norms get instance-level forwards; with no tables they run torch's RMSNorm as
    before. If the processor did not call norm_q and norm_k once each, the call is redone the stock way and
    counted as a fallback (the rotary would otherwise be missing)."""

    def __init__(self, attn: torch.nn.Module, receipt: Any):
        self.attn, self.receipt = attn, receipt
        self.tables: tuple[torch.Tensor, torch.Tensor] | None = None
        self.norm_calls = 0
        for name in NORMS:
            norm = getattr(attn, name)
            norm.forward = self._forward_for(norm)

    def _forward_for(self, norm: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

        from workbench.kernels.head_norm_rope import head_norm_rope

        stock = type(norm).forward.__get__(norm)

        def forward(x: torch.Tensor) -> torch.Tensor:
            if self.tables is None:
                return stock(x)
            self.norm_calls += 1
            reason = _norm_reason(norm, x, self.tables)
            if reason is not None:
                self.receipt.count_fallback(f"qk norm + rotary: {reason}")
                return _apply_rotary_emb(stock(x), *self.tables)
            self.receipt.count("qk_norm_rope_calls")
            eps = torch.finfo(x.dtype).eps if norm.eps is None else norm.eps
            return head_norm_rope(x, norm.weight, eps, *self.tables)

        return forward

    def __call__(
        self, hidden_states: torch.Tensor, rotary_emb: Any, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        if rotary_emb is None:
            return self.attn(hidden_states, None, attention_mask)
        self.tables, self.norm_calls = tuple(rotary_emb), 0
        try:
            out = self.attn(hidden_states, None, attention_mask)
        finally:
            self.tables = None
        if self.norm_calls != 2:
            self.receipt.count_fallback("attention processor did not call norm_q and norm_k once each")
            return self.attn(hidden_states, rotary_emb, attention_mask)
        return out

    def remove(self) -> None:
        for name in NORMS:
            del getattr(self.attn, name).forward


def qk_norms_reason(block: torch.nn.Module) -> str | None:
    """Why a block's q/k norms cannot get QKNormRope's forwards (checked at prepare), or None."""
    for name in NORMS:
        norm = getattr(block.attn, name, None)
        if type(norm) is not torch.nn.RMSNorm or hooked(norm):
            return f"attn.{name} is {type(norm).__name__}{' with hooks' if norm is not None and hooked(norm) else ''}"
    return None


def forward_for(
    block: torch.nn.Module, receipt: Any, checked: dict, attention: Callable[..., torch.Tensor] | None = None
) -> Any:
    """An instance-level forward for one MiniMaxH3TransformerBlock. `checked` is shared by the handle's blocks: the
    last index tensor seen, the table rows it was checked against, and whether its values were in range.
    `attention(hidden_states, rotary_emb, attention_mask)` replaces `block.attn` (fused_block_norms: QKNormRope)."""
    stock = type(block).forward.__get__(block)
    ops = InDtypeOps(receipt)
    attend = block.attn if attention is None else attention

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
        attn_output = attend(norm_hidden_states, rotary_emb, attention_mask)
        hidden_states = ops.residual(residual, attn_output, gate_msa, adaln_indices)

        residual = hidden_states
        norm_hidden_states = ops.modulate(block.norm2(hidden_states), scale_mlp, shift_mlp, adaln_indices)
        ff_output = block.ff(norm_hidden_states)
        hidden_states = ops.residual(residual, ff_output, gate_mlp, adaln_indices)
        receipt.count("blocks_fused")
        return hidden_states

    return forward


def norms_forward_for(block: torch.nn.Module, receipt: Any, checked: dict) -> tuple[Any, Callable[[], None]]:
    """fused_block_norms' forward for one block (`forward_for` with `QKNormRope` as its attention) and its undo."""
    qk = QKNormRope(block.attn, receipt)
    return forward_for(block, receipt, checked, qk), qk.remove


FUSED = FusedBlocks(
    ops=lambda block, receipt, options, shared: forward_for(block, receipt, shared),
    norms=norms_forward_for,
    norms_check=qk_norms_reason,
)
