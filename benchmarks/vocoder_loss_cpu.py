"""Does the vocoder loss let a demo-av vocoder learn the tones? Two losses side by side, same start, same data.

The first H200 train-tiny run's vocoder learned near-silence (pitch match 0.0, RMS 0.004 against ~0.2).
This script starts twice from that run's vocoder (`--checkpoint`, a train-tiny checkpoint folder), trains
it alone on true log-mels of the synthetic scenes (current tones) with the project's `vocoder_loss`, once
with the STFT log term's floor as committed (`STFT_LOG_EPS` added) and once with the old 1e-5 clamp, and
every `--every` steps scores pitch and rhythm on held-out scenes with the project's detectors.
CPU is enough: the vocoder is small. Writes `<date>-vocoder-loss-cpu.json` via benchmarks.common.

    python -m benchmarks.vocoder_loss_cpu --checkpoint out/demo-av-run/checkpoint --steps 700
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import envelope, write
from workbench.data.detect import detect_pitch, detect_rhythm
from workbench.training import audio, checkpoint
from workbench.training.dataset import train_scene
from workbench.training.model import SAMPLE_RATE, build_pipeline

MEL_FRAMES = 33  # what 9 frames give (mel_frames of 9 latent frames)


def clamped_stft_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The STFT loss of the first run: magnitudes clamped at 1e-5 before the log (kept here to compare)."""
    length = min(prediction.shape[-1], target.shape[-1])
    prediction = prediction[..., :length].reshape(-1, length).float()
    target = target[..., :length].reshape(-1, length).float()
    total = prediction.new_zeros(())
    for n_fft, hop in audio.STFT_RESOLUTIONS:
        window = torch.hann_window(n_fft)
        spec = [torch.stft(x, n_fft, hop, window=window, return_complex=True).abs() for x in (prediction, target)]
        predicted, wanted = (s.clamp(min=1e-5) for s in spec)
        convergence = torch.linalg.norm(wanted - predicted) / torch.linalg.norm(wanted).clamp(min=1e-5)
        total = total + convergence + (predicted.log() - wanted.log()).abs().mean()
    return total / len(audio.STFT_RESOLUTIONS)


def _scenes(seeds: range) -> tuple[list, torch.Tensor, torch.Tensor]:
    scenes = [train_scene(seed) for seed in seeds]
    wave = torch.from_numpy(np.stack([s.audio for s in scenes]))  # (N, 2, samples)
    return scenes, wave, audio.log_mel(wave, MEL_FRAMES)


def _score(vocoder: torch.nn.Module, scenes: list, mel: torch.Tensor) -> dict:
    vocoder.eval()
    with torch.no_grad():
        out = vocoder(mel).numpy()
    vocoder.train()
    pitch = np.mean([detect_pitch(o, SAMPLE_RATE) == s.labels["colour"] for o, s in zip(out, scenes, strict=True)])
    rhythm = np.mean([detect_rhythm(o, SAMPLE_RATE) == s.labels["rhythm"] for o, s in zip(out, scenes, strict=True)])
    return {"pitch": float(pitch), "rhythm": float(rhythm), "rms": float(np.sqrt((out**2).mean()))}


def run(arm: str, tensors: dict, args: argparse.Namespace, train: tuple, held_out: tuple) -> dict:
    torch.manual_seed(0)
    vocoder = build_pipeline(0).vocoder
    vocoder.load_state_dict({k.removeprefix("vocoder."): v for k, v in tensors.items() if k.startswith("vocoder.")})
    stft = audio.stft_loss if arm == "committed" else clamped_stft_loss
    _, wave, mel = train
    optimizer = torch.optim.AdamW(vocoder.parameters(), lr=args.lr, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(0)
    curve, start = [{"step": 0, **_score(vocoder, held_out[0], held_out[2])}], time.perf_counter()
    for step in range(1, args.steps + 1):
        index = torch.randint(len(wave), (args.batch,), generator=generator)
        out = vocoder(mel[index])
        target = wave[index][..., : out.shape[-1]]
        loss = stft(out, target) + (audio.log_mel(out, MEL_FRAMES) - mel[index]).abs().mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vocoder.parameters(), 1.0)
        optimizer.step()
        if step % args.every == 0:
            row = {"step": step, "loss": float(loss), **_score(vocoder, held_out[0], held_out[2])}
            row["seconds"] = time.perf_counter() - start
            curve.append(row)
            print(arm, row, flush=True)
    return {"curve": curve, "final": curve[-1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, required=True, help="a train-tiny checkpoint folder")
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    args = parser.parse_args()
    loaded = checkpoint.load(args.checkpoint)
    if loaded is None:
        raise SystemExit(f"--checkpoint: no train-tiny checkpoint in {args.checkpoint}")
    train, held_out = _scenes(range(512)), _scenes(range(5000, 5024))
    arms = {arm: run(arm, loaded[0], args, train, held_out) for arm in ("committed", "clamp_1e-5")}
    shape = {"train_scenes": 512, "held_out_scenes": 24, "steps": args.steps, "batch": args.batch, "lr": args.lr}
    ratios = {arm: arms[arm]["final"] for arm in arms}
    notes = (
        f"Both arms start from the vocoder in {args.checkpoint} (first H200 run, trained on the old tones) and see "
        "the same batches of the current tones; loss = STFT term (committed floor vs 1e-5 clamp) + mel L1. "
        "Pitch/rhythm: the project's detectors on the vocoder's output from true log-mels of held-out scenes."
    )
    write(envelope("vocoder-loss-cpu", shape, arms, ratios, notes), "vocoder-loss-cpu")


if __name__ == "__main__":
    main()
