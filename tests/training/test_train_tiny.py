import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from workbench.training import checkpoint
from workbench.training.audio import log_mel, stft_loss
from workbench.training.config import TrainConfig
from workbench.training.model import MEL_BINS, SAMPLE_RATE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("minutes", -1.0),
        ("ae_share", 1.5),
        ("train_clips", 0),
        ("ae_batch", 0),
        ("profile_steps", -1),
        ("caption_dropout", -0.1),
        ("vocoder_lr", 0.0),
        ("vocoder_lr", float("inf")),
        ("checkpoint_seconds", float("inf")),
        ("vocoder_reset", True),
    ],
)
def test_train_tiny_bad_option_raises(tmp_path, field, value):
    config = TrainConfig(out=tmp_path)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=field):
        config.validate()


def test_checkpoint_round_trips_compactly_and_survives_an_interrupted_swap(tmp_path, rng):
    from workbench.training.checkpoint import SMALL

    weight = torch.from_numpy(rng.normal(size=(SMALL // 16 + 3, 16)).astype(np.float32))
    bias = torch.from_numpy(rng.normal(size=(7,)).astype(np.float32))
    average = weight + torch.from_numpy(rng.normal(0, 1e-3, size=weight.shape).astype(np.float32))
    second = torch.from_numpy(rng.uniform(0, 1e-4, size=(7,)).astype(np.float32))
    adam = {"state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.ones(7), "exp_avg_sq": second}}}
    adam["param_groups"] = [{"lr": 1e-3, "params": [0]}]
    state = {"stage": "denoiser", "steps": {"denoiser": int(rng.integers(1, 100))}}
    folder = tmp_path / "checkpoint"
    checkpoint.save(folder, {"a.weight": weight, "a.bias": bias}, {"a.weight": average}, {"optimizer": adam}, state)
    weights, ema, optimizer, loaded_state = checkpoint.load(folder)
    assert loaded_state == state and torch.equal(weights["a.bias"], bias)  # small tensors stay exact
    assert torch.equal(weights["a.weight"], weight.to(torch.bfloat16).float())
    delta = average - weights["a.weight"]  # stored as int8 blocks: error at most half a step of the largest,
    rounding = torch.finfo(torch.float32).eps * float(average.abs().max())  # plus float32 rounding of the sum
    assert float((ema["a.weight"] - average).abs().max()) <= float(delta.abs().max()) / 254 * 1.001 + rounding
    restored = optimizer["optimizer"]["state"][0]
    assert torch.equal(restored["exp_avg"], torch.zeros(7))  # first moment restarts
    root_step = float(second.sqrt().max()) / 255
    assert ((restored["exp_avg_sq"].sqrt() - second.sqrt()) >= 0).all()  # rounded up: steps never grow
    assert float((restored["exp_avg_sq"].sqrt() - second.sqrt()).max()) <= root_step * 1.001
    assert checkpoint.size_bytes(folder) < 3 * weight.numel() + 2**14  # 2 bytes weight + 1 byte EMA
    folder.rename(tmp_path / "checkpoint.old")  # as if the run died between the two renames
    assert checkpoint.load(folder)[3] == state
    assert checkpoint.load(tmp_path / "nothing") is None


def test_pack_splits_into_capped_parts_that_restore_the_run(tmp_path, rng):
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    payload = rng.integers(0, 256, size=300_000, dtype=np.uint8).tobytes()
    (run / "sub" / "blob.bin").write_bytes(payload)
    (run / "train.json").write_text(json.dumps({"steps": 3}))
    parts = checkpoint.pack(run, tmp_path / "packed", part_mib=0.1, loose=("train.json",))
    assert len(parts) >= 3 and all(p.stat().st_size <= 0.1 * 2**20 for p in parts)
    assert (tmp_path / "packed" / "train.json").is_file()
    joined = tmp_path / "joined.tar"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        tar.extractall(tmp_path / "restored", filter="data")
    assert (tmp_path / "restored" / "sub" / "blob.bin").read_bytes() == payload


def test_log_mel_puts_higher_tones_in_higher_bins(rng):
    time = np.arange(6000) / SAMPLE_RATE
    low = rng.uniform(150.0, 1000.0)
    high = low * rng.uniform(1.5, 3.5)  # stays inside the filterbank's 60 Hz - 4 kHz
    waves = torch.tensor(np.stack([np.stack([0.3 * np.sin(2 * np.pi * f * time)] * 2) for f in (low, high)]))
    mel = log_mel(waves.float(), frames=33)
    assert mel.shape == (2, 2, 33, MEL_BINS)
    peaks = mel[:, 0, 10:20].mean(dim=1).argmax(dim=-1)
    assert peaks[0] < peaks[1]
    with pytest.raises(ValueError, match="waveform"):
        log_mel(waves.float()[..., :800], frames=33)


def test_stft_loss_is_zero_only_for_the_same_spectrum(rng):
    wave = torch.from_numpy(rng.normal(0, 0.3, size=(2, 2, 4000)).astype(np.float32))
    assert float(stft_loss(wave, wave)) < 1e-5
    assert float(stft_loss(0.5 * wave, wave)) > 0.1


def test_train_tiny_smoke_runs_resumes_and_exports_a_loadable_model(tmp_path):
    from dataclasses import replace

    from workbench.models import resolve
    from workbench.training.train_tiny import PROFILE_SKIP, train

    config = TrainConfig(
        out=tmp_path / "run", minutes=0.001, device="cpu", train_clips=2, ae_batch=1, denoise_batch=1, eval_requests=0
    )
    config.warmup_steps = 1
    first = train(config)
    assert first["steps"]["autoencoders"] >= 1 and first["stage"] == "denoiser"
    with pytest.raises(ValueError, match="resume"):  # a second fresh run would overwrite the checkpoint
        train(config)
    second = train(replace(config, resume=True))
    assert second["steps"]["autoencoders"] == first["steps"]["autoencoders"] and second["steps"]["denoiser"] >= 1
    assert len(second["calls"]) == 2 and {h["stage"] for h in second["loss"]} == {"autoencoders", "denoiser"}
    third = train(replace(config, resume=True, stage="vocoder"))  # the vocoder alone; nothing else moves
    assert third["steps"]["vocoder"] >= 1 and third["steps"]["denoiser"] == second["steps"]["denoiser"]
    assert {h["stage"] for h in third["loss"]} == {"autoencoders", "denoiser", "vocoder"}
    vocoder_before = {k: v.clone() for k, v in _vocoder_state(tmp_path / "run").items()}
    fourth = train(replace(config, resume=True, stage="vocoder", vocoder_reset=True))  # a fresh vocoder learns
    assert fourth["calls"][-1]["steps"]["vocoder"] == fourth["steps"]["vocoder"] >= 1
    assert fourth["steps"]["denoiser"] == second["steps"]["denoiser"]
    assert any(not torch.equal(v, vocoder_before[k]) for k, v in _vocoder_state(tmp_path / "run").items())
    # a budget far shorter than a step: the stage still runs the PROFILE_SKIP + 1 + 2 steps its profile needs
    profiled = train(replace(config, resume=True, stage="vocoder", profile_steps=2))
    assert profiled["steps"]["vocoder"] >= fourth["steps"]["vocoder"] + PROFILE_SKIP + 1 + 2
    assert "aten::" in (tmp_path / "run" / "profile-vocoder.txt").read_text()
    second = profiled
    assert json.loads((tmp_path / "run" / "train.json").read_text())["steps"] == second["steps"]
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0
    loaded = resolve(tmp_path / "run" / "demo-av", dtype=torch.float32)
    assert loaded.family.name == "ltx2" and loaded.defaults["frames"] == 9
    # the latent statistics measured on the data were saved where the pipeline reads them
    assert not torch.equal(loaded.pipeline.vae.latents_std, torch.ones_like(loaded.pipeline.vae.latents_std))


def test_cli_train_tiny_bad_input_writes_nothing(tmp_path, capsys):
    from workbench.cli import main

    out = tmp_path / "run"
    assert main(["train-tiny", "--out", str(out), "--minutes", "-1", "--device", "cpu"]) == 2
    assert "--minutes: " in capsys.readouterr().err  # said under its flag
    assert main(["train-tiny", "--out", str(out), "--resume", "--device", "cpu"]) == 2
    assert "resume" in capsys.readouterr().err
    assert main(["train-tiny", "--out", str(out), "--preset", "av2", "--ae-train", "both", "--device", "cpu"]) == 2
    assert "--ae-train: 'both'; allowed: one of ['video', 'audio', 'all']" in capsys.readouterr().err
    assert main(["train-tiny", "--out", str(out), "--preset", "av3", "--device", "cpu"]) == 2
    assert "preset" in capsys.readouterr().err
    assert not out.exists()


def test_vocoder_output_repeats_every_hop_for_a_steady_mel(rng):
    """The fact behind the synthetic tones (issue 10): LTX2Vocoder maps a steady mel to a HOP-periodic wave."""
    from workbench.training.model import HOP, vocoder

    torch.manual_seed(int(rng.integers(2**31)))
    frame = torch.from_numpy(rng.normal(size=(1, 2, 1, MEL_BINS)).astype(np.float32))
    with torch.no_grad():
        wave = vocoder().eval()(frame.expand(1, 2, 40, MEL_BINS))[0, 0]
    middle = wave[15 * HOP : 25 * HOP]  # away from the zero-padded ends
    shifted = wave[16 * HOP : 26 * HOP]
    assert float(middle.abs().mean()) > 0
    assert float((middle - shifted).abs().max()) < 1e-4 * float(middle.abs().max()) + 1e-7


def test_every_tone_is_a_multiple_of_the_vocoder_frame_rate():
    """A tone off the 100 Hz grid cannot come out of a HOP-periodic vocoder (first run: pitch match 0.0)."""
    from workbench.data.synthetic import TONE_GRID_HZ, TONES_HZ
    from workbench.training.model import HOP

    assert TONE_GRID_HZ == SAMPLE_RATE / HOP
    for colour, hz in TONES_HZ.items():
        assert hz % TONE_GRID_HZ == 0, f"{colour}: {hz} Hz is not a multiple of {TONE_GRID_HZ} Hz"


def test_vocoder_loss_prefers_the_right_tone_to_silence(rng):
    from workbench.training.audio import vocoder_loss

    time = np.arange(5280) / SAMPLE_RATE
    hz = 100.0 * int(rng.integers(2, 17))
    tone = torch.from_numpy(np.stack([0.3 * np.sin(2 * np.pi * hz * time)] * 2).astype(np.float32))[None]
    mel = log_mel(tone, frames=33)
    assert float(vocoder_loss(tone, tone, mel)) < 1e-4
    assert float(vocoder_loss(0.01 * tone, tone, mel)) > float(vocoder_loss(0.8 * tone, tone, mel))


def test_channel_gains_scale_each_channel_on_its_own(rng):
    from workbench.training.audio import CHANNEL_GAIN_LOW, channel_gains

    wave = torch.from_numpy(rng.standard_normal((64, 2, 100)).astype(np.float32))
    gains = channel_gains(wave, torch.Generator().manual_seed(int(rng.integers(1 << 30)))) / wave
    per_channel = gains[..., 0]
    assert torch.allclose(gains, per_channel[..., None].expand_as(gains), rtol=1e-5)  # one gain per clip and channel
    assert per_channel.min() >= CHANNEL_GAIN_LOW - 1e-6 and per_channel.max() <= 1 + 1e-6
    balance = per_channel[:, 1] / per_channel[:, 0]
    assert balance.min() < 0.7 and balance.max() > 1.4  # the channels' levels move apart, both ways


@pytest.mark.parametrize(("stage", "resume"), [("audio", True), ("vocoder", False), ("autoencoders", True)])
def test_train_tiny_bad_stage_raises(tmp_path, stage, resume):
    with pytest.raises(ValueError, match="stage"):
        TrainConfig(out=tmp_path, stage=stage, resume=resume).validate()


def test_stft_loss_prefers_a_noisy_right_tone_to_near_silence(rng):
    """The first vocoder learned near-silence (a tiny log floor let the many silent bins of a pure tone
    outweigh the tone): the right tone over a noise floor ~50 dB down must score better than a whisper."""
    time = np.arange(5280) / SAMPLE_RATE
    hz = 100.0 * int(rng.integers(2, 17))
    tone = torch.from_numpy(np.stack([0.3 * np.sin(2 * np.pi * hz * time)] * 2).astype(np.float32))[None]
    noise = torch.from_numpy(rng.standard_normal(tone.shape).astype(np.float32))
    right_but_noisy = tone + 1e-3 * noise  # about 50 dB below the tone
    whisper = 0.01 * tone + 1e-4 * noise
    assert float(stft_loss(right_but_noisy, tone)) < float(stft_loss(whisper, tone))


def _vocoder_state(run: Path) -> dict[str, torch.Tensor]:
    """The exported vocoder's weights of a train-tiny run folder."""
    return load_file(run / "demo-av" / "vocoder" / "diffusion_pytorch_model.safetensors")
