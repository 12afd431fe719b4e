"""Issue 24's LoRA bar: a 4-step Wan2.1-1.3B-shaped request (480x832, 81 frames, CFG 5: 8 transformer passes; random
weights, bf16) with a LoRA adapter, through `Session.generate`, text encoding and VAE decode included.

The adapter is random, made here (`random_lora`): rank 32 on q, k, v and out of both attentions and on both FFN
linears of every block (300 linears), its delta B @ A about a tenth of each weight's RMS, saved in diffusers' key
format to a temporary safetensors file with no metadata (the request sets steps and guidance itself). Arms, each set
up before its request and taken down after it, outside the request's time:
- `stock+unfused` (the reference and the A/B/A baseline): no plugin; the adapter loaded through diffusers' own LoRA
  path (`pipe.load_lora_weights`, `set_adapters`), PEFT's LoRA layers active beside every targeted linear (the base
  GEMM plus two low-rank GEMMs per call); `pipe.unload_lora_weights()` after.
- `stock+fused`: no plugin; the adapter fused into the weights by the workbench (`session.load_adapters`: diffusers'
  loader, `fuse_lora`, LoRA layers dropped); `load_adapters([])` after restores the weights bit for bit. Contract
  `reduction` against the reference: W + B @ A rounded once to bf16, one GEMM instead of three summed.
- `exact-fast+fused`: the fused adapter under the `exact-fast` profile plus `fused_vae_decode` at its fastest measured
  setting, `channels_last` + Triton norm (`reduction`; benchmarks/results/vae-decode.json). Contract: the weakest of
  the fusion's and of every executed plugin's.

One untimed pilot request per arm (Triton compiles there; each timed request must equal its arm's pilot), then A/B/A
rounds of whole requests against `stock+unfused` (`request_wan.compare_requests`). Per arm: total and per-stage
medians (text_encode, denoise, video_decode, other), peak memory per stage, the pilot's receipts, its contract, its
latent relative L2 and frame PSNR against the reference's pilot. The base weights' fingerprint is taken before the
first and after the last request: `shape.weights_restored` says every arm put them back. Needs peft (the `lora`
extra). `--smoke`: tiny-wan on the CPU, rank 4, 5 frames at 16x16, 1 step, the decode without the Triton norm.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.scenarios.request_wan import Requests, compare_requests, stage_notes
from benchmarks.workloads import exact_fast, open_wan, wan_request
from workbench import Adapter, Session
from workbench.accelerations import fingerprint
from workbench.accelerations.base import CONTRACTS
from workbench.quality import video_psnr

NAME = "request-lora"
SUMMARY = "issue 24: Wan2.1-1.3B 4-step request 480x832x81 CFG 5 with a rank-32 LoRA: stock+unfused vs fused arms"
GPUS = 1
STEPS = 4
RANK, SMOKE_RANK = 32, 4
RELATIVE = 0.1  # RMS of B @ A over the RMS of the weight it adds to
TARGETS = tuple(f"attn{i}.{p}" for i in (1, 2) for p in ("to_q", "to_k", "to_v", "to_out.0"))
TARGETS += ("ffn.net.0.proj", "ffn.net.2")
DECODE = {"channels_last": True, "norm": "triton"}  # fused_vae_decode's fastest setting on the H200 (reduction)
SMOKE_DECODE = {"channels_last": True}  # the Triton norm under the interpreter is most of a smoke run's time
REFERENCE = "stock+unfused"


def random_lora(denoiser: torch.nn.Module, path: Path, rank: int, seed: int) -> dict[str, Any]:
    """A random LoRA of `rank` on the `TARGETS` linears of every block of `denoiser`, saved to `path` as diffusers'
    keys (`transformer.<module>.lora_A.weight` (rank, in) and `.lora_B.weight` (out, rank), what
    `WanPipeline.save_lora_weights` writes) in the weights' dtype. No alpha is stored: diffusers then takes
    alpha = rank, so the delta is B @ A at scale 1. A ~ N(0, 1/in), B ~ N(0, (RELATIVE * rms(W))^2 / rank): B @ A
    has about RELATIVE times the RMS of W. Drawn on the weights' device from `seed`. Returns what was made."""
    from safetensors.torch import save_file

    state: dict[str, torch.Tensor] = {}
    for name, module in denoiser.named_modules():
        parts = name.split(".", 2)
        if len(parts) < 3 or parts[0] != "blocks" or parts[2] not in TARGETS:
            continue
        weight = module.weight.detach()
        generator = torch.Generator(weight.device).manual_seed(seed + len(state))
        out_features, in_features = weight.shape
        a = torch.randn(rank, in_features, generator=generator, device=weight.device) / in_features**0.5
        b = torch.randn(out_features, rank, generator=generator, device=weight.device)
        b *= RELATIVE * weight.float().pow(2).mean().sqrt() / rank**0.5
        state[f"transformer.{name}.lora_A.weight"] = a.to(weight.dtype).cpu().contiguous()
        state[f"transformer.{name}.lora_B.weight"] = b.to(weight.dtype).cpu().contiguous()
    if not state:
        raise RuntimeError(f"{NAME}: the denoiser has none of the LoRA target linears {list(TARGETS)}")
    save_file(state, str(path))
    return {"rank": rank, "linears": len(state) // 2, "targets": list(TARGETS), "relative_rms": RELATIVE,
            "parameters": sum(t.numel() for t in state.values()), "file_bytes": path.stat().st_size}  # fmt: skip


@contextlib.contextmanager
def unfused(session: Session, adapter: Adapter, seen: dict[str, Any]) -> Iterator[None]:
    """diffusers' own LoRA path around one request: loaded, activated at the adapter's scale, unloaded after; the
    LoRA layers' count and dtype go into `seen`."""
    pipe = session.model.pipeline
    pipe.load_lora_weights(
        str(adapter.path.parent), weight_name=adapter.path.name, adapter_name=adapter.name, local_files_only=True
    )
    try:
        pipe.set_adapters([adapter.name], [adapter.scale])
        layers = [m for m in pipe.transformer.modules() if adapter.name in getattr(m, "lora_A", {})]
        seen.update(lora_layers=len(layers), lora_dtype=str(layers[0].lora_A[adapter.name].weight.dtype))
        yield
    finally:
        pipe.unload_lora_weights()


@contextlib.contextmanager
def fused(session: Session, adapter: Adapter, config: dict[str, Any]) -> Iterator[None]:
    """The adapter fused into the weights (`load_adapters`), then the plugins of `config` installed over them, around
    one request; both taken off after (the weights restored bit for bit). Installing after fusing spares
    `load_adapters` taking the plugins off and putting them back."""
    session.load_adapters([adapter])
    try:
        session.accelerate(config)
        try:
            yield
        finally:
            session.accelerate({})
    finally:
        session.load_adapters([])


def contract(receipts: dict[str, Any], fused_adapter: bool) -> str:
    """The weakest contract among the executed plugins' and the fusion's (`reduction`); `reference` for neither."""
    found = [r["contract"] for r in receipts.values() if r["executed"]] + (["reduction"] if fused_adapter else [])
    return max(found, key=CONTRACTS.index) if found else "reference"


def run(context: Context) -> Measurement:
    smoke, device = context.smoke, context.device
    notes: list[str] = []
    session = open_wan(smoke, device)
    request = wan_request(STEPS, smoke)
    before = fingerprint(session.model.pipeline.transformer)
    seen: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "random-lora.safetensors"
        made = random_lora(session.model.pipeline.transformer, path, SMOKE_RANK if smoke else RANK, seed=24)
        adapter = Adapter(path, scale=1.0, name="random_lora")
        decode = SMOKE_DECODE if smoke else DECODE
        fast = {**exact_fast("wan", device, notes, session.model), "fused_vae_decode": decode}
        configs = {REFERENCE: {}, "stock+fused": {}, "exact-fast+fused": fast}
        arms = {  # the fused arms install their plugins themselves (`fused`), the harness installs nothing
            REFERENCE: ({}, lambda: unfused(session, adapter, seen)),
            "stock+fused": ({}, lambda: fused(session, adapter, {})),
            "exact-fast+fused": ({}, lambda: fused(session, adapter, fast)),
        }
        requests = Requests(session, request, reference=REFERENCE)
        rows, ratios = compare_requests(requests, arms, context.rounds, notes)
    for name, config in configs.items():
        rows[name]["config"] = config
    restored = fingerprint(session.model.pipeline.transformer) == before
    reference = requests.pilots[REFERENCE]
    for name, row in rows.items():
        pilot = requests.pilots[name]
        stages = row.get("stages_median_s", {})
        row |= {"contract": contract(pilot.receipts, name != REFERENCE), "denoise_s": stages.get("denoise"),
                "video_decode_s": stages.get("video_decode")}  # fmt: skip
        if name != REFERENCE:
            row["psnr_db_vs_reference"] = video_psnr(reference.frames, pilot.frames)
    notes += stage_notes(rows)
    notes.append(
        f"Adapter: {made['linears']} linears at rank {made['rank']}, {made['parameters']:,} parameters; in the "
        f"{REFERENCE} arm diffusers ran {seen.get('lora_layers')} LoRA layers in {seen.get('lora_dtype')}."
    )
    if not restored:
        notes.append("The transformer's fingerprint after the last request differs from before the first: an arm "
                     "did not put the base weights back; the figures are not comparable.")  # fmt: skip
    notes.append(
        "Times: the session's request total (CUDA events per stage); setting an arm up and down (loading, fusing, "
        "restoring the adapter, installing plugins) is outside it; pilots untimed. Random weights: the error figures "
        "compare outputs of the same noise, not image quality."
        if not smoke
        else f"Smoke: tiny-wan, rank-4 adapter, 5 frames at 16x16, 1 step, on the CPU, fused_vae_decode {decode} (its "
        "Triton norm runs in the vae-decode smoke); the numbers say nothing about speed."
    )
    shape = {"model": session.model.name, "request": session.resolve(request).to_dict(), "dtype": "bfloat16",
             "adapter": made | {"scale": adapter.scale}, "weights_restored": restored,
             "decode_options": decode}  # fmt: skip
    return Measurement(SUMMARY, shape, rows, ratios, notes)
