"""sol_attn: self-attention through NVIDIA's Sol-Attn package, when installed (contract: approximate).

The adapter routes the same modules as `block_sparse` (the family adapter's self-attention, through diffusers'
dispatcher; see `sparse_routing`) with the same options, but the attention is `sol_attn.sol_attn` from the
`sol-attn` package. It adds `thresh_type` (the package's "diag" or "exact" threshold) and `backend`: which
backend the package must pick on this device ("cute": its CuTe DSL kernel for this GPU's architecture, the
default; "triton": its Triton kernel). A mismatch is refused, never run on something else.

What this adapter assumes, and what was verified: it was written from the public interface of sol-attn 0.5.0
(NVlabs/Sana, `techniques/sparse_backends`): `sol_attn.sol_attn(q, k, v, *, scale, tau, thresh_type,
kv_splits, sink_tokens, sink_start)` on contiguous bfloat16 (B, T, H, 128) CUDA tensors, non-causal, forward
only, one exact KV sink range `[sink_start, sink_start + sink_tokens)` (omitting `sink_start` would put it at
the END of the sequence, so the adapter always passes `sink_start=0`: the families' non-video rows are a
prefix), and `sol_attn.get_sol_attn_backend(device)`, which names the backend a call would use
("cute_sm89" / "cute_sm90" / "cute_sm100" / "cute_sm120", else "triton"). The package is not installed where
this was written and no GPU has run this adapter: the tested paths are the refusals (package missing, entry
points missing, no CUDA, backend mismatch) and the argument mapping against a stand-in module. A real Sol-Attn
call is unverified until run on a GPU with the package installed (see the README, "Sparse attention").

Receipts: `sparse_calls`, `dense_calls` (dense steps / blocks), `protected_rows`, `notes["backend"]` and
`notes["package_version"]`; the package reports no density.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

from workbench.accelerations.attention.block_sparse import RoutedHandle
from workbench.accelerations.attention.sparse_routing import Call, Router, Settings, sparse_options
from workbench.accelerations.base import Option, Spec

PACKAGE = "sol_attn"
ENTRY_POINTS = ("sol_attn", "get_sol_attn_backend")
HEAD_DIM = 128
# the CuTe backend sol-attn 0.5 names for each compute capability it specialises
CUTE_BACKENDS = {(8, 9): "cute_sm89", (9, 0): "cute_sm90", (10, 0): "cute_sm100", (12, 0): "cute_sm120"}
INSTALL_HINT = (
    "install it from its source (README, 'Sparse attention': `pip install -e techniques/sparse_backends` in a "
    "checkout of NVlabs/Sana) and its runtime with `pip install 'vflash-workbench[sol]'`"
)


def probe() -> ModuleType:
    """The imported package with its documented entry points, or RuntimeError saying what is missing."""
    try:
        package = importlib.import_module(PACKAGE)
    except ImportError as error:
        raise RuntimeError(f"sol_attn: the `{PACKAGE}` package is not importable ({error}); {INSTALL_HINT}") from error
    missing = [name for name in ENTRY_POINTS if not callable(getattr(package, name, None))]
    if missing:
        raise RuntimeError(
            f"sol_attn: `{PACKAGE}` at {getattr(package, '__file__', '?')} lacks {missing}; this adapter expects the "
            "sol-attn 0.5 interface"
        )
    return package


def expected_backend(device: torch.device, backend: str) -> str:
    """The backend name `get_sol_attn_backend` must return for option `backend` on this CUDA device."""
    if backend == "triton":
        return "triton"
    capability = torch.cuda.get_device_capability(device)
    if capability not in CUTE_BACKENDS:
        raise RuntimeError(
            f"sol_attn: sol-attn 0.5 has no CuTe kernel for sm_{capability[0]}{capability[1]}; it has "
            f"{sorted(CUTE_BACKENDS.values())} (backend='triton' takes its Triton kernel instead)"
        )
    return CUTE_BACKENDS[capability]


def router_for(model: Any, device: torch.device, options: dict[str, Any], settings_for: Any) -> Router:
    """Every check, then a Router that calls the package; nothing is mutated (Router.install does that)."""
    package = probe()
    if device.type != "cuda":
        raise RuntimeError(f"sol_attn: the package runs on CUDA devices; this session runs on {device}")
    want = expected_backend(device, options["backend"])
    got = package.get_sol_attn_backend(device)
    if got != want:
        hint = " (CuTe DSL runtime missing: pip install 'vflash-workbench[sol]')" if got == "triton" else ""
        raise RuntimeError(f"sol_attn: the package picks backend {got!r} on {device}; required {want!r}{hint}")
    try:
        version = metadata.version("sol-attn")
    except metadata.PackageNotFoundError:
        version = None

    def attend(call: Call) -> tuple[torch.Tensor, None]:
        q, k, v = (x.contiguous() for x in call.qkv)
        if q.dtype != torch.bfloat16 or q.shape[-1] != HEAD_DIM:
            raise RuntimeError(f"sol_attn: q {tuple(q.shape)} {q.dtype}; the package takes bfloat16, head dim 128")
        settings = call.settings
        out = package.sol_attn(
            q, k, v, scale=call.kwargs.get("scale"), tau=settings.tau, thresh_type=settings.extra["thresh_type"],
            kv_splits=1, sink_tokens=call.rows(settings.sink_tokens), sink_start=0,
        )  # fmt: skip
        call.router.receipt.notes.update(backend=got, package_version=version)
        return out, None

    router = Router("sol_attn", model, None, attend, settings_for)
    router.check_modules(HEAD_DIM, (torch.bfloat16,))
    return router


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    settings = Settings.from_options(options, extra=("thresh_type",))
    router = router_for(model, device, options, lambda rows: settings)
    return lambda: RoutedHandle(SPEC, options, router)


SPEC = Spec(
    name="sol_attn",
    contract="approximate",
    summary="self-attention through NVIDIA's sol-attn package (optional; refused when missing or mismatched)",
    prepare_fn=_prepare,
    options=(
        *sparse_options(default_tau=1.0),
        Option("thresh_type", str, "diag", allowed=("diag", "exact"), help="the package's routing threshold"),
        Option("backend", str, "cute", allowed=("cute", "triton"), help="the package backend this device must use"),
    ),
    families=("wan", "ltx2", "h3"),
    touches=("attention_processor.backend", "blocks.compiled_call"),
    order=20,
)
SPECS = (SPEC,)
