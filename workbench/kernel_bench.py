"""The fused block kernels against their torch references, A/B/A, reported against the roofline.

`benchmark(device, rounds, smoke)` is the one entry, used by `notebooks/30_kernels.ipynb` and the `kernels` benchmark
scenario (`python -m benchmarks run kernels`, which records it):
- `all_cases`: each kernel's launcher call (the launch it ships), its reference call and its `cost()`, the Wan block's
  kernels at Wan2.1-1.3B's shape (x (1, 32,760, 1536) bf16, 12 heads of 128) and `head_norm_rope` at MiniMax-H3's
  q (1, 52,648, 56, 128) bf16;
- `compare`: each kernel's output checked against its reference on the very inputs it is timed on (`check`: equal,
  or within the bound its contract allows), so a fast wrong kernel cannot report a speed; then A/B/A rounds,
  reference / kernel / reference, each visit one `time_call` of CUDA-graph replays queued back to back (device time
  per call). Not plain launches: a launcher's Python can cost as much host time as one of these kernels takes on the
  GPU, and then back-to-back launches time the host, not the kernel (benchmarks/results/notebooks/README.md). The
  host's cost of one launch is reported beside it (`host_launch_s`);
- the roofline: a call cannot take less than max(bytes_moved / copy bandwidth, flops / bf16 GEMM rate), at the
  ceilings `measure_ceilings(device)` measures on the device that runs, in the same process
  (`Ceilings.roofline_seconds`).

`smoke`: tiny shapes, one call a visit and tiny ceilings, on a CPU under Triton's interpreter
(TRITON_INTERPRET=1): the checks are real, the times and fractions say nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from typing import Any

import torch

from workbench.evidence.timing import aba_rounds, time_call
from workbench.kernels import adaln_modulate, gated_residual, head_norm_rope, layernorm_modulate, qk_norm_rope
from workbench.kernels._runtime import cpu_without_interpreter
from workbench.quality.latent import rel_l2
from workbench.telemetry import Telemetry, maybe_sampler, summarize_samples

HEADS = 12  # Wan2.1-1.3B: 12 heads of 128
WAN = {"batch": 1, "tokens": 32760, "channels": 1536, "heads": HEADS}  # x (1, 32,760, 1536): 81 x 480 x 832
H3_Q = (1, 52648, 56, 128)  # the full-size MiniMax-H3's q: (batch, tokens, heads, head_dim)
H3_ROTARY = 96  # rotated channels of each H3 head
SMOKE_WAN = {"batch": 1, "tokens": 8, "channels": 64, "heads": 2}
SMOKE_H3_Q = (1, 8, 1, 128)
REPEATS, WARMUP = 20, 2  # calls a visit on a full run, and untimed calls before them


@dataclass(frozen=True)
class Case:
    """One kernel at one shape: `kernel()` and `reference()` compute the same maths on the same inputs.

    `exact`: the contract is bitwise (torch.equal required); otherwise the relative L2 against the reference
    must be <= `rel_l2_bound` (a reduction-order or approximation contract, stated by the kernel module)."""

    name: str
    kernel: Callable[[], Any]
    reference: Callable[[], Any]
    bytes_moved: int
    flops: int
    exact: bool
    rel_l2_bound: float = 0.0


@dataclass(frozen=True)
class Ceilings:
    """What one device reached, measured by `measure_ceilings`: a large copy and a large bf16 GEMM, each the median
    seconds of its calls. Bytes count as the kernels' `cost()` counts them: bytes read plus bytes written."""

    device: str  # the GPU's name (`torch.cuda.get_device_name`), or the device type off CUDA
    copy_bytes: int  # bytes one timed copy moves: its source read plus its destination written
    copy_s: float
    gemm_flops: int  # flops of one timed GEMM: 2 * M * N * K
    gemm_s: float

    @property
    def copy_bytes_per_s(self) -> float:
        return self.copy_bytes / self.copy_s

    @property
    def bf16_flops_per_s(self) -> float:
        return self.gemm_flops / self.gemm_s

    def roofline_seconds(self, bytes_moved: int, flops: int) -> float:
        """The least time a call moving `bytes_moved` and computing `flops` can take at these ceilings."""
        return max(bytes_moved / self.copy_bytes_per_s, flops / self.bf16_flops_per_s)

    def to_dict(self) -> dict[str, Any]:
        """The record's `ceilings`: `copy_bytes_per_s`, `bf16_flops` (flop/s), the device and what was timed."""
        return {"device": self.device, "copy_bytes_per_s": self.copy_bytes_per_s, "bf16_flops": self.bf16_flops_per_s,
                "copy_bytes": self.copy_bytes, "copy_s": self.copy_s, "gemm_flops": self.gemm_flops,
                "gemm_s": self.gemm_s}  # fmt: skip


def measure_ceilings(
    device: str | torch.device, copy_bytes: int = 1 << 30, gemm_size: int = 8192, repeats: int = 10, warmup: int = 3
) -> Ceilings:
    """The copy bandwidth and bf16 GEMM rate of `device`, measured now with `time_call` (the median of `repeats`
    synchronised calls, after `warmup` untimed ones):
    - copy: `dst.copy_(src)` of `copy_bytes` bytes (uint8); it moves 2 * `copy_bytes` (src read, dst written), as
      the kernels' `cost()` counts bytes;
    - GEMM: `torch.mm(a, b, out=c)` of bf16 (`gemm_size`, `gemm_size`) matrices, 2 * `gemm_size`**3 flops.
    The defaults are sized for a GPU (a 1 GiB copy, far past any L2; an 8192^3 GEMM). Off CUDA the same calls run
    on the host, where the defaults take long: pass tiny sizes (tests, smoke runs), whose numbers say nothing.
    ValueError for copy_bytes or gemm_size < 1 (and `time_call`'s for repeats, warmup)."""
    if copy_bytes < 1 or gemm_size < 1:
        raise ValueError(f"copy_bytes, gemm_size: must be >= 1, got {copy_bytes}, {gemm_size}")
    device = torch.device(device)
    src = torch.ones(copy_bytes, dtype=torch.uint8, device=device)  # written: every page is real memory
    dst = torch.empty_like(src)
    copy_s = time_call(lambda: dst.copy_(src), device, repeats, warmup, queued=False).median_s
    generator = torch.Generator(device).manual_seed(0)
    a, b = torch.randn(2, gemm_size, gemm_size, device=device, generator=generator, dtype=torch.bfloat16).unbind()
    c = torch.empty_like(a)
    gemm_s = time_call(lambda: torch.mm(a, b, out=c), device, repeats, warmup, queued=False).median_s
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return Ceilings(name, 2 * copy_bytes, copy_s, 2 * gemm_size**3, gemm_s)


def device_ceilings(device: str | torch.device, smoke: bool = False) -> Ceilings:
    """`measure_ceilings` at its default sizes, or for a smoke run a 64 KiB copy and a 64^3 GEMM, one call each
    (numbers nobody reads: the run only has to go through)."""
    if smoke:
        return measure_ceilings(device, copy_bytes=1 << 16, gemm_size=64, repeats=1, warmup=0)
    return measure_ceilings(device)


def cases(
    batch: int,
    tokens: int,
    channels: int,
    heads: int = HEADS,
    device: str | torch.device = "cuda",
    seed: int = 0,
) -> list[Case]:
    """The Wan block's fused kernels at (batch, tokens, channels) with `heads` heads; bf16 activations,
    fp32 modulation tables and rotary tables as the workbench's bf16 sessions hold them. Inputs drawn from `seed`."""
    generator = torch.Generator(device).manual_seed(seed)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=generator).to(dtype)

    bf16, shape = torch.bfloat16, (batch, tokens, channels)
    n = randn(*shape)
    table = randn(batch, 6, channels)
    scale, shift, gate = table[:, 1:2], table[:, 0:1], table[:, 2:3]
    x, y = randn(*shape, dtype=bf16), randn(*shape, dtype=bf16)
    weight, bias = randn(channels), randn(channels)
    head_dim = channels // heads
    cos, sin = randn(1, tokens, 1, head_dim), randn(1, tokens, 1, head_dim)
    rms_weight = randn(channels, dtype=bf16)
    q = x.unflatten(2, (heads, head_dim))
    eps = 1e-6
    return [
        Case(
            "adaln_modulate",
            lambda: adaln_modulate.adaln_modulate(n, scale, shift, bf16),
            lambda: adaln_modulate.reference(n, scale, shift, bf16),
            *adaln_modulate.cost(shape, bf16),
            exact=True,
        ),
        Case(
            "gated_residual",
            lambda: gated_residual.gated_residual(x, y, gate),
            lambda: gated_residual.reference(x, y, gate),
            *gated_residual.cost(shape, bf16),
            exact=True,
        ),
        Case(
            "layernorm_modulate",
            lambda: layernorm_modulate.layernorm_modulate(x, eps, scale=scale, shift=shift),
            lambda: layernorm_modulate.reference(x, eps, scale=scale, shift=shift),
            *layernorm_modulate.cost(shape, bf16),
            exact=False,
            rel_l2_bound=1e-2,
        ),
        Case(
            "layernorm_affine",
            lambda: layernorm_modulate.layernorm_modulate(x, eps, weight=weight, bias=bias),
            lambda: layernorm_modulate.reference(x, eps, weight=weight, bias=bias),
            *layernorm_modulate.cost(shape, bf16, affine=True, modulate=False),
            exact=False,
            rel_l2_bound=1e-2,
        ),
        Case(
            "rope_only",
            lambda: qk_norm_rope.rope_only(q, cos, sin),
            lambda: qk_norm_rope.rope_reference(q, cos, sin),
            *qk_norm_rope.cost((batch, tokens, heads, head_dim), norm=False),
            exact=True,
        ),
        Case(
            "qk_norm_rope",
            lambda: qk_norm_rope.qk_norm_rope(x, rms_weight, eps, cos, sin, heads),
            lambda: qk_norm_rope.reference(x, rms_weight, eps, cos, sin, heads),
            *qk_norm_rope.cost((batch, tokens, heads, head_dim)),
            exact=False,
            rel_l2_bound=1e-2,
        ),
    ]


def head_norm_rope_case(shape: tuple[int, int, int, int], device: str | torch.device, seed: int = 1) -> Case:
    """MiniMax-H3's per-head RMS norm and partial rotary (`H3_ROTARY` channels) on q of `shape` (batch, tokens,
    heads, head_dim) bf16, inputs drawn from `seed`."""
    g = torch.Generator(device).manual_seed(seed)
    x = (torch.randn(shape, generator=g, device=device) * 2 + 0.1).bfloat16()
    weight = torch.randn(shape[-1], generator=g, device=device).bfloat16()
    cos, sin = (torch.randn(shape[1], H3_ROTARY, generator=g, device=device) for _ in range(2))
    moved = head_norm_rope.cost(shape)
    bytes_moved, flops = moved if isinstance(moved, tuple) else (moved, 0)
    return Case(
        "head_norm_rope",
        lambda: head_norm_rope.head_norm_rope(x, weight, 1e-6, cos, sin),
        lambda: head_norm_rope.reference(x, weight, 1e-6, cos, sin),
        bytes_moved,
        flops,
        exact=False,
        rel_l2_bound=1e-2,
    )


def shapes(smoke: bool = False) -> tuple[dict[str, int], tuple[int, int, int, int]]:
    """(the Wan block's `cases` arguments, H3's q shape): `WAN`, `H3_Q`, or the tiny ones of a smoke run."""
    return (SMOKE_WAN, SMOKE_H3_Q) if smoke else (WAN, H3_Q)


def all_cases(device: str | torch.device, smoke: bool = False) -> list[Case]:
    """Every kernel `benchmark` times: the Wan block's and head_norm_rope at `shapes(smoke)`."""
    wan, h3_q = shapes(smoke)
    return [*cases(**wan, device=device), head_norm_rope_case(h3_q, device)]


def check(case: Case) -> dict[str, Any]:
    """The kernel's output against the reference's on the case's inputs: equal / differing / rel-L2 / within."""
    got, want = case.kernel(), case.reference()
    got, want = (got[-1], want[-1]) if isinstance(got, tuple) else (got, want)  # fused add: the normed output
    equal = bool(torch.equal(got, want))
    error = rel_l2(got, want)
    within = equal if case.exact else error <= case.rel_l2_bound
    return {"bitwise_equal": equal, "differing_elements": int((got != want).sum()), "rel_l2": error, "within": within}


@dataclass
class Comparison:
    """What `compare` measured. `arms`: per kernel, its check (`check`), bytes and flops, and when timed its median
    seconds and its reference's (`median_s`, `reference_median_s`), `roofline_s`, `fraction_of_roofline` and
    `achieved_gbps`, and `host_launch_s` (CUDA: host seconds to enqueue one call, no sync); `ratios`:
    `"<kernel> reference/<kernel>"` -> the paired speed-up with its CI95
    (`RatioCI.to_dict`, >= 3 rounds); `notes`: kernels left untimed and why, then how to read the times;
    `device_state`: the GPU's clocks, temperature, throttling and other processes while `benchmark` ran
    (`telemetry.summarize_samples` of NVML samples; empty off CUDA or without NVML)."""

    ceilings: Ceilings
    smoke: bool
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    ratios: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    device_state: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Every kernel within its contract and timed."""
        return bool(self.arms) and all(arm["within"] and "median_s" in arm for arm in self.arms.values())

    def html(self) -> str:
        """A self-contained table (no script): per kernel its check, both medians, the speed-up and its CI95, its
        fraction of the roofline as a bar and, when measured (CUDA), its host launch time; the ceilings (each rate at
        the SI prefix that keeps it readable: "2.98 TB/s", a smoke run's "16.7 MB/s") and the notes under it."""
        launches = any("host_launch_s" in arm for arm in self.arms.values())  # a column only where one was measured
        rows = []
        for name, arm in self.arms.items():
            check = "equal" if arm["bitwise_equal"] else f"rel L2 {arm['rel_l2']:.1e}"
            check += "" if arm["within"] else " (outside its contract)"
            ratio = self.ratios.get(f"{name} reference/{name}")
            if "median_s" not in arm:
                cells = [""] * (4 + launches)
            else:
                fraction = arm["fraction_of_roofline"]
                speedup = f"{ratio['median']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}]" if ratio else "< 3 rounds"
                bar = (f'<span style="display:inline-block;width:{min(fraction, 1) * 8:.2f}em;height:0.8em;'
                       f'background:#4c72b0"></span> {fraction:.0%}')  # fmt: skip
                launch = f"{arm['host_launch_s'] * 1e3:.3f}" if "host_launch_s" in arm else ""
                cells = [f"{arm['median_s'] * 1e3:.3f}", f"{arm['reference_median_s'] * 1e3:.3f}", speedup, bar]
                cells += [launch] * launches
            cells = [escape(name), escape(check), *cells]
            rows.append("".join(f'<td style="text-align:{_align(i)}">{c}</td>' for i, c in enumerate(cells)))
        columns = ["kernel", "check", "kernel ms", "reference ms", "speed-up [CI95]", "of roofline"]
        columns += ["host launch ms"] * launches
        head = "".join(f'<th style="text-align:{_align(i)}">{h}</th>' for i, h in enumerate(columns))  # as its cells
        c = self.ceilings
        caption = (f"{escape(c.device)}: copy {_rate(c.copy_bytes_per_s, 'B')} (read + write), "
                   f"bf16 GEMM {_rate(c.bf16_flops_per_s, 'FLOP')}, measured in this run")  # fmt: skip
        if self.smoke:
            caption = (
                "Smoke run (tiny shapes, Triton's interpreter): the checks are real, the times say nothing.<br>"
                + caption
            )
        if state := self.device_state:
            caption += (
                f"; during the run: SM clock {state['min_sm_clock_mhz']}-{state['max_sm_clock_mhz']} MHz, up to "
                f"{state['max_temperature_c']} C, {state['throttled_samples']} of {state['count']} samples "
                f"slowed by heat or hardware, up to {state['max_processes']} processes on the GPU"
            )
        notes = "".join(f"<li>{escape(note)}</li>" for note in self.notes)
        # the caption reads from the table's left edge, as the notes under it do (a browser centres it by default)
        return (f'<table class="vflash-kernels"><caption style="text-align:left">{caption}</caption><tr>{head}</tr>'
                + "".join(f"<tr>{row}</tr>" for row in rows) + f"</table><ul>{notes}</ul>")  # fmt: skip


def _align(column: int) -> str:
    """A column's alignment in `Comparison.html`, its heading's too: text (kernel, check, the roofline bar) left,
    numbers right."""
    return "left" if column in (0, 1, 5) else "right"


def _rate(per_s: float, unit: str) -> str:
    """`per_s` (`unit` per second) at the SI prefix, up to P, that puts it at 1 or more: "2.98 TB/s", "766 TFLOP/s",
    "16.7 MB/s"; 3 significant digits, none after the point from 100 up."""
    prefix, scale = next(
        (p for p in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)) if per_s >= p[1]), ("", 1.0)
    )
    value = per_s / scale
    return f"{value:.3g} {prefix}{unit}/s" if value < 100 else f"{value:.0f} {prefix}{unit}/s"


def compare(
    cases: list[Case], device: str | torch.device, ceilings: Ceilings, rounds: int, clock: dict[str, Any],
    smoke: bool = False,
) -> Comparison:  # fmt: skip
    """Check each case (`check`), then time the ones within their contract in `rounds` A/B/A rounds, reference /
    kernel / reference, each visit `time_call(..., **clock)`'s device seconds. A kernel outside its contract, or one
    that fails while timed, is noted and left untimed; the others still run."""
    result = Comparison(ceilings, smoke)
    for case in cases:
        checked = check(case)
        arm: dict[str, Any] = {**checked, "bytes_moved": case.bytes_moved, "flops": case.flops}
        result.arms[case.name] = arm
        if not checked["within"]:
            result.notes.append(f"{case.name}: output outside its contract's bound; not timed ({checked}).")
            continue
        rounds_run = aba_rounds(
            (f"{case.name} reference", lambda c=case: time_call(c.reference, device, **clock).device_s),
            {case.name: lambda c=case: time_call(c.kernel, device, **clock).device_s},
            rounds,
        )
        if case.name in rounds_run.errors:
            arm["error"] = rounds_run.errors[case.name]
            result.notes.append(f"{case.name}: failed while timed: {arm['error']}")
            continue
        medians = rounds_run.medians()
        roofline = ceilings.roofline_seconds(case.bytes_moved, case.flops)
        arm.update(
            median_s=medians[case.name],
            reference_median_s=medians[f"{case.name} reference"],
            roofline_s=roofline,
            fraction_of_roofline=roofline / medians[case.name],
            achieved_gbps=case.bytes_moved / medians[case.name] / 1e9,
        )
        if torch.device(device).type == "cuda":
            arm["host_launch_s"] = host_launch_seconds(case.kernel, device)
        result.ratios.update({k: v.to_dict() for k, v in rounds_run.ratios().items()})
    clocked = "calls queued back to back (device time per call)"
    if clock.get("graph"):
        clocked = "CUDA-graph replays queued back to back (device time per call, no host launch cost)"
    if not clock.get("queued", True):
        clocked = "each call timed alone, synchronised (on a CPU: the host clock)"
    result.notes.append(
        f"Times: {clocked}, median of the A/B/A visits; ratios are reference time / kernel time (> 1: the kernel is "
        "faster). Of roofline: the least time the kernel's bytes and flops can take at the ceilings measured on this "
        "device in this run (copy bytes read plus written per second, bf16 GEMM flop/s), over the kernel's time."
    )
    return result


def host_launch_seconds(fn: Callable[[], Any], device: str | torch.device, calls: int = REPEATS) -> float:
    """Host seconds to enqueue one call of `fn` on CUDA: `calls` calls back to back without a sync, after one warm
    call, on the host clock (the GPU may still be running them). What a step pays per call when the host, not the
    GPU, is the bottleneck."""
    fn()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = (time.perf_counter() - start) / calls
    torch.cuda.synchronize(device)
    return seconds


def benchmark(device: str | torch.device, rounds: int = 5, smoke: bool = False) -> Comparison:
    """Every kernel (`all_cases`) against its reference on `device`, `rounds` A/B/A rounds, at the ceilings measured
    first on the same device (`device_ceilings`). A full run: `REPEATS` calls a visit after `WARMUP`. `smoke`: one
    call a visit, tiny shapes; on a CPU the kernels then need TRITON_INTERPRET=1. On CUDA the GPU's state is sampled
    through the timed part (`Comparison.device_state`).

    RuntimeError for a full run off CUDA (the times would be a CPU's), and on a CPU when the Triton interpreter is
    off (the kernels cannot run there otherwise)."""
    device = torch.device(device)
    if not smoke and device.type != "cuda":
        raise RuntimeError(f"kernel benchmarks need a CUDA device, got {device}; pass smoke=True for the CPU check")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("kernel benchmarks: device cuda asked for, and this machine has no CUDA device")
    if cpu_without_interpreter(device):
        raise RuntimeError("Triton kernels on a CPU need TRITON_INTERPRET=1 (set before the first kernel launch)")
    clock = {"repeats": 1, "warmup": 0, "queued": False} if smoke else {"repeats": REPEATS, "warmup": WARMUP}
    if device.type == "cuda" and not smoke:  # (a smoke run's one unwarmed call cannot be captured)
        clock["graph"] = True  # device time alone: the launchers' host cost is near the kernels' (module doc)
    ceilings = device_ceilings(device, smoke)
    # on CUDA, a throttled or shared GPU shows in the result
    sampling = maybe_sampler(device, Telemetry(device)) if device.type == "cuda" else contextlib.nullcontext()
    with sampling as sampler:
        result = compare(all_cases(device, smoke), device, ceilings, rounds, clock, smoke)
    result.device_state = summarize_samples(sampler.samples if sampler is not None else [])
    return result
