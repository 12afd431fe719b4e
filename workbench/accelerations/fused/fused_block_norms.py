"""Block norms, residual adds and AdaLN glue as a few Triton kernels (contract: reduction). Wan and MiniMax-H3.

On an H200 a Wan2.1-1.3B forward spends ~45 ms of ~535 ms in pointwise glue even with `fused_block_ops`: torch's
fp32 LayerNorms, the bf16 -> fp32 copies around them, the modulations, casts and residual adds, and torch's q/k
RMSNorms. Each `WanTransformerBlock` gets an instance-level forward that is diffusers 0.42.x's forward with:

- norm1 + modulation: one `layernorm_modulate` reading bf16 x (no fp32 copy of the residual stream);
- attn1 run here as `WanAttnProcessor` runs self-attention (`_fused_wan.self_attention`), with norm_q/norm_k
  and the rotary step as one `qk_norm_rope` kernel each for q and k;
- both gated residuals `(x.float() + y * gate).type_as(x)` as `gated_residual` (torch's rounding);
- norm2 (affine FP32LayerNorm) as `layernorm_modulate` with weight and bias (an Identity norm2 passes x itself,
  which is what `Identity(x.float()).type_as(x)` returns);
- `x + attn2_output` fused into norm3's call (`add_layernorm_modulate`): it writes the new residual stream (bit-equal
  to torch's add) and the modulated norm. attn2, the FFN and the projections are the block's own modules.

Why `reduction`, not `rounding`: the LayerNorm and RMSNorm row statistics are summed in another order than torch's
(kernels/layernorm_modulate.py, kernels/qk_norm_rope.py), so a normed value can differ by about an ulp of its dtype,
and those differences travel through attention and the FFN. Bounds tested on the CPU interpreter
(tests/accelerations/test_fused_block_norms.py): one block vs a float64 run of the stock block, the fused block's
max-abs and relative-L2 errors are at most 2x the stock block's own (bf16 or fp32) plus a small floor; a whole
tiny-wan request stays within a stated relative-L2 of the stock request. H200, Wan2.1-1.3B shape, random weights
(benchmarks/results/2026-11-30-exact-fast-forward-run2.json, -run5.json): with adaln_precompute, cross_kv_cache and
gelu_epilogue one forward ran 1.22-1.23x stock with output relative L2 4.9e-3 against stock (without the GELU
epilogue 1.207x, 4.8e-3); the glue outside attention and GEMM fell from 63 ms to 28 ms per forward.

MiniMax-H3 (`MiniMaxH3TransformerBlock`): fused_block_ops' H3 forward (in-dtype modulation and gated residuals with
the per-row AdaLN index, torch's rounding; _fused_h3.py) plus the attention's q/k RMSNorm + rotate-half rotary as one
`head_norm_rope` kernel each (`_fused_h3.QKNormRope`), in place of two RMSNorm launches, eight concatenation copies
and the pointwise passes of the rotary per block. On the H200 at the 33.1B model's 52,648 rows
(benchmarks/results/2026-11-30-h3-full-forward-run5.json) one forward went from 11.03 to 10.42 s (1.059x; the glue
outside attention and GEMM from 1.38 to 0.50 s), output rel-L2 2.3e-3 against stock. Its norms' sums of squares
are summed in another order than torch's (kernels/head_norm_rope.py): `reduction` as for Wan.

Fail closed: on CPU the kernels need `TRITON_INTERPRET=1` (RuntimeError at prepare); a block whose forward another
plugin replaced (e.g. fused_block_ops, which also touches `blocks.forward`) is refused. A call the kernels cannot
take (grad mode, another dtype or shape, replaced or hooked norms, another attn1 processor) runs the stock code for
that piece and is counted under `fallbacks` with its reason.
Receipts: `blocks_fused`, `layernorm_modulate_calls`, `qk_norm_rope_calls`, `gated_residual_calls` (and
`rope_calls` when q/k fall back to torch's RMSNorm and the rotary kernel); H3 also `adaln_modulate_calls`.
No options.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.accelerations.base import Handle, Spec
from workbench.accelerations.fused.blocks import block_classes, replaceable_blocks
from workbench.models.fused import h3 as _fused_h3

NAME = "fused_block_norms"
BLOCKS = ("WanTransformerBlock", "MiniMaxH3TransformerBlock")
PROOF = ("layernorm_modulate_calls", "qk_norm_rope_calls", "gated_residual_calls")


def _norms_reason(block: torch.nn.Module, hidden_states: torch.Tensor) -> str | None:
    """Why the block's norms cannot run as the LayerNorm kernel (then the whole block runs stock), or None."""
    from diffusers.models.normalization import FP32LayerNorm

    from workbench.models.fused.wan import hooked

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


def forward_for(block: torch.nn.Module, receipt: Any) -> Any:
    """An instance-level forward for one WanTransformerBlock."""
    from workbench.kernels.gated_residual import gated_residual
    from workbench.kernels.layernorm_modulate import add_layernorm_modulate, layernorm_modulate
    from workbench.kernels.qk_norm_rope import qk_norm_rope, rope_only
    from workbench.models.fused.wan import attn1_reason, modulation_chunks, self_attention, wan_block_reason

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


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], blocks: list[torch.nn.Module], device: torch.device):
        super().__init__(spec, options, proof=PROOF)
        # counted from inside a block a user may torch.compile: fixed keys count as tensors there (Receipt)
        self.receipt.traceable(device, counters=(*PROOF, "blocks_fused", "rope_calls", "adaln_modulate_calls"))
        self.blocks = blocks
        self.checked: dict = {}  # H3: the last AdaLN index checked (shared by the blocks, cleared per request)
        self.qk_norms: list[_fused_h3.QKNormRope] = []
        for block in blocks:
            if type(block).__name__ == "MiniMaxH3TransformerBlock":
                self.qk_norms.append(_fused_h3.QKNormRope(block.attn, self.receipt))
                block.forward = _fused_h3.forward_for(block, self.receipt, self.checked, self.qk_norms[-1])
            else:
                block.forward = forward_for(block, self.receipt)

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.checked.clear()

    def end_request(self, request_id: int) -> None:
        self.checked.clear()

    def _remove(self) -> None:
        self.checked.clear()
        for qk in self.qk_norms:
            qk.remove()
        for block in self.blocks:
            del block.forward


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    blocks = replaceable_blocks(NAME, model, block_classes(NAME, model, BLOCKS), device)
    for block in blocks:
        reason = _fused_h3.qk_norms_reason(block) if type(block).__name__ == "MiniMaxH3TransformerBlock" else None
        if reason is not None:
            raise RuntimeError(f"{NAME}: a MiniMaxH3TransformerBlock's {reason}; another plugin changed it?")
    return lambda: _Installed(SPEC, options, blocks, device)


SPEC = Spec(
    name=NAME,
    contract="reduction",
    summary="block norms (+ residual add, modulation), q/k RMSNorm + rotary and gated residuals as Triton kernels",
    prepare_fn=_prepare,
    families=("wan", "h3"),
    touches=("blocks.forward", "attention.qk_norms"),
    order=40,
)
SPECS = (SPEC,)
