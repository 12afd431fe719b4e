"""Named benchmark scenarios, one small module each: `NAME`, `SUMMARY`, `GPUS` and `run(context) -> Measurement`;
optionally `SETTINGS` (the environment variables it reads), `ALLOCATOR` (the PYTORCH_CUDA_ALLOC_CONF setting it needs)
and `STOPS_AT_MAX_SECONDS = True` (it reads `context.max_seconds`; the harness refuses `--max-seconds` otherwise).

A scenario measures at its production shape on CUDA; with `context.smoke` it runs the same code path at a tiny
shape on the CPU (Triton kernels under TRITON_INTERPRET=1) in seconds, or states in its notes what it skips there.
"""

from __future__ import annotations

from types import ModuleType

from benchmarks.scenarios import (
    calibrate_wan,
    fanout,
    fanout_scaling,
    forward_h3,
    forward_wan,
    fp8_attention,
    kernels,
    memory,
    parallel,
    parallel_h3,
    portability,
    relayout,
    request_capped,
    request_h3_capped,
    request_lora,
    request_wan,
    request_wan22,
    ring,
    sparse_attention,
    text_ring,
    vae_decode,
)

MODULES: tuple[ModuleType, ...] = (
    forward_wan, forward_h3, request_wan, sparse_attention, fp8_attention, kernels, relayout, portability, parallel,
    parallel_h3,
    memory, ring, text_ring, fanout, fanout_scaling, vae_decode, calibrate_wan, request_lora, request_wan22,
    request_capped, request_h3_capped,
)  # fmt: skip
SCENARIOS: dict[str, ModuleType] = {module.NAME: module for module in MODULES}
