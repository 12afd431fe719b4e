"""Two GPUs, one Wan2.1-1.3B-shaped request: context parallelism (Ulysses) against one GPU and against two
independent workers, with the workbench's direct relayouts against the references and diffusers' own copies.

Run on a 2-GPU machine from the repository root (launches itself under torchrun with 2 processes):

    python -m benchmarks.parallel_wan_1_3b
    # or: torchrun --standalone --nproc-per-node 2 -m benchmarks.parallel_wan_1_3b

Phases; rank 0 rewrites $OUT/<date>-parallel-wan-1.3b.json after each, and a phase that fails is recorded
(both ranks agree on failure before going on) rather than ending the run:
1. relayout micro-benchmark on GPU 0 (`benchmarks.relayout_wan_1_3b`, also written to its own JSON);
2. one self-attention call at the Wan shape over both GPUs, per relayout (diffusers / reference / direct):
   median ms, interleaved, and whether the outputs are bit-equal;
3. one request on GPU 0 alone (the 1-GPU latency; warm-up excluded; two timed requests, checked equal);
4. the same request over both GPUs, Ulysses with diffusers' relayout and with the direct one, interleaved
   rounds after one warm-up each (the reference relayout is compared in phase 2 only: time budget);
5. the VAE decode alone, on fixed random latents of the request's shape: one GPU untiled, one GPU with
   diffusers' tiled decode in two bands (`context_parallel`'s `parallel_decode='bands'` tiling, per overlap),
   and the same bands over both GPUs (`_parallel_decode`); times, and bitwise equality parallel vs 1-GPU tiled,
   max |diff| and PSNR vs untiled (interleaved rounds after one warm-up);
6. the request over both GPUs with Ulysses (direct) and `parallel_decode='bands'` (warm-up, two timed), and
   the 1-GPU request with the same bands enabled on the VAE (two timed): the request-level latency of issue 9;
7. throughput: both GPUs each run their own request at once, against one request over both GPUs;
8. ring attention over both GPUs (diffusers' ring needs the log-sum-exp: cuDNN backend), one timed request;
9. outputs: `workbench.quality.compare` of every 2-GPU arm against the 1-GPU result (the parallel-decode arm
   also against the 1-GPU tiled result, with frame equality), and equality across arms.
The Wan request has 4 steps (CFG: 8 transformer passes, batch 1 each). A time guard skips what would not
finish inside BUDGET_S (both ranks decide together). `PARALLEL_SMOKE=1 TRITON_INTERPRET=1` runs the same logic
on two CPU processes (gloo, tiny-wan, tiny shapes) to check the script, not to measure anything.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import relayout_wan_1_3b
from benchmarks.common import envelope, wan_1_3b_request, write
from workbench import Request, Session
from workbench import distributed as wd
from workbench.accelerations.base import Receipt
from workbench.accelerations.parallel.parallel_decode import ParallelDecode, band_tiling

SMOKE = os.environ.get("PARALLEL_SMOKE") == "1"  # a CPU/gloo dry run of this script's logic on tiny-wan: no figures
DEVICE = "cpu" if SMOKE else "cuda"
MODEL, DTYPE = ("tiny-wan", "float32") if SMOKE else ("random-wan-1.3b", "bfloat16")
ATTENTION = (1, 24, 2, 16) if SMOKE else (1, 16380, 12, 128)  # one rank's q/k/v (B, T_local, H, D) at world size 2
STEPS = 2 if SMOKE else 4
RELAYOUTS = ("diffusers", "reference", "direct")  # the attention-exchange micro-benchmark compares all three
END_TO_END = ("diffusers", "direct")  # whole requests: the stock path and the workbench path (time budget)
DECODE_OVERLAPS = (2, 3) if SMOKE else (4, 8)  # parallel_decode band overlaps (latent rows) in the decode phase
DECODE_OVERLAP = DECODE_OVERLAPS[0]  # the one the request phases use (the plugin's default in the full run)
BUDGET_S = float(os.environ.get("PARALLEL_BUDGET_S", "390"))  # phases; output comparison follows
START = time.monotonic()


def _agree(flag: bool) -> bool:
    """True only if every rank says True."""
    value = torch.tensor([int(flag)], device=DEVICE)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def _phase(record: dict, name: str, fn: Callable[[], tuple[Any, Any]], need_s: float) -> Any:
    """Run `fn` on every rank if the budget allows; `fn` returns (what to record, what to hand on). Records
    the first (or the error), rank 0 rewrites the JSON; returns the second, or None when skipped or failed."""
    left = BUDGET_S - (time.monotonic() - START)
    if not _agree(left > need_s):
        record["arms"][name] = {"skipped": f"time budget: {left:.0f} s left, phase needs ~{need_s:.0f} s"}
        payload, ok = None, False
    else:
        print(f"[rank {dist.get_rank()}] phase {name} ({time.monotonic() - START:.0f} s)", flush=True)
        began = time.monotonic()
        try:
            (value, payload), ok = fn(), True
            if isinstance(value, dict):
                value["phase_s"] = time.monotonic() - began
        except Exception as error:
            value, payload, ok = {"error": repr(error), "traceback": traceback.format_exc()}, None, False
            print(f"[rank {dist.get_rank()}] {name} failed: {error!r}", flush=True)
        if not _agree(ok) and ok:
            value, payload, ok = {"error": "another rank failed this phase"}, None, False
        record["arms"][name] = value
    if dist.get_rank() == 0:
        write(record, "parallel-wan-1.3b")
    return payload if ok else None


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _elapsed_ms(fn: Callable[[], Any]) -> float:
    """CUDA events around one call on a GPU; perf_counter in the CPU smoke run."""
    if DEVICE != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _broadcast_weights(session: Session) -> tuple[dict[str, bool], None]:
    """Every rank built the random model from the same seed; make sure by copying rank 0's tensors."""
    same = {}
    for name, component in session.model.pipeline.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        tensors = [t.data for t in list(component.parameters()) + list(component.buffers())]
        sums = torch.stack([t.float().sum() for t in tensors])
        gathered = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, sums)
        same[name] = all(torch.equal(g, gathered[0]) for g in gathered)
        for tensor in tensors:
            dist.broadcast(tensor, src=0)
    return same, None


def _attention_exchange(session: Session) -> tuple[dict, None]:
    """One Ulysses self-attention call (1, 32760, 12, 128) bf16 split over the group, per relayout."""
    from diffusers.models import attention_dispatch as ad

    session.accelerate({"context_parallel": {"relayout": "direct"}})
    try:
        handle = next(h for h in session._handles if h.spec.name == "context_parallel")
        handle.begin_request(0, 1)
        g = torch.Generator(DEVICE).manual_seed(1 + dist.get_rank())
        q, k, v = (torch.randn(*ATTENTION, device=DEVICE, generator=g).to(torch.bfloat16) for _ in range(3))

        def call(mode: str) -> torch.Tensor:
            handle.mode = mode
            return ad._templated_context_parallel_attention(
                q, k, v, forward_op=ad._native_attention_forward_op,
                backward_op=ad._native_attention_backward_op, _parallel_config=handle.config,
            )  # fmt: skip

        times: dict[str, list[float]] = {mode: [] for mode in RELAYOUTS}
        with torch.inference_mode():
            outputs = {mode: call(mode) for mode in RELAYOUTS}
            for _ in range(5):
                for mode in RELAYOUTS:
                    call(mode)
            for r in range(20):
                for mode in RELAYOUTS[r % 3 :] + RELAYOUTS[: r % 3]:
                    dist.barrier()
                    times[mode].append(_elapsed_ms(lambda mode=mode: call(mode)))
        medians = {mode: statistics.median(values) for mode, values in times.items()}
        return {
            "median_ms": medians,
            "all_ms": times,
            "speedup_direct_vs_diffusers": medians["diffusers"] / medians["direct"],
            "speedup_direct_vs_reference": medians["reference"] / medians["direct"],
            "bitwise_equal_direct_diffusers": bool(torch.equal(outputs["direct"], outputs["diffusers"])),
            "bitwise_equal_direct_reference": bool(torch.equal(outputs["direct"], outputs["reference"])),
            "receipt": handle.receipt.to_dict(),
        }, None
    finally:
        session.accelerate({})


def _timed(session: Session, request: Any) -> tuple[dict, Any]:
    """One request between two barriers: the wall time is the slowest rank's."""
    dist.barrier()
    start = time.perf_counter()
    result = session.generate(request, progress=False)
    _sync()
    dist.barrier()
    wall = time.perf_counter() - start
    row = {"wall_s": wall, "timings": result.timings, "memory": result.memory, "receipts": result.receipts}
    return row, result


def _one_gpu(session: Session, request: Any) -> tuple[dict, Any]:
    session.accelerate({})
    rows, results = [], []
    for _ in range(3):  # the first is the warm-up
        dist.barrier()
        if dist.get_rank() == 0:
            start = time.perf_counter()
            result = session.generate(request, progress=False)
            _sync()
            rows.append({"wall_s": time.perf_counter() - start, "timings": result.timings, "memory": result.memory})
            results.append(result)
        dist.barrier()
    if dist.get_rank() != 0:
        return {}, None
    timed = rows[1:]
    return {
        "warmup": rows[0],
        "timed": timed,
        "median_total_s": statistics.median(r["timings"]["total"] for r in timed),
        "median_denoise_s": statistics.median(r["timings"]["denoise"] for r in timed),
        "run_to_run_bitwise_equal": bool(torch.equal(results[1].latents, results[2].latents)),
    }, results[-1]


def _two_gpu(session: Session, request: Any) -> tuple[dict, dict]:
    rows: dict[str, list] = {mode: [] for mode in END_TO_END}
    results: dict[str, Any] = {}
    for mode in END_TO_END:  # warm-up per arm
        session.accelerate({"context_parallel": {"relayout": mode}})
        _timed(session, request)
    for r in range(2):
        for mode in END_TO_END[r % 2 :] + END_TO_END[: r % 2]:
            session.accelerate({"context_parallel": {"relayout": mode}})
            row, results[mode] = _timed(session, request)
            rows[mode].append(row)
    session.accelerate({})
    summary = {
        mode: {
            "timed": rows[mode],
            "median_total_s": statistics.median(r["timings"]["total"] for r in rows[mode]),
            "median_denoise_s": statistics.median(r["timings"]["denoise"] for r in rows[mode]),
            "median_wall_s": statistics.median(r["wall_s"] for r in rows[mode]),
        }
        for mode in END_TO_END
    }
    return summary, results


def _latent_shape(vae: Any, request: Any) -> tuple[int, ...]:
    """(B, C, T, H, W) of the latents the request decodes."""
    ratio_t, ratio_s = vae.config.scale_factor_temporal, vae.config.scale_factor_spatial
    return (
        1,
        vae.config.z_dim,
        (request.frames - 1) // ratio_t + 1,
        request.height // ratio_s,
        request.width // ratio_s,
    )


class _BandTiling:
    """diffusers' own tiled decode on this process's VAE with the parallel decode's bands; restores on exit."""

    def __init__(self, vae: Any, shape: tuple[int, ...], overlap: int):
        self.vae, self.tiling = vae, band_tiling(vae, shape[3], shape[4], dist.get_world_size(), overlap)

    def __enter__(self) -> None:
        self.saved = {k: v for k, v in vars(self.vae).items() if k == "use_tiling" or k.startswith("tile_sample_")}
        self.vae.enable_tiling(**self.tiling.to_dict())

    def __exit__(self, *_: Any) -> None:
        for key, value in self.saved.items():
            setattr(self.vae, key, value)


def _decode_only(session: Session, request: Any) -> tuple[dict, None]:
    """The VAE decode alone on fixed latents: 1 GPU untiled, 1 GPU in bands (tiled), both GPUs in bands."""
    vae = session.model.pipeline.vae
    shape = _latent_shape(vae, request)
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(7)).to(DEVICE, vae.dtype)  # same on both ranks
    rank = dist.get_rank()

    def one_gpu(tiled_overlap: int | None) -> Callable[[], Any]:
        def run() -> Any:
            if rank != 0:
                return None
            if tiled_overlap is None:
                return vae.decode(z).sample
            with _BandTiling(vae, shape, tiled_overlap):
                return vae.decode(z).sample

        return run

    def both_gpus(overlap: int, receipt: Receipt) -> Callable[[], Any]:
        def run() -> Any:
            decode = ParallelDecode(vae, overlap, receipt)
            try:
                return vae.decode(z).sample
            finally:
                decode.remove()

        return run

    receipts = {o: Receipt(("parallel_decodes",)) for o in DECODE_OVERLAPS}
    arms: dict[str, Callable[[], Any]] = {"untiled_1gpu": one_gpu(None)}
    for o in DECODE_OVERLAPS:
        arms[f"tiled_1gpu_overlap{o}"] = one_gpu(o)
        arms[f"parallel_2gpu_overlap{o}"] = both_gpus(o, receipts[o])
    names = list(arms)
    times: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, Any] = {}
    with torch.inference_mode():
        for r in range(3):  # round 0 is the warm-up; rounds rotate the order
            for name in names[r % len(names) :] + names[: r % len(names)]:
                dist.barrier()
                start = time.perf_counter()
                outputs[name] = arms[name]()
                _sync()
                elapsed = time.perf_counter() - start
                dist.barrier()
                if r > 0:
                    times[name].append(elapsed)
    row: dict[str, Any] = {"latents": list(shape), "seconds": times}
    if rank == 0:
        row["median_s"] = {name: statistics.median(values) for name, values in times.items()}
        untiled = outputs["untiled_1gpu"].float()
        for o in DECODE_OVERLAPS:
            parallel, tiled = outputs[f"parallel_2gpu_overlap{o}"], outputs[f"tiled_1gpu_overlap{o}"]
            mse = float((parallel.float() - untiled).pow(2).mean())
            row[f"overlap{o}"] = {
                "bitwise_equal_parallel_vs_1gpu_tiled": bool(torch.equal(parallel, tiled)),
                "max_abs_parallel_vs_untiled": float((parallel.float() - untiled).abs().max()),
                "psnr_db_parallel_vs_untiled": 10 * math.log10(4.0 / mse) if mse > 0 else float("inf"),
                "speedup_untiled_1gpu_over_parallel": row["median_s"]["untiled_1gpu"]
                / row["median_s"][f"parallel_2gpu_overlap{o}"],
                "receipt": receipts[o].to_dict(),
            }
    return row, None


def _parallel_decode_request(session: Session, request: Any) -> tuple[dict, Any]:
    """Ulysses (direct) over both GPUs with the decode in bands: warm-up, then two timed requests."""
    config = {"relayout": "direct", "parallel_decode": "bands", "decode_overlap": DECODE_OVERLAP}
    session.accelerate({"context_parallel": config})
    try:
        _timed(session, request)
        rows, result = [], None
        for _ in range(2):
            row, result = _timed(session, request)
            rows.append(row)
    finally:
        session.accelerate({})
    return {
        "config": config,
        "timed": rows,
        "median_total_s": statistics.median(r["timings"]["total"] for r in rows),
        "median_denoise_s": statistics.median(r["timings"]["denoise"] for r in rows),
        "median_video_decode_s": statistics.median(r["timings"]["video_decode"] for r in rows),
        "median_wall_s": statistics.median(r["wall_s"] for r in rows),
    }, result


def _one_gpu_tiled(session: Session, request: Any) -> tuple[dict, Any]:
    """The 1-GPU request with the parallel decode's bands enabled on the VAE (what 2 GPUs must equal)."""
    session.accelerate({})
    vae = session.model.pipeline.vae
    rows, result = [], None
    with _BandTiling(vae, _latent_shape(vae, request), DECODE_OVERLAP):
        for _ in range(2):  # the decode shapes differ from untiled: the first of two is partly a warm-up
            dist.barrier()
            if dist.get_rank() == 0:
                start = time.perf_counter()
                result = session.generate(request, progress=False)
                _sync()
                rows.append({"wall_s": time.perf_counter() - start, "timings": result.timings})
            dist.barrier()
    if dist.get_rank() != 0:
        return {}, None
    return {
        "overlap": DECODE_OVERLAP,
        "timed": rows,
        "last_total_s": rows[-1]["timings"]["total"],
        "last_video_decode_s": rows[-1]["timings"]["video_decode"],
    }, result


def _throughput(session: Session, request: Any) -> tuple[dict, None]:
    """Each GPU its own request (another seed per rank), both at once: requests per second of the pair."""
    import dataclasses

    session.accelerate({})
    own = dataclasses.replace(request, seed=request.seed + dist.get_rank())
    _timed(session, own)  # warm-up (rank 1's first request)
    walls = [_timed(session, own)[0]["wall_s"] for _ in range(2)]
    wall = statistics.median(walls)
    return {"walls_s": walls, "median_wall_s": wall, "requests_per_s": dist.get_world_size() / wall}, None


def _ring(session: Session, request: Any) -> tuple[dict, Any]:
    """diffusers' ring attention over both GPUs (needs a backend that returns the log-sum-exp: cuDNN here)."""
    config = {
        "attention_backend": {"backend": "cudnn"},
        "context_parallel": {"ulysses_degree": 1, "ring_degree": 2, "relayout": "diffusers"},
    }
    session.accelerate(config)
    try:
        _timed(session, request)  # warm-up
        row, result = _timed(session, request)
    finally:
        session.accelerate({})
    return row, result


def _outputs(one: Any, two: dict[str, Any], one_tiled: Any = None) -> dict:
    from workbench.quality import compare

    rows = {}
    for mode, result in two.items():
        comparison = compare(one, result).to_dict()
        rows[f"{mode}_vs_1gpu"] = {k: comparison[k] for k in ("latent_rel_l2", "psnr_db", "min_ssim", "exact")}
    if one_tiled is not None and "parallel_decode" in two:
        comparison = compare(one_tiled, two["parallel_decode"]).to_dict()
        rows["parallel_decode_vs_1gpu_tiled"] = {
            **{k: comparison[k] for k in ("latent_rel_l2", "psnr_db", "min_ssim", "exact")},
            "frames_equal": bool((one_tiled.frames == two["parallel_decode"].frames).all()),
        }
    if "direct" in two and "diffusers" in two:
        rows["direct_vs_diffusers_bitwise_equal"] = bool(torch.equal(two["direct"].latents, two["diffusers"].latents))
    return rows


def main() -> None:
    device = wd.init_worker(DEVICE, timeout_s=300)
    rank = dist.get_rank()
    request = (
        Request("a red circle", seed=42, frames=9, height=64, width=64, steps=STEPS)
        if SMOKE
        else wan_1_3b_request(STEPS)
    )
    shape = {**relayout_wan_1_3b.SHAPE, "steps": STEPS, "request": request.to_dict()}
    record = envelope("parallel-wan-1.3b", shape, {"world_size": dist.get_world_size()}, {}, "")
    relayout = (lambda: (relayout_wan_1_3b.measure(), None)) if rank == 0 else (lambda: ({"rank": rank}, None))
    _phase(record, "relayout", relayout, need_s=0)  # GPU 0 only; rank 1 waits
    if rank == 0:
        relayout_record = envelope("relayout-wan-1.3b", relayout_wan_1_3b.SHAPE, record["arms"]["relayout"], {}, "")
        write(relayout_record, "relayout-wan-1.3b")

    def open_session() -> tuple[dict, Session]:
        session = Session.open(MODEL, device=str(device), dtype=DTYPE)
        return {"init_seconds": session.init_seconds}, session

    session = _phase(record, "open", open_session, need_s=60)
    if session is None:
        return
    _phase(record, "weights_equal_before_broadcast", lambda: _broadcast_weights(session), need_s=20)
    _phase(record, "attention_exchange", lambda: _attention_exchange(session), need_s=30)
    one = _phase(record, "one_gpu", lambda: _one_gpu(session, request), need_s=90)
    two = _phase(record, "two_gpu", lambda: _two_gpu(session, request), need_s=120)
    _phase(record, "decode_only", lambda: _decode_only(session, request), need_s=45)
    bands = _phase(record, "two_gpu_parallel_decode", lambda: _parallel_decode_request(session, request), need_s=30)
    one_tiled = _phase(record, "one_gpu_tiled", lambda: _one_gpu_tiled(session, request), need_s=25)
    _phase(record, "two_workers_throughput", lambda: _throughput(session, request), need_s=90)
    ring = None if SMOKE else _phase(record, "two_gpu_ring_cudnn", lambda: _ring(session, request), need_s=60)
    if rank == 0 and one is not None and two:
        extra = {"ring_cudnn": ring} if ring is not None else {}
        if bands is not None:
            extra["parallel_decode"] = bands
        try:
            record["arms"]["outputs"] = _outputs(one, {**two, **extra}, one_tiled)
        except Exception as error:
            record["arms"]["outputs"] = {"error": repr(error), "traceback": traceback.format_exc()}
    record["ratios"] = _ratios(record["arms"])
    record["notes"] = (
        f"Wan2.1-1.3B shape, random weights (rank 0's, broadcast), {STEPS} steps CFG 5, bf16, native attention; "
        "latency ratios > 1 favour the 2-GPU request, the throughput ratio > 1 favours two independent workers; "
        "request totals include text encoding and the VAE decode, which run replicated on every rank except in "
        "two_gpu_parallel_decode (parallel_decode='bands': diffusers' tiled decode, one band per GPU; approximate "
        "vs the untiled decode, bit-equal to one_gpu_tiled's decode when the latents are)"
    )
    if rank == 0:
        write(record, "parallel-wan-1.3b")
    dist.barrier()


def _ratios(arms: dict) -> dict:
    """Each group of ratios needs its own arms; a missing arm drops its group only (and says which)."""
    ratios: dict[str, Any] = {}
    missing = []
    one, two = arms.get("one_gpu", {}), arms.get("two_gpu", {})
    groups: dict[str, Callable[[], dict[str, float]]] = {
        "ulysses": lambda: {
            **{f"latency_1gpu_over_2gpu_{m}": one["median_total_s"] / two[m]["median_total_s"] for m in END_TO_END},
            **{f"denoise_1gpu_over_2gpu_{m}": one["median_denoise_s"] / two[m]["median_denoise_s"] for m in END_TO_END},
            "denoise_diffusers_over_direct": two["diffusers"]["median_denoise_s"] / two["direct"]["median_denoise_s"],
        },
        "parallel_decode": lambda: {
            "latency_1gpu_over_2gpu_parallel_decode": one["median_total_s"]
            / arms["two_gpu_parallel_decode"]["median_total_s"],
            "video_decode_1gpu_over_2gpu_parallel_decode": statistics.median(
                r["timings"]["video_decode"] for r in one["timed"]
            )
            / arms["two_gpu_parallel_decode"]["median_video_decode_s"],
        },
        "parallel_decode_vs_1gpu_tiled": lambda: {
            "latency_1gpu_tiled_over_2gpu_parallel_decode": arms["one_gpu_tiled"]["last_total_s"]
            / arms["two_gpu_parallel_decode"]["median_total_s"],
        },
        "throughput": lambda: {
            "throughput_two_workers_over_one_2gpu_request": arms["two_workers_throughput"]["requests_per_s"]
            * two["direct"]["median_wall_s"],
        },
    }
    for name, group in groups.items():
        try:
            ratios.update(group())
        except (KeyError, TypeError, ZeroDivisionError) as error:
            missing.append(f"{name}: {error!r}")
    if missing:
        ratios["missing"] = missing
    return ratios


if __name__ == "__main__":
    if "RANK" not in os.environ:  # started plainly: relaunch under torchrun with one process per GPU
        wd.check_gpus(2, DEVICE)
        sys.exit(wd.launch(2, "benchmarks.parallel_wan_1_3b", []).returncode)
    main()
