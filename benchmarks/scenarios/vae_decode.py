"""The families' VAE decodes at their real shapes (bf16, random weights): diffusers' `decode` against
`fused_vae_decode` with each of its levers. Wan: the Wan2.1 VAE at 480x832x81 (latents 1x16x21x60x104). LTX-2: the
release's video VAE (`ltx2.RELEASE_VAE`) at its pipeline's default 512x768x121 (latents 1x128x16x16x24).

`VAE_DECODE_MODELS` picks the families, comma-separated (default `wan,ltx2`; one alone fits a shorter device call);
each family is measured on its own: its VAE built, its arms' pilots, its A/B/A rounds against its own stock arm,
then freed. Arms, named `<family>:<arm>`: `stock` (no plugin); `buffer` (padded conv buffers; bitwise);
`channels_last` (diffusers' cat + pad, channels-last weights and activations: that lever alone);
`buffer+channels_last`; `buffer+triton` (the norm + SiLU kernel); `buffer+channels_last+triton`. The plugin is
installed for each visit and removed after it, outside the timed call. One untimed pilot decode per arm (Triton
compiles there); every timed decode must equal its arm's pilot. Per arm: the decode's median seconds (CUDA events
around one `vae.decode`), its peak allocated memory, the receipt of the pilot, the contract the handle reports and the
pilot's error against the stock pilot: `equal_to_stock`, relative L2, max abs and PSNR (the output is in [-1, 1]:
peak-to-peak 2). `--smoke`: tiny-wan's and tiny-ltx2's VAEs, 2 latent frames at 4x6, on the CPU under the Triton
interpreter.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any

import torch

from benchmarks.envelope import Context, Measurement
from workbench.accelerations import REGISTRY
from workbench.evidence.timing import aba_rounds, time_call
from workbench.models import ltx2, wan
from workbench.quality.latent import rel_l2

NAME = "vae-decode"
SUMMARY = "VAE decode, Wan 480x832x81 and LTX-2 512x768x121 (bf16): stock vs fused_vae_decode per lever"
GPUS = 1
SETTINGS = ("VAE_DECODE_MODELS",)  # environment it reads (the record names those set)
MODELS_ENV = SETTINGS[0]
MODELS = ("wan", "ltx2")
LATENTS = {"wan": (1, 16, 21, 60, 104), "ltx2": (1, 128, 16, 16, 24)}
SMOKE_LATENTS = {"wan": (1, 16, 2, 4, 6), "ltx2": (1, 4, 2, 4, 6)}
VAES = {"wan": "AutoencoderKLWan (Wan2.1 configuration)", "ltx2": "AutoencoderKLLTX2Video (LTX-2 release)"}
ARMS = {
    "buffer": {},
    "channels_last": {"conv_cache": "stock", "channels_last": True},
    "buffer+channels_last": {"channels_last": True},
    "buffer+triton": {"norm": "triton"},
    "buffer+channels_last+triton": {"channels_last": True, "norm": "triton"},
}

SMOKE_SKIPS = ("buffer+channels_last+triton",)  # the interpreter's time; each lever runs in another arm


def models() -> tuple[str, ...]:
    """The families `VAE_DECODE_MODELS` names (comma-separated, in MODELS' order); all of MODELS when unset."""
    value = os.environ.get(MODELS_ENV, "")
    names = {name.strip() for name in value.split(",") if name.strip()} if value.strip() else set(MODELS)
    if not names or names - set(MODELS):
        raise ValueError(f"{MODELS_ENV}: {value!r}; allowed: a comma-separated subset of {list(MODELS)}")
    return tuple(name for name in MODELS if name in names)


def _model(name: str, smoke: bool, device: torch.device) -> Any:
    """The family's model whose `pipeline.vae` is measured, in bf16 on `device`."""
    if name == "wan":
        model = wan.tiny(0) if smoke else wan.random_1_3b(0, device)
    else:
        model = ltx2.tiny(0)
        if not smoke:
            model.pipeline.register_modules(vae=ltx2.random_release_vae(0, device))
    model.pipeline.vae.to(device=device, dtype=torch.bfloat16)
    return model


class Decodes:
    """Pilot and timed decodes per arm on one VAE; the plugin is installed around each decode, never inside its time.
    `baseline`: the stock arm's name, which every other arm's error is taken against."""

    def __init__(self, model: Any, latents: torch.Tensor, device: torch.device, baseline: str):
        self.model, self.latents, self.device, self.baseline = model, latents, device, baseline
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
        got, want = self.pilots[name], self.pilots[self.baseline]
        row: dict[str, Any] = {"options": options}
        if name in self.seconds:
            row |= {"seconds": self.seconds[name], "median_s": statistics.median(self.seconds[name]),
                    "outputs_match_pilot": not self.mismatches.get(name)}  # fmt: skip
        if name in self.peaks:
            row["peak_bytes"] = self.peaks[name]
        if name != self.baseline:
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


def _measure(family: str, context: Context) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[str]]:
    """One family's (shape, rows, ratios, notes), its arms named `<family>:<arm>`."""
    device, smoke = context.device, context.smoke
    model = _model(family, smoke, device)
    shape = (SMOKE_LATENTS if smoke else LATENTS)[family]
    generator = torch.Generator(device).manual_seed(0)
    latents = torch.randn(shape, generator=generator, device=device).to(torch.bfloat16)
    stock = f"{family}:stock"
    decodes = Decodes(model, latents, device, stock)
    candidates = {f"{family}:{arm}": options for arm, options in ARMS.items() if not smoke or arm not in SMOKE_SKIPS}
    arms: dict[str, dict[str, Any] | None] = {stock: None, **candidates}
    for name, options in arms.items():
        decodes.pilot(name, options)
    rounds = aba_rounds(
        (stock, lambda: decodes.visit(stock, None)),
        {name: (lambda n=name, o=options: decodes.visit(n, o)) for name, options in candidates.items()},
        context.rounds,
    )
    notes = [f"arm {name} failed during the rounds: {error}" for name, error in rounds.errors.items()]
    measured = {"latents": list(shape), "video": list(decodes.pilots[stock].shape[2:]), "dtype": "bfloat16",
                "vae": VAES[family] + (" tiny" if smoke else "")}  # fmt: skip
    rows = {name: decodes.row(name, options) for name, options in arms.items()}
    return measured, rows, {k: v.to_dict() for k, v in rounds.ratios().items()}, notes


def run(context: Context) -> Measurement:
    families = models()
    shapes: dict[str, Any] = {}
    rows: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    notes: list[str] = []
    for family in families:
        shapes[family], family_rows, family_ratios, family_notes = _measure(family, context)
        rows |= family_rows
        ratios |= family_ratios
        notes += family_notes
        if context.device.type == "cuda":  # the family's VAE went with _measure's frame
            torch.cuda.empty_cache()
    notes.append(
        "Times: CUDA events around one vae.decode per visit (install and removal outside); pilots untimed. "
        "Ratios are <family>:stock / arm (> 1: the arm is faster), each family's rounds apart. Random weights: the "
        "error figures compare two decodes of the same noise, not image quality."
        if not context.smoke
        else "Smoke: tiny-wan's and tiny-ltx2's VAEs, 2 latent frames at 4x6 on the CPU under the Triton interpreter, "
        f"without {list(SMOKE_SKIPS)} (its pieces run in the other arms); the numbers say nothing about speed."
    )
    what = {"wan": "Wan 480x832x81", "ltx2": "LTX-2 512x768x121"}
    summary = f"VAE decode, {' and '.join(what[f] for f in families)} (bf16): stock vs fused_vae_decode per lever"
    return Measurement(summary, shapes, rows, ratios, notes)
