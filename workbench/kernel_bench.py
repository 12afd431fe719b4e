"""Micro-benchmarks of the block kernels against their torch references and the copy roofline.

Used by `notebooks/30_kernels.ipynb` and `benchmarks/exact_fast_wan_1_3b.py`. Each kernel is checked
`torch.equal` to its reference on the inputs it is timed on, so a fast wrong kernel cannot report.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.kernels import adaln_modulate, gated_residual, gelu_tanh

COPY_BANDWIDTH = 4.17e12  # bytes/s: device-to-device copy measured on the project's H200
WAN_1_3B = {"batch": 1, "tokens": 32760, "channels": 1536, "ffn": 8960}


def micro_benchmarks(
    batch: int = 1, tokens: int = 32760, channels: int = 1536, ffn: int = 8960, copy_bandwidth: float = COPY_BANDWIDTH
) -> list[dict[str, Any]]:
    """Time each kernel and its reference (`triton.testing.do_bench`, median ms) on CUDA; one row per kernel."""
    if not torch.cuda.is_available():
        raise RuntimeError("kernel micro-benchmarks need a CUDA device; this machine has none")
    import triton.testing

    generator = torch.Generator("cuda").manual_seed(0)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=generator).to(dtype)

    n = randn(batch, tokens, channels)
    table = randn(batch, 6, channels)
    scale, shift, gate = table[:, 1:2], table[:, 0:1], table[:, 2:3]
    x, y = randn(batch, tokens, channels, dtype=torch.bfloat16), randn(batch, tokens, channels, dtype=torch.bfloat16)
    h = randn(batch, tokens, ffn, dtype=torch.bfloat16)
    cases = {
        "adaln_modulate": (
            lambda: adaln_modulate.adaln_modulate(n, scale, shift, torch.bfloat16),
            lambda: adaln_modulate.reference(n, scale, shift, torch.bfloat16),
            adaln_modulate.cost((batch, tokens, channels), torch.bfloat16),
        ),
        "gated_residual": (
            lambda: gated_residual.gated_residual(x, y, gate),
            lambda: gated_residual.reference(x, y, gate),
            gated_residual.cost((batch, tokens, channels), torch.bfloat16),
        ),
        "gelu_tanh": (
            lambda: gelu_tanh.gelu_tanh(h),
            lambda: gelu_tanh.reference(h),
            gelu_tanh.cost((batch, tokens, ffn)),
        ),
    }
    rows = []
    for name, (kernel, reference, (bytes_moved, flops)) in cases.items():
        got, want = kernel(), reference()
        kernel_ms = triton.testing.do_bench(kernel, warmup=25, rep=200)
        reference_ms = triton.testing.do_bench(reference, warmup=25, rep=200)
        rows.append(
            {
                "kernel": name,
                "bitwise_equal": bool(torch.equal(got, want)),
                "differing_elements": int((got != want).sum()),
                "kernel_ms": kernel_ms,
                "reference_ms": reference_ms,
                "speedup": reference_ms / kernel_ms,
                "bytes_moved": bytes_moved,
                "flops": flops,
                "roofline_ms": bytes_moved / copy_bandwidth * 1e3,
                "fraction_of_copy_bandwidth": bytes_moved / (kernel_ms / 1e3) / copy_bandwidth,
            }
        )
    return rows
