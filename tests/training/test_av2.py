"""The av2 preset (demo-av 2) through train-tiny at toy sizes: calls that resume, train only the named
autoencoders, switch stages, export a model `workbench.models.ltx2.load` reads, and record every call."""

from dataclasses import replace

import pytest
import torch

from workbench.training import checkpoint
from workbench.training.config import TrainConfig
from workbench.training.model import PRESETS, preset, tokenizer
from workbench.training.train_tiny import train

# av2's structure (VAE 16x space / 8x time, word tokens, rich scenes) at sizes a CPU trains in a blink
TOY = {"frames": 9, "height": 32, "width": 32, "vae_channels": [8, 16, 32], "video_latent": 4, "audio_latent": 2}
TOY |= {"vocoder_channels": 32, "layers": 1, "heads": 2, "audio_heads": 2, "head_dim": 8, "audio_head_dim": 8}
TOY |= {"steps": 2}


def _modules(folder, *names):
    weights = checkpoint.load(folder)[0]
    return {k: v for k, v in weights.items() if k.split(".")[0] in names}


def test_av2_calls_resume_train_only_the_named_autoencoders_and_export_a_loadable_model(tmp_path, monkeypatch):
    from workbench.models.ltx2 import load

    config = TrainConfig(out=tmp_path / "run", preset="av2", overrides=TOY, minutes=0.002, ae_minutes=1.0, device="cpu")
    config = replace(config, train_clips=3, ae_batch=1, denoise_batch=2, eval_requests=0, warmup_steps=1)
    first = train(config)
    assert first["stage"] == "autoencoders" and first["steps"]["autoencoders"] >= 1
    folder = tmp_path / "run" / "checkpoint"
    audio_before, video_before = _modules(folder, "audio_vae", "vocoder"), _modules(folder, "vae")

    # the audio parts must not move at all; the batch size is the checkpoint's when none is given
    second = train(replace(config, resume=True, ae_train="video", ae_batch=None))
    audio_after, video_after = _modules(folder, "audio_vae", "vocoder"), _modules(folder, "vae")
    assert audio_after.keys() == audio_before.keys() and all(
        torch.equal(audio_after[k], v) for k, v in audio_before.items()
    )
    assert any(not torch.equal(video_after[k], v) for k, v in video_before.items())
    assert second["steps"]["autoencoders"] > first["steps"]["autoencoders"]

    # a shorter plan ends the autoencoder stage at once; the denoiser then trains with a new batch size, its blocks
    # compiled (dynamo's eager backend here: the tracing and the training through it, not inductor's code generation)
    from torch._dynamo.utils import counters

    counters.clear()
    compiled, compile_block = [], torch.nn.Module.compile
    monkeypatch.setattr(
        torch.nn.Module,
        "compile",
        lambda module, **options: compiled.append(module) or compile_block(module, backend="eager"),
    )
    third = train(
        replace(
            config, resume=True, ae_minutes=0.001, denoise_minutes=1.0, denoise_batch=3, eval_requests=1, compile=True
        )
    )
    assert third["stage"] == "denoiser" and third["steps"]["denoiser"] >= 1
    assert len(compiled) == TOY["layers"] and third["calls"][-1]["compile"] is True
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo traced the blocks the steps ran through
    calls = third["calls"]
    assert [c["ae_train"] for c in calls] == ["all", "video", "all"] and calls[2]["denoise_batch"] == 3
    assert [c["ae_batch"] for c in calls] == [1, 1, 1] and second["config"]["ae_batch"] == 1
    assert calls[1]["steps"]["autoencoders"] == second["steps"]["autoencoders"] - first["steps"]["autoencoders"]
    assert calls[2]["steps"]["denoiser"] == third["steps"]["denoiser"] and "eval" in calls[2]
    assert third["plan_seconds"]["denoiser"] == 60.0 and third["checkpoint_bytes"] > 0
    assert checkpoint.load(folder)[3]["calls"] == calls  # the checkpoint's state has the rows too
    assert third["eval"]["requested"] == 1 and set(third["eval"]["all"]) >= {"shape", "speed", "pan", "loudness"}

    model = load(tmp_path / "run" / "av2", dtype=torch.float32)
    assert model.defaults["frames"] == 9 and model.pipeline.vae.spatial_compression_ratio == 16
    assert model.pipeline.vocoder.config.hidden_channels == 2 * TOY["vocoder_channels"]  # channels separated
    assert model.pipeline.tokenizer.tokenize("a red circle moves left")[1] == "red"  # word tokens travel


def test_av2_resume_keeps_its_preset_and_refuses_to_reopen_a_finished_autoencoder_stage(tmp_path):
    config = TrainConfig(out=tmp_path / "run", preset="av2", overrides=TOY, minutes=0.001, device="cpu")
    config = replace(config, ae_minutes=0.0005, train_clips=2, ae_batch=1, denoise_batch=1, eval_requests=0)
    assert train(config)["stage"] == "denoiser"
    with pytest.raises(ValueError, match="preset"):
        train(replace(config, resume=True, preset="demo-av", overrides=None))
    with pytest.raises(ValueError, match="ae_minutes"):
        train(replace(config, resume=True, ae_minutes=5.0))
    with pytest.raises(ValueError, match="ae_train"):
        train(replace(config, resume=True, ae_train="audio"))
    # a wall clock that leaves no room beside export and evaluation: no step, but the call still records
    walled = train(replace(config, resume=True, minutes=5.0, wall_minutes=0.01))
    assert walled["calls"][-1]["steps"]["denoiser"] == 0 and walled["calls"][-1]["wall_minutes"] == 0.01
    assert walled["calls"][-1]["seconds"]["denoiser"] == 0.0


def test_separated_vocoder_plays_each_channel_from_its_own_mel_only(rng):
    from workbench.training.audio import one_channel
    from workbench.training.model import MEL_BINS, separate_channels, vocoder

    dense = vocoder(preset("av2", {"vocoder_channels": 16})).eval()
    stereo = separate_channels(dense).eval()
    mel = torch.from_numpy(rng.normal(size=(2, 2, 12, MEL_BINS)).astype("float32"))
    with torch.no_grad():
        out = stereo(mel)
        for c in range(2):  # channel c is the dense vocoder's row c on channel c's mel, on both inputs
            alone = dense(torch.stack([mel[:, c], mel[:, c]], 1))[:, c]
            torch.testing.assert_close(out[:, c], alone, rtol=1e-5, atol=1e-6)
            other = mel.clone()
            other[:, 1 - c] = torch.from_numpy(rng.normal(size=other[:, 1 - c].shape).astype("float32"))
            assert torch.equal(stereo(other)[:, c], out[:, c])  # the other channel's mel cannot reach it
    with pytest.raises(ValueError, match="vocoder"):
        separate_channels(stereo.__class__(in_channels=MEL_BINS, hidden_channels=32, out_channels=1))

    wave = torch.from_numpy(rng.normal(size=(5, 2, 30)).astype("float32"))
    mono_mel, mono_wave = one_channel(mel.repeat(3, 1, 1, 1)[:5], wave, torch.Generator().manual_seed(0))
    for i in range(5):  # each clip: one of its channels, the same one for mel and waveform, on both channels
        c = 0 if torch.equal(mono_wave[i, 0], wave[i, 0]) else 1
        assert torch.equal(mono_wave[i, 1], wave[i, c]) and torch.equal(mono_wave[i, 0], wave[i, c])
        assert torch.equal(mono_mel[i, 0], mel.repeat(3, 1, 1, 1)[i, c]) and torch.equal(mono_mel[i, 1], mono_mel[i, 0])


def test_learning_rate_warms_up_then_anneals_over_the_plan_to_the_floor():
    from workbench.training.config import LR_FLOOR, learning_rate

    assert learning_rate(1.0, 9, 0.0, 100.0, 20, "cosine") == pytest.approx(0.5)  # half-way through warm-up
    assert learning_rate(1.0, 50, 50.0, 100.0, 20, "cosine") == pytest.approx(LR_FLOOR + (1 - LR_FLOOR) / 2)
    assert learning_rate(1.0, 50, 25.0, 100.0, 20, "linear") == pytest.approx(LR_FLOOR + (1 - LR_FLOOR) * 0.75)
    assert learning_rate(1.0, 50, 500.0, 100.0, 20, "cosine") == pytest.approx(LR_FLOOR)  # past the plan
    assert learning_rate(1.0, 50, 500.0, None, 20, "cosine") == learning_rate(1.0, 50, 5.0, 1.0, 20, "constant") == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ae_train", "both"),
        ("schedule", "step"),
        ("preset", "demo-av-3"),
        ("overrides", {"frames": 50}),
        ("overrides", {"depth": 2}),
        ("wall_minutes", 0),
        ("denoise_minutes", -1.0),
        ("ae_minutes", float("nan")),
    ],
)
def test_train_tiny_av2_bad_option_raises_naming_the_field(tmp_path, field, value):
    config = TrainConfig(out=tmp_path, preset="av2")
    setattr(config, field, value)
    named = {"overrides": "frames" if value == {"frames": 50} else "overrides"}.get(field, field)
    with pytest.raises(ValueError, match=named):
        config.validate()


def test_av2_spec_compresses_to_a_small_latent_and_keeps_caption_words_whole():
    spec = PRESETS["av2"]
    assert (spec.spatial_ratio, spec.temporal_ratio) == (16, 8)
    tokens = (spec.frames - 1) // spec.temporal_ratio + 1, spec.height // 16, spec.width // 16
    assert tokens == (7, 8, 8)  # 448 video tokens
    words = tokenizer(spec).tokenize("a red circle moves left fast on a light background, loud low hum")
    assert len(words) <= 16 and {"red", "circle", "left", "fast", "light", "loud", "low", "hum"} <= set(words)
    assert tokenizer(spec).tokenize("reddish") == list("reddish")  # unknown words fall back to characters
    demo = tokenizer(PRESETS["demo-av"])
    assert demo.tokenize("a red circle") == list("aredcircle")  # demo-av's tokenizer is unchanged
    with pytest.raises(ValueError, match="height"):
        preset("av2", {"height": 120})
    with pytest.raises(ValueError, match="vae_channels"):
        preset("av2", {"vae_channels": [32, 48, 96]})


def test_av2_text_features_of_a_word_do_not_depend_on_the_words_before_it():
    """What composing an unseen colour-direction pair needs from the frozen text path: "left" after "blue"
    is the same input as "left" after "red" (demo-av's encoder mixes them)."""
    from workbench.training.model import build_pipeline

    for name, same in (("av2", True), ("demo-av", False)):
        spec = preset(name, TOY if name == "av2" else None)
        pipe = build_pipeline(0, spec)
        with torch.no_grad():
            embeds = pipe.encode_prompt(
                ["a red circle moves left", "a blue square moves left"],
                do_classifier_free_guidance=False,
                max_sequence_length=spec.max_tokens,
            )[0]
        assert torch.equal(embeds[0, -1], embeds[1, -1]) == same, name
        assert not torch.equal(embeds[0, -3], embeds[1, -3])  # "circle" and "square" do differ
