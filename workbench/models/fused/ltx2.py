"""fused_block_ops for `LTX2VideoTransformerBlock` (diffusers 0.42.x); see fused_block_ops.py for the contract.

LTX-2 writes its AdaLN glue on same-dtype tensors, with no upcast: `norm(x) * (1 + scale) + shift` and
`x + y * gate` (or `x + gate * y`), where diffusers' `RMSNorm` returns x's dtype and the modulation tensors come
from `scale_shift_table + temb` in the model's dtype. torch rounds each op to that dtype, so these run as the
in-dtype kernels (`adaln_modulate_in_dtype`, `gated_residual_in_dtype`), which round the same way. Fused, for the
video and the audio stream alike: the self-attention and feed-forward modulations and gated residuals, the four
a2v/v2a cross-attention modulations and their two gated residuals, and (LTX-2.3's `cross_attn_adaln`) the text
query/key-value modulations and the gated text cross-attention residuals. Everything else (norms, attention
modules and their rotary steps, the FFNs, the plain residual adds) is the block's own code, called in order.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.models.family import FusedBlocks
from workbench.models.fused.guards import InDtypeOps, block_reason


def forward_for(block: torch.nn.Module, receipt: Any, options: dict[str, Any]) -> Any:
    """An instance-level forward for one LTX2VideoTransformerBlock: its 0.42.1 forward with the glue fused."""
    stock = type(block).forward.__get__(block)
    ops = InDtypeOps(receipt)
    mod, res = ops.modulate, ops.residual

    def forward(
        hidden_states: torch.Tensor,
        audio_hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        audio_encoder_hidden_states: torch.Tensor,
        temb: torch.Tensor,
        temb_audio: torch.Tensor,
        temb_ca_scale_shift: torch.Tensor,
        temb_ca_audio_scale_shift: torch.Tensor,
        temb_ca_gate: torch.Tensor,
        temb_ca_audio_gate: torch.Tensor,
        temb_prompt: torch.Tensor | None = None,
        temb_prompt_audio: torch.Tensor | None = None,
        video_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        audio_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        ca_video_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        ca_audio_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        audio_encoder_attention_mask: torch.Tensor | None = None,
        self_attention_mask: torch.Tensor | None = None,
        audio_self_attention_mask: torch.Tensor | None = None,
        a2v_cross_attention_mask: torch.Tensor | None = None,
        v2a_cross_attention_mask: torch.Tensor | None = None,
        use_a2v_cross_attention: bool = True,
        use_v2a_cross_attention: bool = True,
        perturbation_mask: torch.Tensor | None = None,
        all_perturbed: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        reason = block_reason(block, hidden_states, audio_hidden_states)
        if reason is not None:
            receipt.count_fallback(reason)
            return stock(**{name: value for name, value in locals().items() if name in PARAMETERS})
        batch_size = hidden_states.size(0)

        # 1.1. Video self-attention
        video_ada_params = block.get_mod_params(block.scale_shift_table, temb, batch_size)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = video_ada_params[:6]
        if block.video_cross_attn_adaln:
            shift_text_q, scale_text_q, gate_text_q = video_ada_params[6:9]
        norm_hidden_states = mod(block.norm1(hidden_states), scale_msa, shift_msa)
        video_self_attn_args = {
            "hidden_states": norm_hidden_states,
            "encoder_hidden_states": None,
            "query_rotary_emb": video_rotary_emb,
            "attention_mask": self_attention_mask,
        }
        if block.perturbed_attn:
            video_self_attn_args["perturbation_mask"] = perturbation_mask
            video_self_attn_args["all_perturbed"] = all_perturbed
        attn_hidden_states = block.attn1(**video_self_attn_args)
        hidden_states = res(hidden_states, attn_hidden_states, gate_msa)

        # 1.2. Audio self-attention
        audio_ada_params = block.get_mod_params(block.audio_scale_shift_table, temb_audio, batch_size)
        audio_shift_msa, audio_scale_msa, audio_gate_msa, audio_shift_mlp, audio_scale_mlp, audio_gate_mlp = (
            audio_ada_params[:6]
        )
        if block.audio_cross_attn_adaln:
            audio_shift_text_q, audio_scale_text_q, audio_gate_text_q = audio_ada_params[6:9]
        norm_audio_hidden_states = mod(block.audio_norm1(audio_hidden_states), audio_scale_msa, audio_shift_msa)
        audio_self_attn_args = {
            "hidden_states": norm_audio_hidden_states,
            "encoder_hidden_states": None,
            "query_rotary_emb": audio_rotary_emb,
            "attention_mask": audio_self_attention_mask,
        }
        if block.perturbed_attn:
            audio_self_attn_args["perturbation_mask"] = perturbation_mask
            audio_self_attn_args["all_perturbed"] = all_perturbed
        attn_audio_hidden_states = block.audio_attn1(**audio_self_attn_args)
        audio_hidden_states = res(audio_hidden_states, attn_audio_hidden_states, audio_gate_msa)

        # 2. Text cross-attention (prompt-side modulation as the stock block computes it)
        if block.cross_attn_adaln:
            if temb_prompt is not None:
                shift_text_kv, scale_text_kv = block.get_mod_params(
                    block.prompt_scale_shift_table, temb_prompt, batch_size
                )
            else:
                shift_text_kv, scale_text_kv = (
                    block.prompt_scale_shift_table[None, None]
                    .to(device=hidden_states.device, dtype=hidden_states.dtype)
                    .unbind(dim=2)
                )
            if temb_prompt_audio is not None:
                audio_shift_text_kv, audio_scale_text_kv = block.get_mod_params(
                    block.audio_prompt_scale_shift_table, temb_prompt_audio, batch_size
                )
            else:
                audio_shift_text_kv, audio_scale_text_kv = (
                    block.audio_prompt_scale_shift_table[None, None]
                    .to(device=audio_hidden_states.device, dtype=audio_hidden_states.dtype)
                    .unbind(dim=2)
                )

        # 2.1. Video-text
        norm_hidden_states = block.norm2(hidden_states)
        if block.video_cross_attn_adaln:
            norm_hidden_states = mod(norm_hidden_states, scale_text_q, shift_text_q)
        if block.cross_attn_adaln:
            encoder_hidden_states = mod(encoder_hidden_states, scale_text_kv, shift_text_kv)
        attn_hidden_states = block.attn2(
            norm_hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            query_rotary_emb=None,
            attention_mask=encoder_attention_mask,
        )
        if block.video_cross_attn_adaln:  # `h + (attn * gate)`: the product rounded, then the sum
            hidden_states = res(hidden_states, attn_hidden_states, gate_text_q)
        else:
            hidden_states = hidden_states + attn_hidden_states

        # 2.2. Audio-text
        norm_audio_hidden_states = block.audio_norm2(audio_hidden_states)
        if block.audio_cross_attn_adaln:
            norm_audio_hidden_states = mod(norm_audio_hidden_states, audio_scale_text_q, audio_shift_text_q)
        if block.cross_attn_adaln:
            audio_encoder_hidden_states = mod(audio_encoder_hidden_states, audio_scale_text_kv, audio_shift_text_kv)
        attn_audio_hidden_states = block.audio_attn2(
            norm_audio_hidden_states,
            encoder_hidden_states=audio_encoder_hidden_states,
            query_rotary_emb=None,
            attention_mask=audio_encoder_attention_mask,
        )
        if block.audio_cross_attn_adaln:
            audio_hidden_states = res(audio_hidden_states, attn_audio_hidden_states, audio_gate_text_q)
        else:
            audio_hidden_states = audio_hidden_states + attn_audio_hidden_states

        # 3. Audio-to-video and video-to-audio cross-attention
        if use_a2v_cross_attention or use_v2a_cross_attention:
            norm_hidden_states = block.audio_to_video_norm(hidden_states)
            norm_audio_hidden_states = block.video_to_audio_norm(audio_hidden_states)
            video_per_layer_ca_scale_shift = block.video_a2v_cross_attn_scale_shift_table[:4, :]
            video_per_layer_ca_gate = block.video_a2v_cross_attn_scale_shift_table[4:, :]
            video_ca_ada_params = block.get_mod_params(video_per_layer_ca_scale_shift, temb_ca_scale_shift, batch_size)
            video_ca_gate_param = block.get_mod_params(video_per_layer_ca_gate, temb_ca_gate, batch_size)
            video_a2v_ca_scale, video_a2v_ca_shift, video_v2a_ca_scale, video_v2a_ca_shift = video_ca_ada_params
            a2v_gate = video_ca_gate_param[0].squeeze(2)
            audio_per_layer_ca_scale_shift = block.audio_a2v_cross_attn_scale_shift_table[:4, :]
            audio_per_layer_ca_gate = block.audio_a2v_cross_attn_scale_shift_table[4:, :]
            audio_ca_ada_params = block.get_mod_params(
                audio_per_layer_ca_scale_shift, temb_ca_audio_scale_shift, batch_size
            )
            audio_ca_gate_param = block.get_mod_params(audio_per_layer_ca_gate, temb_ca_audio_gate, batch_size)
            audio_a2v_ca_scale, audio_a2v_ca_shift, audio_v2a_ca_scale, audio_v2a_ca_shift = audio_ca_ada_params
            v2a_gate = audio_ca_gate_param[0].squeeze(2)

            if use_a2v_cross_attention:
                mod_norm_hidden_states = mod(
                    norm_hidden_states, video_a2v_ca_scale.squeeze(2), video_a2v_ca_shift.squeeze(2)
                )
                mod_norm_audio_hidden_states = mod(
                    norm_audio_hidden_states, audio_a2v_ca_scale.squeeze(2), audio_a2v_ca_shift.squeeze(2)
                )
                a2v_attn_hidden_states = block.audio_to_video_attn(
                    mod_norm_hidden_states,
                    encoder_hidden_states=mod_norm_audio_hidden_states,
                    query_rotary_emb=ca_video_rotary_emb,
                    key_rotary_emb=ca_audio_rotary_emb,
                    attention_mask=a2v_cross_attention_mask,
                )
                hidden_states = res(hidden_states, a2v_attn_hidden_states, a2v_gate)

            if use_v2a_cross_attention:
                mod_norm_hidden_states = mod(
                    norm_hidden_states, video_v2a_ca_scale.squeeze(2), video_v2a_ca_shift.squeeze(2)
                )
                mod_norm_audio_hidden_states = mod(
                    norm_audio_hidden_states, audio_v2a_ca_scale.squeeze(2), audio_v2a_ca_shift.squeeze(2)
                )
                v2a_attn_hidden_states = block.video_to_audio_attn(
                    mod_norm_audio_hidden_states,
                    encoder_hidden_states=mod_norm_hidden_states,
                    query_rotary_emb=ca_audio_rotary_emb,
                    key_rotary_emb=ca_video_rotary_emb,
                    attention_mask=v2a_cross_attention_mask,
                )
                audio_hidden_states = res(audio_hidden_states, v2a_attn_hidden_states, v2a_gate)

        # 4. Feed-forward
        norm_hidden_states = mod(block.norm3(hidden_states), scale_mlp, shift_mlp)
        ff_output = block.ff(norm_hidden_states)
        hidden_states = res(hidden_states, ff_output, gate_mlp)
        norm_audio_hidden_states = mod(block.audio_norm3(audio_hidden_states), audio_scale_mlp, audio_shift_mlp)
        audio_ff_output = block.audio_ff(norm_audio_hidden_states)
        audio_hidden_states = res(audio_hidden_states, audio_ff_output, audio_gate_mlp)
        receipt.count("blocks_fused")
        return hidden_states, audio_hidden_states

    return forward


PARAMETERS = (
    "hidden_states",
    "audio_hidden_states",
    "encoder_hidden_states",
    "audio_encoder_hidden_states",
    "temb",
    "temb_audio",
    "temb_ca_scale_shift",
    "temb_ca_audio_scale_shift",
    "temb_ca_gate",
    "temb_ca_audio_gate",
    "temb_prompt",
    "temb_prompt_audio",
    "video_rotary_emb",
    "audio_rotary_emb",
    "ca_video_rotary_emb",
    "ca_audio_rotary_emb",
    "encoder_attention_mask",
    "audio_encoder_attention_mask",
    "self_attention_mask",
    "audio_self_attention_mask",
    "a2v_cross_attention_mask",
    "v2a_cross_attention_mask",
    "use_a2v_cross_attention",
    "use_v2a_cross_attention",
    "perturbation_mask",
    "all_perturbed",
)

FUSED = FusedBlocks(ops=lambda block, receipt, options, shared: forward_for(block, receipt, options))
