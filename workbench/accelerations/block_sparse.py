"""block_sparse: Wan self-attention through the own Triton block-sparse kernel (contract: approximate).

The kernel (`workbench.kernels.block_sparse_attention`) routes 64-token blocks Sol-style: exact where a
key block's proxy score beats `mean + tau * std`, on the diagonal band and in the sink range; every other
block enters the softmax as one mean pseudo-key. Only self-attention (`attn1` of each Wan block) is routed:
each selected module's processor is wrapped by one that computes q/k/v exactly as diffusers' 0.42
`WanAttnProcessor` does (projections, q/k norm, rotary) and then calls the kernel; cross-attention and
dense calls go through the untouched original processor.

Options: `tau` (higher: fewer exact blocks); `sink_tokens` (the first tokens whose key blocks are always
exact; the family adapter should supply where text / conditioning / audio tokens sit, for now it is a
user-given count); `dense_steps` (first denoising steps dense: the step is the pipeline's cache-context
step index, or, without one, the count of denoiser calls in the request); `dense_blocks` (first transformer
blocks dense); `protect_prefix` (the first query rows take dense attention, the rest keep the sparse output).

Receipts: `sparse_calls`, `dense_calls` (split into `dense_step_calls`, `dense_block_calls` and
`fallbacks[reason]`), `protected_rows`, and `notes["mean_density"]` over the sparse calls.

Fail closed: head dim != 128, a dtype other than bfloat16/float32, a family other than Wan, or a CPU
without `TRITON_INTERPRET=1` is a RuntimeError at prepare; never a silent dense run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_wan import _get_qkv_projections

from workbench.accelerations.base import Handle, Option, Spec, drop_restored_forwards
from workbench.kernels._runtime import interpreting
from workbench.kernels.block_sparse_attention import DTYPES, HEAD_DIM, block_sparse_attention
from workbench.kernels.qk_norm_rope import rope_reference

STEP_HOOK = "workbench_block_sparse_step"


@dataclass
class _NoState(BaseState):
    def reset(self) -> None:
        pass


class _StepHook(ModelHook):
    """On the denoiser: records the step of each call (cache-context step index, else the call count)."""

    _is_stateful = True

    def __init__(self, handle: _Installed):
        super().__init__()
        self.handle = handle
        self.state_manager = StateManager(_NoState)

    def reset_state(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        context = self.state_manager._context
        handle = self.handle
        handle.step = context.step_index if context is not None and context.step_index is not None else handle.calls
        handle.calls += 1
        return self.fn_ref.original_forward(*args, **kwargs)


class _SparseProcessor:
    """Wraps one attn1's processor; dense calls go to the original unchanged."""

    def __init__(self, original: Any, handle: _Installed, block_index: int):
        self.original = original
        self.handle = handle
        self.block_index = block_index

    def __getattr__(self, name: str) -> Any:  # _attention_backend, _parallel_config, ...
        return getattr(self.original, name)

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        handle, options = self.handle, self.handle.options
        reason = None
        if encoder_hidden_states is not None or attention_mask is not None or attn.add_k_proj is not None:
            reason = "fallback"
            handle.receipt.fallbacks["not plain self-attention (mask or encoder states)"] += 1
        elif handle.step < options["dense_steps"]:
            reason = "dense_step"
        elif self.block_index < options["dense_blocks"]:
            reason = "dense_block"
        if reason is not None:
            handle.receipt.counters["dense_calls"] += 1
            if reason != "fallback":
                handle.receipt.counters[f"{reason}_calls"] += 1
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))  # (B, T, H, D)
        if rotary_emb is not None:
            query, key = rope_reference(query, *rotary_emb), rope_reference(key, *rotary_emb)
        if query.shape[-1] != HEAD_DIM or query.dtype not in DTYPES:
            raise RuntimeError(
                f"block_sparse: attention of head dim {query.shape[-1]} in {query.dtype} reached the kernel; "
                f"it supports head dim {HEAD_DIM} in {[str(d) for d in DTYPES]}"
            )
        out, density = block_sparse_attention(
            *(x.transpose(1, 2) for x in (query, key, value)), options["tau"], options["sink_tokens"],
            return_density=True,
        )  # fmt: skip
        out = out.transpose(1, 2)  # (B, T, H, D)
        rows = min(options["protect_prefix"], query.shape[1])
        if rows:
            dense = dispatch_attention_fn(
                query[:, :rows], key, value, backend=self.original._attention_backend, parallel_config=None
            )
            out = torch.cat([dense.to(out.dtype), out[:, rows:]], 1)
            handle.receipt.counters["protected_rows"] += rows
        handle.record_sparse(density)
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], denoisers: list[torch.nn.Module]):
        super().__init__(spec, options, proof=("sparse_calls",))
        self.denoisers = denoisers
        self.step = 0
        self.calls = 0
        self.density_sum = 0.0
        self.wrapped: list[tuple[torch.nn.Module, Any]] = []
        for denoiser in denoisers:
            HookRegistry.check_if_exists_or_initialize(denoiser).register_hook(_StepHook(self), STEP_HOOK)
            for index, block in enumerate(denoiser.blocks):
                original = block.attn1.processor
                self.wrapped.append((block.attn1, original))
                block.attn1.processor = _SparseProcessor(original, self, index)

    def record_sparse(self, density: float) -> None:
        self.receipt.counters["sparse_calls"] += 1
        self.density_sum += density
        self.receipt.notes["mean_density"] = self.density_sum / self.receipt.counters["sparse_calls"]

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        self.step, self.calls, self.density_sum = 0, 0, 0.0

    def _remove(self) -> None:
        for module, original in self.wrapped:
            module.processor = original
        for denoiser in self.denoisers:
            registry = HookRegistry.check_if_exists_or_initialize(denoiser)
            if registry.get_hook(STEP_HOOK) is not None:
                registry.remove_hook(STEP_HOOK, recurse=False)
            drop_restored_forwards(denoiser)


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    if model.family.name != "wan":
        raise RuntimeError(f"block_sparse: routes Wan self-attention only for now, not family {model.family.name!r}")
    if device.type == "cpu" and not interpreting():
        raise RuntimeError("block_sparse: the Triton kernel on CPU needs TRITON_INTERPRET=1 (or a CUDA device)")
    denoisers = model.denoisers()
    for denoiser in denoisers:
        head_dim = denoiser.config.attention_head_dim
        if head_dim != HEAD_DIM:
            raise RuntimeError(f"block_sparse: the kernel supports head dim {HEAD_DIM}; this model has {head_dim}")
        dtype = denoiser.blocks[0].attn1.to_q.weight.dtype
        if dtype not in DTYPES:
            raise RuntimeError(f"block_sparse: the kernel runs {[str(d) for d in DTYPES]}; this model is {dtype}")
    return lambda: _Installed(SPEC, options, denoisers)


SPEC = Spec(
    name="block_sparse",
    contract="approximate",
    summary="Wan self-attention through an own Triton block-sparse kernel with Sol-style routing",
    prepare_fn=_prepare,
    options=(
        Option("tau", float, 0.0, help="exact where a block's score > mean + tau*std; higher: sparser"),
        Option("sink_tokens", int, 0, minimum=0, help="first tokens whose key blocks are always exact"),
        Option("dense_steps", int, 0, minimum=0, help="first denoising steps run dense"),
        Option("dense_blocks", int, 0, minimum=0, help="first transformer blocks run dense"),
        Option("protect_prefix", int, 0, minimum=0, help="first query rows take dense attention"),
    ),
    families=("wan",),
    touches=("attention_processor.backend",),
    order=20,
)
SPECS = (SPEC,)
