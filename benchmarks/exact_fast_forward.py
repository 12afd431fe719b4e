"""Issue 6 performance bar: `exact-fast` against stock and cuDNN + compile on one Wan2.1-1.3B-shaped transformer
forward (12 x 128 heads, 30 layers, FFN 8960, 480x832x81 = 32,760 tokens, bf16), then on a full 16-step request.

One session (`random-wan-1.3b`, built as diffusers builds a bf16 checkpoint: `_keep_in_fp32_modules` stay fp32).
Transformer inputs are built once: latents (1, 16, 21, 60, 104), timestep 500, text embeddings (1, 512, 4096)
from the pipeline's own (random, shape-reduced) text encoder. Arms:
- `stock`: nothing installed;
- `cudnn`: cuDNN attention only (separates the attention share of the gain);
- `cudnn+compile`: cuDNN attention + `regional_compile` (diffusers `compile_repeated_blocks`, fullgraph);
- `exact-fast`: `profiles.profile("exact-fast", "wan", device)`, as the profile is defined (no compile; diffusers'
  default attention since the first run measured forcing cuDNN slower);
- `reduction`: candidates for the profile beyond the bit-equal set: `fused_block_norms` (LayerNorm/RMSNorm fused
  with the modulation and rotary step; contract reduction) + adaln_precompute + cross_kv_cache + `gelu_epilogue`
  (CUDA); `reduction without gelu_epilogue` (that plugin's share); `reduction+compile` (script compile as above);
- `reduction(ln <launch>)`: `reduction` with another LayerNorm kernel launch (`LN_LAUNCHES`), whose row sums may
  take another order (the forward's speed and its output against stock say what that launch does end to end);
- `flash4`, `reduction+flash4`: attention through FlashAttention-4 (`flash4_attention`), alone and with `reduction`;
- `exact-fast+compile`: the same plugins, then `torch.compile` of every `WanTransformerBlock` done HERE, by the
  script (fullgraph=False): `regional_compile` refuses blocks another plugin changed (fused_block_ops replaces
  each block's forward, cross_kv_cache attn2's K/V forwards), so this arm checks whether dynamo can trace the
  instance-level forward that launches the Triton kernels. Graph breaks and graphs compiled are recorded;
- `exact-fast+compile(opaque kernels)`: the same, with fused_block_ops' forwards built over the three Wan kernel
  launchers registered as torch custom ops (`_opaque_kernels`), so dynamo keeps each launch as one opaque call in
  the block's graph (the launcher and its `enable_fp_fusion=False` run unchanged) instead of tracing into Triton.
  Inductor still compiles the torch ops around them (norms, projections): contract `reduction`, like compile.
An arm that fails records its error; the others go on.

Phases (JSON written to $OUT after each, `benchmarks/common.py` envelope, name `exact-fast-forward`):
1. check: per arm, the first forward (compile included: `first_forward_seconds`) and a second one; its output
   against stock (rel-L2, max abs) and `torch.equal` against every other arm (`exact-fast` must equal `stock`:
   its other plugins are bitwise/rounding); the plugins' receipts of that forward.
2. forward: A/B/A rounds (stock, cand1, stock, cand2, stock, ...). A visit installs the arm (untimed), runs one
   warm forward and `--per-visit` timed ones (CUDA events) inside one begin/end_request, so cross_kv_cache and
   adaln_precompute are in their steady state (from step 2 of a request on; adaln_precompute hits on every
   timed forward here, in a request only on the CFG branch: its part is a few microseconds either way), then
   uninstalls. Ratios: stock/candidate (stock = mean of its two neighbours), cudnn+compile/candidate (same round),
   median and bootstrap CI95 (workbench.evidence.stats.paired_ratio_ci).
3. profile: one torch.profiler forward per arm; CUDA kernel time split into attention (names with
   flash/fmha/cudnn/attention/sdpa), GEMM (gemm/cutlass/sm90_xmma/nvjet/cublas) and rest; busy fraction (kernel
   time / forward time: what CUDA graphs could at most recover); top kernels; achieved bandwidth of the fused
   pointwise kernels against copy bandwidth (4.17 TB/s).
4. request: `wan_1_3b_request(16)` A/B/A for `--request-arms`, up to `--request-rounds`, skipped round by round
   when the next round would pass `--budget-s` (the remaining rounds are recorded as skipped).
`python -m benchmarks.exact_fast_forward` on one H200; `--smoke`: tiny-wan on the CPU under TRITON_INTERPRET=1
(cuDNN replaced by the native backend there), to run every phase of the script; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo

from workbench.kernel_bench import COPY_BANDWIDTH

LN_LAUNCHES = ("r1_w1", "r2_w4")  # other LayerNorm launches (kernels/layernorm_modulate.py CANDIDATES) as arms


_OPAQUE: dict[str, Any] = {}


def _opaque_kernels() -> dict[tuple[Any, str], Any]:
    """The three Wan kernel launchers as torch custom ops (built once), so dynamo keeps each one call in its graph
    instead of tracing into Triton's launcher; the op runs the same launcher, unchanged, at run time."""
    from workbench.kernels import adaln_modulate, gated_residual, qk_norm_rope

    if not _OPAQUE:
        launch_modulate, launch_residual, launch_rope = (
            adaln_modulate.adaln_modulate, gated_residual.gated_residual, qk_norm_rope.rope_only
        )  # fmt: skip

        @torch.library.custom_op("exact_fast_bench::adaln_modulate", mutates_args=())
        def modulate(n: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
            return launch_modulate(n, scale, shift, out_dtype)

        @modulate.register_fake
        def _(n, scale, shift, out_dtype):
            return n.new_empty(n.shape, dtype=out_dtype)

        @torch.library.custom_op("exact_fast_bench::gated_residual", mutates_args=())
        def residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
            return launch_residual(x, y, gate)

        @residual.register_fake
        def _(x, y, gate):
            return x.new_empty(x.shape)

        @torch.library.custom_op("exact_fast_bench::rope_only", mutates_args=())
        def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            return launch_rope(x, cos, sin)

        @rope.register_fake
        def _(x, cos, sin):
            return x.new_empty(x.shape)

        _OPAQUE.update({"adaln_modulate": modulate, "gated_residual": residual, "rope_only": rope})
    return {
        (adaln_modulate, "adaln_modulate"): _OPAQUE["adaln_modulate"],
        (gated_residual, "gated_residual"): _OPAQUE["gated_residual"],
        (qk_norm_rope, "rope_only"): _OPAQUE["rope_only"],
    }


class Arm:
    """One configuration: plugins through `Session.accelerate`, optionally a script-level compile of the blocks
    (`opaque`: fused_block_ops' forwards built over the kernels as custom ops, see `_opaque_kernels`), and
    optionally another LayerNorm kernel launch as `layernorm_modulate.DEFAULT` while the arm is installed."""

    def __init__(
        self,
        name: str,
        config: dict[str, Any],
        compile_blocks: bool = False,
        opaque: bool = False,
        ln_launch: str | None = None,
    ):
        self.name, self.config, self.compile_blocks, self.opaque = name, config, compile_blocks, opaque
        self.ln_launch, self.ln_default = ln_launch, None
        self.error: str | None = None
        self.blocks: list[torch.nn.Module] = []

    def install(self, session: Any) -> None:
        if self.ln_launch is not None:  # the launchers read DEFAULT at each call
            from workbench.kernels import layernorm_modulate

            self.ln_default = layernorm_modulate.DEFAULT
            layernorm_modulate.DEFAULT = layernorm_modulate.CANDIDATES[self.ln_launch]
        if self.opaque:  # fused_block_ops' forward_for imports the launchers when it builds each forward
            swapped = _opaque_kernels()
            originals = {key: getattr(*key) for key in swapped}
            try:
                for (module, name), op in swapped.items():
                    setattr(module, name, op)
                session.accelerate(self.config)
            finally:
                for (module, name), original in originals.items():
                    setattr(module, name, original)
        else:
            session.accelerate(self.config)
        if self.compile_blocks:
            transformer = session.model.pipeline.transformer
            self.blocks = [m for m in transformer.modules() if type(m).__name__ in transformer._repeated_blocks]
            for block in self.blocks:
                block.compile(fullgraph=False)

    def uninstall(self, session: Any) -> None:
        for block in self.blocks:
            block._compiled_call_impl = None
        self.blocks = []
        session.accelerate({})
        if self.ln_default is not None:
            from workbench.kernels import layernorm_modulate

            layernorm_modulate.DEFAULT, self.ln_default = self.ln_default, None


def _arms(device: torch.device) -> list[Arm]:
    from workbench.profiles import profile

    attention = {"backend": "cudnn" if device.type == "cuda" else "native"}
    exact = profile("exact-fast", "wan", device)
    reduction = {"fused_block_norms": {}, "adaln_precompute": {}, "cross_kv_cache": {}}
    if device.type == "cuda":
        reduction["gelu_epilogue"] = {}
    return [
        Arm("stock", {}),
        Arm("cudnn", {"attention_backend": attention}),
        Arm("cudnn+compile", {"attention_backend": attention, "regional_compile": {}}),
        Arm("exact-fast", exact),
        Arm("exact-fast+compile", exact, compile_blocks=True),
        Arm("exact-fast+compile(opaque kernels)", exact, compile_blocks=True, opaque=True),
        Arm("reduction", reduction),
        Arm("reduction without gelu_epilogue", {k: v for k, v in reduction.items() if k != "gelu_epilogue"}),
        *(Arm(f"reduction(ln {name})", reduction, ln_launch=name) for name in LN_LAUNCHES),
        Arm("reduction+compile", reduction, compile_blocks=True),
        Arm("flash4", {"flash4_attention": {}}),
        Arm("reduction+flash4", {**reduction, "flash4_attention": {}}),
    ]


def _inputs(session: Any, smoke: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    from benchmarks.common import wan_1_3b_request

    pipe, device = session.model.pipeline, session.device
    request = session.resolve(wan_1_3b_request(16))
    if smoke:
        request = session.resolve(dataclasses.replace(request, frames=9, height=32, width=32, steps=2))
    frames = (request.frames - 1) // 4 + 1
    shape = (1, pipe.transformer.config.in_channels, frames, request.height // 8, request.width // 8)
    g = torch.Generator(device).manual_seed(0)
    latents = torch.randn(shape, device=device, generator=g, dtype=torch.float32).to(session.dtype)
    max_len = session.model.call_overrides.get("max_sequence_length", 512)
    with torch.inference_mode():
        text, _ = pipe.encode_prompt(
            request.prompt, do_classifier_free_guidance=False, max_sequence_length=max_len, device=device
        )
    text = text.to(session.dtype)
    kwargs = {
        "hidden_states": latents,
        "timestep": torch.tensor([500.0], device=device),
        "encoder_hidden_states": text,
        "return_dict": False,
    }
    tokens = frames * (request.height // 16) * (request.width // 16)
    described = {"latents": list(shape), "text": list(text.shape), "tokens": tokens, "dtype": str(session.dtype)}
    return kwargs, described


def _forward(session: Any, kwargs: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """One transformer forward; (output, seconds: CUDA events on a GPU, wall clock on the CPU)."""
    transformer = session.model.pipeline.transformer
    with torch.inference_mode():
        if session.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = transformer(**kwargs)[0]
            end.record()
            end.synchronize()
            return out, start.elapsed_time(end) / 1e3
        begin = time.perf_counter()
        out = transformer(**kwargs)[0]
        return out, time.perf_counter() - begin


class _Visit:
    """Install an arm and open one mini-request (begin/end_request of every handle) around its forwards."""

    def __init__(self, session: Any, arm: Arm):
        self.session, self.arm = session, arm

    def __enter__(self) -> _Visit:
        self.arm.install(self.session)
        for handle in self.session._handles:
            handle.begin_request(0, 1)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for handle in self.session._handles:
                handle.end_request(0)
        finally:
            self.arm.uninstall(self.session)

    def receipts(self) -> dict[str, Any]:
        return {h.spec.name: h.report() for h in self.session._handles}


def _dynamo_counters() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    return {
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "graph_break_reasons": Counter(counters["graph_break"]),
    }


def _rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def check(session: Any, arms: list[Arm], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    rows, outputs = {}, {}
    for arm in arms:
        try:
            before = _dynamo_counters()
            with _Visit(session, arm) as visit:
                begin = time.perf_counter()
                first, _ = _forward(session, kwargs)
                first_seconds = time.perf_counter() - begin
                out, seconds = _forward(session, kwargs)
                receipts = visit.receipts()
            after = _dynamo_counters()
            outputs[arm.name] = out
            rows[arm.name] = {
                "config": arm.config,
                "script_compiles_blocks": arm.compile_blocks,
                "first_forward_seconds": first_seconds,
                "second_forward_seconds": seconds,
                "compile_seconds_estimate": max(0.0, first_seconds - seconds),
                "first_equals_second": bool(torch.equal(first, out)),
                "receipts": receipts,
                "dynamo": {
                    "graphs_compiled": after["unique_graphs"] - before["unique_graphs"],
                    "graph_breaks": after["graph_breaks"] - before["graph_breaks"],
                    "graph_break_reasons": {
                        reason.splitlines()[0][:200] + " | " + reason.split("Developer debug context:")[-1][:200]: n
                        for reason, n in (after["graph_break_reasons"] - before["graph_break_reasons"]).most_common(8)
                    },
                },
            }
        except Exception as error:
            arm.error = repr(error)
            rows[arm.name] = {"config": arm.config, "error": repr(error), "traceback": traceback.format_exc()[-3000:]}
        print(f"check {arm.name}: {rows[arm.name].get('error') or round(rows[arm.name]['second_forward_seconds'], 4)}")
    stock = outputs.get("stock")
    for name, out in outputs.items():
        row = rows[name]
        if stock is not None:
            row["rel_l2_vs_stock"] = _rel_l2(out, stock)
            row["max_abs_vs_stock"] = float((out.float() - stock.float()).abs().max())
        row["equal_to"] = {other: bool(torch.equal(out, o)) for other, o in outputs.items() if other != name}
    return rows, outputs


def forward_rounds(
    session: Any, arms: list[Arm], kwargs: dict[str, Any], outputs: dict[str, torch.Tensor], rounds: int,
    per_visit: int, deadline: float, on_round: Callable[[dict[str, Any], dict[str, Any]], None],
) -> None:  # fmt: skip
    from workbench.evidence.stats import MIN_PAIRS, paired_ratio_ci

    stock, candidates = arms[0], [a for a in arms[1:] if a.error is None]
    times: dict[str, list[float]] = {a.name: [] for a in arms}
    paired: dict[str, list[float]] = {a.name: [] for a in candidates}
    matches: dict[str, bool] = {a.name: True for a in arms}
    errors: dict[str, str] = {}

    def visit(arm: Arm) -> float:
        with _Visit(session, arm):
            _forward(session, kwargs)
            seconds = []
            for _ in range(per_visit):
                out, s = _forward(session, kwargs)
                seconds.append(s)
                matches[arm.name] &= bool(torch.equal(out, outputs[arm.name]))
        return statistics.median(seconds)

    last = 0.0
    for index in range(rounds):
        begin = time.perf_counter()
        if begin + last > deadline:
            print(f"forward rounds: {rounds - index} skipped (--budget-s)")
            return
        before = visit(stock)
        times["stock"].append(before)
        for arm in candidates:
            if arm.name in errors:
                continue
            try:
                seconds = visit(arm)
            except Exception as error:  # a later failure drops the arm from the remaining rounds
                errors[arm.name] = repr(error)
                continue
            after = visit(stock)
            times[arm.name].append(seconds)
            times["stock"].append(after)
            paired[arm.name].append((before + after) / 2)
            before = after
        rows, ratios = {}, {}
        for arm in arms:
            rows[arm.name] = {"seconds": times[arm.name], "outputs_match_check": matches[arm.name]}
            if times[arm.name]:
                rows[arm.name]["median_seconds"] = statistics.median(times[arm.name])
            if arm.name in errors:
                rows[arm.name]["error"] = errors[arm.name]
        for arm in candidates:
            n = len(times[arm.name])
            rows[arm.name]["paired_stock_seconds"] = paired[arm.name]
            if n >= MIN_PAIRS:
                ratios[f"stock/{arm.name}"] = paired_ratio_ci(paired[arm.name], times[arm.name]).to_dict()
            rows[arm.name]["skipped_rounds_after_budget"] = rounds - index - 1
            base = times.get("cudnn+compile", [])
            if arm.name != "cudnn+compile" and n >= MIN_PAIRS and len(base) == n:
                ratios[f"cudnn+compile/{arm.name}"] = paired_ratio_ci(base, times[arm.name]).to_dict()
        print(f"forward round {index + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.4f}s" for k, v in times.items() if v))
        on_round(rows, ratios)
        last = time.perf_counter() - begin


def _fused_bytes(tokens: int, width: int, heads: int) -> dict[str, int]:
    """Bytes each fused kernel moves per call at this shape (the kernels' own `cost`)."""
    from workbench.kernels import adaln_modulate, gated_residual, qk_norm_rope

    return {
        "_modulate": adaln_modulate.cost((1, tokens, width))[0],
        "_gated_residual": gated_residual.cost((1, tokens, width))[0],
        # the tiled DEFAULT's name; the q/k RMSNorm path moves the same bytes plus a (C,) weight
        "_tiled_qk_norm_rope": qk_norm_rope.cost((1, tokens, heads, width // heads), norm=False)[0],
    }


def profile_arms(session: Any, arms: list[Arm], kwargs: dict[str, Any], tokens: int) -> dict[str, Any]:
    from benchmarks.common import kernel_split

    cuda = session.device.type == "cuda"
    config = session.model.pipeline.transformer.config
    width = config.num_attention_heads * config.attention_head_dim
    fused_bytes = _fused_bytes(tokens, width, config.num_attention_heads)
    rows = {}
    for arm in arms:
        if arm.error is not None:
            continue
        try:
            with _Visit(session, arm):
                _forward(session, kwargs)
                (_, seconds), per_kernel, split = kernel_split(lambda: _forward(session, kwargs), cuda)
            fused = {}
            for name, (us, count) in per_kernel.items():
                if name in fused_bytes and count:
                    mean_s = us / count / 1e6
                    fused[name] = {"calls": count, "mean_us": us / count, "bytes_per_call": fused_bytes[name],
                                   "fraction_of_copy_bandwidth": fused_bytes[name] / mean_s / COPY_BANDWIDTH}  # fmt: skip
            rows[arm.name] = {
                "forward_seconds": seconds,
                "busy_fraction": split["kernel_seconds"] / seconds,
                **split,
                "fused_kernels": fused,
            }
            print(f"profile {arm.name}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows[arm.name]["share"].items()))
        except Exception as error:
            rows[arm.name] = {"error": repr(error), "traceback": traceback.format_exc()[-3000:]}
            print(f"profile {arm.name}: error {error!r}")
    return rows


def request_rounds(
    session: Any, arms: list[Arm], request: Any, rounds: int, deadline: float,
    on_round: Callable[[dict[str, Any], dict[str, Any]], None],
) -> None:  # fmt: skip
    from workbench.evidence.stats import MIN_PAIRS, paired_ratio_ci
    from workbench.quality import compare

    stock, candidates = arms[0], arms[1:]
    rows: dict[str, Any] = {}

    def run(arm: Arm) -> Any:
        arm.install(session)
        try:
            return session.generate(request, progress=False)
        finally:
            arm.uninstall(session)

    pilot = run(stock)
    rows["stock"] = {"pilot_seconds": pilot.timings["total"], "seconds": [], "outputs_match_pilot": True}
    pilots = {}
    for arm in candidates:
        try:
            pilots[arm.name] = run(arm)
            rows[arm.name] = {"pilot_seconds": pilots[arm.name].timings["total"], "seconds": [],
                              "paired_stock_seconds": [], "outputs_match_pilot": True,
                              "receipts": pilots[arm.name].receipts,
                              "quality_vs_stock": compare(pilot, pilots[arm.name]).to_dict()}  # fmt: skip
        except Exception as error:
            rows[arm.name] = {"error": repr(error), "traceback": traceback.format_exc()[-3000:]}
        print(f"request pilot {arm.name}: {rows[arm.name].get('error') or round(rows[arm.name]['pilot_seconds'], 2)}")
    live = [a for a in candidates if a.name in pilots]
    estimate = pilot.timings["total"] * (1 + len(live)) + sum(p.timings["total"] for p in pilots.values())
    for index in range(rounds):
        if time.perf_counter() + estimate > deadline:
            rows["skipped_rounds"] = {"count": rounds - index, "reason": f"--budget-s: next round ~{estimate:.0f}s"}
            on_round(rows, {})
            print(f"request rounds: {rounds - index} skipped (budget)")
            return
        before = run(stock)
        rows["stock"]["seconds"].append(before.timings["total"])
        rows["stock"]["outputs_match_pilot"] &= bool(torch.equal(before.latents, pilot.latents))
        for arm in live:
            result, after = run(arm), run(stock)
            row = rows[arm.name]
            row["seconds"].append(result.timings["total"])
            row["paired_stock_seconds"].append((before.timings["total"] + after.timings["total"]) / 2)
            row["outputs_match_pilot"] &= bool(torch.equal(result.latents, pilots[arm.name].latents))
            rows["stock"]["seconds"].append(after.timings["total"])
            before = after
        ratios = {}
        for arm in live:
            row = rows[arm.name]
            if len(row["seconds"]) >= MIN_PAIRS:
                ratios[f"request stock/{arm.name}"] = paired_ratio_ci(
                    row["paired_stock_seconds"], row["seconds"]
                ).to_dict()
        print(f"request round {index + 1}/{rounds} done")
        on_round(rows, ratios)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny-wan on the CPU under TRITON_INTERPRET=1")
    parser.add_argument("--phases", default="forward,profile,request", help="subset of forward,profile,request")
    parser.add_argument("--arms", default="", help="comma-separated subset of the arms (stock is always run)")
    parser.add_argument("--rounds", type=int, default=5, help="A/B/A forward rounds (>= 3 for a CI)")
    parser.add_argument("--per-visit", type=int, default=2, help="timed forwards per arm visit (median kept)")
    parser.add_argument("--request-arms", default="exact-fast,cudnn+compile")
    parser.add_argument("--request-rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=520.0, help="rounds stop before this many seconds")
    parser.add_argument("--name", default="exact-fast-forward")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        raise RuntimeError("exact_fast_forward: needs a CUDA device (or --smoke for a CPU check of the script)")
    from benchmarks.common import envelope, wan_1_3b_request, write
    from workbench import Session

    for knob in ("recompile_limit", "cache_size_limit"):  # 30 distinct block forwards may each need a graph
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    model, device = ("tiny-wan", "cpu") if args.smoke else ("random-wan-1.3b", "cuda")
    session = Session.open(model, device=device, dtype="bfloat16")
    fp32 = sorted({n.rsplit(".", 1)[0] for n, p in session.model.pipeline.transformer.named_parameters()
                   if p.dtype == torch.float32})  # fmt: skip
    kwargs, shape = _inputs(session, args.smoke)
    shape.update(model=model, session_seconds=session.init_seconds, fp32_modules=fp32[:8], fp32_module_count=len(fp32))
    arms = _arms(session.device)
    if args.arms:
        wanted = {"stock", *args.arms.split(",")}
        unknown = sorted(wanted - {a.name for a in arms})
        if unknown:
            raise SystemExit(f"--arms: unknown {unknown}; choose from {[a.name for a in arms]}")
        arms = [a for a in arms if a.name in wanted]
    record: dict[str, Any] = {"check": {}, "forward": {}, "profile": {}, "request": {}}
    ratios: dict[str, Any] = {}
    notes = (
        "stock/candidate and cudnn+compile/candidate: seconds ratios (>1 = candidate faster), A/B/A paired, median "
        "and bootstrap CI95; per-forward times are CUDA events of one transformer forward in the steady state of a "
        "request (see benchmarks/exact_fast_forward.py). Random weights. exact-fast+compile is compiled by the script, "
        "not by regional_compile (which refuses blocks other plugins changed)."
        + (" SMOKE RUN: tiny-wan on the CPU, Triton interpreter, native attention; numbers meaningless." if args.smoke else "")
    )  # fmt: skip

    def save(phase: str) -> None:
        record["elapsed_seconds"] = time.perf_counter() - started
        print(f"[{record['elapsed_seconds']:.0f}s] {phase} written")
        write(
            envelope(args.name + ("-smoke" if args.smoke else ""), shape, record, ratios, notes),
            args.name + ("-smoke" if args.smoke else ""),
        )

    phases = set(args.phases.split(","))
    record["check"], outputs = check(session, arms, kwargs)
    save("check")
    if "forward" in phases:

        def on_round(rows: dict[str, Any], new: dict[str, Any]) -> None:
            record["forward"] = rows
            ratios.update(new)
            save("forward round")

        deadline = started + args.budget_s
        forward_rounds(session, arms, kwargs, outputs, args.rounds, args.per_visit, deadline, on_round)
    if "profile" in phases:
        record["profile"] = profile_arms(session, arms, kwargs, shape["tokens"])
        save("profile")
    if "request" in phases:
        by_name = {a.name: a for a in arms}
        chosen = [by_name["stock"]] + [
            by_name[n] for n in args.request_arms.split(",") if n in by_name and by_name[n].error is None
        ]
        request = wan_1_3b_request(16)
        if args.smoke:
            request = dataclasses.replace(request, frames=9, height=32, width=32, steps=2)

        def on_request_round(rows: dict[str, Any], new: dict[str, Any]) -> None:
            record["request"] = rows
            ratios.update(new)
            save("request round")

        try:
            request_rounds(session, chosen, request, args.request_rounds, started + args.budget_s, on_request_round)
        except Exception as error:
            record["request"]["error"] = repr(error)
            record["request"]["traceback"] = traceback.format_exc()[-3000:]
            save("request error")
    return record


if __name__ == "__main__":
    main()
