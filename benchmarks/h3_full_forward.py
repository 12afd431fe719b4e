"""Issue 8: one forward of the full-size MiniMax-H3 transformer (33.1B parameters, random weights), stock vs the
workbench's accelerations, on one H200 (`python -m benchmarks.h3_full_forward`, about 6-8 minutes).

Model: diffusers' default `MiniMaxH3Transformer3DModel` config, built on the meta device and materialised straight
on the GPU (`to_empty`), bf16 with its `_keep_in_fp32_modules` parameters in float32 (matched per name component,
as `from_pretrained(torch_dtype=bf16)` does). Weights: each `nn.Linear` / `nn.RMSNorm` runs its own
`reset_parameters()` on the GPU (torch's default init, the distribution a CPU-built model would have);
`rope.inv_freq` is recomputed. Nothing is materialised on the CPU.

Inputs: a t2va packing built by the modular pipeline's own static methods
(`MiniMaxH3PrepareLayoutStep.build_packed_sequence`, `MiniMaxH3SetTimestepsStep.build_row_timesteps`): 512 text
rows, 400 audio latents x 2 channels, 72 x 46 x 62 video latents (72 x 23 x 31 rows after the (1, 2, 2) patch) =
52,648 rows, the shape of the 10.56 s stock anchor. (The pipeline itself would give 405 audio latents for the
243-frame clip with 72 latent frames; 400 keeps the anchor's shape.) Timesteps: step 8 of the 17-step Base16
schedules (video shift 12, audio shift 3). Latents and audio rows float32 random normal as the pipeline draws
them; text embeddings bf16 random normal.

Arms, installed through the plugins' own prepare/activate path (`install.plan` / `install.activate` on a
`LoadedModel` whose pipeline holds just this transformer):
- `stock`: nothing installed (diffusers' `native` backend, torch SDPA);
- `cudnn`: `attention_backend` cuDNN (contract reduction);
- `exact_fast`: `profiles.profile("exact-fast", "h3", device)` (fused_block_norms, and FlashAttention-4 where it
  is installed; on the CPU only under the interpreter, which --smoke needs anyway);
- `block_sparse`: tau chosen by bisection on the routing function (`routing(q, k, tau, prefix)`, the kernel's
  own) over q/k captured from the middle block of a stock forward, for `--density` (20%) exact block pairs;
  `sink_tokens` and `protect_prefix` at their "family" default (the 1,312 text + audio rows).
Each arm has one untimed warm-up forward (Triton compiles there; its output and receipts are the arm's checks),
then `--rounds` interleaved rounds of one timed forward per arm, and a closing stock forward (A/B/.../A). A new
round starts only if it fits in `--budget-s` (from process start); fewer than 3 rounds is stated in the notes.
Per arm: median / all seconds, rel-L2 of the video and audio outputs against stock, `torch.equal` against stock
and against its own warm-up output (run-to-run), peak memory; `exact_fast` is also checked for `torch.equal`
against the arm with the same attention setting (`cudnn` on the GPU, `stock` on the CPU) when its config holds
fused_block_ops, a rounding contract, so bit-equal is required there (`rounding_contract`; runs 1-3).
`--flash4`: adds `flash4` (attention through FlashAttention-4) and `exact_fast+flash4`.
`--stacks`: adds `norms` (fused_block_norms: fused_block_ops' glue plus the q/k RMSNorm + rotary as one kernel each),
`block_sparse+norms`, `fp8` (selective_fp8 on the six Linears of every block: torchao row-wise dynamic FP8, eager),
`fp8f` (the same recipe on selective_fp8's fused path: one quantization kernel per activation, torch._scaled_mm),
`block_sparse+norms+fp8` and `block_sparse+norms+fp8f`; with `--flash4` also `norms+flash4`.
`--profile`: after the rounds, one torch.profiler forward per arm, its kernel time split into attention, GEMM and
the rest with the top kernels (benchmarks/common.py's `kernel_split`).
Every arm records its error instead of stopping the run; the JSON is written to $OUT after every phase.
`--smoke`: the same phases on the CPU with tiny-h3's transformer config at head dim 128 (the sparse kernel's only
one) and a small packing; run it with `TRITON_INTERPRET=1`. On the CPU `cudnn` means the `math` backend. Its
timings mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

import torch
from diffusers import MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3RotaryPosEmbed
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
    MINIMAX_H3_AUDIO_CHANNELS,
    MINIMAX_H3_AUDIO_TAG,
    MINIMAX_H3_TEXT_TAG,
    MINIMAX_H3_VIDEO_TAG,
    audio_latent_num_frames,
)

from benchmarks.common import envelope, kernel_split, write
from workbench.accelerations import REGISTRY, install
from workbench.accelerations.attention.sparse_routing import captured_qkv
from workbench.kernels.block_sparse_attention import routing
from workbench.models import h3
from workbench.models.loaded import LoadedModel
from workbench.profiles import profile

NAME = "h3-full-forward"
# selective_fp8's selection for --stacks: q, k, v, out and both FFN projections of every transformer block
FP8_BLOCK_LINEARS = [
    f"transformer_blocks.*.{path}"
    for path in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
]
START = time.perf_counter()
# text rows, latent frames, latent height, latent width (pixels / 16), audio latents per channel
FULL = {"text": 512, "latent_frames": 72, "latent_height": 46, "latent_width": 62, "audio_latents": 400}
SMOKE = {"text": 24, "latent_frames": 7, "latent_height": 16, "latent_width": 20, "audio_latents": 20}
SMOKE_CONFIG = {**h3.TINY_TRANSFORMER, "attention_head_dim": 128}
SCHEDULE_STEPS, STEP = 17, 8  # Base16's schedule; the step whose timesteps the forward sees
GIB = 2**30


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {message}", flush=True)


def arm(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """Run one phase; its result, or its error with the traceback, goes into `results[name]`."""
    log(f"{name} ...")
    try:
        value = fn()
    except Exception as error:  # one failed phase must not lose the others
        results[name] = {"error": repr(error), "traceback": traceback.format_exc()[-3000:]}
        log(f"{name}: ERROR {error!r}")
        return None
    results[name] = value
    log(f"{name}: done")
    return value


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(config: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    """The transformer from the meta device, materialised on `device` (see the module docstring)."""
    start = time.perf_counter()
    with torch.device("meta"):
        model = MiniMaxH3Transformer3DModel(**config)
    keep = set(model._keep_in_fp32_modules or [])
    for name, param in model.named_parameters():
        param.data = param.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    initialised: set[int] = set()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear | torch.nn.RMSNorm):
                module.reset_parameters()
                initialised.update(id(p) for p in module.parameters(recurse=False))
        missed = [n for n, p in model.named_parameters() if id(p) not in initialised]
        if missed:
            raise RuntimeError(f"h3 build: no initialiser for parameters {missed[:5]} ({len(missed)} in all)")
        buffers = [n for n, _ in model.named_buffers()]
        if buffers != ["rope.inv_freq"]:
            raise RuntimeError(f"h3 build: unexpected buffers {buffers}; only rope.inv_freq is recomputed")
        fresh = MiniMaxH3RotaryPosEmbed(model.config.rope_freq_dim, model.config.rope_theta)
        model.rope.inv_freq.copy_(fresh.inv_freq)
    model.eval().requires_grad_(False)
    sync(device)
    dtypes: dict[str, int] = {}
    for p in model.parameters():
        dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + p.numel()
    return {
        "model": model,
        "seconds": time.perf_counter() - start,
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameters_by_dtype": dtypes,
        "weights_gib": torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None,
    }


def packed_inputs(model: torch.nn.Module, shape: dict[str, int], device: torch.device, seed: int) -> dict[str, Any]:
    """One t2va transformer call's keyword arguments, built as the modular pipeline builds them."""
    config = model.config
    layout = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.full((shape["text"],), MINIMAX_H3_TEXT_TAG, dtype=torch.long),
        shape["latent_frames"],
        shape["latent_height"],
        shape["latent_width"],
        shape["audio_latents"],
        tuple(config.patch_size),
        MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG,
        MINIMAX_H3_VIDEO_TAG,
        (),  # t2va: no keyframe anchors
    )
    position_ids, token_tags, video_indices, audio_indices, text_indices, cond_video, cond_audio = layout
    video_scheduler, audio_scheduler = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    video_scheduler.set_timesteps(SCHEDULE_STEPS)
    audio_scheduler.set_timesteps(SCHEDULE_STEPS)
    t_video, t_audio = float(video_scheduler.timesteps[STEP]), float(audio_scheduler.timesteps[STEP])
    timestep, timestep_indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        video_indices, audio_indices, cond_video, cond_audio, text_indices.numel(), t_video, t_audio,
        max(t_video, 0.999), 1.0,
    )  # fmt: skip
    g = torch.Generator(device).manual_seed(seed)
    latents = torch.randn(
        1, config.in_channels, shape["latent_frames"], shape["latent_height"], shape["latent_width"],
        generator=g, device=device,
    )  # fmt: skip
    audio_rows = torch.randn(
        shape["audio_latents"] * MINIMAX_H3_AUDIO_CHANNELS, config.audio_in_channels, generator=g, device=device
    )
    text = torch.randn(1, shape["text"], config.text_dim, generator=g, device=device).to(torch.bfloat16)
    return {
        "hidden_states": patchify_video_latents(latents, tuple(config.patch_size))[None],
        "audio_hidden_states": audio_rows[None],
        "encoder_hidden_states": text,
        "timestep": timestep.to(device),
        "timestep_indices": timestep_indices.to(device),
        "token_tags": token_tags.to(device),
        "position_ids": position_ids.to(device),
        "video_indices": video_indices.to(device),
        "audio_indices": audio_indices.to(device),
        "text_indices": text_indices.to(device),
        "return_dict": False,
    }


def tau_for(q: torch.Tensor, k: torch.Tensor, sink: int, target: float) -> dict[str, Any]:
    """Bisection on tau for a routing density near `target` (density falls as tau rises); q, k (B, H, T, D)."""
    low, high = -4.0, 8.0
    floor = routing(q, k, high, sink)[1]
    if floor > target:  # the diagonal band and the sink rows alone exceed the target
        return {"tau": high, "density": floor, "target": target, "reachable": False}
    for _ in range(24):
        mid = (low + high) / 2
        if routing(q, k, mid, sink)[1] > target:
            low = mid
        else:
            high = mid
    tau = (low + high) / 2
    return {"tau": tau, "density": routing(q, k, tau, sink)[1], "target": target, "reachable": True}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def equal(a: tuple, b: tuple) -> bool:
    """torch.equal of every output (video, audio)."""
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


class Bench:
    """The model, its inputs and the arms; `forward(name)` installs an arm, runs one forward, uninstalls."""

    def __init__(self, model: torch.nn.Module, inputs: dict[str, Any], device: torch.device):
        pipeline = types.SimpleNamespace(transformer=model)  # what the plugins read: `model.denoisers()`
        self.loaded = LoadedModel("random-h3-full", h3.FAMILY, pipeline, {}, {})
        self.model, self.inputs, self.device = model, inputs, device
        self.configs: dict[str, dict[str, Any]] = {}

    def forward(self, name: str, receipts: dict[str, Any] | None = None) -> tuple[float, float | None, tuple]:
        """(seconds, peak GiB, (video, audio)) of one forward with arm `name` installed."""
        handles = install.activate(install.plan(REGISTRY, self.loaded, self.configs[name], self.device))
        try:
            for handle in handles:
                handle.begin_request(0, 1)
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            sync(self.device)
            start = time.perf_counter()
            with torch.no_grad():
                out = self.model(**self.inputs)
            sync(self.device)
            seconds = time.perf_counter() - start
            peak = torch.cuda.max_memory_allocated(self.device) / GIB if self.device.type == "cuda" else None
            if receipts is not None:
                receipts.update({h.spec.name: h.report() for h in handles})
        finally:
            install.uninstall(handles)
        return seconds, peak, tuple(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny config and packing on the CPU (dry run)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (at most)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no round that would end past this")
    parser.add_argument("--density", type=float, default=0.20, help="block_sparse target density")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="after the rounds, one profiled forward per arm")
    parser.add_argument("--flash4", action="store_true", help="add arms with attention through FlashAttention-4")
    parser.add_argument("--stacks", action="store_true", help="add the fused-norms, block_sparse and FP8 stacks")
    parser.add_argument("--arms", default="", help="comma-separated subset of the arms (stock always runs)")
    args = parser.parse_args()

    device = torch.device("cpu" if args.smoke else "cuda")
    cuda = device.type == "cuda"
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("h3_full_forward: needs a CUDA device (or --smoke on the CPU)")
    dtype = torch.bfloat16
    shape = dict(SMOKE if args.smoke else FULL)
    config = SMOKE_CONFIG if args.smoke else {}
    arms: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    record_shape: dict[str, Any] = {**shape, "dtype": "bfloat16", "batch": 1, "smoke": args.smoke}
    notes = [
        "Random weights (torch's default Linear/RMSNorm init on the GPU); routing density and rel-L2 are "
        "properties of this random model, not of the released checkpoint. One forward per timed sample "
        "(host clock around a synchronised forward); speed-ups are stock median / arm median in this process."
    ]

    def save(phase: str) -> None:
        text = " ".join(notes) + f" Last phase written: {phase}."
        write(envelope(NAME + ("-smoke" if args.smoke else ""), record_shape, arms, ratios, text), NAME)

    built = arm(arms, "build", lambda: build(config, device, dtype, args.seed))
    if built is None:
        save("build")
        return
    model = built.pop("model")
    log(f"built {built['parameters'] / 1e9:.2f}B parameters in {built['seconds']:.1f}s")
    try:
        inputs = packed_inputs(model, shape, device, args.seed + 1)
    except Exception as error:
        arms["inputs"] = {"error": repr(error), "traceback": traceback.format_exc()[-3000:]}
        save("inputs")
        raise
    rows = inputs["position_ids"].shape[0]
    prefix = h3.target_video_start((), inputs)
    record_shape.update({
        "rows": rows, "video_rows": inputs["video_indices"].numel(), "audio_rows": inputs["audio_indices"].numel(),
        "text_rows": inputs["text_indices"].numel(), "prefix_rows": prefix, "timesteps": inputs["timestep"].tolist(),
        "schedule_step": STEP, "heads": model.config.num_attention_heads, "head_dim": model.config.attention_head_dim,
        "layers": model.config.num_layers, "parameters": built["parameters"],
        "pipeline_audio_latents_for_these_frames": audio_latent_num_frames(
            (shape["latent_frames"] - 2) // 5 * 17 + 5),
    })  # fmt: skip
    log(f"packed {rows} rows (prefix {prefix})")
    save("build")

    bench = Bench(model, inputs, device)
    bench.configs["stock"] = {}
    bench.configs["cudnn"] = {"attention_backend": {"backend": "cudnn" if device.type == "cuda" else "math"}}
    try:
        given = profile("exact-fast", "h3", device)
        arms["exact_fast_profile_as_given"] = given
        bench.configs["exact_fast"] = given
    except Exception as error:
        arms["exact_fast_profile_as_given"] = {"error": repr(error)}
    if args.flash4:
        bench.configs["flash4"] = {"flash4_attention": {}}
        bench.configs["exact_fast+flash4"] = {**bench.configs.get("exact_fast", {}), "flash4_attention": {}}

    def calibrate() -> dict[str, Any]:
        middle = model.config.num_layers // 2
        with captured_qkv(bench.loaded, keep=lambda step, block: block == middle) as records:
            bench.forward("stock")  # untimed; the capture shim runs the same backend
        q, k = (records[0][x].transpose(1, 2) for x in ("q", "k"))  # (B, H, T, D) views
        result = {"block": middle, "prefix": records[0]["prefix"], **tau_for(q, k, prefix, args.density)}
        del records, q, k
        return result

    wanted = {"stock", *args.arms.split(",")} if args.arms else None
    if wanted is None or "block_sparse" in wanted:
        chosen = arm(arms, "calibration", calibrate)
        if chosen is not None:
            bench.configs["block_sparse"] = {"block_sparse": {"tau": chosen["tau"]}}
    if args.stacks:
        norms, fp8 = {"fused_block_norms": {}}, {"selective_fp8": {"include": FP8_BLOCK_LINEARS}}
        bench.configs["norms"] = norms
        if args.flash4:
            bench.configs["norms+flash4"] = {**norms, "flash4_attention": {}}
        fp8f = {"selective_fp8": {"include": FP8_BLOCK_LINEARS, "path": "fused"}}
        bench.configs["fp8"], bench.configs["fp8f"] = fp8, fp8f
        if "block_sparse" in bench.configs:
            bench.configs["block_sparse+norms"] = {**bench.configs["block_sparse"], **norms}
            bench.configs["block_sparse+norms+fp8"] = {**bench.configs["block_sparse"], **norms, **fp8}
            bench.configs["block_sparse+norms+fp8f"] = {**bench.configs["block_sparse"], **norms, **fp8f}
    if wanted is not None:
        for name in set(bench.configs) - wanted:
            del bench.configs[name]
    arms["configs"] = bench.configs
    save("calibration")

    # warm-up: one untimed forward per arm; its output and receipts are the arm's checks
    outputs: dict[str, tuple] = {}
    for name in list(bench.configs):
        receipts: dict[str, Any] = {}

        def warm(name: str = name, receipts: dict[str, Any] = receipts) -> dict[str, Any]:
            seconds, peak, out = bench.forward(name, receipts)
            outputs[name] = out
            return {"warmup_seconds": seconds, "warmup_peak_gib": peak, "receipts": receipts}

        if arm(arms, name, warm) is None:
            del bench.configs[name]
        save(f"warm-up {name}")
    if "stock" not in outputs:
        save("warm-up (no stock output: no rounds)")
        return
    for name, out in outputs.items():
        checks = {
            "rel_l2_video_vs_stock": rel_l2(out[0], outputs["stock"][0]),
            "rel_l2_audio_vs_stock": rel_l2(out[1], outputs["stock"][1]),
            "equal_to_stock": equal(out, outputs["stock"]),
        }
        if name == "exact_fast":  # fused_block_ops is `rounding`: bit-equal to the arm with the same attention
            base = {k: v for k, v in bench.configs[name].items() if k != "fused_block_ops"}
            same = [n for n, c in bench.configs.items() if n != name and c == base and n in outputs]
            if same:
                checks["rounding_contract"] = {"against": same[0], "equal": equal(out, outputs[same[0]])}
        arms[name].update(checks, seconds=[], peak_gib=[], equal_to_own_warmup=[])
    save("checks")

    def timed(name: str, label: str) -> None:
        """One timed forward of arm `name`, appended to its record (an error is recorded, not raised)."""
        try:
            seconds, peak, out = bench.forward(name)
        except Exception as error:
            arms[name].setdefault("round_errors", []).append(f"{label}: {error!r}")
            log(f"{label} {name}: ERROR {error!r}")
            return
        arms[name]["seconds"].append(seconds)
        arms[name]["peak_gib"].append(peak)
        arms[name]["equal_to_own_warmup"].append(equal(out, outputs[name]))
        log(f"{label} {name}: {seconds:.3f}s")

    # timed rounds: every arm once per round, stock first; a closing stock forward after the last round
    order = list(bench.configs)
    done, last_round = 0, None
    for r in range(args.rounds):
        elapsed = time.perf_counter() - START
        estimate = last_round or sum(arms[n]["warmup_seconds"] for n in order)
        closing = statistics.median(arms["stock"]["seconds"] or [arms["stock"]["warmup_seconds"]])
        if r > 0 and elapsed + estimate + closing > args.budget_s:
            notes.append(f"Stopped after {done} rounds: round {r + 1} would end past the {args.budget_s:.0f}s budget.")
            break
        round_start = time.perf_counter()
        for name in order:
            timed(name, f"round {r + 1}")
        last_round, done = time.perf_counter() - round_start, r + 1
        save(f"round {done}")
    timed("stock", "closing")
    if done < 3:
        notes.append(f"Only {done} timed round(s) fit (the brief asks for >= 3): rounds reduced, shape kept.")

    for name in order:
        times = arms[name]["seconds"]
        if times:
            arms[name]["median_seconds"] = statistics.median(times)
    stock_median = arms["stock"].get("median_seconds")
    for name in order:
        if name != "stock" and stock_median and arms[name].get("median_seconds"):
            ratios[f"{name}_speedup_vs_stock"] = stock_median / arms[name]["median_seconds"]
    targets = {"exact_fast": (1.08, 5e-3), "block_sparse": (2.0, None)}
    for name, (speedup, budget) in targets.items():
        if f"{name}_speedup_vs_stock" in ratios:
            rel = max(arms[name]["rel_l2_video_vs_stock"], arms[name]["rel_l2_audio_vs_stock"])
            ratios[f"{name}_target"] = {
                "speedup": speedup, "rel_l2": budget,
                "met": ratios[f"{name}_speedup_vs_stock"] >= speedup and (budget is None or rel <= budget),
            }  # fmt: skip
    record_shape["rounds_done"] = done
    if args.profile:
        for name in order:  # where the time goes: attention / GEMM / rest per arm
            arm(arms, f"profile {name}", lambda name=name: kernel_split(lambda: bench.forward(name), cuda)[2])
            save(f"profile {name}")
    save("done")
    log("done: " + ", ".join(f"{k}={v:.3f}" for k, v in ratios.items() if isinstance(v, float)))


if __name__ == "__main__":
    main()
