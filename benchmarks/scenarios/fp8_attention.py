"""The low-bit attention kernel (Q.K^T in INT8 or FP8 e4m3 x P.V in FP8, INT8 or bf16) against cuDNN dense attention and
FlashAttention-4 (when importable), and block_sparse at 20 % exact block pairs with its exact blocks in low precision
against block_sparse alone, at the Wan2.1-1.3B attention shape (1 x 12 heads x 32,760 tokens x 128, bf16).

fp8_attention, per precision pair: each whole call (Triton quantization + kernel) is timed A/B/A against cuDNN
SDPA, and against FA4's `flash_attn_func` when `flash4_attention` finds it usable here (ratio with CI95, queued
clock: calls back to back, as inside a forward); the kernel alone (`attend` on quantized operands) and the
quantization alone (`attention_quantize.quantize`, with its GB/s from `attention_quantize.cost`) with both clocks of
`time_call`. The plugin's default pair is also timed A/B/A on q, k, v in the attention dispatcher's (B, T, H, D)
memory order (`dispatcher-layout`: what a model's calls hand the kernels; its quantization timed alone too, its
output checked equal to the contiguous call's). TFLOP/s from `cost()` (dense-attention FLOPs, so arms compare
directly). Relative L2 of each output against cuDNN's bf16 output on three inputs: iid normal q, k, v;
`structured` (`sparse_attention.structured_qkv`: q and k share smooth positional features, as video attention
does); `outliers` (`outlier_qkv`: RMS-normed q/k with a shared channel offset and 4 outlier channels, as a DiT's
q/k norm leaves them); and per call on `captured` q, k, v:
the video self-attention of the trained demo-av (4 heads of 48, zero-padded to 64 by the kernel) recorded during one
dense request (`captured_calls`), median and worst call with the median per step. `error_parts` says where that error
comes from: each quantization step alone and all of them together, per input (the references' maths in fp32 on head
0's first ERROR_PART_ROWS queries against all keys, against exact fp32 attention of the same rows). A launch sweep
(`LAUNCHES`) times the Triton kernel alone for each pair of `SWEEP_PAIRS` at other tile sizes, warps and stages, each
A/B/A against the default path (kernel alone, ratio with CI95), with its error against the default path's output;
the A/B/A arms take `attend`'s default path, each arm's `kernel_path` names it: the CuTe kernel where
`fa.sm90_kernel` holds (sm_90, a one-byte P.V, the DSL importable), else the Triton kernel with `launch_for`'s launch.
For TRITON_TWIN_PAIRS whose default is the CuTe kernel, the pair also runs through the Triton kernel (`...,triton` arm, A/B/A with the rest, its output against the CuTe kernel's).
`quantize_kernels`: one quantization under the profiler, device time by kernel (the torch reductions, the three
launches of `_quantize_fwd`, the scales' small ops). `compiled` lists what Triton's JIT built in this process for the
attention and quantization kernels: launch, registers and spilled bytes per variant (from the JIT's cache; the CPU
compile reports of `workbench.kernels.targets` should agree).

block_sparse at 20 %: tau by bisection on the structured q/k (as `sparse-attention`), the exact arm against each
low-precision arm (`SPARSE_PRECISIONS`) A/B/A on the queued clock, each with its relative L2 against dense and against
the exact arm; the plan (routing, and the quantizer's key mean and v amax), the quantization and the attention
kernel alone are timed apart (each arm's `kernel_path`: the CuTe kernel, `fp8_attention_sm90.attend_sparse`,
or the Triton kernel), and where that is the CuTe kernel, the Triton kernel alone at SPARSE_LAUNCHES beside it, A/B/A
(`launch_sweep`).
`--smoke`: (1, 1, 128, 128) float32 on the CPU under the Triton interpreter against the math backend, every arm and
swept launch, the captured calls from a short request (`SMOKE_CAPTURE`); the numbers say nothing.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios.sparse_attention import SMOKE_GRID, SMOKE_HEADS, structured_qkv
from benchmarks.workloads import WAN_TOKENS_GRID, calls, captured_qkv, tau_for
from workbench import Request, Session
from workbench.accelerations.attention import flash4_attention
from workbench.evidence.timing import aba_rounds, kernel_times, time_call
from workbench.kernels import attention_quantize as aq
from workbench.kernels import block_sparse_attend
from workbench.kernels import block_sparse_attention as bsa
from workbench.kernels import fp8_attention as fa
from workbench.quality.latent import rel_l2

NAME = "fp8-attention"
SUMMARY = "low-bit attention (QK int8/e4m3 x PV fp8/int8/bf16) vs cuDNN and FA4; block_sparse 20 % exact vs low-bit"
GPUS = 1
PAIRS = tuple((qk, pv) for qk in fa.QK_MODES for pv in fa.PV_MODES)
SWEEP_PAIRS = (("int8", "fp8"), ("int8", "int8"), ("int8", "bf16"))  # the plugin's default; one-byte P.V whose
# error meets the 3e-2; the lowest-error pair
DISPATCHER_PAIR = ("int8", "fp8")  # the plugin's default, also timed on the dispatcher's (B, T, H, D) memory order
LAUNCHES = {
    "m64_n128_w4_s3": fa.Launch(64, 128, 4, 3),  # shipped on sm_90 for pv="fp8" (DEFAULT)
    "m64_n128_w4_s2": fa.Launch(64, 128, 4, 2),  # shipped on sm_90 for pv="bf16" (BF16_PV)
    "m64_n128_w4_s4": fa.Launch(64, 128, 4, 4),
    "m64_n64_w4_s3": fa.Launch(64, 64, 4, 3),
    "m128_n128_w8_s2": fa.Launch(128, 128, 8, 2),
    "m128_n128_w8_s3": fa.Launch(128, 128, 8, 3),
}
TRITON_TWIN_PAIRS = (("int8", "fp8"), ("int8", "int8"))  # the plugin's default pair; one-byte P.V within 3e-2
CAPTURE_MODEL = "demo-av"  # trained: its attention activations are a model's, not synthetic
CAPTURE_PROMPT = "a red circle moves left slow on a dark background, soft low hum"
# smoke: 2 steps of 9 frames (2 latent frames: 128 video rows, as many as the smoke's synthetic inputs)
SMOKE_CAPTURE = {"steps": 2, "frames": 9}
HEAD_DIM = 128  # the production head dim (Wan, LTX-2, H3): the kernels' case measured here
SPARSE_DENSITY = 0.20
SPARSE_PRECISIONS = (("int8", "fp8"), ("int8", "int8"), ("int8", "bf16"), ("e4m3", "fp8"))
SPARSE_LAUNCHES = {"triton": block_sparse_attend.DEFAULT}  # where the low-precision default is the CuTe kernel, the
# Triton kernel alone at its shipped launch beside it
ERROR_PART_ROWS = 4096  # query rows (of head 0, against all keys) `error_parts` runs on: a (4096, T) fp32 logits tile


def outlier_qkv(
    tokens: int, heads: int, device: torch.device, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1, heads, T, 128): q and k share a per-channel offset, 4 channels get 6x gain, then each token is
    RMS-normalised (the models' q/k norm); v iid normal."""
    g = torch.Generator(device).manual_seed(seed)
    q, k, v = (torch.randn(1, heads, tokens, HEAD_DIM, generator=g, device=device) for _ in range(3))
    offset = torch.randn(1, heads, 1, HEAD_DIM, generator=g, device=device)
    gain = torch.ones(HEAD_DIM, device=device)
    gain[torch.randperm(HEAD_DIM, generator=g, device=device)[:4]] = 6.0

    def normed(x: torch.Tensor) -> torch.Tensor:
        x = (x + offset) * gain
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))).to(dtype)

    return normed(q), normed(k), v.to(dtype)


COMPILED_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "ROWS", "QK_INT8", "PV", "LOWBIT", "INT8", "CHANNEL", "SMOOTH", "F32")


def compiled_kernels() -> list[dict[str, Any]] | str:
    """Every variant Triton's JIT compiled in this process for fp8_attention, attention_quantize and
    block_sparse_attend: kernel name, the constexprs that pick the variant, warps, stages, registers per thread and
    spilled bytes (ptxas' counts as the driver reports them). Read from the JIT's cache (Triton 3.x internals): a
    string saying why when they cannot be read."""
    rows = []
    try:
        for module in (fa, aq, block_sparse_attend):
            jitted = module._KERNEL._jitted.get((False, None))  # this GPU's own builds
            if jitted is None:
                continue
            for cache in jitted.device_caches.values():
                for kernel in cache[0].values():
                    kernel._init_handles()  # registers and spills are read when the binary is loaded
                    names = kernel.src.fn.arg_names
                    constants = {names[key[0]]: value for key, value in kernel.src.constants.items()}
                    rows.append({
                        "kernel": kernel.metadata.name,
                        **{k: v for k, v in constants.items() if k in COMPILED_CONSTEXPRS},
                        "num_warps": kernel.metadata.num_warps, "num_stages": kernel.metadata.num_stages,
                        "registers": kernel.n_regs, "spill_bytes": kernel.n_spills,
                    })  # fmt: skip
    except Exception as error:  # noqa: BLE001 - a diagnostic read of Triton internals must not fail the run
        return f"not readable from this Triton's JIT cache: {type(error).__name__}: {error}"
    return rows


def captured_calls(device: torch.device, smoke: bool) -> list[tuple[int, tuple[torch.Tensor, ...]]]:
    """(step, (q, k, v) as (B, H, T, D)) of CAPTURE_MODEL's routed video self-attention in one dense request of its
    default size (CFG: both branches in one call), in the session's dtype; smoke: `SMOKE_CAPTURE`, first block only."""
    session = Session.open(CAPTURE_MODEL, device=str(device))
    keep = (lambda step, block: block == 0) if smoke else (lambda step, block: True)
    records = captured_qkv(session, Request(CAPTURE_PROMPT, seed=5, **(SMOKE_CAPTURE if smoke else {})), keep)
    return [(r["step"], tuple(r[name].transpose(1, 2) for name in "qkv")) for r in records]


def _captured_errors(calls: list, run, dense) -> dict[str, Any]:
    """Relative L2 of `run(q, k, v)` against `dense(q, k, v)` per captured call: median, worst, median per step."""
    errors = [(step, rel_l2(run(*qkv), dense(*qkv))) for step, qkv in calls]
    steps = sorted({step for step, _ in errors})
    return {
        "calls": len(errors),
        "median": statistics.median(e for _, e in errors),
        "max": max(e for _, e in errors),
        "median_by_step": [statistics.median(e for s, e in errors if s == step) for step in steps],
    }


def error_parts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, float]:
    """Relative L2 against exact fp32 attention of each of the kernel's quantization steps alone, and of them all
    (the default pair, int8 Q.K^T with FP8 P.V; and int8 with INT8 P.V), on head 0's first ERROR_PART_ROWS queries
    of q, k, v (B, H, T, 128): Q.K^T in int8 or e4m3 (smoothed keys, per-block scales,
    `attention_quantize.quantize_reference`), P rounded to e4m3 or int8 per key tile of `fa.DEFAULT.block_n`
    (`fa.online_step`), v in e4m3 or int8 with its per-channel scale."""
    q, k, v = q[:1, :1, :ERROR_PART_ROWS], k[:1, :1], v[:1, :1]
    scale = q.shape[-1] ** -0.5

    def attend(logits: torch.Tensor, values: torch.Tensor, pv: str | None) -> torch.Tensor:
        acc, l = fa.online_softmax(logits, values, pv, fa.DEFAULT.block_n)  # noqa: E741
        return acc / aq.P_TOP.get(pv, 1.0) / l[..., None]  # a rounded P carried the 448 (127)

    def v_rounded(pv: str) -> torch.Tensor:  # (1, 1, T, 128) v's one-byte values times their per-channel scale
        z = aq.quantize_reference(q, k, v, pv, qk="int8")
        return aq.v_in_key_order(z.v, k.shape[2]).transpose(-1, -2).float() * (z.v_scale * aq.P_TOP[pv])[:, :, None]

    exact_logits = (q.float() @ k.float().transpose(-1, -2)) * (scale * fa.LOG2E)
    z = {qk: aq.quantize_reference(q, k, v, "bf16", qk=qk) for qk in fa.QK_MODES}
    logits = {qk: fa.reference_logits(z[qk], q.shape[2], k.shape[2], scale)[0] for qk in fa.QK_MODES}
    v8 = {pv: v_rounded(pv) for pv in ("fp8", "int8")}
    exact = attend(exact_logits, v.float(), None)
    parts = {
        "qk_int8": attend(logits["int8"], v.float(), None),
        "qk_e4m3": attend(logits["e4m3"], v.float(), None),
        "p_e4m3": attend(exact_logits, v.float(), "fp8"),
        "v_e4m3": attend(exact_logits, v8["fp8"], None),
        "p_and_v_e4m3": attend(exact_logits, v8["fp8"], "fp8"),
        "all_int8_fp8": attend(logits["int8"], v8["fp8"], "fp8"),
        "p_int8": attend(exact_logits, v.float(), "int8"),
        "v_int8": attend(exact_logits, v8["int8"], None),
        "all_int8_int8": attend(logits["int8"], v8["int8"], "int8"),
    }
    return {name: rel_l2(out, exact) for name, out in parts.items()}


def _label(qk: str, pv: str) -> str:
    return f"qk={qk},pv={pv}"


def run(context: Context) -> Measurement:
    device, smoke = context.device, context.smoke
    grid, heads = (SMOKE_GRID, SMOKE_HEADS) if smoke else (WAN_TOKENS_GRID, 12)
    dtype = torch.float32 if smoke else torch.bfloat16
    backend = SDPBackend.MATH if smoke else SDPBackend.CUDNN_ATTENTION
    tokens = math.prod(grid)
    g = torch.Generator(device).manual_seed(7)
    inputs = {
        "iid": tuple(torch.randn(1, heads, tokens, HEAD_DIM, generator=g, device=device).to(dtype) for _ in "qkv"),
        "structured": structured_qkv(grid, heads, device, dtype, seed=11),
        "outliers": outlier_qkv(tokens, heads, device, dtype, seed=13),
    }
    q, k, v = inputs["iid"]
    captured = captured_calls(device, smoke)
    clock = calls(smoke, repeats=10, warmup=2)
    notes = []

    def dense(q=q, k=k, v=v) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    def queued(fn) -> float:
        return time_call(fn, device, **clock).device_s

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
    scale = HEAD_DIM**-0.5
    for qk, pv in PAIRS:
        name = f"fp8_attention[{_label(qk, pv)}]"
        z = aq.quantize(q, k, v, pv, qk=qk)
        out = torch.empty_like(q)
        kernel = time_call(lambda z=z, out=out: fa.attend(z, out, tokens, scale), device, **clock)
        quantize = time_call(lambda pv=pv, qk=qk: aq.quantize(q, k, v, pv, qk=qk), device, **clock)
        arms[name] = {
            "kernel_path": "cute" if fa.sm90_kernel(z, out) else "triton",
            "rel_l2_vs_dense": {
                kind: rel_l2(fa.fp8_attention(*qkv, pv=pv, qk=qk), dense(*qkv)) for kind, qkv in inputs.items()
            },
            "captured_rel_l2_vs_dense": _captured_errors(
                captured, lambda q, k, v, pv=pv, qk=qk: fa.fp8_attention(q, k, v, pv=pv, qk=qk), dense
            ),
            "kernel": kernel.to_dict(),
            "quantize": quantize.to_dict(),
            "quantize_kernels": kernel_times(lambda pv=pv, qk=qk: aq.quantize(q, k, v, pv, qk=qk), device),
            "quantize_gbps": aq.cost(tuple(q.shape), pv, dtype) / quantize.median_s / 1e9,
            "kernel_tflops": flops / kernel.median_s / 1e12,
            "bytes_moved": fa.cost(tuple(q.shape), pv, dtype)[0],
        }
        if (qk, pv) in SWEEP_PAIRS:

            def triton(launch, z=z, out=out) -> torch.Tensor:
                fa.attend(z, out, tokens, scale, launch, kernel="triton")
                return out

            launches = {label: ({}, lambda launch=launch: triton(launch)) for label, launch in LAUNCHES.items()}

            def shipped(z=z, out=out) -> torch.Tensor:  # attend's default path: the CuTe or the Triton kernel
                fa.attend(z, out, tokens, scale)
                return out

            arms[name]["launch_sweep"] = _sweep(launches, shipped, device, clock, flops, context.rounds)
        visits[name] = lambda pv=pv, qk=qk: fa.fp8_attention(q, k, v, pv=pv, qk=qk)
    # The plugin's call: the dispatcher hands (B, T, H, D) tensors, which the kernels read as (B, H, T, D) views
    qd, kd, vd = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    qk, pv = DISPATCHER_PAIR
    name = f"fp8_attention[{_label(qk, pv)},dispatcher-layout]"
    arms[name] = {
        "quantize": time_call(lambda: aq.quantize(qd, kd, vd, pv, qk=qk), device, **clock).to_dict(),
        "kernels": kernel_times(lambda: fa.fp8_attention(qd, kd, vd, pv=pv, qk=qk), device),
        "equal_to_contiguous": torch.equal(
            fa.fp8_attention(qd, kd, vd, pv=pv, qk=qk), fa.fp8_attention(q, k, v, pv=pv, qk=qk)
        ),
    }
    visits[name] = lambda qk=qk, pv=pv: fa.fp8_attention(qd, kd, vd, pv=pv, qk=qk)  # bound now: the loop below rebinds
    for qk, pv in TRITON_TWIN_PAIRS:  # where the default is the CuTe kernel, the Triton kernel's whole call beside it
        if arms[f"fp8_attention[{_label(qk, pv)}]"]["kernel_path"] == "cute":
            name = f"fp8_attention[{_label(qk, pv)},triton]"
            arms[name] = {"rel_l2_vs_cute": rel_l2(fa.fp8_attention(q, k, v, pv=pv, qk=qk, kernel="triton"),
                                                   fa.fp8_attention(q, k, v, pv=pv, qk=qk))}  # fmt: skip
            visits[name] = lambda pv=pv, qk=qk: fa.fp8_attention(q, k, v, pv=pv, qk=qk, kernel="triton")
    ratios: dict[str, Any] = {}
    candidates = {name: fn for name, fn in visits.items() if name.startswith("fp8_attention")}
    for baseline in [name for name in ("cudnn", "flash4") if name in visits]:
        others = {**candidates, **({"flash4": visits["flash4"]} if baseline == "cudnn" and "flash4" in visits else {})}
        rounds = aba_rounds(
            (baseline, lambda fn=visits[baseline]: queued(fn)),
            {name: lambda fn=fn: queued(fn) for name, fn in others.items()},
            context.rounds,
        )
        for name, median in rounds.medians().items():
            arms[name]["queued_median_s"] = median
            arms[name]["tflops"] = flops / median / 1e12
        ratios.update({key: value.to_dict() for key, value in rounds.ratios().items()})
    ratios.update(
        _block_sparse_arms(arms, inputs["structured"], SPARSE_PRECISIONS, dense, queued, context.rounds, clock)
    )
    arms["compiled"] = compiled_kernels()
    arms["error_parts"] = {kind: error_parts(*qkv) for kind, qkv in inputs.items()}
    notes.append(
        "Whole calls A/B/A on the queued clock; `kernel` (attend alone) and `quantize` (the Triton quantizer) carry "
        "both clocks. TFLOP/s count dense attention's 4*T*T*D per head for every arm. Relative L2 against cuDNN's bf16 "
        "output; `structured` and `outliers` q/k are synthetic; `captured_rel_l2_vs_dense` is per call on the trained "
        f"{CAPTURE_MODEL}'s video self-attention ({len(captured)} calls of one dense request). "
        f"`launch_sweep` (the Triton kernel alone, {', '.join(_label(*p) for p in SWEEP_PAIRS)}; shipped launches "
        f"{fa.DEFAULT} for pv=fp8 and int8, {fa.BF16_PV} for pv=bf16): each variant A/B/A against "
        "the default path (the arm's `kernel_path`) on the same operands, `seconds` per visit and `vs_shipped` the "
        "default's time over the variant's with CI95 (> 1: the variant is faster); `rel_l2_vs_shipped` against the "
        "default path's output (another block_n quantizes P over other tiles; the CuTe kernel's l sums P as rounded). "
        "Each arm's `kernel_path`: the default path, cute or triton. "
        f"block_sparse@{SPARSE_DENSITY:.2f}: structured q/k, low-precision arms A/B/A against the exact arm. "
        f"`error_parts`: each quantization step alone against exact fp32 attention, head 0's first {ERROR_PART_ROWS} "
        "query rows against all keys."
    )
    if smoke:
        notes.append("Smoke: float32 on the CPU, math SDPA as the dense arm; the numbers say nothing about speed.")
    shape = {"batch": 1, "heads": heads, "tokens": tokens, "head_dim": HEAD_DIM, "grid": list(grid),
             "dtype": str(dtype).removeprefix("torch.")}  # fmt: skip
    return Measurement(SUMMARY, shape, arms, ratios, notes)


def _sweep(
    variants: dict[str, tuple[dict, Any]],
    shipped: Any,
    device,
    clock: dict,
    flops: int | None,
    rounds: int,
) -> dict:
    """Each variant, {label: (its config entries, a call returning its output)}, A/B/A against `shipped` (the
    shipped path's call, returning its output) for `rounds` rounds, each visit `time_call(**clock)`'s device
    seconds: the variant's seconds per visit, `vs_shipped` (shipped time / variant time with CI95, > 1: the variant
    is faster; from 3 rounds), TFLOP/s of its median when `flops` is given, and its output's relative L2 against
    the shipped path's on the same operands."""
    want = shipped().clone()

    def visit(call) -> float:
        return time_call(call, device, **clock).device_s

    sweep = {}
    for label, (config, call) in variants.items():
        result = aba_rounds(("shipped", lambda: visit(shipped)), {label: lambda call=call: visit(call)}, rounds)
        sweep[label] = {**config, "seconds": result.seconds.get(label, []), "errors": result.errors}
        if label in result.errors:
            continue
        ratio = result.ratios().get(f"shipped/{label}")
        sweep[label]["vs_shipped"] = None if ratio is None else ratio.to_dict()
        if flops is not None:
            sweep[label]["kernel_tflops"] = flops / result.medians()[label] / 1e12
        sweep[label]["rel_l2_vs_shipped"] = rel_l2(call(), want)
    return sweep


def _sparse_sweep(q, k, v, route, z, clock: dict, rounds: int) -> dict:
    """block_sparse's attention kernel alone (`block_sparse_attend.attend` on `route`, low precision on `z`) at each
    of SPARSE_LAUNCHES (the Triton kernel), A/B/A against attend's default path, the CuTe kernel (`_sweep`)."""
    variants = {
        label: (
            {"launch": dataclasses.asdict(launch)},
            lambda launch=launch: block_sparse_attend.attend(q, k, v, route, launch, z, "triton"),
        )
        for label, launch in SPARSE_LAUNCHES.items()
    }
    return _sweep(variants, lambda: block_sparse_attend.attend(q, k, v, route, None, z), q.device, clock, None, rounds)


def _block_sparse_arms(
    arms: dict[str, Any], qkv: tuple, pairs: tuple, dense, queued, rounds: int, clock: dict[str, Any]
) -> dict[str, Any]:
    """block_sparse at SPARSE_DENSITY: the exact arm and one arm per (qk, pv) of `pairs` into `arms`, with the plan,
    the quantization and the kernel alone timed by `time_call(**clock)` as the call runs them (the low-precision
    plan, `plan_with_stats`, also makes the quantizer's key mean and v amax); returns the A/B/A ratios of the
    low-precision arms against the exact one."""
    q, k, v = qkv
    chosen = tau_for(q, k, 0, SPARSE_DENSITY)
    tau, base = chosen["tau"], f"block_sparse@{SPARSE_DENSITY:.2f}"
    want = dense(q, k, v)
    exact = bsa.block_sparse_attention(q, k, v, tau, 0)
    _, flops = bsa.cost(tuple(q.shape), chosen["density"])
    arms[base] = {**chosen, "rel_l2_vs_dense": rel_l2(exact, want)}
    route = bsa.plan(q, k, v, tau, 0)
    arms[base]["plan"] = time_call(lambda: bsa.plan(q, k, v, tau, 0), q.device, **clock).to_dict()
    arms[base]["kernel"] = time_call(lambda: bsa.attend(q, k, v, route), q.device, **clock).to_dict()
    stats = bsa.plan(q, k, v, tau, 0, stats=True)  # the low-precision call's plan: also the quantizer's statistics
    arms[base]["plan_with_stats"] = time_call(
        lambda: bsa.plan(q, k, v, tau, 0, stats=True), q.device, **clock
    ).to_dict()
    visits = {}
    for qk, pv in pairs:
        name = f"{base}[{_label(qk, pv)}]"
        out = bsa.block_sparse_attention(q, k, v, tau, 0, precision=qk, pv=pv)
        z = aq.quantize(q, k, v, pv, qk=qk, k_mean=stats.key_mean, v_amax=stats.v_amax)
        smoothed = dataclasses.replace(route, k_mean=(route.k_mean.float() - z.k_mean).to(route.k_mean.dtype))
        cute = block_sparse_attend.sm90_sparse(z, q)  # block_sparse_attend.attend's default path
        arms[name] = {
            **chosen,
            "kernel_path": "cute" if cute else "triton",
            "rel_l2_vs_dense": rel_l2(out, want),
            "rel_l2_vs_exact_blocks": rel_l2(out, exact),
            "bytes_moved": bsa.cost(tuple(q.shape), chosen["density"], q.dtype, qk, pv)[0],
            "quantize": time_call(
                lambda qk=qk, pv=pv: aq.quantize(q, k, v, pv, qk=qk, k_mean=stats.key_mean, v_amax=stats.v_amax),
                q.device,
                **clock,
            ).to_dict(),
            "kernel": time_call(
                lambda z=z, r=smoothed: block_sparse_attend.attend(q, k, v, r, None, z),
                q.device,
                **clock,
            ).to_dict(),  # fmt: skip
        }
        if cute:
            arms[name]["launch_sweep"] = _sparse_sweep(q, k, v, smoothed, z, clock, rounds)
        visits[name] = lambda qk=qk, pv=pv: bsa.block_sparse_attention(q, k, v, tau, 0, precision=qk, pv=pv)
    result = aba_rounds(
        (base, lambda: queued(lambda: bsa.block_sparse_attention(q, k, v, tau, 0))),
        {name: lambda fn=fn: queued(fn) for name, fn in visits.items()},
        rounds,
    )
    for name, median in result.medians().items():
        arms[name]["queued_median_s"] = median
        arms[name]["tflops"] = flops / median / 1e12
    return {key: value.to_dict() for key, value in result.ratios().items()}
