"""One Wan2.1-1.3B-shaped transformer forward (12 x 128 heads, 30 layers, FFN 8960; 480x832x81 = 32,760 tokens; bf16,
random weights as diffusers builds a bf16 checkpoint): stock against the `exact-fast` profile and the bit-equal set.

Inputs built once: latents (1, 16, 21, 60, 104), timestep 500, the pipeline's own text encoding. Arms:
`stock` (nothing installed), `exact-fast` (`profiles.profile("exact-fast", "wan", device)`: fused_block_norms,
adaln_precompute, cross_kv_cache, gelu_epilogue, flash4_attention where installed), `bit-equal`
(fused_block_ops + adaln_precompute + cross_kv_cache: contract bitwise/rounding, must equal stock),
`exact-fast+fp8_attention` (exact-fast with the own low-bit attention kernel as its self-attention, FA4 keeping
the cross-attention; approximate: its error against stock is in its row). A visit
installs the arm, runs one untimed forward (plugin caches fill, as from step 2 of a request on) and two timed ones.
After the rounds each arm's row gets `kernels`: one more forward under torch.profiler, device time by kernel name
(`kernel_times`), which says where two arms' times part (not a clock: the A/B/A rounds are).
"""

from __future__ import annotations

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import (
    ForwardArm,
    Forwards,
    compare_forwards,
    exact_fast,
    open_wan,
    wan_forward_inputs,
    wan_request,
    with_fp8_attention,
)

NAME = "forward-wan"
SUMMARY = "Wan2.1-1.3B transformer forward, 32,760 tokens bf16: stock vs exact-fast vs the bit-equal set"
GPUS = 1
BIT_EQUAL = {"fused_block_ops": {}, "adaln_precompute": {}, "cross_kv_cache": {}}


def run(context: Context) -> Measurement:
    notes: list[str] = []
    session = open_wan(context.smoke, context.device)
    kwargs, shape = wan_forward_inputs(session, wan_request(16, context.smoke))
    transformer = session.model.pipeline.transformer
    shape.update(model=session.model.name, layers=transformer.config.num_layers)
    fast = exact_fast("wan", context.device, notes, session.model)
    arms = [
        ForwardArm("stock", {}),
        ForwardArm("exact-fast", fast),
        ForwardArm("bit-equal", BIT_EQUAL),
        ForwardArm("exact-fast+fp8_attention", with_fp8_attention(fast)),
    ]
    forwards = Forwards(
        session, lambda: transformer(**kwargs)[0], per_visit=1 if context.smoke else 2, warmup=int(not context.smoke)
    )
    rows, ratios = compare_forwards(forwards, arms, context.rounds, notes, kernels=True)
    if rows["bit-equal"].get("equal_to_stock") is False:
        notes.append("CONTRACT BROKEN: the bit-equal arm's output differs from stock's.")
    notes.append(
        "Times: CUDA events around one synchronised transformer forward, median of 2 per visit after 1 untimed."
        if not context.smoke
        else "Smoke: tiny-wan on the CPU (perf_counter, one forward per visit); the numbers say nothing about speed."
    )
    return Measurement(SUMMARY, shape, rows, ratios, notes)
