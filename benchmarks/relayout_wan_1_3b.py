"""Ulysses relayouts at the Wan2.1-1.3B shape on one GPU: reference vs direct (vs diffusers' own copy chain).

Shape: 480x832, 81 frames -> 32,760 tokens; 12 heads x 128; bf16; world size 2 (T_local = 16,380, H/W = 6).
Per op (pack q/k/v before the all-to-all, split the attention result, merge the returned heads):
- hot-copy median ms over interleaved rounds (CUDA events around each call; warm-up calls excluded),
  with achieved GB/s against `relayout.cost` and the measured copy ceiling;
- incremental peak memory of one call (`max_memory_allocated` - allocated before), and its transient part
  (the increment beyond the output itself);
- `torch.equal(direct, reference)` on the timed inputs, and the diffusers chain's output compared with the
  direct one after mapping its layout (same elements, another order: a check that all three move the same data).

The diffusers arm is what stock `TemplatedUlyssesAttention` copies at the same point (per operand for q/k/v,
three all-to-alls instead of one): it is the baseline a user would otherwise run.

Run: `python -m benchmarks.relayout_wan_1_3b` (one GPU; writes $OUT/<date>-relayout-wan-1.3b.json).
"""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import envelope, write
from workbench.kernel_bench import COPY_BANDWIDTH
from workbench.kernels import relayout

SHAPE = {"batch": 1, "tokens": 32760, "heads": 12, "head_dim": 128, "world_size": 2, "dtype": "bfloat16"}


def _inputs(shape: dict[str, Any], device: str = "cuda") -> dict[str, torch.Tensor]:
    b, t, h, d, w = (shape[k] for k in ("batch", "tokens", "heads", "head_dim", "world_size"))
    g = torch.Generator(device).manual_seed(0)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=device, generator=g, dtype=torch.float32).to(torch.bfloat16)

    return {
        "q": randn(b, t // w, h, d),  # the processor's q/k/v after RoPE: contiguous (B, T_local, H, D)
        "k": randn(b, t // w, h, d),
        "v": randn(b, t // w, h, d),
        "out": randn(b, h // w, t, d).transpose(1, 2),  # SDPA's result as diffusers sees it: (B, T_full, H/W, D) view
        "received": randn(w, b, t // w, h // w, d),  # what the return all-to-all delivers (workbench layout)
        "received_diffusers": randn(w, h // w, b, t // w, d),  # the same, in diffusers' layout
    }


def _ops(x: dict[str, torch.Tensor], w: int) -> dict[str, dict[str, Callable[[], Any]]]:
    b, t_local, h, d = x["q"].shape
    hw = h // w
    return {
        "pack_qkv": {
            "reference": lambda: relayout.pack_qkv_reference(x["q"], x["k"], x["v"], w),
            "direct": lambda: relayout.pack_qkv(x["q"], x["k"], x["v"], w),
            "diffusers": lambda: [
                y.reshape(b, t_local, w, hw, d).permute(2, 1, 0, 3, 4).contiguous() for y in (x["q"], x["k"], x["v"])
            ],
        },
        "split_result": {
            "reference": lambda: relayout.split_result_reference(x["out"], w),
            "direct": lambda: relayout.split_result(x["out"], w),
            "diffusers": lambda: x["out"].reshape(b, w, t_local, hw, d).permute(1, 3, 0, 2, 4).contiguous(),
        },
        "merge_heads": {
            "reference": lambda: relayout.merge_heads_reference(x["received"], w),
            "direct": lambda: relayout.merge_heads(x["received"], w),
            "diffusers": lambda: x["received_diffusers"].flatten(0, 1).permute(1, 2, 0, 3).contiguous(),
        },
    }


def _diffusers_matches_direct(op: str, diffusers: Any, direct: torch.Tensor, x: dict[str, torch.Tensor]) -> bool:
    """The diffusers chain's output holds the same elements as the direct one (mapped to the direct layout)."""
    if op == "pack_qkv":  # diffusers: per operand (W, T_local, B, H/W, D); direct: (W, B, T_local, 3, H/W, D)
        return all(torch.equal(direct[:, :, :, i], y.permute(0, 2, 1, 3, 4)) for i, y in enumerate(diffusers))
    if op == "split_result":  # diffusers: (W, H/W, B, T_local, D); direct: (W, B, T_local, H/W, D)
        return torch.equal(direct, diffusers.permute(0, 2, 3, 1, 4))
    # merge: diffusers' input is another tensor in another layout; compare it with its own reference meaning
    w, hw, b, t, d = x["received_diffusers"].shape
    want = x["received_diffusers"].permute(0, 2, 3, 1, 4).permute(1, 2, 0, 3, 4).reshape(b, t, w * hw, d)
    return torch.equal(diffusers, want)


def _time(fns: dict[str, Callable[[], Any]], warmup: int, rounds: int) -> dict[str, list[float]]:
    """Interleaved rounds (arm order rotates each round); one CUDA-event pair per call."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return times


def _peak(fn: Callable[[], Any]) -> dict[str, int]:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    increment = torch.cuda.max_memory_allocated() - before
    outputs = out if isinstance(out, list) else [out]
    output_bytes = sum(o.numel() * o.element_size() for o in outputs)
    del out, outputs
    return {
        "incremental_peak_bytes": increment,
        "output_bytes": output_bytes,
        "transient_bytes": increment - output_bytes,
    }


def measure(shape: dict[str, Any] = SHAPE, warmup: int = 10, rounds: int = 30) -> dict[str, Any]:
    """One row per op; an op that fails records its error instead of stopping the others."""
    if not torch.cuda.is_available():
        raise RuntimeError("relayout benchmark: needs a CUDA device; this machine has none")
    x = _inputs(shape)
    w = shape["world_size"]
    rows: dict[str, Any] = {}
    for op, fns in _ops(x, w).items():
        try:
            direct, reference, stock = fns["direct"](), fns["reference"](), fns["diffusers"]()
            source = {"pack_qkv": "q", "split_result": "out", "merge_heads": "received"}[op]
            in_shape = tuple(x[source].shape)
            bytes_moved, _ = relayout.cost(op, in_shape, torch.bfloat16)
            times = _time(fns, warmup, rounds)
            medians = {name: statistics.median(values) for name, values in times.items()}
            rows[op] = {
                "input_shape": list(in_shape),
                "bitwise_equal_direct_reference": bool(torch.equal(direct, reference)),
                "diffusers_same_elements": bool(_diffusers_matches_direct(op, stock, direct, x)),
                "median_ms": medians,
                "all_ms": times,
                "speedup_direct_vs_reference": medians["reference"] / medians["direct"],
                "speedup_direct_vs_diffusers": medians["diffusers"] / medians["direct"],
                "bytes_moved": bytes_moved,
                "achieved_GBps": {name: bytes_moved / (ms / 1e3) / 1e9 for name, ms in medians.items()},
                "fraction_of_copy_bandwidth": {
                    n: bytes_moved / (ms / 1e3) / COPY_BANDWIDTH for n, ms in medians.items()
                },
                "memory": {name: _peak(fn) for name, fn in fns.items()},
            }
            del direct, reference, stock
        except Exception as error:  # record and go on: one broken op must not hide the others
            rows[op] = {"error": repr(error), "traceback": traceback.format_exc()}
        print(op, {k: v for k, v in rows[op].items() if k not in ("all_ms", "traceback")}, flush=True)
    return rows


def main() -> None:
    rows = measure()
    ratios = {op: row.get("speedup_direct_vs_reference") for op, row in rows.items()}
    notes = (
        "hot-copy medians (CUDA events, interleaved rounds, warm-up excluded); memory: increment of "
        "max_memory_allocated over one call, transient = increment - output bytes; diffusers = stock Ulysses copies"
    )
    write(envelope("relayout-wan-1.3b", SHAPE, rows, ratios, notes), "relayout-wan-1.3b")


if __name__ == "__main__":
    main()
