"""The fused block kernels against their torch references, reported against the roofline.

`cases(...)` builds each kernel's launcher call (DEFAULT launch), its reference call and its `cost()` at one
shape; `measure(case, ...)` times both with `workbench.evidence.timing.time_call` and checks the kernel's output
against the reference on the very inputs it is timed on (equal, or within the bound its contract allows), so a
fast wrong kernel cannot report a speed. Used by `notebooks/30_kernels.ipynb` (`micro_benchmarks`) and the
`kernels` benchmark scenario (`python -m benchmarks run kernels`).

Roofline: a call cannot take less than max(bytes_moved / copy bandwidth, flops / bf16 GEMM rate), the ceilings
`measure_ceilings(device)` measures on the device that runs, in the same process (`Ceilings.roofline_seconds`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.evidence.timing import time_call
from workbench.kernels import adaln_modulate, gated_residual, layernorm_modulate, qk_norm_rope

HEADS = 12  # Wan2.1-1.3B: 12 heads of 128


@dataclass(frozen=True)
class Case:
    """One kernel at one shape: `kernel()` and `reference()` compute the same maths on the same inputs.

    `exact`: the contract is bitwise (torch.equal required); otherwise the relative L2 against the reference
    must be <= `rel_l2_bound` (a reduction-order or approximation contract, stated by the kernel module)."""

    name: str
    kernel: Callable[[], Any]
    reference: Callable[[], Any]
    bytes_moved: int
    flops: int
    exact: bool
    rel_l2_bound: float = 0.0


@dataclass(frozen=True)
class Ceilings:
    """What one device reached, measured by `measure_ceilings`: a large copy and a large bf16 GEMM, each the median
    seconds of its calls. Bytes count as the kernels' `cost()` counts them: bytes read plus bytes written."""

    device: str  # the GPU's name (`torch.cuda.get_device_name`), or the device type off CUDA
    copy_bytes: int  # bytes one timed copy moves: its source read plus its destination written
    copy_s: float
    gemm_flops: int  # flops of one timed GEMM: 2 * M * N * K
    gemm_s: float

    @property
    def copy_bytes_per_s(self) -> float:
        return self.copy_bytes / self.copy_s

    @property
    def bf16_flops_per_s(self) -> float:
        return self.gemm_flops / self.gemm_s

    def roofline_seconds(self, bytes_moved: int, flops: int) -> float:
        """The least time a call moving `bytes_moved` and computing `flops` can take at these ceilings."""
        return max(bytes_moved / self.copy_bytes_per_s, flops / self.bf16_flops_per_s)

    def to_dict(self) -> dict[str, Any]:
        """The record's `ceilings`: `copy_bytes_per_s`, `bf16_flops` (flop/s), the device and what was timed."""
        return {"device": self.device, "copy_bytes_per_s": self.copy_bytes_per_s, "bf16_flops": self.bf16_flops_per_s,
                "copy_bytes": self.copy_bytes, "copy_s": self.copy_s, "gemm_flops": self.gemm_flops,
                "gemm_s": self.gemm_s}  # fmt: skip


def measure_ceilings(
    device: str | torch.device, copy_bytes: int = 1 << 30, gemm_size: int = 8192, repeats: int = 10, warmup: int = 3
) -> Ceilings:
    """The copy bandwidth and bf16 GEMM rate of `device`, measured now with `time_call` (the median of `repeats`
    synchronised calls, after `warmup` untimed ones):
    - copy: `dst.copy_(src)` of `copy_bytes` bytes (uint8); it moves 2 * `copy_bytes` (src read, dst written), as
      the kernels' `cost()` counts bytes;
    - GEMM: `torch.mm(a, b, out=c)` of bf16 (`gemm_size`, `gemm_size`) matrices, 2 * `gemm_size`**3 flops.
    The defaults are sized for a GPU (a 1 GiB copy, far past any L2; an 8192^3 GEMM). Off CUDA the same calls run
    on the host, where the defaults take long: pass tiny sizes (tests, smoke runs), whose numbers say nothing.
    ValueError for copy_bytes or gemm_size < 1 (and `time_call`'s for repeats, warmup)."""
    if copy_bytes < 1 or gemm_size < 1:
        raise ValueError(f"copy_bytes, gemm_size: must be >= 1, got {copy_bytes}, {gemm_size}")
    device = torch.device(device)
    src = torch.ones(copy_bytes, dtype=torch.uint8, device=device)  # written: every page is real memory
    dst = torch.empty_like(src)
    copy_s = time_call(lambda: dst.copy_(src), device, repeats, warmup, queued=False).median_s
    generator = torch.Generator(device).manual_seed(0)
    a, b = torch.randn(2, gemm_size, gemm_size, device=device, generator=generator, dtype=torch.bfloat16).unbind()
    c = torch.empty_like(a)
    gemm_s = time_call(lambda: torch.mm(a, b, out=c), device, repeats, warmup, queued=False).median_s
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return Ceilings(name, 2 * copy_bytes, copy_s, 2 * gemm_size**3, gemm_s)


def cases(
    batch: int,
    tokens: int,
    channels: int,
    heads: int = HEADS,
    device: str | torch.device = "cuda",
    seed: int = 0,
) -> list[Case]:
    """The Wan block's fused kernels at (batch, tokens, channels) with `heads` heads; bf16 activations,
    fp32 modulation tables and rotary tables as the workbench's bf16 sessions hold them. Inputs drawn from `seed`."""
    generator = torch.Generator(device).manual_seed(seed)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=generator).to(dtype)

    bf16, shape = torch.bfloat16, (batch, tokens, channels)
    n = randn(*shape)
    table = randn(batch, 6, channels)
    scale, shift, gate = table[:, 1:2], table[:, 0:1], table[:, 2:3]
    x, y = randn(*shape, dtype=bf16), randn(*shape, dtype=bf16)
    weight, bias = randn(channels), randn(channels)
    head_dim = channels // heads
    cos, sin = randn(1, tokens, 1, head_dim), randn(1, tokens, 1, head_dim)
    rms_weight = randn(channels, dtype=bf16)
    q = x.unflatten(2, (heads, head_dim))
    eps = 1e-6
    return [
        Case(
            "adaln_modulate",
            lambda: adaln_modulate.adaln_modulate(n, scale, shift, bf16),
            lambda: adaln_modulate.reference(n, scale, shift, bf16),
            *adaln_modulate.cost(shape, bf16),
            exact=True,
        ),
        Case(
            "gated_residual",
            lambda: gated_residual.gated_residual(x, y, gate),
            lambda: gated_residual.reference(x, y, gate),
            *gated_residual.cost(shape, bf16),
            exact=True,
        ),
        Case(
            "layernorm_modulate",
            lambda: layernorm_modulate.layernorm_modulate(x, eps, scale=scale, shift=shift),
            lambda: layernorm_modulate.reference(x, eps, scale=scale, shift=shift),
            *layernorm_modulate.cost(shape, bf16),
            exact=False,
            rel_l2_bound=1e-2,
        ),
        Case(
            "layernorm_affine",
            lambda: layernorm_modulate.layernorm_modulate(x, eps, weight=weight, bias=bias),
            lambda: layernorm_modulate.reference(x, eps, weight=weight, bias=bias),
            *layernorm_modulate.cost(shape, bf16, affine=True, modulate=False),
            exact=False,
            rel_l2_bound=1e-2,
        ),
        Case(
            "rope_only",
            lambda: qk_norm_rope.rope_only(q, cos, sin),
            lambda: qk_norm_rope.rope_reference(q, cos, sin),
            *qk_norm_rope.cost((batch, tokens, heads, head_dim), norm=False),
            exact=True,
        ),
        Case(
            "qk_norm_rope",
            lambda: qk_norm_rope.qk_norm_rope(x, rms_weight, eps, cos, sin, heads),
            lambda: qk_norm_rope.reference(x, rms_weight, eps, cos, sin, heads),
            *qk_norm_rope.cost((batch, tokens, heads, head_dim)),
            exact=False,
            rel_l2_bound=1e-2,
        ),
    ]


def check(case: Case) -> dict[str, Any]:
    """The kernel's output against the reference's on the case's inputs: equal / differing / rel-L2 / within."""
    got, want = case.kernel(), case.reference()
    got, want = (got[-1], want[-1]) if isinstance(got, tuple) else (got, want)  # fused add: the normed output
    equal = bool(torch.equal(got, want))
    rel_l2 = float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))
    within = equal if case.exact else rel_l2 <= case.rel_l2_bound
    return {"bitwise_equal": equal, "differing_elements": int((got != want).sum()), "rel_l2": rel_l2, "within": within}


def measure(
    case: Case, device: str | torch.device, ceilings: Ceilings, repeats: int = 20, warmup: int = 3
) -> dict[str, Any]:
    """One row: the check, both arms' times (`time_call`: `*_ms` on the queued clock, device time per call back to
    back; `*_synchronised_ms` each call alone), the speed-up reference / kernel and the kernel's fractions of the
    roofline and of the copy bandwidth of `ceilings` (`measure_ceilings` on the same device), both on the queued
    clock. ValueError naming the kernel if it fails its check."""
    checked = check(case)
    if not checked["within"]:
        raise ValueError(f"{case.name}: kernel output differs from its reference beyond its contract: {checked}")
    kernel = time_call(case.kernel, device, repeats, warmup)
    reference = time_call(case.reference, device, repeats, warmup)
    roofline = ceilings.roofline_seconds(case.bytes_moved, case.flops)
    return {
        "kernel": case.name,
        **checked,
        "kernel_ms": kernel.device_s * 1e3,
        "kernel_synchronised_ms": kernel.median_s * 1e3,
        "reference_ms": reference.device_s * 1e3,
        "reference_synchronised_ms": reference.median_s * 1e3,
        "speedup": reference.device_s / kernel.device_s,
        "bytes_moved": case.bytes_moved,
        "flops": case.flops,
        "roofline_ms": roofline * 1e3,
        "fraction_of_roofline": roofline / kernel.device_s,
        "fraction_of_copy_bandwidth": case.bytes_moved / kernel.device_s / ceilings.copy_bytes_per_s,
        "clock": kernel.clock,
    }


def micro_benchmarks(batch: int = 1, tokens: int = 32760, channels: int = 1536) -> list[dict[str, Any]]:
    """Each kernel and its reference on CUDA (`measure`, one row per kernel), against the ceilings `measure_ceilings`
    measures on that GPU first. RuntimeError without a CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("kernel micro-benchmarks need a CUDA device; this machine has none")
    ceilings = measure_ceilings("cuda")
    return [measure(case, "cuda", ceilings) for case in cases(batch, tokens, channels, device="cuda")]
