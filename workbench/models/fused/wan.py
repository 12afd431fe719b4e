"""The fused forwards of `WanTransformerBlock` (diffusers 0.42.x); see the fused_block_ops and fused_block_norms
plugins for the contracts. `FUSED` is what the Wan family names (`Family.fused`).

`forward_for` (fused_block_ops) is the block's forward, op for op, with:
- the AdaLN modulation `(norm(x.float()) * (1 + scale) + shift).type_as(x)` and the gated residuals
  `(x.float() + y * gate).type_as(x)` each as one Triton kernel (fp32 arithmetic, one cast at the end);
- with `rope` on, attn1's rotary step (`WanAttnProcessor`'s `apply_rotary_emb` on q and k) as the `rope_only`
  kernel. attn1 is then run here as `WanAttnProcessor.__call__` runs it for self-attention: the same projections,
  diffusers' own `norm_q`/`norm_k` (torch's RMSNorm: the fused RMSNorm kernel is a `reduction` and is not used),
  the same `dispatch_attention_fn` call with the processor's backend and parallel config, the same output
  projection. Only a stock `WanAttnProcessor` (or a routing plugin's wrapper of one: the router then decides the
  call, as `sparse_routing.routing` says) on an attn1 without hooks is taken over; any other (another plugin's
  wrapper, a hooked module) runs as it is and the call is counted under `fallbacks`.

`norms_forward_for` (fused_block_norms) shares `self_attention`, `wan_block_reason`, `modulation_chunks` and
`attn1_reason` with it, passes the fused RMSNorm+rotary kernel (`qk_norm_rope`) for q and k, and runs the block's
LayerNorms (with the modulation, and norm3 with the residual add before it) as `layernorm_modulate` kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.models.family import FusedBlocks
from workbench.models.fused.guards import block_reason, hooked

ROPE_X_DTYPES = (torch.bfloat16, torch.float32)
ROPE_FREQ_DTYPES = (torch.float32, torch.float64)


def _stock_rotary(hidden_states: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """diffusers 0.42's `apply_rotary_emb` inside `WanAttnProcessor.__call__`, verbatim."""
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


def attn1_reason(attn: torch.nn.Module) -> str | None:
    """Why attn1 cannot be run here with the rotary kernel (then it runs as it is), or None."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    # imported here, not at the top: the accelerations package loads the model families, this module among them
    from workbench.accelerations.attention.sparse_routing import unrouted

    processor = unrouted(attn.processor)  # a router's wrapper is taken too: self_attention makes its decision
    if type(processor) is not WanAttnProcessor:
        return f"attn1 processor is {type(processor).__name__}, not a stock WanAttnProcessor"
    if hooked(attn):
        return "attn1 has hooks or a replaced forward"
    if attn.add_k_proj is not None:
        return "attn1 has image key/value projections"
    return None


def _rope_reason(query: torch.Tensor, rotary_emb: Any) -> str | None:
    if not (isinstance(rotary_emb, (tuple, list)) and len(rotary_emb) == 2):
        return f"rotary_emb of type {type(rotary_emb).__name__}"
    b, t, h, d = query.shape
    if query.dtype not in ROPE_X_DTYPES:
        return f"q/k dtype {query.dtype}"
    if d % 2:
        return f"odd head dim {d}"
    cos, sin = rotary_emb
    for f in (cos, sin):
        if f.dtype not in ROPE_FREQ_DTYPES or f.dtype != cos.dtype or f.device != query.device:
            return f"rotary tables of dtype {f.dtype} on {f.device}"
        if f.ndim != 4 or f.shape[0] not in (1, b) or f.shape[1] != t or f.shape[2] not in (1, h) or f.shape[3] != d:
            return f"rotary tables of shape {tuple(f.shape)} for q/k {tuple(query.shape)}"
    return None


def qk_norm_reason(attn: torch.nn.Module, query: torch.Tensor, rotary_emb: Any) -> str | None:
    """Why q/k cannot take the fused RMSNorm+rotary kernel (`qk_norm_rope`; then diffusers' norm_q/norm_k and
    the rotary step run), or None. query: (B, T, C) as projected."""
    if rotary_emb is None:
        return "no rotary_emb"
    for name in ("norm_q", "norm_k"):
        norm = getattr(attn, name)
        if type(norm) is not torch.nn.RMSNorm or hooked(norm):
            return f"{name} is {type(norm).__name__} (with hooks: {hooked(norm)}), not a plain torch.nn.RMSNorm"
        if norm.weight is None or norm.weight.dtype != query.dtype or norm.eps is None:
            return f"{name} without weight or eps, or weight dtype {getattr(norm.weight, 'dtype', None)}"
        if tuple(norm.normalized_shape) != (query.shape[-1],):
            return f"{name} over {tuple(norm.normalized_shape)}, not across heads ({query.shape[-1]},)"
    from workbench.kernels.qk_norm_rope import row_tile_problem  # the plugin's kernels: triton is there

    if (problem := row_tile_problem(attn.heads, query.shape[-1] // attn.heads)) is not None:
        return f"q/k of {problem}"
    return _rope_reason(query.unflatten(2, (attn.heads, -1)), rotary_emb)


def _norm_then_rope(attn, query, key, rotary_emb, receipt, rope):
    """diffusers' norm_q/norm_k, then the rotary step as `rope` (a kernel) where it can take it."""
    query = attn.norm_q(query)
    key = attn.norm_k(key)
    query = query.unflatten(2, (attn.heads, -1))  # (B, T, H, D)
    key = key.unflatten(2, (attn.heads, -1))
    if rotary_emb is not None:
        reason = _rope_reason(query, rotary_emb)
        if reason is None:
            query = rope(query, *rotary_emb)
            key = rope(key, *rotary_emb)
            receipt.count("rope_calls", 2)
        else:
            receipt.count_fallback(f"rope: {reason}")
            query = _stock_rotary(query, *rotary_emb)
            key = _stock_rotary(key, *rotary_emb)
    return query, key


def self_attention(
    attn: torch.nn.Module,
    hidden_states: torch.Tensor,
    rotary_emb: Any,
    receipt: Any,
    rope: Any,
    qk_norm_rope: Any = None,
) -> torch.Tensor:
    """`WanAttnProcessor.__call__(attn, hidden_states, None, None, rotary_emb)` with the rotary kernel `rope`.
    With `qk_norm_rope` (fused_block_norms; contract reduction), norm_q/norm_k and the rotary step run as that one
    kernel for q and for k where `qk_norm_reason` allows; otherwise (fused_block_ops) as before. Under a routing
    plugin (attn1's processor a router's wrapper, `sparse_routing.routing`) the router decides the call and its kernel
    serves the dispatcher call, as when the wrapper runs the stock processor."""
    from workbench.accelerations.attention.sparse_routing import routing

    with routing(attn.processor, hidden_states.shape[1]):
        hidden_states = _self_attention(attn, hidden_states, rotary_emb, receipt, rope, qk_norm_rope)
    hidden_states = attn.to_out[0](hidden_states)
    hidden_states = attn.to_out[1](hidden_states)
    return hidden_states


def _self_attention(attn, hidden_states, rotary_emb, receipt, rope, qk_norm_rope) -> torch.Tensor:
    """self_attention up to the output projection: (B, T, C) attended."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_wan import _get_qkv_projections

    from workbench.accelerations.attention.sparse_routing import unrouted

    processor = unrouted(attn.processor)
    query, key, value = _get_qkv_projections(attn, hidden_states, None)
    reason = None if qk_norm_rope is None else qk_norm_reason(attn, query, rotary_emb)
    if qk_norm_rope is not None and reason is None:
        query = qk_norm_rope(query, attn.norm_q.weight, attn.norm_q.eps, *rotary_emb, attn.heads)  # (B, T, H, D)
        key = qk_norm_rope(key, attn.norm_k.weight, attn.norm_k.eps, *rotary_emb, attn.heads)
        receipt.count("qk_norm_rope_calls", 2)
    else:
        if reason is not None:
            receipt.count_fallback(f"qk_norm_rope: {reason}")
        query, key = _norm_then_rope(attn, query, key, rotary_emb, receipt, rope)
    value = value.unflatten(2, (attn.heads, -1))
    hidden_states = dispatch_attention_fn(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        backend=processor._attention_backend,
        parallel_config=processor._parallel_config,  # self-attention: the stock processor passes it
    )
    return hidden_states.flatten(2, 3).type_as(query)


def modulation_chunks(block: torch.nn.Module, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The block's six fp32 AdaLN chunks (shift, scale, gate; then the FFN's), as its stock forward computes them:
    (B, 1, C) from a (B, 6, C) temb, (B, T, C) from Wan2.2 TI2V's per-token (B, T, 6, C)."""
    if temb.ndim == 4:
        chunks = (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
        return tuple(chunk.squeeze(2) for chunk in chunks)
    return (block.scale_shift_table + temb.float()).chunk(6, dim=1)


def wan_block_reason(block: torch.nn.Module, hidden_states: torch.Tensor, temb: torch.Tensor) -> str | None:
    reason = block_reason(block, hidden_states)
    if reason is None and temb.ndim not in (3, 4):
        reason = f"temb of {temb.ndim} dimensions"
    return reason


def forward_for(block: torch.nn.Module, receipt: Any, options: dict[str, Any]) -> Any:
    """An instance-level forward for one WanTransformerBlock."""
    from workbench.kernels.adaln_modulate import adaln_modulate
    from workbench.kernels.gated_residual import gated_residual
    from workbench.kernels.qk_norm_rope import rope_only

    use_rope = options.get("rope", "auto") != "off"
    stock = type(block).forward.__get__(block)

    def forward(
        hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor, rotary_emb: Any
    ) -> torch.Tensor:
        reason = wan_block_reason(block, hidden_states, temb)
        if reason is not None:
            receipt.count_fallback(reason)
            return stock(hidden_states, encoder_hidden_states, temb, rotary_emb)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = modulation_chunks(block, temb)
        dtype = hidden_states.dtype

        # 1. Self-attention
        norm_hidden_states = adaln_modulate(block.norm1(hidden_states.float()), scale_msa, shift_msa, dtype)
        attn_reason = attn1_reason(block.attn1) if use_rope else None
        if use_rope and attn_reason is None:
            attn_output = self_attention(block.attn1, norm_hidden_states, rotary_emb, receipt, rope_only)
        else:
            if attn_reason is not None:
                receipt.count_fallback(f"rope: {attn_reason}")
            attn_output = block.attn1(norm_hidden_states, None, None, rotary_emb)
        hidden_states = gated_residual(hidden_states, attn_output, gate_msa)

        # 2. Cross-attention (plain residual add: torch's own)
        norm_hidden_states = block.norm2(hidden_states.float()).type_as(hidden_states)
        attn_output = block.attn2(norm_hidden_states, encoder_hidden_states, None, None)
        hidden_states = hidden_states + attn_output

        # 3. Feed-forward; `ff_output.float() * gate` equals `ff_output * gate` (exact upcast, then fp32)
        norm_hidden_states = adaln_modulate(block.norm3(hidden_states.float()), c_scale_msa, c_shift_msa, dtype)
        ff_output = block.ffn(norm_hidden_states)
        hidden_states = gated_residual(hidden_states, ff_output, c_gate_msa)
        receipt.count("adaln_modulate_calls", 2)
        receipt.count("gated_residual_calls", 2)
        receipt.count("blocks_fused")
        return hidden_states

    return forward


def _norms_reason(block: torch.nn.Module, hidden_states: torch.Tensor) -> str | None:
    """Why the block's norms cannot run as the LayerNorm kernel (then the whole block runs stock), or None."""
    from diffusers.models.normalization import FP32LayerNorm

    c = hidden_states.shape[-1]
    for name in ("norm1", "norm2", "norm3"):
        norm = getattr(block, name)
        if name == "norm2" and type(norm) is torch.nn.Identity and not hooked(norm):
            continue
        if type(norm) is not FP32LayerNorm or hooked(norm) or tuple(norm.normalized_shape) != (c,):
            return f"{name} is {type(norm).__name__}, not a plain FP32LayerNorm over ({c},)"
        if name != "norm2" and (norm.weight is not None or norm.bias is not None):
            return f"{name} has an elementwise affine"
    return None


def _modulation_reason(hidden_states: torch.Tensor, chunks: tuple[torch.Tensor, ...]) -> str | None:
    b, t, c = hidden_states.shape
    for chunk in chunks:
        if chunk.ndim != 3 or chunk.shape[0] != b or chunk.shape[1] not in (1, t) or chunk.shape[2] != c:
            return f"modulation of shape {tuple(chunk.shape)} for hidden states {tuple(hidden_states.shape)}"
        if chunk.dtype != torch.float32 or chunk.device != hidden_states.device:
            return f"modulation of dtype {chunk.dtype} on {chunk.device}"
    return None


def norms_forward_for(block: torch.nn.Module, receipt: Any) -> Any:
    """An instance-level forward for one WanTransformerBlock with fused_block_norms' kernels (module docstring)."""
    from workbench.kernels.gated_residual import gated_residual
    from workbench.kernels.layernorm_modulate import add_layernorm_modulate, layernorm_modulate
    from workbench.kernels.qk_norm_rope import qk_norm_rope, rope_only

    stock = type(block).forward.__get__(block)

    def forward(
        hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor, rotary_emb: Any
    ) -> torch.Tensor:
        reason = wan_block_reason(block, hidden_states, temb) or _norms_reason(block, hidden_states)
        if reason is None:
            chunks = modulation_chunks(block, temb)
            reason = _modulation_reason(hidden_states, chunks)
        if reason is not None:
            receipt.count_fallback(reason)
            return stock(hidden_states, encoder_hidden_states, temb, rotary_emb)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = chunks

        # 1. Self-attention: norm1 + modulation from bf16 x; q/k RMSNorm + rotary as one kernel each
        norm_hidden_states = layernorm_modulate(hidden_states, block.norm1.eps, scale=scale_msa, shift=shift_msa)
        attn_reason = attn1_reason(block.attn1)
        if attn_reason is None:
            attn_output = self_attention(
                block.attn1, norm_hidden_states, rotary_emb, receipt, rope_only, qk_norm_rope=qk_norm_rope
            )
        else:
            receipt.count_fallback(f"attn1: {attn_reason}")
            attn_output = block.attn1(norm_hidden_states, None, None, rotary_emb)
        hidden_states = gated_residual(hidden_states, attn_output, gate_msa)

        # 2. Cross-attention: norm2 (affine LayerNorm, or Identity: x itself)
        calls = 2
        if isinstance(block.norm2, torch.nn.Identity):
            norm_hidden_states = hidden_states
        else:
            norm2 = block.norm2
            norm_hidden_states = layernorm_modulate(hidden_states, norm2.eps, norm2.weight, norm2.bias)
            calls = 3
        attn_output = block.attn2(norm_hidden_states, encoder_hidden_states, None, None)

        # 3. Feed-forward: the residual add fused into norm3's call, which also writes the new residual stream
        norm3 = block.norm3
        if attn_output.shape == hidden_states.shape and attn_output.dtype == hidden_states.dtype:
            hidden_states, norm_hidden_states = add_layernorm_modulate(
                hidden_states, attn_output, norm3.eps, scale=c_scale_msa, shift=c_shift_msa
            )
        else:
            receipt.count_fallback(f"residual add: attn2 output {tuple(attn_output.shape)} {attn_output.dtype}")
            hidden_states = hidden_states + attn_output
            norm_hidden_states = layernorm_modulate(hidden_states, norm3.eps, scale=c_scale_msa, shift=c_shift_msa)
        ff_output = block.ffn(norm_hidden_states)
        hidden_states = gated_residual(hidden_states, ff_output, c_gate_msa)
        receipt.count("layernorm_modulate_calls", calls)
        receipt.count("gated_residual_calls", 2)
        receipt.count("blocks_fused")
        return hidden_states

    return forward


FUSED = FusedBlocks(
    ops=lambda block, receipt, options, shared: forward_for(block, receipt, options),
    rope=True,
    norms=lambda block, receipt, shared: (norms_forward_for(block, receipt), None),
)
