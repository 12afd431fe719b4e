"""rope_only on the GPU at Wan2.1-1.3B's q/k shape: is every launch `torch.equal` to `rope_reference`, and what
does one call cost, tiled (every `qk_norm_rope.CANDIDATES` entry) against the legacy kernel and torch.

Shape: x (1, 32,760, 12, 128) bf16 (480x832, 81 frames), rotary tables (1, 32,760, 1, 128). Cases: tables in
float32 (the workbench's bf16 sessions) and float64 (as `WanRotaryPosEmbed` builds them), each with x laid out
as `linear` (`unflatten(2, (12, 128))` of a (1, T, 1536) linear output: what attn1's norm_q/norm_k hand the
plugin) and `fused_qkv` (the q slice of a (1, T, 4608) fused projection, row stride 4608).

Per case and arm: `equal` (torch.equal to `rope_reference`; the tiled default also against the legacy kernel)
and `median_us` over `repeats` calls after `warmup` untimed ones, arms interleaved per round (their order rotates).
Each timed call is one CUDA-event pair right after a 256 MiB memset: the memset evicts L2 (so no call reads the
previous one's bytes from it) and keeps the GPU busy while the host runs the call's checks and launch, so the
pair times the device work only. GB/s counts `qk_norm_rope.cost(..., norm=False)` bytes, also as a fraction of
the project's copy ceiling (COPY_BANDWIDTH, 4.17e12 B/s).

Run: `python -m benchmarks.rope_kernel_gpu` (one H200, well under a minute with Triton's compiles); writes
`$OUT/<date>-rope-kernel-gpu.json` (benchmarks/common.py envelope). `--smoke` runs a tiny shape on the CPU under
`TRITON_INTERPRET=1`, to check the script itself; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import envelope, write
from workbench.kernel_bench import COPY_BANDWIDTH
from workbench.kernels import qk_norm_rope

SHAPE = (1, 32760, 12, 128)  # (B, T, H, D)
SMOKE_SHAPE = (1, 37, 3, 16)
LAYOUTS = ("linear", "fused_qkv")
TABLES = {"f32": torch.float32, "f64": torch.float64}
FLUSH_BYTES = 256 << 20  # several times the H200's L2


def _inputs(shape: tuple[int, ...], layout: str, tables: torch.dtype, device: torch.device, seed: int):
    """x (B, T, H, D) bf16 as a view of a linear output, and WanRotaryPosEmbed-like (1, T, 1, D) tables."""
    b, t, h, d = shape
    g = torch.Generator(device).manual_seed(seed)
    width = h * d if layout == "linear" else 3 * h * d
    projection = torch.randn(b, t, width, device=device, generator=g).to(torch.bfloat16)
    x = projection[..., : h * d].unflatten(2, (h, d))
    angles = torch.rand(1, t, 1, d // 2, device=device, generator=g, dtype=torch.float64) * 1000
    angles = angles.repeat_interleave(2, dim=-1)
    return x, angles.cos().to(tables), angles.sin().to(tables)


def _arms(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    arms = {name: (lambda c=c: qk_norm_rope.rope_only(x, cos, sin, c)) for name, c in qk_norm_rope.CANDIDATES.items()}
    arms["torch_reference"] = lambda: qk_norm_rope.rope_reference(x, cos, sin)
    return arms


def _time(fns: dict[str, Callable[[], Any]], warmup: int, repeats: int, device: torch.device) -> dict[str, list]:
    """Microseconds per call, arms interleaved per round (the order rotates); see the module doc for the flush."""
    cuda = device.type == "cuda"
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if cuda else None
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if cuda:
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end) * 1e3
            else:
                begin = time.perf_counter()
                fns[name]()
                elapsed = (time.perf_counter() - begin) * 1e6
            if round_index >= warmup:
                times[name].append(elapsed)
    return times


def _case(shape, layout, tables, device, warmup, repeats) -> dict[str, Any]:
    x, cos, sin = _inputs(shape, layout, tables, device, seed=0)
    fns = _arms(x, cos, sin)
    want = fns["torch_reference"]()
    outputs = {name: fn() for name, fn in fns.items() if name != "torch_reference"}
    default = next(name for name, c in qk_norm_rope.CANDIDATES.items() if c == qk_norm_rope.DEFAULT)
    equal = {name: bool(torch.equal(out, want)) for name, out in outputs.items()}
    equal["default_vs_legacy"] = bool(torch.equal(outputs[default], outputs["legacy"]))
    differing = {name: int((out != want).sum()) for name, out in outputs.items()}
    del want, outputs
    times = _time(fns, warmup, repeats, device)
    median_us = {name: statistics.median(values) for name, values in times.items()}
    bytes_moved, _ = qk_norm_rope.cost(shape, torch.bfloat16, tables, norm=False)
    gbps = {name: bytes_moved / (us * 1e-6) / 1e9 for name, us in median_us.items()}
    tiled = {name: us for name, us in median_us.items() if name not in ("legacy", "torch_reference")}
    return {
        "x_strides": list(x.stride()),
        "tables": str(tables),
        "bytes_moved": bytes_moved,
        "default_config": default,
        "equal_to_reference": equal,
        "differing_elements": differing,
        "median_us": median_us,
        "achieved_GBps": gbps,
        "fraction_of_copy_bandwidth": {name: g * 1e9 / COPY_BANDWIDTH for name, g in gbps.items()},
        "speedup_default_vs_legacy": median_us["legacy"] / median_us[default],
        "speedup_default_vs_torch": median_us["torch_reference"] / median_us[default],
        "best_tiled_config": min(tiled, key=tiled.get),
        "all_us": times,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape on the CPU under TRITON_INTERPRET=1")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    options = parser.parse_args(argv)
    if options.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device, shape = torch.device("cpu"), SMOKE_SHAPE
        options.warmup, options.repeats = 1, 3
    elif torch.cuda.is_available():
        device, shape = torch.device("cuda"), SHAPE
    else:
        raise RuntimeError("rope_kernel_gpu: needs a CUDA device (or --smoke for a CPU check of the script)")
    cases, ratios = {}, {}
    for tables_name, tables in TABLES.items():
        for layout in LAYOUTS:
            name = f"{layout}/{tables_name}"
            started = time.perf_counter()
            try:
                row = cases[name] = _case(shape, layout, tables, device, options.warmup, options.repeats)
                ratios[f"{name}/default_vs_legacy"] = row["speedup_default_vs_legacy"]
                ratios[f"{name}/default_vs_torch"] = row["speedup_default_vs_torch"]
                ratios[f"{name}/best_tiled_config"] = row["best_tiled_config"]
                us = {arm: round(v, 1) for arm, v in row["median_us"].items()}
                copy = {arm: round(f, 3) for arm, f in row["fraction_of_copy_bandwidth"].items()}
                print(f"{name}: equal {row['equal_to_reference']}\n  us {us}\n  of copy {copy}", flush=True)
            except Exception as error:  # one case's failure must not hide the others
                cases[name] = {"error": repr(error), "traceback": traceback.format_exc()[-4000:]}
                print(f"{name}: error {error!r}", flush=True)
            finally:
                cases.setdefault(name, {})["seconds"] = time.perf_counter() - started
    failed = [n for n, row in cases.items() if "error" in row or not all(row["equal_to_reference"].values())]
    b, t, h, d = shape
    configs = {name: dataclasses.asdict(c) for name, c in qk_norm_rope.CANDIDATES.items()}
    notes = (
        "rope_only per call: qk_norm_rope.CANDIDATES (legacy = the first kernel) and torch's rope_reference, bf16 x; "
        "median over repeats, CUDA events after a 256 MiB memset (L2 cold, host launch time hidden), arms "
        f"interleaved per round; configs {configs}"
        + ("; SMOKE RUN on CPU under the Triton interpreter: timings meaningless" if options.smoke else "")
    )
    shape_row = {"batch": b, "tokens": t, "heads": h, "head_dim": d, "dtype": "bfloat16", "failed": failed}
    record = envelope("rope-kernel-gpu" + ("-smoke" if options.smoke else ""), shape_row, cases, ratios, notes)
    write(record, record["what"])
    if failed:
        raise SystemExit(f"rope_kernel_gpu: not equal or failed: {failed}")
    return record


if __name__ == "__main__":
    main()
