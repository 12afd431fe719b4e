"""The FP8 attention kernel against cuDNN dense attention and FlashAttention-4 (when importable) at the Wan2.1-1.3B
attention shape (1 x 12 heads x 32,760 tokens x 128, bf16), with P.V in FP8 and in bf16.

Each whole call (`fp8_attention`: torch quantization + kernel) is timed A/B/A against cuDNN SDPA, and against FA4's
`flash_attn_func` when `flash4_attention` finds it usable here (ratio with CI95, queued clock: calls back to back, as
inside a forward); the kernel alone (`attend` on quantized operands) and the quantization alone with both clocks of
`time_call`. TFLOP/s from `cost()` (dense-attention FLOPs, so arms compare directly). Relative L2 of each output
against cuDNN's bf16 output on iid normal q, k, v and on structured ones (`sparse_attention.structured_qkv`: q and k
share smooth positional features, as video attention does). `--smoke`: (1, 1, 128, 128) float32 on the CPU under
the Triton interpreter against the math backend.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios.sparse_attention import SMOKE_GRID, SMOKE_HEADS, structured_qkv
from benchmarks.workloads import WAN_TOKENS_GRID, calls, rel_l2
from workbench.accelerations.attention import flash4_attention
from workbench.evidence.timing import aba_rounds, time_call
from workbench.kernels import fp8_attention as fa

NAME = "fp8-attention"
SUMMARY = "FP8 attention kernel (P.V fp8 / bf16) vs cuDNN dense and FA4, 1x12x32760x128 bf16"
GPUS = 1


def run(context: Context) -> Measurement:
    device, smoke = context.device, context.smoke
    grid, heads = (SMOKE_GRID, SMOKE_HEADS) if smoke else (WAN_TOKENS_GRID, 12)
    dtype = torch.float32 if smoke else torch.bfloat16
    backend = SDPBackend.MATH if smoke else SDPBackend.CUDNN_ATTENTION
    tokens = math.prod(grid)
    g = torch.Generator(device).manual_seed(7)
    inputs = {
        "iid": tuple(torch.randn(1, heads, tokens, fa.HEAD_DIM, generator=g, device=device).to(dtype) for _ in "qkv"),
        "structured": structured_qkv(grid, heads, device, dtype, seed=11),
    }
    q, k, v = inputs["iid"]
    clock = calls(smoke, repeats=10, warmup=2)
    notes = []

    def dense(q=q, k=k, v=v) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    arms: dict[str, Any] = {"cudnn": {}}
    visits = {"cudnn": dense}
    reason = flash4_attention.unusable(device)
    if reason is None:
        flash = flash4_attention.load()
        q4, k4, v4 = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FA4 takes (B, T, H, D)
        visits["flash4"] = lambda: flash.flash_attn_func(q4, k4, v4)[0]
        arms["flash4"] = {}
    else:
        notes.append(f"FlashAttention-4 not measured: {reason}.")
    _, flops = fa.cost(tuple(q.shape))
    for pv in fa.PV_MODES:
        name = f"fp8_attention[pv={pv}]"
        z = fa.quantize(q, k, v, pv)
        out = torch.empty_like(q)
        kernel = time_call(lambda z=z, out=out: fa.attend(z, out, tokens, fa.HEAD_DIM**-0.5), device, **clock)
        quantize = time_call(lambda pv=pv: fa.quantize(q, k, v, pv), device, **clock)
        arms[name] = {
            "rel_l2_vs_dense": {
                kind: rel_l2(fa.fp8_attention(*qkv, pv=pv), dense(*qkv)) for kind, qkv in inputs.items()
            },
            "kernel": kernel.to_dict(),
            "quantize": quantize.to_dict(),
            "kernel_tflops": flops / kernel.median_s / 1e12,
            "bytes_moved": fa.cost(tuple(q.shape), pv, dtype)[0],
        }
        visits[name] = lambda pv=pv: fa.fp8_attention(q, k, v, pv=pv)
    ratios: dict[str, Any] = {}
    candidates = {name: fn for name, fn in visits.items() if name.startswith("fp8_attention")}
    for baseline in [name for name in ("cudnn", "flash4") if name in visits]:
        others = {**candidates, **({"flash4": visits["flash4"]} if baseline == "cudnn" and "flash4" in visits else {})}
        rounds = aba_rounds(
            (baseline, lambda fn=visits[baseline]: time_call(fn, device, **clock).device_s),
            {name: lambda fn=fn: time_call(fn, device, **clock).device_s for name, fn in others.items()},
            context.rounds,
        )
        for name, median in rounds.medians().items():
            arms[name]["queued_median_s"] = median
            arms[name]["tflops"] = flops / median / 1e12
        ratios.update({key: value.to_dict() for key, value in rounds.ratios().items()})
    notes.append(
        "Whole calls A/B/A on the queued clock; `kernel` (attend alone) and `quantize` (torch ops) carry both "
        "clocks. TFLOP/s count dense attention's 4*T*T*D per head for every arm. Relative L2 against cuDNN's bf16 "
        "output; `structured` q/k are synthetic, captured activations of a trained model differ."
    )
    if smoke:
        notes.append("Smoke: float32 on the CPU, math SDPA as the dense arm; the numbers say nothing about speed.")
    shape = {"batch": 1, "heads": heads, "tokens": tokens, "head_dim": fa.HEAD_DIM, "grid": list(grid),
             "dtype": str(dtype).removeprefix("torch.")}  # fmt: skip
    return Measurement(SUMMARY, shape, arms, ratios, notes)
