"""Every kernel's non-Hopper launch runs on a Hopper GPU (sm_90): each launch a card below sm_90 takes (`launch_for`:
block_sparse_attend's AMPERE_ADA, fp8_attention's ADA, relayout's AMPERE_ADA) beside Hopper's DEFAULT at the
Wan2.1-1.3B shapes, for correctness against the kernel's torch reference and for time, A/B/A, with the roofline of
its `cost()`.

Three builds per arm: `default` (DEFAULT, built for Hopper), the non-Hopper launch built for Hopper (`ampere_ada`
or `ada`: the launch shape's cost on Hopper), and the same launch built as Triton builds it for the card
(`ampere_ada@sm_86`, `ada@sm_89`: `targets.built_for`, no wgmma, no TMA, assembled for Hopper from the card's code),
which is the card's own kernel run on Hopper's SMs. No build here measures a speed on an A100, 3090 or 4090; what
those cards' builds need (shared memory, registers, spills) is checked without a GPU by tests/kernels/test_targets.py.

Arms (bf16, 1 x 12 heads x 32,760 tokens x 128; structured q/k/v of `sparse_attention.structured_qkv`):
- `block_sparse_attend`: the attention kernel alone on one plan at 20 % exact block pairs; reference: the dense torch
  maths of the same routing on the first head (`block_sparse_attention.reference`; the routing is per head, and all
  12 heads' dense scores would need 52 GB). `block_sparse_attend[int8,fp8]`: the same kernel on the low-precision
  operands (`precision="int8"`, pv "fp8"), quantized once outside the timed call; reference: its low-precision maths.
- `fp8_attention[qk,pv]` for (int8, fp8) (the plugin's default) and (e4m3, bf16) (the other Q.K^T and P.V dot
  types): the kernel alone (`attend`) on `quantize`'s operands; reference: `fp8_attention.reference` on the first head.
- `pack_qkv`, `split_result` (of attention's output in its (B, H/W, T, D) memory order: a contiguous batch-1
  output is returned as a view), `merge_heads`, at world size 2: bit-equal to their reference chains.
Tolerances (`metric` <= `bound`) are the kernel tests' bounds for the dtype. Each build's output is checked before it
is timed; a build outside its bound or failing is recorded and not timed. Times: the synchronised per-call clock,
median of each visit, A/B/A with CI95 (`aba_rounds`); an arm's `median_s` is its `default` build's; roofline:
`Ceilings.roofline_seconds` of the timed call's bytes and flops at the ceilings measured on the same device at the
start of the run (`kernel_bench.device_ceilings`, recorded in `shape.ceilings`), `fraction_of_roofline` per build.
Kernels whose launch does not depend on the card are listed in `arms["kernels_considered"]`.
`--smoke`: tiny shapes, float32, on the CPU under the Triton interpreter (no card builds: the interpreter has no
architecture).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios.sparse_attention import SMOKE_GRID, structured_qkv
from benchmarks.workloads import WAN_TOKENS_GRID, calls, tau_for
from workbench import kernel_bench
from workbench.evidence.timing import aba_rounds, time_call
from workbench.kernels import attention_quantize as aq
from workbench.kernels import block_sparse_attention as bsa
from workbench.kernels import fp8_attention as fa
from workbench.kernels import relayout
from workbench.kernels.targets import TARGETS, built_for, kernel_modules
from workbench.quality.latent import rel_l2

NAME = "portability"
SUMMARY = "every kernel's Ampere/Ada launch and build vs Hopper's, on a Hopper GPU: error, time, roofline"
GPUS = 1
DENSITY = 0.20
HEAD_DIM = 128  # the production head dim (Wan, LTX-2, H3)
LOWBIT = ("int8", "fp8")  # block_sparse's low-precision exact blocks: fp8_attention's default pair
FP8_PAIRS = (("int8", "fp8"), ("e4m3", "bf16"))
WORLD = 2


@dataclasses.dataclass(frozen=True)
class Arm:
    """One kernel call at Hopper's launch and a card's. `call(launch)` returns the output; `reference(launch)` the
    torch reference of its first head (`first_head`) or of all of it, compared by `metric` ("max_abs" or "rel_l2")
    within `bound`. `table`: the kernel module whose launch table holds `hopper` (DEFAULT) and `launch`, the one named
    `other`; `card`: the target whose build of `launch` also runs. `cost`: (bytes, flops) of one call."""

    table: str
    hopper: Any
    other: str
    launch: Any
    card: str
    call: Callable[[Any], torch.Tensor]
    reference: Callable[[Any], torch.Tensor]
    first_head: bool
    metric: str
    bound: float
    cost: tuple[int, int]
    repeats: int


def arms(smoke: bool, device: torch.device) -> dict[str, Arm]:
    """The scenario's arms at the production shape (tiny and float32 for `smoke`)."""
    dtype = torch.float32 if smoke else torch.bfloat16
    bf16 = dtype == torch.bfloat16
    q, k, v = structured_qkv(SMOKE_GRID if smoke else WAN_TOKENS_GRID, 1 if smoke else 12, device, dtype, seed=11)
    shape, tokens, scale = tuple(q.shape), q.shape[2], HEAD_DIM**-0.5
    tau = tau_for(q, k, 0, DENSITY)["tau"]
    route = bsa.plan(q, k, v, tau, 0)
    density = float(route.density)
    head = (q[:, :1], k[:, :1], v[:, :1])
    sparse = dict(table="block_sparse_attend", hopper=bsa.DEFAULT, other="AMPERE_ADA", launch=bsa.AMPERE_ADA,
                  first_head=True, repeats=10)  # fmt: skip
    out: dict[str, Arm] = {
        "block_sparse_attend": Arm(
            **sparse, card="sm_86", call=lambda launch: bsa.attend(q, k, v, route, launch, kernel="triton"),
            reference=lambda launch: bsa.reference(*head, tau, 0),
            metric="max_abs", bound=2e-2 if bf16 else 1e-4, cost=bsa.cost(shape, density, dtype),
        ),
    }  # fmt: skip
    qk, pv = LOWBIT
    stats = bsa.plan(q, k, v, tau, 0, stats=True)  # the quantizer's statistics, as block_sparse_attention takes them
    z = aq.quantize(q, k, v, pv, qk=qk, k_mean=stats.key_mean, v_amax=stats.v_amax)
    smoothed = dataclasses.replace(route, k_mean=(route.k_mean.float() - z.k_mean).to(route.k_mean.dtype))
    moved, flops = bsa.cost(shape, density, dtype, qk, pv)
    out[f"block_sparse_attend[{qk},{pv}]"] = Arm(
        **sparse, card="sm_89", call=lambda launch, z=z: bsa.attend(q, k, v, smoothed, launch, z, "triton"),
        reference=lambda launch, z=z, qk=qk, pv=pv: bsa.reference(
            *head, tau, 0, precision=qk, pv=pv, key_mean=z.k_mean[:, :1]
        ),  # z, qk, pv bound now: the FP8_PAIRS loop below rebinds them
        metric="rel_l2", bound=2e-2 if bf16 else 1e-6, cost=(moved - aq.cost(shape, pv, dtype), flops),
    )  # fmt: skip
    for qk, pv in FP8_PAIRS:
        z = aq.quantize(q, k, v, pv, qk=qk)
        result = torch.empty_like(q)
        moved, flops = fa.cost(shape, pv, dtype)
        out[f"fp8_attention[{qk},{pv}]"] = Arm(
            "fp8_attention", fa.DEFAULT, "ADA", fa.ADA, "sm_89",
            call=lambda launch, z=z, result=result: (fa.attend(z, result, tokens, scale, launch, "triton"), result)[1],
            reference=lambda launch, qk=qk, pv=pv: fa.reference(*head, scale, pv, launch.block_n, qk=qk),
            first_head=True, metric="rel_l2", bound=(1e-2 if bf16 else 1e-6 if pv == "fp8" else 5e-4),
            cost=(moved - aq.cost(shape, pv, dtype), flops), repeats=10,
        )  # fmt: skip
    b, h, t, d = (1, 4, 22, 16) if smoke else (1, 12, tokens, 128)
    g = torch.Generator(device).manual_seed(0)
    heads = [torch.randn(b, t // WORLD, h, d, generator=g, device=device).to(dtype) for _ in range(3)]
    # attention's (B, H/W, T, D) output seen as (B, T, H/W, D): a contiguous batch-1 output needs no copy at all
    attended = torch.randn(b, h // WORLD, t, d, generator=g, device=device).to(dtype).transpose(1, 2)
    received = torch.randn(WORLD, b, t // WORLD, h // WORLD, d, generator=g, device=device).to(dtype)
    copies = {
        "pack_qkv": (lambda launch: relayout.pack_qkv(*heads, WORLD, launch=launch),
                     lambda launch: relayout.pack_qkv_reference(*heads, WORLD), heads[0]),
        "split_result": (lambda launch: relayout.split_result(attended, WORLD, launch=launch),
                         lambda launch: relayout.split_result_reference(attended, WORLD), attended),
        "merge_heads": (lambda launch: relayout.merge_heads(received, WORLD, launch=launch),
                        lambda launch: relayout.merge_heads_reference(received, WORLD), received),
    }  # fmt: skip
    for op, (call, reference, source) in copies.items():
        out[op] = Arm("relayout", relayout.DEFAULT, "AMPERE_ADA", relayout.AMPERE_ADA, "sm_86", call, reference,
                      False, "max_abs", 0.0, relayout.cost(op, tuple(source.shape), dtype), 20)  # fmt: skip
    return out


def error(arm: Arm, got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """max |got - want| and relative L2 of the part of `got` the reference covers."""
    got = got[:, : want.shape[1]] if arm.first_head else got
    return {"max_abs": float((got.float() - want.float()).abs().max()), "rel_l2": rel_l2(got, want)}


def kernels_considered(names: dict[str, list[str]]) -> dict[str, Any]:
    """Every kernel module of workbench.kernels: those that pick a launch by compute capability (`launch_for`, or
    `capability` imported), each with the arms that ran its table (`names`: table module -> arm names), and those
    with one launch for every card. RuntimeError naming a module whose launch table has no arm here."""
    tables, single = {}, []
    for module in kernel_modules():
        name = module.__name__.rsplit(".", 1)[-1]
        launch_for = getattr(module, "launch_for", None)
        if launch_for is None and not hasattr(module, "capability"):
            single.append(name)
            continue
        table = launch_for.__module__.rsplit(".", 1)[-1] if launch_for is not None else name
        if table not in names:
            raise RuntimeError(
                f"portability: workbench.kernels.{name} picks its launch by compute capability but no arm of "
                f"benchmarks/scenarios/portability.py runs it; add one"
            )
        tables[name] = names[table]
    return {"by_capability": tables, "one_launch_for_every_card": single}


def run(context: Context) -> Measurement:
    device, smoke = context.device, context.smoke
    rows: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    notes: list[str] = []
    device_ceilings = kernel_bench.device_ceilings(device, smoke)
    built = arms(smoke, device)
    covered: dict[str, list[str]] = {}
    for op, arm in built.items():
        covered.setdefault(arm.table, []).append(op)
    considered = kernels_considered(covered)  # before any timing: a launch table without an arm fails at once
    for op, arm in built.items():
        label = arm.other.lower()
        builds = {"default": (arm.hopper, None), label: (arm.launch, None)}
        if not smoke:
            builds[f"{label}@{arm.card}"] = (arm.launch, TARGETS[arm.card])

        def once(build: str, arm: Arm = arm, builds: dict = builds) -> torch.Tensor:
            launch, target = builds[build]
            with built_for(target) if target is not None else contextlib.nullcontext():
                return arm.call(launch)

        measured, failed, references = {}, {}, {}
        for build, (launch, _) in builds.items():
            try:
                got = once(build)
                key = getattr(launch, "block_n", None)  # fp8_attention's reference depends on the key tile
                if key not in references:
                    references[key] = arm.reference(launch)
                measured[build] = error(arm, got, references[key])
            except Exception as exc:  # noqa: BLE001 - one failing build must not lose the others
                failed[build] = repr(exc)
        worst = max((m[arm.metric] for m in measured.values()), default=float("nan"))
        within = {build: m[arm.metric] <= arm.bound for build, m in measured.items()}
        roofline = device_ceilings.roofline_seconds(*arm.cost)
        row: dict[str, Any] = {
            "non_hopper_launch": arm.other, "card_build": None if smoke else arm.card, "metric": arm.metric,
            "bound": arm.bound, "worst_error": worst, "within_tolerance": not failed and all(within.values()),
            "roofline_s": roofline,
            "launches": {"default": vars(arm.hopper), label: vars(arm.launch)},
            "max_abs_error_vs_reference": {build: m["max_abs"] for build, m in measured.items()},
            "rel_l2_vs_reference": {build: m["rel_l2"] for build, m in measured.items()},
            "cost": {"bytes_moved": arm.cost[0], "flops": arm.cost[1]},
            "errors": dict(failed),
        }  # fmt: skip
        rows[op] = row
        timed = [build for build in builds if within.get(build)]
        for build in builds:
            if build not in timed:
                notes.append(f"{op} {build}: {'failed' if build in failed else 'outside its bound'}; not timed.")
        if "default" not in timed or len(timed) < 2:
            continue
        clock = {**calls(smoke, repeats=arm.repeats, warmup=2), "queued": False}

        def visit(build: str, once: Callable = once, clock: dict = clock) -> float:
            return time_call(lambda: once(build), device, **clock).median_s

        rounds = aba_rounds(
            (f"{op} default", lambda: visit("default")),
            {f"{op} {build}": lambda b=build: visit(b) for build in timed if build != "default"},
            context.rounds,
        )
        medians = rounds.medians()
        row["median_s"] = medians[f"{op} default"]  # Hopper's own launch and build
        row["medians_s"] = medians
        row["fraction_of_roofline"] = {name.removeprefix(f"{op} "): roofline / s for name, s in medians.items()}
        row["errors"].update(rounds.errors)
        ratios.update({key: value.to_dict() for key, value in rounds.ratios().items()})
    rows["kernels_considered"] = considered
    here = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    notes += [
        f"Ratios are default / candidate seconds (< 1: the candidate is slower on the {here}). `ampere_ada` / `ada`: "
        f"the card's launch built for the {here} (its shape's cost on Hopper); `...@sm_86` / `...@sm_89`: that launch built "
        f"as Triton builds it for the card (no wgmma, no TMA) and run on the {here}, the card's own kernel on Hopper's "
        "SMs. Neither is a speed on an A100, 3090 or 4090.",
        "FP8 arms (fp8_attention, block_sparse_attend[int8,fp8]): their non-Hopper launch is Ada's (sm_89; sm_80/86 "
        f"refuse FP8); the {here} has FP8 tensor cores too, so it runs them, and the ratio is again that launch's (and "
        "build's) cost on Hopper, not a speed on Ada.",
        "Errors against the kernel's torch reference (first head for the attention kernels); bounds are the kernel "
        "tests': block_sparse_attend max |error| 2e-2 (bf16), its int8/fp8 path rel-L2 2e-2, fp8_attention rel-L2 "
        "1e-2 (bf16), relayout bit-equal. roofline_s: max(bytes / copy bandwidth, flops / bf16 GEMM rate) of the "
        "timed kernel (the quantization before the low-precision kernels is not part of it), at the ceilings "
        "measured on this device in this run (shape.ceilings); the FP8/INT8 dots' peak is about twice bf16's and "
        "was not measured, so their fractions of the roofline are upper bounds.",
        "Kernels with one launch for every card (no capability selection; nothing to compare here; their "
        "sm_80/86/89/90 builds are checked by tests/kernels/test_targets.py): "
        + ", ".join(considered["one_launch_for_every_card"])
        + ".",
    ]
    if smoke:
        notes.append("Smoke: CPU under the Triton interpreter, float32; no card builds; the numbers say nothing.")
    return Measurement(SUMMARY, {"tokens_grid": list(SMOKE_GRID if smoke else WAN_TOKENS_GRID), "world_size": WORLD,
                                 "dtype": "float32" if smoke else "bfloat16", "density_target": DENSITY,
                                 "ceilings": device_ceilings.to_dict()}, rows,
                       ratios, notes)  # fmt: skip
