"""`workbench train-tiny`: train a small LTX-2 preset on synthetic scenes, resumably, against a clock.

Two stages. Stage `autoencoders` trains the video VAE, the audio VAE and the vocoder (`ae_train` picks which;
the others stay bit-identical) as reconstructors of the synthetic clips. When its planned time is spent,
the autoencoders are rounded to bfloat16 values and frozen, their latents are normalised with the dataset's
statistics (stored in the VAEs' `latents_mean/std` buffers, where the pipeline reads them), and stage
`denoiser` trains the transformer and the text connectors by flow matching exactly as `LTX2Pipeline`
samples: x_s = (1 - s) x0 + s noise, the model predicts noise - x0 at timestep 1000 s, with s drawn from the
scheduler's shifted distribution and audio and video noised at the same s. Captions are dropped 10% of the
time so classifier-free guidance has an unconditional branch. The text encoder stays random and frozen.

Time, not steps, is the budget. A call trains for `minutes` (set-up, export and evaluation come on top),
or less when `wall_minutes` (the whole call) would not leave room for export and evaluation. Each stage has
a planned total (`ae_minutes`, `denoise_minutes`; extendable on resume) over which its learning rate warms
up and anneals. A checkpoint (`workbench.training.checkpoint`, compact) is written every
`checkpoint_seconds`, at the stage switch and at the end; then the EMA weights are exported in diffusers
format (`<out>/<preset>`, loadable by `workbench.models.ltx2.load`), evaluated through a Session, and
`train.json` (with one `calls` row per call) and the loss curve are written.

On a metered machine that returns a few capped files, a call is one command, the same for every call but
the first (which has no `--resume`): `train-tiny --preset av2 --out RUN --resume --wall-minutes 9
--pack OUTDIR` leaves the checkpoint as <= 15 MiB tar parts plus `train.json` and `loss.png` in OUTDIR;
`cat RUN.tar.part-* | tar x -C RUN` restores `RUN/checkpoint` for the next call, and `--minutes 0 --resume`
remakes the export from it anywhere (the export itself does not travel).
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from workbench.training import checkpoint, dataset, report
from workbench.training.audio import channel_gains, log_mel, mel_frames, one_channel, vocoder_loss
from workbench.training.config import AE_BATCH, AE_PARTS, TrainConfig, learning_rate
from workbench.training.model import FPS, HOP, SHIFT, preset, shipped_vocoder
from workbench.training.model import vocoder as vocoder_module

TRAINED = {
    "autoencoders": AE_PARTS["all"],
    "denoiser": ("transformer", "connectors"),
    "vocoder": ("vocoder",),  # only on request (`stage="vocoder"`): it changes nothing the denoiser depends on
}
EMA_DECAY = 0.999
PROFILE_SKIP = 3  # steps of a stage not profiled (first-step set-up), then one warm-up step
FIXED_RESERVE_SECONDS = 45.0  # export, reconstruction check, report and packing, within `wall_minutes`


def train(config: TrainConfig) -> dict[str, Any]:
    """Run (or resume) training within `config.minutes` (and `wall_minutes`), then export, evaluate and report;
    returns the record."""
    from workbench import environment

    config.validate()
    started = time.perf_counter()
    deadline = started + (config.wall_minutes * 60.0 if config.wall_minutes else math.inf)
    device = environment.device(config.device)
    precision = torch.get_float32_matmul_precision()
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for training only; restored before evaluation
    out = Path(config.out)
    run = _Run(config, device, out)
    try:
        run.stop_at = deadline - run.reserve_seconds()
        print(f"train-tiny: {config.preset} on {device}; stage {run.state['stage']}", flush=True)
        budget = config.minutes * 60.0  # seconds of training steps; set-up and evaluation come on top
        if config.stage is not None and run.state["stage"] != "denoiser":
            raise ValueError(f"stage: {config.stage!r} needs a checkpoint past its autoencoder stage")
        if config.stage == "vocoder":
            budget -= run.vocoder(seconds=budget)
        elif run.state["stage"] == "autoencoders":
            remaining = run.state["plan_seconds"]["autoencoders"] - run.state["seconds"]["autoencoders"]
            budget -= run.autoencoders(seconds=min(budget, max(remaining, 0.0)))
        if run.state["stage"] == "denoiser" and budget > 0 and time.perf_counter() < run.stop_at:
            run.denoiser(seconds=budget)
        torch.set_float32_matmul_precision(precision)
        model_dir = run.export(out / config.preset)
        stages = [stage for stage in TRAINED if stage in run.state["steps"]]  # "vocoder" once it has run
        record = report.record(run.config, run.spec, run.state, environment.describe(device), stages)
        # The evaluations are reported, not trusted to succeed: a one-shot GPU session must still hand back
        # its checkpoint and record when one of them fails, so a failure is recorded with its reason.
        record["reconstruction"] = report.guarded(run.reconstruction)
        if config.eval_requests:
            from workbench.training.evaluate import caption_match_eval

            print(f"train-tiny: evaluating {config.eval_requests} held-out requests", flush=True)
            record["eval"] = report.guarded(
                caption_match_eval,
                model_dir,
                config.eval_requests,
                device=str(device),
                rich=run.spec.rich,
                deadline=deadline - FIXED_RESERVE_SECONDS / 3,
            )
        record["wall_seconds"] = time.perf_counter() - started
        run.finish_call(record)
        report.write_outputs(out, record, stages)
    finally:
        torch.set_float32_matmul_precision(precision)
        if config.pack is not None:  # even after a failure: whatever checkpoint exists goes back
            # the checkpoint and the record travel; the export is remade from the checkpoint where needed
            loose = ("train.json", "loss.png") + tuple(f"profile-{stage}.txt" for stage in TRAINED)
            parts = checkpoint.pack(out, Path(config.pack), loose=loose, include=("checkpoint",))
            print(f"train-tiny: packed into {len(parts)} parts in {config.pack}", flush=True)
    return record


class _Run:
    """The pipeline being trained, its data on the device (rendered when first needed), the resumable state."""

    def __init__(self, config: TrainConfig, device: torch.device, out: Path):
        from workbench.training.model import build_pipeline

        self.config, self.device, self.folder = config, device, out / "checkpoint"
        saved = checkpoint.load(self.folder)
        if saved is not None and not config.resume:
            raise ValueError(f"out: {out} already holds a checkpoint; pass resume (--resume) or choose another --out")
        if saved is None and config.resume:
            raise ValueError(f"resume: no checkpoint in {self.folder}")
        if saved is not None and saved[3]["preset"] != config.preset:
            raise ValueError(f"preset: {config.preset!r}; allowed: {saved[3]['preset']!r}, the checkpoint's")
        # a resumed run keeps its architecture and seed: the checkpoint's weights only fit those
        overrides = saved[3]["overrides"] if saved is not None else config.overrides
        self.seed = saved[3]["seed"] if saved is not None else config.seed
        self.spec = preset(config.preset, overrides)
        # rendered before any CUDA work when this call trains: the renderer forks worker processes
        self._data = self._render(config.train_clips) if config.minutes > 0 else None
        self.pipe = build_pipeline(self.seed, self.spec).to(device)
        self.generator = torch.Generator(device).manual_seed(self.seed)
        self.ema: dict[str, torch.Tensor] = {}
        self.optimizer_saved = None
        self.stop_at = math.inf  # perf_counter time at which training must stop (set by `train`)
        out.mkdir(parents=True, exist_ok=True)
        if saved is None:
            ae_minutes = config.ae_minutes if config.ae_minutes is not None else config.ae_share * config.minutes
            self.state = {"preset": config.preset, "overrides": config.overrides, "seed": config.seed}
            self.state |= {"stage": "autoencoders", "plan_seconds": {"autoencoders": ae_minutes * 60.0}}
            self.state |= {
                "seconds": {"autoencoders": 0.0, "denoiser": 0.0},
                "steps": {"autoencoders": 0, "denoiser": 0},
                "history": [],
                "calls": [],
            }
        else:
            weights, ema, self.optimizer_saved, self.state = saved
            self._load(weights, ema)
            self._replan(config)
        self.state["ae_batch"] = config.ae_batch or self.state.get("ae_batch", AE_BATCH)
        self.config = replace(config, ae_batch=self.state["ae_batch"])
        if config.denoise_minutes is not None:
            self.state["plan_seconds"]["denoiser"] = config.denoise_minutes * 60.0
        self.call_start = {k: dict(self.state[k]) for k in ("steps", "seconds")} | {"started": report.now()}
        self.last_checkpoint = time.perf_counter()
        self.latent_frames = self.spec.audio_latent_frames

    def _replan(self, config: TrainConfig) -> None:
        """On resume: a new `ae_minutes` replaces the autoencoders' plan while they are still training."""
        done = self.state["seconds"]["autoencoders"]
        if self.state["stage"] != "autoencoders" and config.ae_train != "all":
            raise ValueError(
                f"ae_train: {config.ae_train!r}; the autoencoder stage ended at {done / 60:.2f} minutes; "
                "allowed: 'all' (retrain the vocoder alone with stage='vocoder')"
            )
        if config.ae_minutes is None:
            return
        if self.state["stage"] != "autoencoders" and config.ae_minutes * 60.0 > done + 1e-6:
            raise ValueError(
                f"ae_minutes: {config.ae_minutes}; the autoencoder stage ended at {done / 60:.2f} minutes and "
                "the denoiser was trained on it; allowed: None or no more than that"
            )
        self.state["plan_seconds"]["autoencoders"] = config.ae_minutes * 60.0

    def _render(self, count: int) -> dataset.ClipSet:
        print(f"train-tiny: rendering {count} clips", flush=True)
        return dataset.build(count, self.spec)

    @property
    def data(self) -> dataset.ClipSet:
        """The training clips on the device (a call that trains has them from the start)."""
        if self._data is None:
            self._data = self._render(self.config.train_clips)
        if self._data.video.device != self.device:
            self._data = self._data.to(self.device)
        return self._data

    def reserve_seconds(self) -> float:
        """Wall-clock seconds kept for export and evaluation: a fixed part plus the evaluation requests at the
        last call's measured pace (2 s each on a GPU, 30 s on a CPU, before any was measured)."""
        pace = self.state.get("eval_seconds_per_request") or (2.0 if self.device.type == "cuda" else 30.0)
        return FIXED_RESERVE_SECONDS + self.config.eval_requests * pace

    # ---- state -------------------------------------------------------------------------------------------
    def _stored_modules(self) -> tuple[str, ...]:
        """What the checkpoint holds: the autoencoders always, the denoiser once its stage began (before, it is
        its seeded initialisation); never the text encoder (seeded, frozen)."""
        denoising = self.state["stage"] == "denoiser"
        return TRAINED["autoencoders"] + (TRAINED["denoiser"] if denoising else ())

    def _load(self, weights: dict[str, torch.Tensor], ema: dict[str, torch.Tensor]) -> None:
        for name in self._stored_modules():
            prefix = f"{name}."
            own = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
            getattr(self.pipe, name).load_state_dict(own, strict=True)
        self.ema = {k: v.to(self.device) for k, v in ema.items()}

    def save_checkpoint(
        self, optimizer: torch.optim.Optimizer | None = None, stage: str | None = None, modules: tuple[str, ...] = ()
    ) -> None:
        weights = {}
        for name in self._stored_modules():
            weights |= {f"{name}.{k}": v for k, v in getattr(self.pipe, name).state_dict().items()}
        saved = {"optimizer": optimizer.state_dict() if optimizer is not None else None, "stage": stage}
        saved["modules"] = list(modules)
        saved |= {"generator": self.generator.get_state(), "generator_device": self.device.type}
        checkpoint.save(self.folder, weights, self.ema, saved, self.state)
        self.last_checkpoint = time.perf_counter()

    def finish_call(self, record: dict[str, Any]) -> None:
        """Append this call's row to `calls` (in the record and the checkpoint's state, written atomically)."""
        from workbench.io import write_atomic

        row = {"started": self.call_start["started"], "device": record["device"], "preset": self.config.preset}
        options = (
            "minutes",
            "wall_minutes",
            "ae_train",
            "ae_batch",
            "denoise_batch",
            "vocoder_lr",
            "vocoder_reset",
            "compile",
        )
        for key in options:
            row[key] = getattr(self.config, key)
        for table in ("steps", "seconds"):
            row[table] = {k: v - self.call_start[table].get(k, 0) for k, v in self.state[table].items()}
        row["loss"] = {
            s: next((h for h in reversed(self.state["history"]) if h["stage"] == s), None) for s in row["steps"]
        }
        row["stage_after"] = self.state["stage"]
        row["wall_seconds"] = record["wall_seconds"]
        evaluation = record.get("eval") or {}
        if "all" in evaluation:
            row["eval"] = {k: evaluation[k] for k in ("all", "held_out_pairs")}
            self.state["eval_seconds_per_request"] = evaluation["seconds_per_request_median"]
        self.state["calls"].append(row)
        record["calls"] = self.state["calls"]
        record["checkpoint_bytes"] = checkpoint.size_bytes(self.folder)
        write_atomic(self.folder / checkpoint.STATE, json.dumps(self.state, indent=1, allow_nan=False).encode())

    def _optimizer(self, stage: str, lr: float, modules: tuple[str, ...]) -> torch.optim.Optimizer:
        params = [p for name in modules for p in getattr(self.pipe, name).parameters()]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
        saved = self.optimizer_saved
        same = saved is not None and saved.get("stage") == stage and saved.get("modules") == list(modules)
        if same and saved.get("optimizer") is not None:  # ae_train may name other modules than last time
            optimizer.load_state_dict(saved["optimizer"])
        if saved is not None and saved.get("generator_device") == self.device.type:
            self.generator.set_state(saved["generator"])
        else:  # another device type cannot take this generator state: reseed from the step count instead
            self.generator.manual_seed(self.seed + 1 + sum(self.state["steps"].values()))
        self.optimizer_saved = None
        return optimizer

    def _learning_rate(self, stage: str) -> float:
        peak = {"denoiser": self.config.denoise_lr, "vocoder": self.config.vocoder_lr}.get(stage, self.config.ae_lr)
        plan = self.state["plan_seconds"].get(stage)
        step, seconds = self.state["steps"][stage], self.state["seconds"][stage]
        return learning_rate(peak, step, seconds, plan, self.config.warmup_steps, self.config.schedule)

    # ---- stage 1 -----------------------------------------------------------------------------------------
    def autoencoders(self, seconds: float) -> float:
        """Train the `ae_train` autoencoders for up to `seconds`; freeze them once the stage's plan is spent."""
        parts = AE_PARTS[self.config.ae_train]
        self._freeze(parts)
        optimizer = self._optimizer("autoencoders", self.config.ae_lr, parts)
        used = self._loop("autoencoders", optimizer, self._autoencoder_step, seconds, parts)
        if self.state["seconds"]["autoencoders"] >= self.state["plan_seconds"]["autoencoders"] - 1e-6:
            with torch.no_grad():
                for name in TRAINED["autoencoders"]:  # frozen from here on: make them equal their stored copy
                    for tensor in getattr(self.pipe, name).state_dict().values():
                        tensor.copy_(checkpoint.stored(tensor))
            self._set_latent_statistics()
            self.state["stage"] = "denoiser"
            self.save_checkpoint()
        return used

    def _autoencoder_step(self) -> dict[str, torch.Tensor]:
        parts, losses = AE_PARTS[self.config.ae_train], {}
        if "vae" in parts:
            vae = self.pipe.vae
            video = self._video(self._batch(self.config.ae_batch))
            posterior = vae.encode(video).latent_dist
            noise = torch.randn(posterior.mean.shape, generator=self.generator, device=self.device)
            recon = vae.decode(posterior.mean + posterior.std * noise).sample
            losses["video"] = (recon - video).abs().mean() + F.mse_loss(recon, video)
            losses["kl"] = 0.5 * (posterior.mean**2 + posterior.var - 1.0 - posterior.logvar).mean()
        if "audio_vae" in parts:
            audio_vae, vocoder = self.pipe.audio_vae, self.pipe.vocoder
            wave = self.data.audio[self._batch(2 * self.config.ae_batch)]
            mel = log_mel(wave, mel_frames(self.latent_frames))
            audio_posterior = audio_vae.encode(mel).latent_dist
            noise = torch.randn(audio_posterior.mean.shape, generator=self.generator, device=self.device)
            mel_recon = audio_vae.decode(audio_posterior.mean + audio_posterior.std * noise).sample
            losses["mel"] = (mel_recon - mel).abs().mean() + F.mse_loss(mel_recon, mel)
            half = mel.shape[0] // 2  # the vocoder hears true mels (at random channel gains) and reconstructed ones
            louder = channel_gains(wave[:half], self.generator)
            mels = torch.cat([log_mel(louder, mel.shape[2]), mel_recon[half:].detach()])
            vocoder_in, target = self._vocoder_batch(mels, torch.cat([louder, wave[half:]]))
            losses["vocoder"] = vocoder_loss(vocoder(vocoder_in), target, vocoder_in)
        total = sum(v for k, v in losses.items() if k != "kl") + 1e-4 * losses.get("kl", 0.0)
        return {"loss": total} | losses

    # ---- vocoder alone (on request) ----------------------------------------------------------------------
    def vocoder(self, seconds: float) -> float:
        """Train only the vocoder for `seconds` on true and audio-VAE-reconstructed mels (the VAEs stay frozen),
        its learning rate warming up to `vocoder_lr` and annealing over this call's `seconds`."""
        for table in ("seconds", "steps"):
            self.state[table].setdefault("vocoder", 0.0 if table == "seconds" else 0)
        if self.config.vocoder_reset:  # a fresh vocoder (its own seed) learns from here: warm-up and plan restart
            resets = self.state.get("vocoder_resets", 0)
            torch.manual_seed(self.seed + 1000 + resets)
            self.pipe.vocoder.load_state_dict(vocoder_module(self.spec).state_dict())
            self.state["vocoder_resets"] = resets + 1
            self.state["steps"]["vocoder"], self.state["seconds"]["vocoder"] = 0, 0.0
            self.call_start["steps"]["vocoder"], self.call_start["seconds"]["vocoder"] = 0, 0.0
            self.optimizer_saved = None
        self.state["plan_seconds"]["vocoder"] = self.state["seconds"]["vocoder"] + seconds
        self._freeze(TRAINED["vocoder"])
        optimizer = self._optimizer("vocoder", self.config.vocoder_lr, TRAINED["vocoder"])
        return self._loop("vocoder", optimizer, self._vocoder_step, seconds, TRAINED["vocoder"])

    def _vocoder_step(self) -> dict[str, torch.Tensor]:
        wave = channel_gains(self.data.audio[self._batch(2 * self.config.ae_batch)], self.generator)
        with torch.no_grad():
            mel = log_mel(wave, mel_frames(self.latent_frames))
            half = mel.shape[0] // 2
            audio_vae = self.pipe.audio_vae
            recon = audio_vae.decode(audio_vae.encode(mel[half:]).latent_dist.mode()).sample
            vocoder_in, target = self._vocoder_batch(torch.cat([mel[:half], recon]), wave)
        loss = vocoder_loss(self.pipe.vocoder(vocoder_in), target, vocoder_in)
        return {"loss": loss}

    def _vocoder_batch(self, mels: torch.Tensor, waves: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the vocoder trains on: mels (B, 2, T, M) and their waveforms (B, 2, >= T * HOP), cut to the mels'
        length; for a `separate_channels` vocoder one random channel of each clip on both channels, since the
        export plays each channel alone (`one_channel`, one draw from the generator)."""
        target = waves[..., : mels.shape[2] * HOP]
        if self.spec.separate_channels:
            return one_channel(mels, target, self.generator)
        return mels, target

    @torch.no_grad()
    def _encode_all(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior means of every clip: video (N, C, f, h, w), audio (N, C, L, M)."""
        videos, audios = [], []
        for start in range(0, len(self.data), 32):
            index = torch.arange(start, min(start + 32, len(self.data)), device=self.device)
            videos.append(self.pipe.vae.encode(self._video(index)).latent_dist.mode())
            mel = log_mel(self.data.audio[index], mel_frames(self.latent_frames))
            audios.append(self.pipe.audio_vae.encode(mel).latent_dist.mode())
        return torch.cat(videos), torch.cat(audios)

    def _set_latent_statistics(self) -> None:
        self._freeze(())
        video, audio = self._encode_all()
        self.pipe.vae.latents_mean.copy_(video.mean(dim=(0, 2, 3, 4)))
        self.pipe.vae.latents_std.copy_(video.std(dim=(0, 2, 3, 4)).clamp(min=1e-6))
        packed = self.pipe._pack_audio_latents(audio)  # (N, L, C * M): what the pipeline normalises
        self.pipe.audio_vae.latents_mean.copy_(packed.mean(dim=(0, 1)))
        self.pipe.audio_vae.latents_std.copy_(packed.std(dim=(0, 1)).clamp(min=1e-6))

    # ---- stage 2 -----------------------------------------------------------------------------------------
    def denoiser(self, seconds: float) -> float:
        """Train the transformer and connectors for `seconds` (after encoding the clips, which is not counted)."""
        self._freeze(TRAINED["denoiser"])
        pipe = self.pipe
        video, audio = self._encode_all()
        video = pipe._normalize_latents(video, pipe.vae.latents_mean, pipe.vae.latents_std)
        self.video_latents = pipe._pack_latents(video)  # (N, f*h*w, C)
        self.latent_shape = tuple(video.shape[2:])
        packed = pipe._pack_audio_latents(audio)
        self.audio_latents = pipe._normalize_audio_latents(
            packed, pipe.audio_vae.latents_mean, pipe.audio_vae.latents_std
        )
        self.captions = dataset.captions(self.spec.rich)
        with torch.no_grad():
            embeds, masks = pipe.encode_prompt(
                self.captions, do_classifier_free_guidance=False, max_sequence_length=self.spec.max_tokens
            )[:2]
        self.text_embeds, self.text_masks = embeds.detach(), masks.detach()
        if not self.ema:
            self.ema = {f"{n}.{k}": v.detach().clone() for n in TRAINED["denoiser"] for k, v in self._params(n)}
        # built once: detached views share the parameters' storage, so they see every optimizer step
        pairs = [(self.ema[f"{n}.{k}"], p.detach()) for n in TRAINED["denoiser"] for k, p in self._params(n)]
        self.ema_averages, self.ema_params = zip(*pairs, strict=True)
        optimizer = self._optimizer("denoiser", self.config.denoise_lr, TRAINED["denoiser"])
        if self.config.compile:  # each block in place (state_dict keys unchanged); copies drop the compiled code
            pipe.transformer.compile_repeated_blocks(dynamic=False)
        step = self._denoiser_step
        return self._loop("denoiser", optimizer, step, seconds, TRAINED["denoiser"], after_step=self._update_ema)

    def _denoiser_step(self) -> dict[str, torch.Tensor]:
        pipe, batch = self.pipe, self.config.denoise_batch
        index = self._batch(batch)
        x0_video, x0_audio = self.video_latents[index], self.audio_latents[index]
        ids = self.data.caption_ids[index]
        dropped = torch.rand(batch, generator=self.generator, device=self.device) < self.config.caption_dropout
        ids = torch.where(dropped, torch.full_like(ids, len(self.captions) - 1), ids)
        u = torch.rand(batch, generator=self.generator, device=self.device)
        sigma = SHIFT * u / (1 + (SHIFT - 1) * u)  # the scheduler's shifted sigmas, as sampled at inference
        noise_video = torch.randn(x0_video.shape, generator=self.generator, device=self.device)
        noise_audio = torch.randn(x0_audio.shape, generator=self.generator, device=self.device)
        s = sigma[:, None, None]
        frames, height, width = self.latent_shape
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.config.bf16 and self.device.type == "cuda"):
            video_embeds, audio_embeds, mask = pipe.connectors(
                self.text_embeds[ids], self.text_masks[ids], padding_side="left"
            )
            pred_video, pred_audio = pipe.transformer(
                hidden_states=(1 - s) * x0_video + s * noise_video,
                audio_hidden_states=(1 - s) * x0_audio + s * noise_audio,
                encoder_hidden_states=video_embeds,
                audio_encoder_hidden_states=audio_embeds,
                timestep=sigma * 1000.0,
                sigma=sigma * 1000.0,
                encoder_attention_mask=mask,
                audio_encoder_attention_mask=mask,
                num_frames=frames,
                height=height,
                width=width,
                fps=float(FPS),
                audio_num_frames=self.latent_frames,
                use_cross_timestep=True,
                return_dict=False,
            )
        video_loss = F.mse_loss(pred_video.float(), noise_video - x0_video)
        audio_loss = F.mse_loss(pred_audio.float(), noise_audio - x0_audio)
        return {"loss": video_loss + audio_loss, "video": video_loss, "audio": audio_loss}

    @torch.no_grad()
    def _update_ema(self, step: int) -> None:
        decay = min(EMA_DECAY, (1 + step) / (10 + step))
        torch._foreach_lerp_(self.ema_averages, self.ema_params, 1 - decay)  # one launch per group, not per tensor

    # ---- shared ------------------------------------------------------------------------------------------
    def _loop(self, stage: str, optimizer, step_fn, seconds: float, modules: tuple[str, ...], after_step=None):
        """Optimise `modules` until `seconds` have passed or `stop_at` (checked before each step); returns the
        seconds of stepping used (the last checkpoint write not counted). With `profile_steps`, the stage runs at
        least the steps its profile needs (PROFILE_SKIP, one warm-up, then the profiled ones) unless `stop_at`
        comes first: a profile asked for is written, however slow the steps."""
        trained = [p for name in modules for p in getattr(self.pipe, name).parameters()]
        sums: dict[str, float] = {}
        count, last_print, began = 0, time.perf_counter(), time.perf_counter()
        until, skipped = min(began + seconds, self.stop_at), 0
        base_seconds, base_steps = self.state["seconds"][stage], self.state["steps"][stage]
        profiler = self._profiler(stage)
        needed = 0 if profiler is None else PROFILE_SKIP + 1 + self.config.profile_steps  # the profile's steps
        while time.perf_counter() < until or (
            self.state["steps"][stage] - base_steps < needed and time.perf_counter() < self.stop_at
        ):
            losses = step_fn()
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            norm = torch.nn.utils.clip_grad_norm_(trained, 1.0)
            if not torch.isfinite(norm):  # skip the update; a run that only produces these stops
                self.state.setdefault("skipped_steps", {}).setdefault(stage, 0)
                self.state["skipped_steps"][stage] += 1
                skipped += 1
                if skipped > 50:
                    raise RuntimeError(f"{stage}: 50 consecutive non-finite gradients; training diverged")
                continue
            skipped = 0
            for group in optimizer.param_groups:
                group["lr"] = self._learning_rate(stage)
            optimizer.step()
            self.state["steps"][stage] += 1
            if after_step is not None:
                after_step(self.state["steps"][stage])
            for key, value in losses.items():
                sums[key] = sums.get(key, 0.0) + float(value.detach())
            count += 1
            if profiler is not None:
                profiler.step()
            now = time.perf_counter()
            self.state["seconds"][stage] = base_seconds + now - began
            if count == 25 or now - last_print > 15:
                row = {k: v / count for k, v in sums.items()}
                self.state["history"].append({"stage": stage, "step": self.state["steps"][stage]} | row)
                if now - last_print > 15:
                    shown = ", ".join(f"{k} {v:.4f}" for k, v in row.items())
                    print(
                        f"[{stage}] step {self.state['steps'][stage]} ({self.state['seconds'][stage]:.0f} s): {shown}",
                        flush=True,
                    )
                    last_print = now
                sums, count = {}, 0
            if stage == "autoencoders" and self.state["seconds"][stage] >= self.state["plan_seconds"][stage]:
                break
            if now - self.last_checkpoint > self.config.checkpoint_seconds:
                self.save_checkpoint(optimizer, stage, modules)
        used = time.perf_counter() - began  # the budget counts steps; the checkpoint write below comes on top
        if profiler is not None:
            profiler.stop()
        if count:
            self.state["history"].append(
                {"stage": stage, "step": self.state["steps"][stage]} | {k: v / count for k, v in sums.items()}
            )
        self.save_checkpoint(optimizer, stage, modules)
        return used

    def _profiler(self, stage: str):
        """A started torch profiler that records `profile_steps` steps after PROFILE_SKIP and then writes
        `<out>/profile-<stage>.txt` (operators by device time, then by CPU time: where a step's time goes);
        None without `profile_steps`. A failure to write is printed, never fatal to training."""
        if not self.config.profile_steps:
            return None
        from torch.profiler import ProfilerActivity, profile, schedule

        from workbench.io import write_atomic

        cuda = self.device.type == "cuda"
        path = self.folder.parent / f"profile-{stage}.txt"

        def write(finished) -> None:
            def tables() -> dict[str, str]:
                table = finished.key_averages().table
                by_device = table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=30)
                text = f"{self.config.profile_steps} {stage} steps on {self.device}\n{by_device}\n"
                write_atomic(path, (text + table(sort_by="cpu_time_total", row_limit=30)).encode())
                return {"path": str(path)}

            print(f"train-tiny: profile of {stage}: {report.guarded(tables)}", flush=True)

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        plan = schedule(wait=PROFILE_SKIP, warmup=1, active=self.config.profile_steps, repeat=1)
        profiler = profile(activities=activities, schedule=plan, on_trace_ready=write)
        started = report.guarded(profiler.start)
        return None if isinstance(started, dict) and "error" in started else profiler

    def _batch(self, size: int) -> torch.Tensor:
        return torch.randint(len(self.data), (size,), generator=self.generator, device=self.device)

    def _video(self, index: torch.Tensor) -> torch.Tensor:
        """uint8 (B, F, H, W, 3) clips -> float (B, 3, F, H, W) in [-1, 1], as the pipeline's VAE sees them."""
        return self.data.video[index].permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0

    def _params(self, name: str):
        return getattr(self.pipe, name).named_parameters()

    def _freeze(self, trained: tuple[str, ...]) -> None:
        for name, module in self.pipe.components.items():
            if isinstance(module, torch.nn.Module):
                module.train(name in trained).requires_grad_(name in trained)

    # ---- results -----------------------------------------------------------------------------------------
    def export(self, path: Path) -> Path:
        """Save the pipeline with EMA weights (when the denoiser has any) in diffusers format, atomically."""
        import shutil

        from workbench.models.loaded import LoadedModel
        from workbench.models.ltx2 import FAMILY

        pipe = copy.deepcopy(self.pipe).to("cpu")
        for name in TRAINED["denoiser"]:
            module = getattr(pipe, name)
            ema = {k[len(name) + 1 :]: v for k, v in self.ema.items() if k.startswith(f"{name}.")}
            if ema:
                module.load_state_dict(ema | {k: v for k, v in module.state_dict().items() if k not in ema})
        pipe.vocoder = shipped_vocoder(pipe.vocoder, self.spec)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        LoadedModel(self.config.preset, FAMILY, pipe, self.spec.defaults(), self.spec.call()).save(tmp)
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        return path

    @torch.no_grad()
    def reconstruction(self) -> dict[str, Any]:
        from workbench.training.evaluate import reconstruction_eval

        self._freeze(())
        data = self._data if self._data is not None else self._render(min(32, self.config.train_clips))
        shipped = shipped_vocoder(self.pipe.vocoder, self.spec).float()  # as the export holds it
        return reconstruction_eval(self.pipe, data, self.spec.rich, count=min(32, len(data)), vocoder=shipped)
