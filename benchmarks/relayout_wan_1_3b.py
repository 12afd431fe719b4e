"""Ulysses relayouts at the Wan2.1-1.3B shape on one GPU: reference vs direct (every launch config, the first
version's included) vs diffusers' own copy chain vs a plain contiguous copy of the same bytes.

Shape: 480x832, 81 frames -> 32,760 tokens; 12 heads x 128; bf16; world size 2 (T_local = 16,380, H/W = 6).
Per op (pack q/k/v before the all-to-all, split the attention result, merge the returned heads), per arm:
- `median_ms` (per call): CUDA events around one Python call on an idle GPU, interleaved rounds, warm-up
  excluded. This is what the first run (d9ed842) reported; it includes the host time between the start event
  and the kernel launch (argument checks, allocation, Triton's launcher), which an idle GPU waits for.
- `device_median_ms`: the same calls captured in one CUDA graph (CALLS_PER_GRAPH calls rotating over
  INPUT_SETS distinct inputs, so no input is still in the ~50 MB L2 when it is read again), replayed between
  two events, divided by the calls; arms interleaved per round. Device time only: what a call costs inside a
  step where the host runs ahead of the GPU.
- achieved GB/s against `relayout.cost`, as a fraction of the project's measured copy ceiling
  (`COPY_BANDWIDTH`) and of the `copy` arm (a contiguous clone of the op's input bytes, same process);
- incremental peak memory of one call and its transient part (increment beyond the output);
- `torch.equal(direct, reference)` per launch config, and the diffusers chain's output compared with the
  direct one after mapping its layout.

Arms `direct_<name>` are `relayout.CANDIDATES` (`direct_legacy`: the first version's kernel and launches);
`default_config` names the one equal to `relayout.DEFAULT`, which the ratios use. The diffusers arm is what
stock `TemplatedUlyssesAttention` copies at the same point (per operand for q/k/v, three all-to-alls instead
of one): the baseline a user would otherwise run.

Run: `python -m benchmarks.relayout_wan_1_3b` (one GPU; writes $OUT/<date>-relayout-wan-1.3b.json).
`--smoke`: a tiny shape on the CPU under TRITON_INTERPRET=1 (checks and host timing only; no graphs, no memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import envelope, write
from workbench.kernel_bench import COPY_BANDWIDTH
from workbench.kernels import relayout

SHAPE = {"batch": 1, "tokens": 32760, "heads": 12, "head_dim": 128, "world_size": 2, "dtype": "bfloat16"}
SMOKE_SHAPE = {"batch": 1, "tokens": 22, "heads": 4, "head_dim": 16, "world_size": 2, "dtype": "bfloat16"}
INPUT_SETS = 4
CALLS_PER_GRAPH = 16
SOURCE = {"pack_qkv": "q", "split_result": "out", "merge_heads": "received"}


def _inputs(shape: dict[str, Any], device: str, seed: int) -> dict[str, torch.Tensor]:
    b, t, h, d, w = (shape[k] for k in ("batch", "tokens", "heads", "head_dim", "world_size"))
    g = torch.Generator(device).manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=device, generator=g, dtype=torch.float32).to(torch.bfloat16)

    x = {
        "q": randn(b, t // w, h, d),  # the processor's q/k/v after RoPE: contiguous (B, T_local, H, D)
        "k": randn(b, t // w, h, d),
        "v": randn(b, t // w, h, d),
        "out": randn(b, h // w, t, d).transpose(1, 2),  # SDPA's result as diffusers sees it: (B, T_full, H/W, D) view
        "received": randn(w, b, t // w, h // w, d),  # what the return all-to-all delivers (workbench layout)
        "received_diffusers": randn(w, h // w, b, t // w, d),  # the same, in diffusers' layout
    }
    x["flat_pack"] = randn(3 * x["q"].numel())  # the copy arms: contiguous, the op's input bytes
    x["flat_one"] = randn(x["out"].numel())
    return x


def _ops(x: dict[str, torch.Tensor], w: int) -> dict[str, dict[str, Callable[[], Any]]]:
    b, t_local, h, d = x["q"].shape
    hw = h // w
    configs = relayout.CANDIDATES
    return {
        "pack_qkv": {
            "reference": lambda: relayout.pack_qkv_reference(x["q"], x["k"], x["v"], w),
            "diffusers": lambda: [
                y.reshape(b, t_local, w, hw, d).permute(2, 1, 0, 3, 4).contiguous() for y in (x["q"], x["k"], x["v"])
            ],
            "copy": lambda: x["flat_pack"].clone(),
            **{f"direct_{n}": lambda c=c: relayout.pack_qkv(x["q"], x["k"], x["v"], w, c) for n, c in configs.items()},
        },
        "split_result": {
            "reference": lambda: relayout.split_result_reference(x["out"], w),
            "diffusers": lambda: x["out"].reshape(b, w, t_local, hw, d).permute(1, 3, 0, 2, 4).contiguous(),
            "copy": lambda: x["flat_one"].clone(),
            **{f"direct_{n}": lambda c=c: relayout.split_result(x["out"], w, c) for n, c in configs.items()},
        },
        "merge_heads": {
            "reference": lambda: relayout.merge_heads_reference(x["received"], w),
            "diffusers": lambda: x["received_diffusers"].flatten(0, 1).permute(1, 2, 0, 3).contiguous(),
            "copy": lambda: x["flat_one"].clone(),
            **{f"direct_{n}": lambda c=c: relayout.merge_heads(x["received"], w, c) for n, c in configs.items()},
        },
    }


def _default_name() -> str | None:
    return next((n for n, c in relayout.CANDIDATES.items() if c == relayout.DEFAULT), None)


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


def _rotations(names: list[str], rounds: int):
    for r in range(rounds):
        yield names[r % len(names) :] + names[: r % len(names)]


def _time_calls(fns: dict[str, Callable[[], Any]], warmup: int, rounds: int, cuda: bool) -> dict[str, list[float]]:
    """Per call: interleaved rounds (arm order rotates each round); one CUDA-event pair per call (host clock on CPU)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if cuda:
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for order in _rotations(list(fns), rounds):
        for name in order:
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fns[name]()
                times[name].append((time.perf_counter() - begin) * 1e3)
    return times


def _time_graphs(calls: dict[str, list[Callable[[], Any]]], rounds: int) -> tuple[dict[str, list[float]], dict]:
    """Device ms per call: each arm's calls captured in one CUDA graph, replays timed, arms interleaved per round.
    An arm whose capture fails records its error and is left out."""
    graphs, errors = {}, {}
    for name, fns in calls.items():
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm (and compile) outside the capture
                for fn in fns:
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for fn in fns:
                    fn()
            graph.replay()
            torch.cuda.synchronize()
            graphs[name] = graph
        except Exception as error:
            errors[name] = repr(error)
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for order in _rotations(list(graphs), rounds):
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / len(calls[name]))
    del graphs
    torch.cuda.synchronize()
    return times, errors


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


def _bandwidth(bytes_moved: int, medians: dict[str, float]) -> dict[str, Any]:
    copy = medians.get("copy")
    return {
        "achieved_GBps": {n: bytes_moved / (ms / 1e3) / 1e9 for n, ms in medians.items()},
        "fraction_of_copy_bandwidth": {n: bytes_moved / (ms / 1e3) / COPY_BANDWIDTH for n, ms in medians.items()},
        "fraction_of_copy_arm": {n: copy / ms for n, ms in medians.items()} if copy else None,
    }


def _speedups(medians: dict[str, float], default: str | None) -> dict[str, float]:
    if default is None or f"direct_{default}" not in medians:
        return {}
    direct = medians[f"direct_{default}"]
    rows = {f"speedup_direct_vs_{arm}": medians[arm] / direct for arm in ("reference", "diffusers") if arm in medians}
    if "direct_legacy" in medians:
        rows["speedup_direct_vs_legacy"] = medians["direct_legacy"] / direct
    return rows


def measure(shape: dict[str, Any] = SHAPE, warmup: int = 10, rounds: int = 30, device: str = "cuda") -> dict[str, Any]:
    """One row per op; an op that fails records its error instead of stopping the others."""
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("relayout benchmark: needs a CUDA device; this machine has none (or run --smoke)")
    sets = [_inputs(shape, device, seed) for seed in range(INPUT_SETS if cuda else 1)]
    w = shape["world_size"]
    per_set = [_ops(x, w) for x in sets]
    x = sets[0]
    default = _default_name()
    rows: dict[str, Any] = {}
    for op, fns in per_set[0].items():
        try:
            reference = fns["reference"]()
            directs = {n: fn() for n, fn in fns.items() if n.startswith("direct_")}
            stock = fns["diffusers"]()
            equal = {n: bool(torch.equal(out, reference)) for n, out in directs.items()}
            in_shape = tuple(x[SOURCE[op]].shape)
            bytes_moved, _ = relayout.cost(op, in_shape, torch.bfloat16)
            times = _time_calls(fns, warmup, rounds, cuda)
            medians = {name: statistics.median(values) for name, values in times.items()}
            row: dict[str, Any] = {
                "input_shape": list(in_shape),
                "bytes_moved": bytes_moved,
                "default_config": default,
                "configs": {n: dataclasses.asdict(c) for n, c in relayout.CANDIDATES.items()},
                "bitwise_equal_direct_reference": all(equal.values()),
                "bitwise_equal_per_config": equal,
                "diffusers_same_elements": bool(
                    _diffusers_matches_direct(op, stock, directs[f"direct_{default or 'legacy'}"], x)
                ),
                "median_ms": medians,
                "all_ms": times,
                **_speedups(medians, default),
                **_bandwidth(bytes_moved, medians),
            }
            del reference, directs, stock
            if cuda:
                calls = {n: [per_set[i % len(sets)][op][n] for i in range(CALLS_PER_GRAPH)] for n in fns}
                device_times, errors = _time_graphs(calls, rounds)
                device_medians = {name: statistics.median(values) for name, values in device_times.items()}
                row["device_median_ms"] = device_medians
                row["device_all_ms"] = device_times
                row["device_timing_errors"] = errors
                row["device"] = {**_speedups(device_medians, default), **_bandwidth(bytes_moved, device_medians)}
                directs_timed = {n: ms for n, ms in device_medians.items() if n.startswith("direct_")}
                row["best_device_config"] = min(directs_timed, key=directs_timed.get) if directs_timed else None
                row["memory"] = {name: _peak(fn) for name, fn in fns.items()}
            rows[op] = row
        except Exception as error:  # record and go on: one broken op must not hide the others
            rows[op] = {"error": repr(error), "traceback": traceback.format_exc()}
        shown = ("all_ms", "device_all_ms", "traceback", "configs", "memory", "achieved_GBps")
        print(op, {k: v for k, v in rows[op].items() if k not in shown}, flush=True)
    return rows


def ratios(rows: dict[str, Any]) -> dict[str, Any]:
    """Per op: the default direct config over the reference, diffusers and the legacy kernel, per call and on the
    device (graph replay), and the device-time winner among the candidates."""
    out: dict[str, Any] = {}
    for op, row in rows.items():
        for key in ("speedup_direct_vs_reference", "speedup_direct_vs_diffusers", "speedup_direct_vs_legacy"):
            if key in row:
                out[f"{op}_{key}_per_call"] = row[key]
            if key in row.get("device", {}):
                out[f"{op}_{key}_device"] = row["device"][key]
        if row.get("best_device_config"):
            out[f"{op}_best_device_config"] = row["best_device_config"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape on the CPU (TRITON_INTERPRET=1), no file")
    args = parser.parse_args()
    if args.smoke:
        rows = measure(SMOKE_SHAPE, warmup=1, rounds=3, device="cpu")
        failed = [op for op, row in rows.items() if "error" in row or not row["bitwise_equal_direct_reference"]]
        if failed:
            raise SystemExit(f"relayout smoke: failed ops {failed}")
        print("relayout smoke: ok", ratios(rows))
        return
    rows = measure()
    notes = (
        "median_ms: per call, CUDA events around one Python call on an idle GPU (host launch time included, as in "
        "the first run); device_median_ms: CUDA-graph replay of CALLS_PER_GRAPH calls over INPUT_SETS inputs, per "
        "call; interleaved rounds, warm-up excluded; memory: increment of max_memory_allocated over one call, "
        "transient = increment - output bytes; diffusers = stock Ulysses copies; copy = contiguous clone of the "
        "same bytes; direct_<name> = relayout.CANDIDATES, ratios use default_config"
    )
    write(envelope("relayout-wan-1.3b", SHAPE, rows, ratios(rows), notes), "relayout-wan-1.3b")


if __name__ == "__main__":
    main()
