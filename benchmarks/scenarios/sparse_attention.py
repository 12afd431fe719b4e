"""The block-sparse attention kernel against cuDNN dense attention at the Wan2.1-1.3B attention shape
(1 x 12 heads x 32,760 tokens x 128, bf16) at 10, 20 and 40 % exact block pairs.

Q/K are structured random (tokens on the 21 x 30 x 52 latent grid, q and k sharing smooth positional features, so
scores are local as in video; v is noise); tau per density by bisection on the kernel's `routing`. Per density
the whole call (`block_sparse_attention`: routing plan + attend) is timed A/B/A against cuDNN SDPA (ratio
with CI95), and the attention kernel alone (`attend` on a precomputed plan) and the routing alone (`plan`) with both
clocks of `time_call` (synchronised and queued). TFLOP/s from
the kernel's `cost()`; relative L2 of each output against dense. `--smoke`: (1, 1, 128, 128) float32 on the CPU
under the Triton interpreter against the math backend.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import WAN_TOKENS_GRID, calls, tau_for
from workbench.evidence.timing import aba_rounds, time_call
from workbench.kernels import block_sparse_attention as bsa
from workbench.quality.latent import rel_l2

NAME = "sparse-attention"
SUMMARY = "block-sparse attention kernel vs cuDNN dense, 1x12x32760x128 bf16, at 10/20/40 % density"
GPUS = 1
DENSITIES = (0.10, 0.20, 0.40)
SMOKE_GRID, SMOKE_HEADS = (1, 8, 16), 1


def structured_qkv(
    grid: tuple[int, int, int], heads: int, device: torch.device, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1, heads, T, 128): q and k share random Fourier features of the token's grid position plus unit noise."""
    g = torch.Generator(device).manual_seed(seed)
    axes = (torch.arange(n, device=device, dtype=torch.float32) for n in grid)
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)  # (T, 3)
    freqs = torch.randn(heads, 3, 64, generator=g, device=device) * 0.35
    angles = pos @ freqs  # (H, T, 64)
    features = torch.cat([angles.sin(), angles.cos()], -1) * 1.2  # (H, T, 128)
    q, k, v = (torch.randn(1, heads, math.prod(grid), 128, generator=g, device=device) for _ in range(3))
    return (q + features).to(dtype), (k + features).to(dtype), v.to(dtype)


def run(context: Context) -> Measurement:
    device, smoke = context.device, context.smoke
    grid, heads = (SMOKE_GRID, SMOKE_HEADS) if smoke else (WAN_TOKENS_GRID, 12)
    dtype = torch.float32 if smoke else torch.bfloat16
    backend = SDPBackend.MATH if smoke else SDPBackend.CUDNN_ATTENTION
    q, k, v = structured_qkv(grid, heads, device, dtype, seed=11)
    clock = calls(smoke, repeats=10, warmup=1)

    def dense() -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    want = dense()
    arms: dict[str, Any] = {"cudnn": {}}
    visits = {}
    for target in DENSITIES:
        chosen = tau_for(q, k, 0, target)
        tau, name = chosen["tau"], f"block_sparse@{target:.2f}"
        route = bsa.plan(q, k, v, tau, 0)
        kernel = time_call(lambda route=route: bsa.attend(q, k, v, route), device, **clock)
        routing = time_call(lambda tau=tau: bsa.plan(q, k, v, tau, 0), device, **clock)
        bytes_moved, flops = bsa.cost(tuple(q.shape), chosen["density"], dtype)
        arms[name] = {
            **chosen,
            "rel_l2_vs_dense": rel_l2(bsa.block_sparse_attention(q, k, v, tau, 0), want),
            "kernel": kernel.to_dict(),
            "routing": routing.to_dict(),
            "kernel_median_s": kernel.median_s,
            "kernel_tflops": flops / kernel.median_s / 1e12,
            "bytes_moved": bytes_moved,
        }
        visits[name] = lambda tau=tau: bsa.block_sparse_attention(q, k, v, tau, 0)
    ratios: dict[str, Any] = {}
    # Two clocks for the whole call (routing plan + attend): queued back to back, as inside a forward, and each call
    # synchronised, which also pays the host while it issues the routing's launches.
    for clock_name, read in (("queued", "device_s"), ("synchronised", "median_s")):
        rounds = aba_rounds(
            ("cudnn", lambda read=read: getattr(time_call(dense, device, **clock), read)),
            {
                name: lambda fn=fn, read=read: getattr(time_call(fn, device, **clock), read)
                for name, fn in visits.items()
            },
            context.rounds,
        )
        for name, median in rounds.medians().items():
            arms[name][f"{clock_name}_median_s"] = median
        ratios.update({f"{key} ({clock_name})": value.to_dict() for key, value in rounds.ratios().items()})
    notes = [
        "Whole call (routing plan + attend) against cuDNN dense, A/B/A on two clocks: `queued_median_s` (calls back to "
        "back, as inside a forward) and `synchronised_median_s` (each call alone, the host's launch time included); "
        "`kernel` (attend alone) and `routing` (plan alone) carry both clocks. Structured random q/k: routing on a "
        "trained model differs."
    ]
    if smoke:
        notes.append("Smoke: float32 on the CPU, math SDPA as the dense arm; the numbers say nothing about speed.")
    shape = {"batch": 1, "heads": heads, "tokens": math.prod(grid), "head_dim": 128, "grid": list(grid),
             "dtype": str(dtype).removeprefix("torch.")}  # fmt: skip
    return Measurement(SUMMARY, shape, arms, ratios, notes)
