"""The kernels' Ampere/Ada launches run on the H200 (issue 28): each launch a card below sm_90 takes
(`launch_for`: block_sparse_attention's AMPERE_ADA, relayout's AMPERE_ADA) against the H200's DEFAULT at the
Wan2.1-1.3B shapes, for correctness against the reference and for time, A/B/A (DEFAULT / AMPERE_ADA).

Block-sparse: 1 x 12 x 32,760 x 128 bf16 structured q/k/v (`sparse_attention.structured_qkv`) at 20 % exact block
pairs, the attention kernel alone (`attend` on one plan), max |error| on the first head against the dense torch maths
of the same routing (`reference` on that head: the routing is per head, and all 12 heads' dense scores would need
52 GB). Relayout: `pack_qkv` and `merge_heads` at world size 2, bit-equal to their reference
chains. Both launches are compiled for sm_90 here (the H200 runs sm_90 code only), so this measures the launch
shapes' cost on Hopper, not an A100's or a 4090's speed; what the sm_80/86/89 builds need (shared memory,
registers, spills) is checked without a GPU by tests/kernels/test_targets.py. `--smoke`: tiny shapes on the CPU
under the Triton interpreter (both launches run the same interpreted maths).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios.sparse_attention import SMOKE_GRID, structured_qkv
from benchmarks.workloads import WAN_TOKENS_GRID, calls, tau_for
from workbench.evidence.timing import aba_rounds, time_call
from workbench.kernels import block_sparse_attention as bsa
from workbench.kernels import relayout

NAME = "portability"
SUMMARY = "Ampere/Ada launches (block-sparse attention, relayout) vs the H200's, on the H200: error and time"
GPUS = 1
DENSITY = 0.20


def ops(smoke: bool, device: torch.device) -> dict[str, tuple[Callable[[Any], torch.Tensor], Callable, Any, Any]]:
    """op -> (call with a launch, reference call, the H200's launch, the Ampere/Ada launch)."""
    dtype = torch.float32 if smoke else torch.bfloat16
    q, k, v = structured_qkv(SMOKE_GRID if smoke else WAN_TOKENS_GRID, 1 if smoke else 12, device, dtype, seed=11)
    tau = tau_for(q, k, 0, DENSITY)["tau"]
    route = bsa.plan(q, k, v, tau, 0)
    b, h, t, d, w = 1, 12, q.shape[2], 128, 2
    if smoke:
        h, t, d = 4, 22, 16
    g = torch.Generator(device).manual_seed(0)
    heads = [torch.randn(b, t // w, h, d, generator=g, device=device).to(dtype) for _ in range(3)]
    received = torch.randn(w, b, t // w, h // w, d, generator=g, device=device).to(dtype)
    return {
        "block_sparse_attend": (lambda launch: bsa.attend(q, k, v, route, launch),
                                lambda: bsa.reference(q[:, :1], k[:, :1], v[:, :1], tau, 0), bsa.DEFAULT, bsa.AMPERE_ADA),
        "pack_qkv": (lambda launch: relayout.pack_qkv(*heads, w, launch=launch),
                     lambda: relayout.pack_qkv_reference(*heads, w), relayout.DEFAULT, relayout.AMPERE_ADA),
        "merge_heads": (lambda launch: relayout.merge_heads(received, w, launch=launch),
                        lambda: relayout.merge_heads_reference(received, w), relayout.DEFAULT, relayout.AMPERE_ADA),
    }  # fmt: skip


def run(context: Context) -> Measurement:
    device, smoke = context.device, context.smoke
    clock = calls(smoke, repeats=20, warmup=2)
    arms: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for op, (call, reference, hopper, ampere) in ops(smoke, device).items():
        want = reference()
        errors = {}
        for name, launch in (("default", hopper), ("ampere_ada", ampere)):
            got = call(launch)[:, : want.shape[1]] if op == "block_sparse_attend" else call(launch)  # the first head
            errors[name] = float((got.float() - want.float()).abs().max())
        rounds = aba_rounds(
            (f"{op} default", lambda c=call, x=hopper: time_call(lambda: c(x), device, **clock).median_s),
            {f"{op} ampere_ada": lambda c=call, x=ampere: time_call(lambda: c(x), device, **clock).median_s},
            context.rounds,
        )
        arms[op] = {
            "launches": {"default": vars(hopper), "ampere_ada": vars(ampere)},
            "max_abs_error_vs_reference": errors,
            "medians_s": rounds.medians(),
            "errors": rounds.errors,
        }
        ratios.update({k: v.to_dict() for k, v in rounds.ratios().items()})
    notes = [
        "Ratios are default / ampere_ada seconds (< 1: the Ampere/Ada launch is slower on the H200); both launches "
        "are compiled for sm_90 (the H200 cannot load sm_80/86/89 code), so the ratio is the cost of the launch "
        "shape on Hopper, not a speed on those cards.",
        f"block_sparse_attend: the attention kernel alone on one plan at {DENSITY:.0%} exact block pairs; its "
        "reference is the dense torch maths of the same routing (bf16 rounding expected, ~1e-2).",
    ]
    if smoke:
        notes.append("Smoke: CPU under the Triton interpreter; both launches run the same interpreted maths.")
    return Measurement(SUMMARY, {"tokens_grid": list(SMOKE_GRID if smoke else WAN_TOKENS_GRID)}, arms, ratios, notes)
