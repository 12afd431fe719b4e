"""The fused block norms' kernels on the GPU at Wan2.1-1.3B's shape: what each launch candidate costs per call
and whether it gives the default launch's result.

Kernels (x (1, 32,760, 1536) bf16, fresh random per run, the seed recorded): `layernorm_modulate` with fp32
(1, 1, C) scale/shift (norm1/norm3), the affine variant with fp32 weight/bias (norm2), `add_layernorm_modulate`
with a bf16 residual (the add before norm3), each over every `layernorm_modulate.CANDIDATES` entry; and
`qk_norm_rope` (12 heads x 128, float32 (1, T, 1, 128) tables) over `qk_norm_rope.CANDIDATES`, one arm per
distinct launch of its norm path (that path takes every head, so candidates differing only in `heads` are one);
and `gelu_tanh` on Wan's FFN activation (x (1, 32,760, 8960) bf16, randn * 3 + 0.05) over `gelu_tanh.CANDIDATES`.

Checks, per candidate: both kernels may differ from their DEFAULT launch only in the row statistic's sum order
(their module docs), so each arm records whether it is torch.equal to DEFAULT and must meet its contract's bound on
the first CHECK_ROWS tokens (max-abs and relative-L2 error vs a float64 ground truth at most 2x torch's own plus
2 fp32 ulps for layernorm, plus 1e-7 for qk_norm_rope; layernorm's residual sum torch.equal to `x + r`).
gelu_tanh (not bitwise, its module doc): each arm against torch's `F.gelu(x, approximate="tanh")` on the device,
within the tests' bounds (`gelu_tanh.excess` <= 1, differing fraction <= `DIFFER_FRACTION`); the largest difference
in output ulps and torch.equal to DEFAULT are recorded too.

Timing as benchmarks/rope_kernel_gpu.py: one CUDA-event pair per call right after a 256 MiB memset (L2 cold,
host launch time hidden); `rounds` rounds, the arm order rotating, each arm `repeats` calls per round; the first
call of each arm (its compile and the check) untimed; median over all calls. GB/s counts the module's `cost()`
bytes, also as a fraction of COPY_BANDWIDTH (4.17e12 B/s; the issue's bar is 0.8).

Run: `python -m benchmarks.norm_kernels_gpu` (one H200, about a minute with Triton's compiles); writes
`$OUT/<date>-norm-kernels-gpu.json` after each kernel. `--smoke` runs tiny shapes on the CPU under
`TRITON_INTERPRET=1`, to check the script itself; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import envelope, write
from benchmarks.rope_kernel_gpu import FLUSH_BYTES
from workbench.kernel_bench import COPY_BANDWIDTH
from workbench.kernels import gelu_tanh as gelu
from workbench.kernels import layernorm_modulate as ln
from workbench.kernels import qk_norm_rope as qk

SHAPE, HEADS = (1, 32760, 1536), 12
SMOKE_SHAPE, SMOKE_HEADS = (1, 37, 96), 3
GELU_SHAPE, SMOKE_GELU_SHAPE = (1, 32760, 8960), (1, 37, 200)
CHECK_ROWS = 4096  # tokens of the qk_norm_rope contract check (float64 on the device)
EPS = 1e-6


def _layernorm_arms(kind: str, shape, device, g) -> tuple[dict[str, Callable[[], Any]], tuple[int, int], Callable]:
    b, t, c = shape
    x = torch.randn(shape, device=device, generator=g) * 3 + 4 * torch.randn(b, t, 1, device=device, generator=g)
    x = x.to(torch.bfloat16)
    if kind == "affine":
        weight = 1 + 0.3 * torch.randn(c, device=device, generator=g)
        bias = 0.2 * torch.randn(c, device=device, generator=g)
        norm = {"weight": weight, "bias": bias}
    else:
        scale, shift = (0.5 * torch.randn(b, 2, c, device=device, generator=g)).chunk(2, dim=1)
        norm = {"scale": scale, "shift": shift}
    residual = (2 * torch.randn(shape, device=device, generator=g)).to(torch.bfloat16) if kind == "add" else None
    if residual is not None:
        arms = {
            n: (lambda c=c: ln.add_layernorm_modulate(x, residual, EPS, **norm, config=c))
            for n, c in ln.CANDIDATES.items()
        }
    else:
        arms = {n: (lambda c=c: ln.layernorm_modulate(x, EPS, **norm, config=c)) for n, c in ln.CANDIDATES.items()}

    def errors(got: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
        """The reduction contract on the first CHECK_ROWS tokens: error vs the float64 chain at most 2x torch's own
        plus 2 fp32 ulps (tests/kernels/test_layernorm_modulate.py); the residual sum torch.equal to `x + r`."""
        rows = min(t, CHECK_ROWS)
        start, sum_ok = x[:, :rows], True
        if residual is not None:
            summed, got = got
            start = x[:, :rows] + residual[:, :rows]
            sum_ok = torch.equal(summed[:, :rows], start)
        truth = ln.reference(start.double(), EPS, **{k: v.double() for k, v in norm.items()}, out_dtype=torch.float64)
        want = ln.reference(start, EPS, **norm)
        (k_max, k_rel), (t_max, t_rel) = [_errors(a, truth) for a in (got[:, :rows], want)]
        ulp = torch.finfo(torch.float32).eps
        ok = sum_ok and k_max <= 2 * t_max + 2 * ulp * truth.abs().max().item() and k_rel <= 2 * t_rel + 2 * ulp
        return {"kernel_max": k_max, "kernel_rel": k_rel, "torch_max": t_max, "torch_rel": t_rel, "sum_equal": sum_ok,
                "ok": ok}  # fmt: skip

    cost = ln.cost(shape, torch.bfloat16, residual=kind == "add", affine=kind == "affine", modulate=kind != "affine")
    return arms, cost, errors


def _layernorm_checks(arms: dict[str, Callable[[], Any]], errors: Callable) -> dict[str, dict[str, Any]]:
    """Per candidate: the contract bound (`errors`), and whether it is torch.equal to the DEFAULT launch."""
    default = next(n for n, c in ln.CANDIDATES.items() if c == ln.DEFAULT)
    want = arms[default]()
    checks = {}
    for name, fn in arms.items():
        got = fn()
        pairs = list(zip(got, want, strict=True)) if isinstance(got, tuple) else [(got, want)]
        differing = sum(int((a != b).sum()) for a, b in pairs)
        checks[name] = {"equal_to_default": differing == 0, "differing_elements": differing, **errors(got)}
    return checks


def _qk_arms(shape, heads, device, g) -> tuple[dict[str, Callable[[], Any]], tuple[int, int], Callable]:
    b, t, c = shape
    x = (3 * torch.randn(shape, device=device, generator=g) + 0.2).to(torch.bfloat16)
    weight = (1 + 0.2 * torch.randn(c, device=device, generator=g)).to(torch.bfloat16)
    angles = torch.rand(1, t, 1, c // heads // 2, device=device, generator=g, dtype=torch.float64) * 1000
    angles = angles.repeat_interleave(2, dim=-1)
    cos, sin = angles.cos().float(), angles.sin().float()
    distinct: dict[qk.LaunchConfig, str] = {}  # the norm path ignores `heads`: one arm per launch otherwise
    for name, config in qk.CANDIDATES.items():
        distinct.setdefault(dataclasses.replace(config, heads=qk.DEFAULT.heads), name)
    arms = {
        n: (lambda c=qk.CANDIDATES[n]: qk.qk_norm_rope(x, weight, EPS, cos, sin, heads, c)) for n in distinct.values()
    }

    def errors(out: torch.Tensor) -> dict[str, float]:
        """Contract bound on the first CHECK_ROWS tokens: kernel vs torch, both against float64."""
        rows = min(t, CHECK_ROWS)
        xs, cs, ss = x[:, :rows], cos[:, :rows], sin[:, :rows]
        truth = qk.reference(xs.double(), weight.double(), EPS, cs.double(), ss.double(), heads)
        want = qk.reference(xs, weight, EPS, cs, ss, heads)
        (k_max, k_rel), (t_max, t_rel) = [_errors(a, truth) for a in (out[:, :rows], want)]
        ok = k_max <= 2 * t_max + 1e-7 * truth.abs().max().item() and k_rel <= 2 * t_rel + 1e-7
        return {"kernel_max": k_max, "kernel_rel": k_rel, "torch_max": t_max, "torch_rel": t_rel, "ok": ok}

    return arms, qk.cost((b, t, heads, c // heads), torch.bfloat16, torch.float32, norm=True), errors


def _errors(got: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - truth
    return diff.abs().max().item(), (diff.norm() / truth.norm()).item()


def _qk_checks(arms: dict[str, Callable[[], Any]], errors: Callable) -> dict[str, dict[str, Any]]:
    want = arms[next(n for n, c in qk.CANDIDATES.items() if c == qk.NORM_DEFAULT)]()
    checks = {}
    for name, fn in arms.items():
        got = fn()
        differing = int((got != want).sum())
        checks[name] = {"equal_to_default": differing == 0, "differing_elements": differing, **errors(got)}
    return checks


def _gelu_arms(shape, device, g) -> tuple[dict[str, Callable[[], Any]], tuple[int, int], torch.Tensor]:
    x = (3 * torch.randn(shape, device=device, generator=g) + 0.05).to(torch.bfloat16)
    arms = {n: (lambda c=c: gelu.gelu_tanh(x, config=c)) for n, c in gelu.CANDIDATES.items()}
    return arms, gelu.cost(shape, torch.bfloat16), x


def _gelu_checks(arms: dict[str, Callable[[], Any]], x: torch.Tensor) -> dict[str, dict[str, Any]]:
    """Per candidate against torch on the same device: the tests' bounds, the largest difference in ulps of the
    output at torch's value (large where torch's own `1 + tanh` cancels, x below about -4: what the bound's |x|
    term allows), and whether it is torch.equal to the DEFAULT launch (the same op sequence)."""
    want = gelu.reference(x)
    info = torch.finfo(want.dtype)
    # |want| = m * 2**exponent, m in [0.5, 1); subnormals and zero have the smallest normal's ulp
    _, exponent = torch.frexp(want.float().abs().clamp_min(info.tiny))
    ulp = torch.ldexp(torch.full_like(want, info.eps, dtype=torch.float32), exponent - 1)
    default = arms[next(n for n, c in gelu.CANDIDATES.items() if c == gelu.DEFAULT)]()
    checks = {}
    for name, fn in arms.items():
        got = fn()
        excess, differing = gelu.excess(x, got, want), (got != want).float().mean().item()
        checks[name] = {
            "equal_to_default": torch.equal(got, default),
            "differing_fraction": differing,
            "max_ulps": ((got.float() - want.float()).abs() / ulp).max().item(),
            "excess": excess,
            "ok": excess <= 1 and differing <= gelu.DIFFER_FRACTION[x.dtype],
        }
    return checks


def _drop_broken(arms: dict[str, Callable[[], Any]]) -> dict[str, str]:
    """Run each arm once; one that raises (a launch that does not compile here) is reported and left out."""
    broken = {}
    for name, fn in list(arms.items()):
        try:
            fn()
        except Exception as error:
            broken[name] = repr(error)[:2000]
            del arms[name]
            print(f"  launch {name} left out: {error!r}"[:400], flush=True)
    return broken


def _same_bytes_copy(bytes_moved: int, device: torch.device) -> Callable[[], Any]:
    """A device copy moving the kernel's bytes (half read, half written), timed by the same clock: what this
    timer sees of the copy bandwidth at this size (the flush's dirty L2 lines and the ramp included)."""
    src = torch.empty(bytes_moved // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _measure(arms, checks, cost, device, rounds, repeats) -> dict[str, Any]:
    times = _time(arms, rounds, repeats, device)
    bytes_moved = cost[0]
    median_us = {name: statistics.median(values) for name, values in times.items()}
    gbps = {name: bytes_moved / (us * 1e-6) / 1e9 for name, us in median_us.items()}
    best = min(median_us, key=median_us.get)
    return {
        "bytes_moved": bytes_moved,
        "checks": checks,
        "median_us": median_us,
        "achieved_GBps": gbps,
        "fraction_of_copy_bandwidth": {name: g * 1e9 / COPY_BANDWIDTH for name, g in gbps.items()},
        "best": best,
        "best_ok": checks[best]["ok"],
        "all_us": times,
    }


def _time(fns: dict[str, Callable[[], Any]], rounds: int, repeats: int, device: torch.device) -> dict[str, list]:
    """Microseconds per call: `rounds` rounds, the arm order rotating, each arm `repeats` calls in a row, each
    timed alone after the flush (benchmarks/rope_kernel_gpu.py's timer, with repeats grouped per round)."""
    cuda = device.type == "cuda"
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if cuda else None
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            for _ in range(repeats):
                if cuda:
                    flush.zero_()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fns[name]()
                    end.record()
                    end.synchronize()
                    times[name].append(start.elapsed_time(end) * 1e3)
                else:
                    begin = time.perf_counter()
                    fns[name]()
                    times[name].append((time.perf_counter() - begin) * 1e6)
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    options = parser.parse_args(argv)
    if options.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device, shape, heads = torch.device("cpu"), SMOKE_SHAPE, SMOKE_HEADS
        options.rounds, options.repeats = 2, 2
    elif torch.cuda.is_available():
        device, shape, heads = torch.device("cuda"), SHAPE, HEADS
    else:
        raise RuntimeError("norm_kernels_gpu: needs a CUDA device (or --smoke for a CPU check of the script)")
    seed = secrets.randbits(31)
    g = torch.Generator(device).manual_seed(seed)
    configs = {
        "layernorm_modulate": {n: dataclasses.asdict(c) for n, c in ln.CANDIDATES.items()},
        "qk_norm_rope": {n: dataclasses.asdict(c) for n, c in qk.CANDIDATES.items()},
        "gelu_tanh": {n: dataclasses.asdict(c) for n, c in gelu.CANDIDATES.items()},
    }
    gelu_shape = SMOKE_GELU_SHAPE if options.smoke else GELU_SHAPE
    b, t, c = shape
    what = "norm-kernels-gpu" + ("-smoke" if options.smoke else "")
    notes = (
        "per call, median over rounds x repeats, CUDA events after a 256 MiB memset (L2 cold), arms rotating per "
        f"round; bf16 x, fp32 scale/shift/weight/bias, fp32 (1, T, 1, D) rope tables; gelu_tanh x {gelu_shape} bf16; "
        f"seed {seed}; configs {configs}"
        + ("; SMOKE RUN on CPU under the Triton interpreter: timings meaningless" if options.smoke else "")
    )
    kernels, ratios, failed = {}, {}, []
    for kernel in ("layernorm_modulate", "layernorm_affine", "add_layernorm_modulate", "qk_norm_rope", "gelu_tanh"):
        started = time.perf_counter()
        try:
            if kernel == "qk_norm_rope":
                arms, cost, errors = _qk_arms(shape, heads, device, g)
                broken = _drop_broken(arms)
                checks = _qk_checks(arms, errors)
            elif kernel == "gelu_tanh":
                arms, cost, x = _gelu_arms(gelu_shape, device, g)
                broken = _drop_broken(arms)
                checks = _gelu_checks(arms, x)
            else:
                arms, cost, errors = _layernorm_arms(
                    {"layernorm_affine": "affine", "add_layernorm_modulate": "add"}.get(kernel, "modulate"),
                    shape,
                    device,
                    g,
                )
                broken = _drop_broken(arms)
                checks = _layernorm_checks(arms, errors)
            row = kernels[kernel] = _measure(arms, checks, cost, device, options.rounds, options.repeats)
            row["broken_launches"] = broken
            failed += [f"{kernel}/{n}" for n in broken]
            copy_us = statistics.median(
                _time({"copy": _same_bytes_copy(cost[0], device)}, options.rounds, options.repeats, device)["copy"]
            )
            row["same_bytes_copy_us"] = copy_us
            row["fraction_of_same_bytes_copy"] = {n: copy_us / us for n, us in row["median_us"].items()}
            default = next(n for n in arms if n in ("default", "tiled"))
            ratios[f"{kernel}/best_vs_default"] = row["median_us"][default] / row["median_us"][row["best"]]
            ratios[f"{kernel}/best"] = row["best"]
            failed += [f"{kernel}/{n}" for n, check in checks.items() if not check["ok"]]
            us = {n: round(v, 1) for n, v in row["median_us"].items()}
            copy = {n: round(f, 3) for n, f in row["fraction_of_copy_bandwidth"].items()}
            equal = {n: check["equal_to_default"] for n, check in checks.items()}
            print(f"{kernel}: equal to default {equal}\n  us {us}\n  of copy {copy}", flush=True)
            print(
                f"  same-bytes copy {copy_us:.1f} us ({cost[0] / copy_us * 1e6 / COPY_BANDWIDTH:.3f} of copy)",
                flush=True,
            )
        except Exception as error:  # one kernel's failure must not hide the others
            kernels[kernel] = {"error": repr(error), "traceback": traceback.format_exc()[-4000:]}
            failed.append(kernel)
            print(f"{kernel}: error {error!r}", flush=True)
        finally:
            kernels.setdefault(kernel, {})["seconds"] = time.perf_counter() - started
        shape_row = {"batch": b, "tokens": t, "channels": c, "heads": heads, "dtype": "bfloat16", "failed": failed}
        shape_row["gelu_tanh_x"] = list(gelu_shape)
        record = envelope(what, shape_row, kernels, ratios, notes)
        write(record, what)
    if failed:
        raise SystemExit(f"norm_kernels_gpu: not equal, out of contract or failed: {failed}")
    return record


if __name__ == "__main__":
    main()
