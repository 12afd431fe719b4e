"""Issue-6 first GPU look: are the block kernels bitwise on the H200, how fast are they against the
roofline, and what do the exact plugins do to a Wan2.1-1.3B-shaped request (A/B/A harness)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import triton.testing

from benchmarks.common import envelope, write
from workbench import Request, Session
from workbench.evidence.harness import qualify
from workbench.evidence.records import write_record
from workbench.kernels import adaln_modulate, gated_residual, gelu_tanh

COPY_BANDWIDTH = 4.17e12  # bytes/s, measured on this H200 kind (project notes)
B, T, C, FFN = 1, 32760, 1536, 8960


def kernels() -> dict:
    torch.manual_seed(0)
    dev = "cuda"
    n = torch.randn(B, T, C, device=dev)
    table = torch.randn(B, 6, C, device=dev)
    scale, shift, gate = table[:, 1:2], table[:, 0:1], table[:, 2:3]
    x = torch.randn(B, T, C, device=dev, dtype=torch.bfloat16)
    y = torch.randn(B, T, C, device=dev, dtype=torch.bfloat16)
    h = torch.randn(B, T, FFN, device=dev, dtype=torch.bfloat16)
    cases = {
        "adaln_modulate": (
            lambda: adaln_modulate.adaln_modulate(n, scale, shift, torch.bfloat16),
            lambda: adaln_modulate.reference(n, scale, shift, torch.bfloat16),
            adaln_modulate.cost((B, T, C), torch.bfloat16),
        ),
        "gated_residual": (
            lambda: gated_residual.gated_residual(x, y, gate),
            lambda: gated_residual.reference(x, y, gate),
            gated_residual.cost((B, T, C), torch.bfloat16),
        ),
        "gelu_tanh": (lambda: gelu_tanh.gelu_tanh(h), lambda: gelu_tanh.reference(h), gelu_tanh.cost((B, T, FFN))),
    }
    out = {}
    for name, (kernel, reference, (bytes_moved, flops)) in cases.items():
        got, want = kernel(), reference()
        ms_k = triton.testing.do_bench(kernel, warmup=25, rep=200)
        ms_r = triton.testing.do_bench(reference, warmup=25, rep=200)
        out[name] = {
            "bitwise_equal": bool(torch.equal(got, want)),
            "differing_elements": int((got != want).sum()),
            "kernel_ms": ms_k,
            "reference_ms": ms_r,
            "speedup": ms_r / ms_k,
            "bytes_moved": bytes_moved,
            "flops": flops,
            "roofline_ms": bytes_moved / COPY_BANDWIDTH * 1e3,
            "fraction_of_copy_bandwidth": bytes_moved / (ms_k / 1e3) / COPY_BANDWIDTH,
        }
        print(name, out[name])
    return out


def main() -> None:
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    results = {"kernels": kernels()}
    write(
        envelope("exact-fast-kernels", {"B": B, "T": T, "C": C, "ffn": FFN}, results, {}, "first GPU look"),
        "exact-fast-kernels",
    )
    session = Session.open("random-wan-1.3b", device="cuda", dtype="bfloat16")
    request = Request(
        "a red circle moves left over a blue floor", seed=42, frames=81, height=480, width=832, steps=4, guidance=5.0
    )
    for name, candidate in [
        ("fused-block-ops", {"fused_block_ops": {}}),
        ("exact-plugins", {"fused_block_ops": {}, "adaln_precompute": {}, "cross_kv_cache": {}}),
    ]:
        try:
            record, _ = qualify(session, [request], {}, candidate, rounds=3, progress=False)
        except Exception as error:
            write_record(out / f"exact-fast-{name}.json", {"error": repr(error)})
            print(name, "error", repr(error))
            continue
        write_record(out / f"exact-fast-{name}.json", record)
        case = record["cases"][0]
        print(name, record["verdict"], case["reason"], "exact:", case["quality"]["exact"], case["receipts"])


if __name__ == "__main__":
    main()
