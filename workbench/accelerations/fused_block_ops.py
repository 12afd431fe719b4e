"""Transformer-block glue through Triton kernels that keep torch's rounding boundaries (contract: rounding).

diffusers' Wan block runs its AdaLN modulation `(norm(x.float()) * (1 + scale) + shift).type_as(x)` and
its gated residuals `(x.float() + y * gate).type_as(x)` as chains of small torch kernels. This plugin
gives each block an instance-level `forward` that is diffusers' `WanTransformerBlock.forward` (0.42.x)
op for op, except that those two pieces run as one Triton kernel each (`workbench.kernels.adaln_modulate`,
`workbench.kernels.gated_residual`). Everything else (the fp32 LayerNorms, attn1, attn2, the cross-attention
residual, the FFN linears and its GELU) is the block's own submodules, called in the same order.

What is proven where: the kernels are bit-equal to torch's op sequence under the Triton CPU interpreter
(tests here and in tests/kernels); on a GPU they are compiled with FP fusion off and the equality is
**unverified until measured**. The GELU-tanh kernel (`workbench.kernels.gelu_tanh`) is not used: it is
not bit-equal to torch's tanh (see its docstring), so using it would break this contract.

Fail closed: on CPU the kernels need `TRITON_INTERPRET=1` (a RuntimeError at prepare says so); LTX-2's
block is refused as not implemented yet. A call the kernels cannot take (another dtype, a shape the
block does not normally see) runs the stock forward and is counted under `fallbacks` with its reason.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from workbench.accelerations.base import Handle, Spec

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
NOT_IMPLEMENTED = ("LTX2VideoTransformerBlock",)


def _wan_forward(block: torch.nn.Module, receipt: Any, kernels: Any) -> Any:
    adaln_modulate, gated_residual = kernels
    stock = type(block).forward.__get__(block)

    def forward(
        hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor, rotary_emb: Any
    ) -> torch.Tensor:
        reason = _unsupported(hidden_states, temb)
        if reason is not None:
            receipt.fallbacks[reason] += 1
            return stock(hidden_states, encoder_hidden_states, temb, rotary_emb)
        if temb.ndim == 4:  # batch_size, seq_len, 6, inner_dim (wan2.2 ti2v)
            chunks = (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
            chunks = tuple(chunk.squeeze(2) for chunk in chunks)
        else:  # batch_size, 6, inner_dim
            chunks = (block.scale_shift_table + temb.float()).chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = chunks
        dtype = hidden_states.dtype

        # 1. Self-attention
        norm_hidden_states = adaln_modulate(block.norm1(hidden_states.float()), scale_msa, shift_msa, dtype)
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
        receipt.counters["adaln_modulate_calls"] += 2
        receipt.counters["gated_residual_calls"] += 2
        receipt.counters["blocks_fused"] += 1
        return hidden_states

    return forward


def _unsupported(hidden_states: torch.Tensor, temb: torch.Tensor) -> str | None:
    if hidden_states.dtype not in SUPPORTED_DTYPES:
        return f"hidden_states dtype {hidden_states.dtype}"
    if hidden_states.ndim != 3:
        return f"hidden_states of {hidden_states.ndim} dimensions"
    if temb.ndim not in (3, 4):
        return f"temb of {temb.ndim} dimensions"
    return None


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], blocks: list[torch.nn.Module]):
        super().__init__(spec, options, proof=("adaln_modulate_calls", "gated_residual_calls"))
        from workbench.kernels.adaln_modulate import adaln_modulate
        from workbench.kernels.gated_residual import gated_residual

        self.blocks = blocks
        for block in blocks:
            block.forward = _wan_forward(block, self.receipt, (adaln_modulate, gated_residual))

    def _remove(self) -> None:
        for block in self.blocks:
            del block.forward


def _check_runtime(device: torch.device) -> None:
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("fused_block_ops: needs triton (pip install triton)")
    from workbench.kernels._runtime import interpreting

    if device.type == "cpu" and not interpreting():
        raise RuntimeError(
            "fused_block_ops: on CPU the Triton kernels run only under the interpreter; "
            "set TRITON_INTERPRET=1 in the environment, or open the session on a CUDA device"
        )


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    import diffusers

    if not diffusers.__version__.startswith("0.42."):
        raise RuntimeError(
            f"fused_block_ops: replicates diffusers 0.42.x's WanTransformerBlock.forward; found {diffusers.__version__}"
        )
    names = set(model.family.block_classes)
    refused = sorted(names & set(NOT_IMPLEMENTED))
    if refused:
        raise RuntimeError(
            f"fused_block_ops: block class {refused[0]} is not implemented yet (only WanTransformerBlock)"
        )
    blocks = []
    for denoiser in model.denoisers():
        for path, module in denoiser.named_modules():
            if type(module).__name__ in names:
                if "forward" in module.__dict__:
                    raise RuntimeError(f"fused_block_ops: {path} already has its forward replaced by another plugin")
                blocks.append(module)
    if not blocks:
        raise RuntimeError(f"fused_block_ops: found no {sorted(names)} blocks in the denoiser")
    _check_runtime(device)
    return lambda: _Installed(SPEC, options, blocks)


SPEC = Spec(
    name="fused_block_ops",
    contract="rounding",
    summary="AdaLN modulation and gated residuals of each block as Triton kernels with torch's rounding",
    prepare_fn=_prepare,
    families=("wan", "ltx2"),  # ltx2 is refused at prepare with a clear message (not implemented yet)
    touches=("blocks.forward",),
    order=40,
)
SPECS = (SPEC,)
