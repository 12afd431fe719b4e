"""FlashAttention-4 (CuTe DSL, `flash_attn.cute`) against cuDNN SDPA at the two production attention shapes.

Shapes (bf16, non-causal, no mask, head dim 128): Wan2.1-1.3B self-attention (1, 32,760, 12, 128) and the full-size
MiniMax-H3 packed sequence (1, 52,648, 56, 128). The inputs are the (B, S, H, D) tensors diffusers' dispatcher
holds; cuDNN reads them as (B, H, S, D) views (what diffusers' native backend passes to SDPA), FA4 reads them as
they are. Per shape: FA4's first call (its JIT compile), then `--rounds` interleaved rounds of `--reps` timed calls
per kernel (CUDA events, median per round, median of rounds), TFLOP/s (4 * S^2 * H * D per call), the speed-up
cuDNN / FA4, and FA4's output against cuDNN's and against a float32 math reference on the first 1,024 query rows
(relative L2). Any failure is recorded in the JSON, not raised. `--smoke` checks the script on the CPU (FA4 absent
there: the error is what it records).
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import envelope, write

SHAPES = {"wan-1.3b": (1, 32760, 12, 128), "h3-full": (1, 52648, 56, 128)}
SMOKE_SHAPES = {"tiny": (1, 256, 2, 128)}


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    backend = SDPBackend.CUDNN_ATTENTION if q.is_cuda else SDPBackend.MATH
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)


def _time(fn: Any, reps: int, cuda: bool) -> float:
    """Median milliseconds of `reps` calls."""
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def measure(shape: tuple[int, ...], rounds: int, reps: int, device: torch.device) -> dict[str, Any]:
    from flash_attn.cute import flash_attn_func

    b, s, h, d = shape
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(shape, device=device, generator=g, dtype=torch.bfloat16) for _ in range(3))
    cuda = device.type == "cuda"
    begin = time.perf_counter()
    fa4 = flash_attn_func(q, k, v)[0]
    if cuda:
        torch.cuda.synchronize(device)
    first_call = time.perf_counter() - begin
    dense = _cudnn(q, k, v)
    rows = slice(0, min(1024, s))
    want = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q[:, rows], k, v))).transpose(1, 2)
    arms = {"cudnn": lambda: _cudnn(q, k, v), "fa4": lambda: flash_attn_func(q, k, v)}
    per_round: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            per_round[name].append(_time(fn, reps, cuda))
    flops = 4 * b * s * s * h * d
    ms = {name: statistics.median(values) for name, values in per_round.items()}
    return {
        "first_call_seconds": first_call,
        "rounds_ms": per_round,
        "median_ms": ms,
        "tflops": {name: flops / (value / 1e3) / 1e12 for name, value in ms.items()},
        "speedup_fa4_vs_cudnn": ms["cudnn"] / ms["fa4"],
        "rel_l2_fa4_vs_cudnn": _rel(fa4, dense),
        "rel_l2_vs_fp32_first_rows": {"fa4": _rel(fa4[:, rows], want), "cudnn": _rel(dense[:, rows], want)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    arms: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for name, shape in shapes.items():
        try:
            arms[name] = measure(shape, args.rounds, args.reps, device)
            ratios[f"{name}_fa4_vs_cudnn"] = arms[name]["speedup_fa4_vs_cudnn"]
        except Exception as error:
            arms[name] = {"error": repr(error), "traceback": traceback.format_exc()[-3000:]}
        print(name, {k: v for k, v in arms[name].items() if k != "traceback"}, flush=True)
        record_shape = {"shapes": {k: list(v) for k, v in shapes.items()}, "dtype": "bfloat16"}
        notes = "cuDNN = torch SDPA with the cuDNN backend forced on (B, H, S, D) views; FA4 = flash_attn.cute."
        write(envelope("flash4-attention", record_shape, arms, ratios, notes), "flash4-attention")


if __name__ == "__main__":
    main()
