"""Non-finite latents, frames or audio fail a request naming the stage, or (when allowed) mark the Result, which
evidence refuses."""

import dataclasses
import functools
import json

import numpy as np
import pytest
import torch

from workbench import Request, Session
from workbench.evidence.harness import qualify
from workbench.media import verify_mp4

REQUEST = Request("a red circle moves left", seed=4, steps=2, frames=9, height=32, width=32)


def _poison(module):
    """A forward hook that writes NaN (and inf) into `module`'s first output tensor; returns its handle."""

    def hook(_, __, output):
        tensor = output[0] if isinstance(output, tuple | list) else getattr(output, "sample", output)
        poisoned = tensor.clone()
        poisoned.view(-1)[::3] = float("nan")
        poisoned.view(-1)[1::7] = float("inf")
        if isinstance(output, tuple | list):
            return (poisoned, *output[1:])
        if hasattr(output, "sample"):
            output.sample = poisoned
            return output
        return poisoned

    return module.register_forward_hook(hook)


@pytest.fixture(scope="module")
def wan():
    return Session.open("tiny-wan", device="cpu")


@pytest.fixture(scope="module")
def ltx2():
    return Session.open("tiny-ltx2", device="cpu")


def test_nan_latents_raise_naming_denoise(wan):
    handle = _poison(wan.model.pipeline.transformer)
    events = []
    unsubscribe = wan.subscribe(events.append)
    try:
        with pytest.raises(
            RuntimeError, match=r"denoise produced non-finite latents \((\d+) of (\d+) values"
        ) as caught:
            wan.generate(REQUEST, progress=False)
    finally:
        handle.remove()
        unsubscribe()
    # the request ran to its end (request_end, as subscribers saw it), then its outputs failed it: no second ending
    assert [e.kind for e in events if e.kind.startswith("request_")] == ["request_end"]
    message = str(caught.value)
    assert "guidance=" in message and "steps=2" in message and "allow_non_finite=True" in message
    assert wan.active_request is None
    assert torch.isfinite(wan.generate(REQUEST, progress=False).latents).all()  # the session is still usable


def test_allow_non_finite_returns_result_marked_and_qualify_refuses_it(wan, monkeypatch):
    handle = _poison(wan.model.pipeline.transformer)
    try:
        result = wan.generate(REQUEST, progress=False, allow_non_finite=True)
        assert result.finite is False and not torch.isfinite(result.latents).all()
        notes = result.metadata["non_finite"]
        assert notes[0].startswith("denoise produced non-finite latents")
        assert any(note.startswith("video_decode produced non-finite frames") for note in notes)
        summary = json.loads(json.dumps(result.summary(), default=str))
        assert summary["finite"] is False and summary["metadata"]["non_finite"] == notes

        with pytest.raises(RuntimeError, match="denoise produced non-finite latents"):
            qualify(wan, [REQUEST], {}, {"cross_kv_cache": {}}, progress=False)
        monkeypatch.setattr(wan, "generate", functools.partial(Session.generate, wan, allow_non_finite=True))
        with pytest.raises(RuntimeError, match=r"qualify: the baseline arm's output is not finite \(denoise produced"):
            qualify(wan, [REQUEST], {}, {"cross_kv_cache": {}}, progress=False)
    finally:
        handle.remove()
    assert wan.accelerations == {}


def test_finite_result_says_so(wan):
    result = wan.generate(REQUEST, progress=False)
    assert result.finite is True and "non_finite" not in result.metadata and result.summary()["finite"] is True


def test_non_finite_frames_raise_naming_video_decode(wan, monkeypatch):
    vae = wan.model.pipeline.vae
    decode = type(vae).decode

    def poisoned(self, *args, **kwargs):
        out = decode(self, *args, **kwargs)
        sample = (out[0] if isinstance(out, tuple) else out.sample).clone()
        sample.view(-1)[::5] = float("nan")
        return (sample,) if isinstance(out, tuple) else type(out)(sample=sample)

    monkeypatch.setattr(type(vae), "decode", poisoned)
    with pytest.raises(RuntimeError, match=r"video_decode produced non-finite frames \(\d+ of \d+ values NaN/inf\)"):
        wan.generate(REQUEST, progress=False)


def test_non_finite_audio_raises_naming_audio_decode(ltx2):
    handle = _poison(ltx2.model.pipeline.vocoder)
    try:
        with pytest.raises(RuntimeError, match=r"audio_decode produced non-finite audio \(\d+ of \d+ values"):
            ltx2.generate(REQUEST, progress=False)
    finally:
        handle.remove()


def test_non_finite_audio_latents_raise_naming_denoise(ltx2):
    """NaN in the denoiser's audio output at its one step: the audio latents the audio VAE decodes are named (stage
    denoise), not the audio decoded from them; the video latents stay finite (one step: the video branch never saw
    the NaN)."""

    def poison_audio(_, __, output):
        audio = (output[1] if isinstance(output, tuple) else output.audio_sample).clone()
        audio.view(-1)[::3] = float("nan")
        if isinstance(output, tuple):
            return (output[0], audio, *output[2:])
        output.audio_sample = audio
        return output

    request = dataclasses.replace(REQUEST, steps=1)
    handle = ltx2.model.pipeline.transformer.register_forward_hook(poison_audio)
    try:
        with pytest.raises(
            RuntimeError, match=r"^denoise produced non-finite audio latents \(\d+ of \d+ values NaN/inf"
        ):
            ltx2.generate(request, progress=False)
        notes = ltx2.generate(request, progress=False, allow_non_finite=True).metadata["non_finite"]
    finally:
        handle.remove()
    assert notes[0].startswith("denoise produced non-finite audio latents")
    assert not any(note.startswith("denoise produced non-finite latents") for note in notes)
    assert ltx2.generate(request, progress=False).finite  # the probe holds nothing over to the next request


def test_allowed_non_finite_audio_is_marked_then_made_finite_so_it_saves_and_shows(ltx2, tmp_path):
    """Like the frames, the audio of an allowed non-finite result carries NaN as silence and +-inf as full scale:
    the record still says the decoder produced NaN/inf and how many, and the result saves and shows (PyAV refuses
    NaN samples)."""
    handle = _poison(ltx2.model.pipeline.vocoder)
    try:
        result = ltx2.generate(REQUEST, progress=False, allow_non_finite=True)
    finally:
        handle.remove()
    assert result.finite is False
    inf_at = np.zeros(result.audio.size, bool)
    inf_at[1::7] = True  # where _poison wrote inf (over its NaN where both fall)
    nan_at = np.zeros_like(inf_at)
    nan_at[::3] = True
    nan_at &= ~inf_at
    note = f"audio_decode produced non-finite audio ({(nan_at | inf_at).sum()} of {inf_at.size} values NaN/inf)"
    assert result.metadata["non_finite"] == [note]  # what the decoder produced, counted before it was replaced
    assert result.audio.dtype == np.float32 and np.isfinite(result.audio).all()
    flat = result.audio.reshape(-1)
    assert (flat[nan_at] == 0).all() and (flat[inf_at] == 1).all()  # NaN: silence; inf: full scale
    mp4 = result.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.html", "result.json", "result.mp4"]
    assert json.loads((tmp_path / "result.json").read_text())["metadata"]["non_finite"] == [note]
    report = verify_mp4(mp4, expect_frames=REQUEST.frames, expect_audio_seconds=result.audio_seconds)
    assert report.audio_finite and report.audio_channels == result.audio.shape[0]
    assert "data:video/mp4;base64," in result._repr_html_()


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"progress": False, "allow_non_finite": "yes"}, "^allow_non_finite: expected a bool, got str 'yes'"),
        ({"progress": "no"}, r"^progress: expected a bool, got str 'no'; allowed: True, False"),  # "no" is truthy
        ({"progress": None}, r"^progress: expected a bool, got NoneType None; allowed: True, False"),
    ],
)
def test_generate_flags_must_be_bool(wan, flags, match):
    with pytest.raises(ValueError, match=match):
        wan.generate(REQUEST, **flags)
