"""Issue-7 GPU measurement of block-sparse attention (`python -m benchmarks.sparse_attention_h200`, < 5 min on
one H200). Writes `<date>-sparse-attention-h200.json` into $OUT (default benchmarks/results).

1. Correctness on the GPU: kernel vs its torch reference (same routing) in fp32 and bf16 (the bf16 tensor-core
   path is only exercised here), and all-exact routing vs cuDNN dense attention at 32,760 tokens.
2. Kernel time vs dense at the Wan2.1-1.3B attention shape (1 x 12 heads x 32,760 tokens x 128, bf16):
   cuDNN and flash SDPA against block_sparse at ~10/20/40% density (tau found by bisection on the routing
   function), on structured random Q/K (tokens on the 21x30x52 latent grid, keys and queries sharing smooth
   positional features, so scores are local as in video) and on Q/K/V captured from random-wan-1.3b's attn1
   (blocks 0, 15, 29) at 480x832x81; with the relative L2 of each against dense. Each row also splits the call
   into its routing (`plan`: block means, proxy scores, threshold, index compaction) and the attention kernel
   (`attend`) timed on their own.
2b. Launch sweep (`launch_sweep_*`): the d9ed842 launch ("previous") against the candidate launches of
   `CANDIDATES` that ran in the correctness check (a failing one is reported there, not fatal), interleaved
   in rounds in this one process, at the same 10/20/40% taus: routing, kernel and whole-call times, the
   kernel's computed density (group 2 computes the union of two query blocks' lists), and the max difference
   of each output from the previous launch's.
3. One transformer forward at that shape, stock vs block_sparse at the tau giving ~20% on the captured block 15.
4. Whether NVIDIA's sol-attn package is importable here (the sol_attn plugin's probe).

Every arm records its error instead of stopping the run; progress is printed as it goes.
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import envelope, write
from workbench import Session
from workbench.accelerations.attention import sol_package as sol_attn
from workbench.accelerations.attention.sparse_routing import captured_qkv
from workbench.kernels.block_sparse_attention import (
    CANDIDATES,
    DEFAULT,
    attend,
    block_sparse_attention,
    cost,
    plan,
    reference,
    routing,
)

GRID = (21, 30, 52)  # latent frames x height x width tokens of 81x480x832 after the (1, 2, 2) patch
TOKENS, HEADS, DIM = math.prod(GRID), 12, 128
DEVICE = "cuda"
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
DENSITIES = (0.10, 0.20, 0.40)
CAPTURE_BLOCKS = (0, 15, 29)  # first, middle, last of the 30 blocks
LAUNCHES = dict(CANDIDATES)  # the candidates that ran in `correctness`; the sweeps time these
SWEEPS = True  # --no-sweeps: the DEFAULT rows only
START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {message}", flush=True)


def arm(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """Run one arm; its result, or its error with the traceback, goes into `results[name]`, which is then written."""
    log(f"{name} ...")
    try:
        value = fn()
    except Exception as error:  # one failed arm must not lose the others
        results[name] = {"error": repr(error), "traceback": traceback.format_exc()[-3000:]}
        log(f"{name}: ERROR {error!r}")
        torch.cuda.empty_cache()
        save(results)
        return None
    results[name] = value
    log(f"{name}: {value if not isinstance(value, dict) else {k: v for k, v in value.items() if k != 'rows'}}")
    save(results)
    return value


def timed_ms(fn: Callable[[], Any], repeats: int = 10, warmup: int = 3) -> dict[str, float]:
    """Two clocks. `median_ms`: each call alone, synchronised before and after, so the host's launch time of a
    call made of many launches shows as GPU idle time inside it. `stream_ms`: `repeats` calls queued back to
    back between one event pair (the host runs ahead, as it does inside a model forward), per call: the GPU
    time a call costs when launches are not the bottleneck."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    stream = start.elapsed_time(end) / repeats
    return {"median_ms": statistics.median(times), "min_ms": min(times), "stream_ms": stream, "repeats": repeats}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "cudnn") -> torch.Tensor:
    with sdpa_kernel(BACKENDS[backend]):
        return F.scaled_dot_product_attention(q, k, v)


def structured_qkv(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1, 12, 32760, 128) bf16: q and k share random Fourier features of the token's grid position (scale of a
    few latent cells, per head), plus unit noise; v is noise. Attention is local and peaky, as in video."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    t, h, w = (torch.arange(n, device=DEVICE, dtype=torch.float32) for n in GRID)
    pos = torch.stack(torch.meshgrid(t, h, w, indexing="ij"), -1).reshape(-1, 3)  # (T, 3)
    freqs = torch.randn(HEADS, 3, DIM // 2, generator=g, device=DEVICE) * 0.35
    angles = pos @ freqs  # (H, T, 64)
    features = torch.cat([angles.sin(), angles.cos()], -1) * 1.2  # (H, T, 128)
    q, k, v = (torch.randn(1, HEADS, TOKENS, DIM, generator=g, device=DEVICE) for _ in range(3))
    return (q + features).bfloat16(), (k + features).bfloat16(), v.bfloat16()


def tau_for(q: torch.Tensor, k: torch.Tensor, target: float) -> tuple[float, float]:
    """Bisection on tau for a routing density near `target` (density falls as tau rises)."""
    low, high = -4.0, 8.0
    for _ in range(24):
        mid = (low + high) / 2
        if routing(q, k, mid, 0)[1] > target:
            low = mid
        else:
            high = mid
    tau = (low + high) / 2
    return tau, routing(q, k, tau, 0)[1]


def correctness() -> dict[str, Any]:
    out: dict[str, Any] = {}
    g = torch.Generator(DEVICE).manual_seed(1)
    for dtype, t, tau, sink in ((torch.float32, 1000, 0.5, 0), (torch.bfloat16, 2050, 0.3, 100)):
        q, k, v = (torch.randn(1, 2, t, DIM, generator=g, device=DEVICE).to(dtype) for _ in range(3))
        got, density = block_sparse_attention(q, k, v, tau, sink, return_density=True)
        want = reference(q, k, v, tau, sink)
        err = (got.float() - want.float()).abs().max().item()
        out[str(dtype).removeprefix("torch.")] = {"tokens": t, "tau": tau, "density": float(density), "max_abs": err}
    q, k, v = (torch.randn(1, 2, 2050, DIM, generator=g, device=DEVICE).bfloat16() for _ in range(3))
    want = reference(q, k, v, 0.3, 100)
    out["bfloat16_launches"], out["launch_errors"] = {}, {}
    for name, launch in list(LAUNCHES.items()):  # a launch that fails here is left out of the sweeps, not fatal
        try:
            got = block_sparse_attention(q, k, v, 0.3, 100, launch=launch)
            out["bfloat16_launches"][name] = (got.float() - want.float()).abs().max().item()
        except Exception as error:
            out["launch_errors"][name] = repr(error)
            del LAUNCHES[name]
    q, k, v = structured_qkv(7)
    exact = block_sparse_attention(q, k, v, float("-inf"), 0)
    cudnn = dense(q, k, v, "cudnn")
    out["all_exact_vs_cudnn_32760"] = {"max_abs": (exact.float() - cudnn.float()).abs().max().item(),
                                       "rel_l2": rel_l2(exact, cudnn)}  # fmt: skip
    out["bounds"] = {"float32": 1e-4, "bfloat16": 2e-2, "all_exact_rel_l2": 1e-2}
    out["pass"] = (
        out["float32"]["max_abs"] < 1e-4
        and out["bfloat16"]["max_abs"] < 2e-2
        and all(err < 2e-2 for err in out["bfloat16_launches"].values())
        and not out["launch_errors"]
        and out["all_exact_vs_cudnn_32760"]["rel_l2"] < 1e-2
    )
    return out


def kernel_vs_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, label: str) -> dict[str, Any]:
    """Times at each target density, with rel-L2 against cuDNN dense. q/k/v are (1, 12, T, 128)."""
    reference_out = dense(q, k, v, "cudnn")
    rows: dict[str, Any] = {
        "cudnn": timed_ms(lambda: dense(q, k, v, "cudnn")),
        "flash": timed_ms(lambda: dense(q, k, v, "flash")),
    }
    for target in DENSITIES:
        tau, density = tau_for(q, k, target)
        out = block_sparse_attention(q, k, v, tau, 0)
        timing = timed_ms(lambda tau=tau: block_sparse_attention(q, k, v, tau, 0))
        route = plan(q, k, v, tau, 0)
        routing = timed_ms(lambda tau=tau: plan(q, k, v, tau, 0))
        kernel = timed_ms(lambda route=route: attend(q, k, v, route))
        routing_ms, kernel_ms = routing["median_ms"], kernel["median_ms"]
        _, flops = cost(tuple(q.shape), density)
        rows[f"block_sparse@{target:.2f}"] = {
            "tau": tau,
            "density": density,
            "rel_l2_vs_dense": rel_l2(out, reference_out),
            **timing,
            "tflops": flops / timing["median_ms"] / 1e9,
            "speedup_vs_cudnn": rows["cudnn"]["median_ms"] / timing["median_ms"],
            "stream_speedup_vs_cudnn": rows["cudnn"]["stream_ms"] / timing["stream_ms"],
            "launch": repr(DEFAULT),
            "routing_ms": routing_ms,
            "kernel_ms": kernel_ms,
            "kernel_tflops": flops / kernel_ms / 1e9,
            "routing_stream_ms": routing["stream_ms"],
            "kernel_stream_ms": kernel["stream_ms"],
        }
        log(f"{label} target {target}: {rows[f'block_sparse@{target:.2f}']}")
    return rows


def launch_sweep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, label: str, rounds: int = 3) -> dict[str, Any]:
    """Every launch of CANDIDATES at each target density, interleaved: `rounds` passes over the launches,
    each timing routing (`plan`), kernel (`attend`, on a ready plan) and the whole call; medians over rounds."""
    cudnn_ms = timed_ms(lambda: dense(q, k, v, "cudnn"))["median_ms"]
    result: dict[str, Any] = {"cudnn_ms": cudnn_ms, "launches": {n: repr(x) for n, x in LAUNCHES.items()}}
    for target in DENSITIES:
        tau, density = tau_for(q, k, target)
        _, flops = cost(tuple(q.shape), density)
        plans = {name: plan(q, k, v, tau, 0, launch=launch) for name, launch in LAUNCHES.items()}
        previous = attend(q, k, v, plans["previous"], LAUNCHES["previous"])
        samples: dict[str, dict[str, list[float]]] = {n: {"routing": [], "kernel": [], "call": []} for n in plans}
        for _ in range(rounds):
            for name, launch in LAUNCHES.items():
                route = plans[name]
                samples[name]["routing"].append(
                    timed_ms(lambda launch=launch, tau=tau: plan(q, k, v, tau, 0, launch=launch))["median_ms"]
                )
                samples[name]["kernel"].append(
                    timed_ms(lambda route=route, launch=launch: attend(q, k, v, route, launch))["median_ms"]
                )
                samples[name]["call"].append(
                    timed_ms(lambda launch=launch, tau=tau: block_sparse_attention(q, k, v, tau, 0, launch=launch))[
                        "median_ms"
                    ]
                )
        rows: dict[str, Any] = {"tau": tau, "density": density}
        for name, launch in LAUNCHES.items():
            routing_ms, kernel_ms, call_ms = (
                statistics.median(samples[name][p]) for p in ("routing", "kernel", "call")
            )
            out = attend(q, k, v, plans[name], launch)
            rows[name] = {
                "routing_ms": routing_ms,
                "kernel_ms": kernel_ms,
                "call_ms": call_ms,
                "computed_density": plans[name].computed_density(),
                "kernel_tflops_useful": flops / kernel_ms / 1e9,
                "speedup_vs_cudnn": cudnn_ms / call_ms,
                "kernel_speedup_vs_previous": statistics.median(samples["previous"]["kernel"]) / kernel_ms,
                "call_speedup_vs_previous": statistics.median(samples["previous"]["call"]) / call_ms,
                "max_abs_vs_previous": (out.float() - previous.float()).abs().max().item(),
                "rounds": samples[name],
            }
        fastest = min(LAUNCHES, key=lambda name: rows[name]["call_ms"])
        rows["fastest_call"] = fastest
        result[f"{target:.2f}"] = rows
        summary = ", ".join(
            f"{n} {rows[n]['routing_ms']:.2f}+{rows[n]['kernel_ms']:.2f}={rows[n]['call_ms']:.2f} ms" for n in LAUNCHES
        )
        log(f"{label} sweep {target}: fastest {fastest}: {summary}")
        del plans, previous
    return result


def open_session() -> tuple[Session, dict[str, Any]]:
    """random-wan-1.3b on the GPU and one transformer call's inputs at 480x832x81 (random latents and text)."""
    session = Session.open("random-wan-1.3b", device=DEVICE, dtype="bfloat16")
    g = torch.Generator(DEVICE).manual_seed(3)
    inputs = {
        "hidden_states": torch.randn(1, 16, GRID[0], GRID[1] * 2, GRID[2] * 2, generator=g, device=DEVICE).bfloat16(),
        "timestep": torch.tensor([500.0], device=DEVICE),
        "encoder_hidden_states": torch.randn(1, 512, 4096, generator=g, device=DEVICE).bfloat16(),
        "return_dict": False,
    }
    return session, inputs


def save(arms: dict[str, Any]) -> None:
    """Write what is measured so far (called after every phase: a run cut short still hands back its rows)."""
    ratios: dict[str, Any] = {}
    for name, rows in (
        ("structured", arms.get("structured")),
        ("captured_middle_block", arms.get("captured_middle_block")),
    ):
        if isinstance(rows, dict) and "cudnn" in rows:
            ratios[name] = {key: row["speedup_vs_cudnn"] for key, row in rows.items() if "speedup_vs_cudnn" in row}
            ratios[f"{name}_stream"] = {
                key: row["stream_speedup_vs_cudnn"] for key, row in rows.items() if "stream_speedup_vs_cudnn" in row
            }
    e2e = arms.get("transformer_forward")
    if isinstance(e2e, dict) and "speedup" in e2e:
        ratios["transformer_forward_speedup_at_20pct"] = e2e["speedup"]
    for name in ("launch_sweep_structured", "launch_sweep_captured_middle_block"):
        rows = arms.get(name)
        if isinstance(rows, dict) and "cudnn_ms" in rows:
            ratios[name] = {
                f"{launch}@{target}": {
                    "call_vs_cudnn": rows[target][launch]["speedup_vs_cudnn"],
                    "call_vs_previous": rows[target][launch]["call_speedup_vs_previous"],
                    "kernel_vs_previous": rows[target][launch]["kernel_speedup_vs_previous"],
                }
                for target in (f"{d:.2f}" for d in DENSITIES)
                for launch in LAUNCHES
            }
    shape = {"batch": 1, "heads": HEADS, "tokens": TOKENS, "head_dim": DIM, "dtype": "bfloat16", "grid": GRID}
    notes = (
        "Two clocks per arm (timed_ms): median_ms times each call alone, synchronised, so a call made of many "
        "launches (the sparse routing) also pays the host's launch time; stream_ms queues the calls back to back "
        "between one event pair, as a model forward does, and is the GPU time per call. "
        "Kernel times (median_ms) include the routing (block means, proxy scores, threshold, index compaction) "
        "that every call pays; routing_ms and kernel_ms time the two parts alone (their sum can differ from the "
        "call by launch gaps). block_sparse@ rows use the DEFAULT launch; launch_sweep_* compare the d9ed842 launch "
        "('previous': heads-outer grid, 4 warps, 2 stages, fp32 mean K/V, argsort lists) with the candidates, "
        "interleaved rounds, median of round medians; kernel_tflops_useful counts the routed exact pairs only. Dense arms are torch SDPA with the cuDNN and flash backends on contiguous (B, H, T, D) inputs; "
        "the sparse arm reads the same tensors. Captured q/k/v come from random weights: the routing they give is "
        "a property of this random model, not of a trained Wan. One-forward speed-up: median of 3 A/B rounds."
    )
    write(envelope("sparse-attention-h200", shape, arms, ratios, notes), "sparse-attention-h200")


def main() -> None:
    arms: dict[str, Any] = {}
    arm(arms, "correctness", correctness)
    arm(arms, "structured", lambda: kernel_vs_dense(*structured_qkv(11), "structured"))
    if SWEEPS:
        arm(arms, "launch_sweep_structured", lambda: launch_sweep(*structured_qkv(11), "structured"))

    session, inputs = open_session()
    transformer = session.model.pipeline.transformer
    log(f"session open: init {session.init_seconds:.1f}s")

    def capture() -> dict[str, Any]:
        with torch.no_grad(), captured_qkv(session.model, keep=lambda step, block: block in CAPTURE_BLOCKS) as records:
            transformer(**inputs)
        return {r["block"]: tuple(x.transpose(1, 2) for x in (r["q"], r["k"], r["v"])) for r in records}

    captured, middle = None, CAPTURE_BLOCKS[1]
    try:
        captured = capture()
        log(f"captured attn1 q/k/v of blocks {sorted(captured)}: {tuple(captured[CAPTURE_BLOCKS[0]][0].shape)}")
    except Exception as error:
        arms["captured"] = {"error": repr(error), "traceback": traceback.format_exc()[-3000:]}
    if captured is not None:
        arm(arms, "captured_middle_block", lambda: kernel_vs_dense(*captured[middle], f"captured block {middle}"))
        if SWEEPS:
            arm(
                arms,
                "launch_sweep_captured_middle_block",
                lambda: launch_sweep(*captured[middle], f"captured block {middle}", rounds=2),
            )

        def other_blocks() -> dict[str, Any]:
            out = {}
            for block in CAPTURE_BLOCKS:
                q, k, v = captured[block]
                ref = dense(q, k, v, "cudnn")
                for target in DENSITIES:
                    tau, density = tau_for(q, k, target)
                    out[f"block{block}@{target:.2f}"] = {
                        "tau": tau,
                        "density": density,
                        "rel_l2_vs_dense": rel_l2(block_sparse_attention(q, k, v, tau, 0), ref),
                    }
            return out

        arm(arms, "captured_quality", other_blocks)

    def end_to_end() -> dict[str, Any]:
        if captured is None:
            raise RuntimeError("no captured q/k/v to choose tau from")
        tau, density = tau_for(captured[middle][0], captured[middle][1], 0.20)
        for block in [b for b in captured if b != middle]:
            del captured[block]  # free the other captures before timing
        with torch.no_grad():
            stock_out = transformer(**inputs)[0]
            result: dict[str, Any] = {
                "tau": tau,
                "middle_block": middle,
                "density_middle_block": density,
                "stock": [],
                "block_sparse": [],
            }
            for _ in range(3):  # A/B rounds: the plugin is installed and removed between them
                result["stock"].append(timed_ms(lambda: transformer(**inputs), repeats=3, warmup=1)["median_ms"])
                session.accelerate({"block_sparse": {"tau": tau}})
                try:
                    result["block_sparse"].append(
                        timed_ms(lambda: transformer(**inputs), repeats=3, warmup=1)["median_ms"]
                    )
                    handle = session._handles[0]
                    handle.begin_request(0, 1)
                    sparse_out = transformer(**inputs)[0]
                    result["receipt"] = handle.report()
                finally:
                    session.accelerate({})
        result["rel_l2_output_vs_stock"] = rel_l2(sparse_out, stock_out)
        result["speedup"] = statistics.median(result["stock"]) / statistics.median(result["block_sparse"])
        return result

    arm(arms, "transformer_forward", end_to_end)
    arm(arms, "sol_attn_probe", lambda: {"importable": bool(sol_attn.probe())})

    log("done")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sparse_attention_h200",
        description=__doc__.split("\n\n")[0] + " Needs a CUDA GPU.",
    )
    parser.add_argument("--launches", default="", help="comma-separated CANDIDATES to sweep ('previous' always)")
    parser.add_argument("--no-sweeps", action="store_true", help="skip the launch sweeps (the DEFAULT rows only)")
    options = parser.parse_args()
    chosen = options.launches
    SWEEPS = not options.no_sweeps
    if chosen:
        wanted = {"previous", *chosen.split(",")}
        unknown = sorted(wanted - set(CANDIDATES))
        if unknown:
            parser.error(f"--launches: unknown {unknown}; allowed: {sorted(CANDIDATES)}")
        for name in set(LAUNCHES) - wanted:
            del LAUNCHES[name]
    main()
