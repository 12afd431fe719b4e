"""The Wan VAE decode at 480x832x81 (latents 1x16x21x60x104, bf16, random weights at the Wan2.1 VAE's real shape):
diffusers' `AutoencoderKLWan.decode` against `fused_vae_decode` with each of its levers.

Arms: `stock` (no plugin); `buffer` (padded conv buffers; bitwise); `channels_last` (diffusers' cat + pad, channels-last
weights and activations: that lever alone); `buffer+channels_last`; `buffer+triton` (the rms_norm_silu kernel);
`buffer+channels_last+triton`. The plugin is installed for each visit and removed after it, outside the timed call.
One untimed pilot decode per arm (Triton compiles there); every timed decode must equal its arm's pilot. Per arm: the
decode's median seconds (CUDA events around one `vae.decode`), its peak allocated memory, the receipt of the pilot,
the contract the handle reports and the pilot's error against the stock pilot: `equal_to_stock`, relative L2, max
abs and PSNR (the output is in [-1, 1]: peak-to-peak 2). `--smoke`: tiny-wan's VAE, 2 latent frames at 4x6, on the
CPU under the Triton interpreter.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from benchmarks.workloads import rel_l2
from workbench.accelerations import REGISTRY
from workbench.evidence.timing import aba_rounds, time_call
from workbench.models import wan

NAME = "vae-decode"
SUMMARY = "Wan VAE decode 480x832x81 (latents 1x16x21x60x104, bf16): stock vs fused_vae_decode per lever"
GPUS = 1
LATENTS = (1, 16, 21, 60, 104)
SMOKE_LATENTS = (1, 16, 2, 4, 6)
ARMS = {
    "buffer": {},
    "channels_last": {"conv_cache": "stock", "channels_last": True},
    "buffer+channels_last": {"channels_last": True},
    "buffer+triton": {"norm": "triton"},
    "buffer+channels_last+triton": {"channels_last": True, "norm": "triton"},
}

SMOKE_SKIPS = ("buffer+channels_last+triton",)  # the interpreter's time; each lever runs in another arm


class Decodes:
    """Pilot and timed decodes per arm on one VAE; the plugin is installed around each decode, never inside its time."""

    def __init__(self, model: Any, latents: torch.Tensor, device: torch.device):
        self.model, self.latents, self.device = model, latents, device
        self.pilots: dict[str, torch.Tensor] = {}
        self.receipts: dict[str, Any] = {}
        self.seconds: dict[str, list[float]] = {}
        self.peaks: dict[str, int] = {}
        self.mismatches: dict[str, int] = {}

    def _decode(self, name: str, options: dict[str, Any] | None) -> tuple[torch.Tensor, float]:
        handle = None
        if options is not None:
            handle = REGISTRY["fused_vae_decode"].prepare(self.model, options, self.device).activate()
            handle.begin_request(0, 1)
        try:
            out: list[torch.Tensor] = []
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            with torch.no_grad():
                timing = time_call(lambda: out.append(self.model.pipeline.vae.decode(self.latents).sample),
                                   self.device, repeats=1, warmup=0, queued=False)  # fmt: skip
            if self.device.type == "cuda":
                self.peaks[name] = max(self.peaks.get(name, 0), torch.cuda.max_memory_allocated(self.device))
            if handle is not None:
                self.receipts[name] = handle.report()
            return out[-1], timing.synchronised_s[0]
        finally:
            if handle is not None:
                handle.uninstall()

    def pilot(self, name: str, options: dict[str, Any] | None) -> None:
        self.pilots[name], _ = self._decode(name, options)

    def visit(self, name: str, options: dict[str, Any] | None) -> float:
        out, seconds = self._decode(name, options)
        if not torch.equal(out, self.pilots[name]):
            self.mismatches[name] = self.mismatches.get(name, 0) + 1
        self.seconds.setdefault(name, []).append(seconds)
        return seconds

    def row(self, name: str, options: dict[str, Any] | None) -> dict[str, Any]:
        got, want = self.pilots[name], self.pilots["stock"]
        row: dict[str, Any] = {"options": options}
        if name in self.seconds:
            row |= {"seconds": self.seconds[name], "median_s": statistics.median(self.seconds[name]),
                    "outputs_match_pilot": not self.mismatches.get(name)}  # fmt: skip
        if name in self.peaks:
            row["peak_bytes"] = self.peaks[name]
        if name != "stock":
            mse = (got.double() - want.double()).pow(2).mean().item()
            row |= {
                "contract": self.receipts[name]["contract"],
                "receipt": self.receipts[name],
                "equal_to_stock": bool(torch.equal(got, want)),
                "rel_l2_vs_stock": rel_l2(got, want),
                "max_abs_vs_stock": (got.double() - want.double()).abs().max().item(),
                "psnr_db_vs_stock": math.inf if mse == 0 else 10 * math.log10(4.0 / mse),
            }
        return row


def run(context: Context) -> Measurement:
    device, smoke = context.device, context.smoke
    model = wan.tiny(0) if smoke else wan.random_1_3b(0, device)
    model.pipeline.vae.to(device=device, dtype=torch.bfloat16)
    shape = SMOKE_LATENTS if smoke else LATENTS
    generator = torch.Generator(device).manual_seed(0)
    latents = torch.randn(shape, generator=generator, device=device).to(torch.bfloat16)
    decodes = Decodes(model, latents, device)
    candidates = {name: options for name, options in ARMS.items() if not smoke or name not in SMOKE_SKIPS}
    arms: dict[str, dict[str, Any] | None] = {"stock": None, **candidates}
    for name, options in arms.items():
        decodes.pilot(name, options)
    rounds = aba_rounds(
        ("stock", lambda: decodes.visit("stock", None)),
        {name: (lambda n=name, o=options: decodes.visit(n, o)) for name, options in candidates.items()},
        context.rounds,
    )
    notes = [f"arm {name} failed during the rounds: {error}" for name, error in rounds.errors.items()]
    notes.append(
        "Times: CUDA events around one vae.decode per visit (install and removal outside); pilots untimed. "
        "Ratios are stock / arm (> 1: the arm is faster). Random weights: the error figures compare two decodes of "
        "the same noise, not image quality."
        if not smoke
        else "Smoke: tiny-wan's VAE (3 channels), 2 latent frames at 4x6 on the CPU under the Triton interpreter, "
        f"without {list(SMOKE_SKIPS)} (its pieces run in the other arms); the numbers say nothing about speed."
    )
    measured_shape = {"latents": list(shape), "video": [shape[2] * 4 - 3, shape[3] * 8, shape[4] * 8],
                      "dtype": "bfloat16", "vae": "AutoencoderKLWan (Wan2.1 configuration)" + (" tiny" if smoke else "")}  # fmt: skip
    rows = {name: decodes.row(name, options) for name, options in arms.items()}
    return Measurement(SUMMARY, measured_shape, rows, {k: v.to_dict() for k, v in rounds.ratios().items()}, notes)
