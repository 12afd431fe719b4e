"""Probe of kernels/fp8_attention_sm90.py (the CuTe DSL kernel) against main's Triton kernel `fp8_attention.attend`.

CPU: compile only (for sm_90a), both Q.K^T modes, every variant. GPU, per Q.K^T mode (e4m3, int8), on the
same quantized operands:
1. correctness on small shapes (T = 300 and 1,061: masked last tiles, partial query tiles), each of `VARIANTS`:
   relative L2 of the CuTe output against `fp8_attention.reference` and against the Triton kernel;
2. at 1 x 12 x 32,760 x 128 bf16, each variant right on the small shapes: relative L2 against the Triton kernel and
   against cuDNN's bf16 output, then the kernels alone A/B/A (queued clock, `ROUNDS` rounds): ms, TFLOP/s
   (dense-attention FLOPs), Triton / CuTe with CI95;
3. with FlashAttention-4 importable: the whole call (quantize on fresh operands + the fastest variant) A/B/A against
   FA4's `flash_attn_func`, with main's Triton call (`fp8_attention.fp8_attention`) beside it: issue 25's first bar.
Writes $OUT/cute_fp8.json after every step (or prints it when OUT is unset).
"""

import json
import os
import time

import cuda.bindings.driver as cuda
import cutlass.cute as cute
import torch

from workbench.accelerations.attention import flash4_attention
from workbench.evidence.timing import aba_rounds, time_call
from workbench.kernels import attention_quantize as aq
from workbench.kernels import fp8_attention as fa
from workbench.kernels.fp8_attention_sm90 import Fp8AttentionSm90, operands

SCALE = 128**-0.5
ROUNDS = int(os.environ.get("ROUNDS", "5"))
VARIANTS = {  # simplest first: a fault in a later one (the CUDA context lost) leaves the earlier ones' results
    "plain_s2": {"overlap": False},
    "s3": {"stages": 3},
    "s2_lsum": {"lsum_mma": True},
    "s3_lsum": {"stages": 3, "lsum_mma": True},
}
# relative L2 against the Triton kernel on the same operands below which a variant counts as right: lsum_mma's l sums
# P as rounded to e4m3 (about 2.5 % RMS an element, averaging out over the keys: ~1.5e-3 at 300 keys, ~1.5e-4 at 32,760)
SMALL_RIGHT, RIGHT = 5e-3, 2e-3

def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


COMPILED = {}  # (qk, variant name, tk) -> the compiled kernel, for whole calls on fresh operands


def build(qk: str, z: aq.Quantized, out: torch.Tensor, tk: int, config: dict, name: str = ""):
    """The compiled CuTe kernel (options `config`) for these operands, and a call of it."""
    args = operands(z, out)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream if out.is_cuda else 0)
    start = time.time()
    kernel = Fp8AttentionSm90(qk_int8=qk == "int8", **config)
    compiled = cute.compile(kernel, *args, SCALE * fa.LOG2E, tk, stream, options="--gpu-arch sm_90a")
    COMPILED[qk, name, tk] = compiled
    seconds = time.time() - start
    return seconds, lambda: compiled(*args, SCALE * fa.LOG2E, tk, stream)


def inputs(t: int, device: str, seed: int):
    g = torch.Generator(device).manual_seed(seed)
    return [torch.randn(1, 12, t, 128, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3)]


def save(record: dict) -> None:
    """The record so far into $OUT/cute_fp8.json (after every step: a hang or fault keeps what was measured)."""
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "cute_fp8.json"), "w") as f:
            json.dump(record, f, indent=1)


def measure(qk: str, record: dict, row: dict) -> None:
    """Steps 1-3 of the module doc for one Q.K^T mode on the GPU, saving into `record` as it goes."""
    device = "cuda"
    for t in (300, 1061):
        q, k, v = inputs(t, device, t)
        z = aq.quantize(q, k, v, "fp8", qk=qk)
        out, triton_out = torch.empty_like(q), torch.empty_like(q)
        fa.attend(z, triton_out, t, SCALE)
        want = fa.reference(q, k, v, SCALE, "fp8", qk=qk)
        for name, config in VARIANTS.items():
            try:
                out.zero_()
                _, call = build(qk, z, out, t, config, name)
                call()
                torch.cuda.synchronize()
                row[f"T{t}_{name}"] = {"rel_l2_vs_reference": rel_l2(out, want),
                                       "rel_l2_vs_triton": rel_l2(out, triton_out)}  # fmt: skip
            except Exception as error:  # recorded; the next variant still runs
                row[f"T{t}_{name}"] = {"error": repr(error)[:500]}
            save(record)
    t = 32760
    q, k, v = inputs(t, device, 7)
    z = aq.quantize(q, k, v, "fp8", qk=qk)
    out, triton_out = torch.empty_like(q), torch.empty_like(q)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    fa.attend(z, triton_out, t, SCALE)
    calls = {}
    for name, config in VARIANTS.items():
        small = [row.get(f"T{t}_{name}", {}) for t in (300, 1061)]
        if any(s.get("rel_l2_vs_triton", 1) > SMALL_RIGHT for s in small):
            continue  # wrong (or failed) on the small shapes: not timed
        row[f"compile_s_{name}"], calls[name] = build(qk, z, out, t, config, name)
        out.zero_()
        calls[name]()
        torch.cuda.synchronize()
        row[f"rel_l2_vs_triton_{name}"] = rel_l2(out, triton_out)
        row[f"rel_l2_vs_dense_{name}"] = rel_l2(out, dense)
        save(record)
    clock = {"repeats": 10, "warmup": 2}

    def queued(fn) -> float:
        return time_call(fn, device, **clock).device_s

    rounds = aba_rounds(
        ("triton", lambda: queued(lambda: fa.attend(z, triton_out, t, SCALE))),
        {name: lambda call=call: queued(call) for name, call in calls.items()},
        ROUNDS,
    )
    flops = fa.cost(tuple(q.shape))[1]
    row["ms"] = {name: 1e3 * value for name, value in rounds.medians().items()}
    row["tflops"] = {name: flops / value / 1e12 for name, value in rounds.medians().items()}
    row["ratio_triton_over_cute"] = {key: ratio.to_dict() for key, ratio in rounds.ratios().items()}
    row["errors"] = rounds.errors
    save(record)
    if flash4_attention.unusable(q.device) is not None:
        return
    # bar 1: the whole call (quantize on fresh operands + the fastest variant) against FA4 and main's Triton call
    right = [name for name in calls if row[f"rel_l2_vs_triton_{name}"] < RIGHT]
    if not right:
        return
    best = min(right, key=lambda name: rounds.medians()[name])
    compiled = COMPILED[qk, best, t]
    flash = flash4_attention.load()
    q4, k4, v4 = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FA4 takes (B, T, H, D)

    def whole() -> None:
        compiled(*operands(aq.quantize(q, k, v, "fp8", qk=qk), out), SCALE * fa.LOG2E, t,
                 cuda.CUstream(torch.cuda.current_stream().cuda_stream))  # fmt: skip

    versus = aba_rounds(
        ("flash4", lambda: queued(lambda: flash.flash_attn_func(q4, k4, v4)[0])),
        {f"quantize+cute_{best}": lambda: queued(whole),
         "quantize+triton": lambda: queued(lambda: fa.fp8_attention(q, k, v, pv="fp8", qk=qk))},
        ROUNDS,
    )  # fmt: skip
    row["whole_call_ms"] = {name: 1e3 * value for name, value in versus.medians().items()}
    row["ratio_flash4_over_whole_call"] = {key: ratio.to_dict() for key, ratio in versus.ratios().items()}
    row["whole_call_errors"] = versus.errors
    save(record)


def main() -> None:
    gpu = torch.cuda.is_available()
    record = {"device": torch.cuda.get_device_name() if gpu else "cpu (compile only)", "modes": {}}
    for qk in ("e4m3", "int8"):
        row = record["modes"].setdefault(qk, {})
        if gpu:
            measure(qk, record, row)
            print(qk, json.dumps(row), flush=True)
            continue
        q, k, v = inputs(300, "cpu", 0)
        z = aq.quantize_reference(q, k, v, "fp8", qk=qk)
        for name, config in VARIANTS.items():
            row[f"compile_s_{name}"], _ = build(qk, z, torch.empty_like(q), 300, config, name)
    save(record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
