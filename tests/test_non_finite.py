"""Non-finite latents, frames or audio fail a request naming the stage, or (when allowed) mark the Result, which
evidence refuses."""

import functools
import json

import pytest
import torch

from workbench import Request, Session
from workbench.evidence.harness import qualify

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


def test_nan_latents_raise_naming_denoise(wan):
    handle = _poison(wan.model.pipeline.transformer)
    try:
        with pytest.raises(
            RuntimeError, match=r"denoise produced non-finite latents \((\d+) of (\d+) values"
        ) as caught:
            wan.generate(REQUEST, progress=False)
    finally:
        handle.remove()
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


def test_non_finite_audio_raises_naming_audio_decode():
    session = Session.open("tiny-ltx2", device="cpu")
    handle = _poison(session.model.pipeline.vocoder)
    try:
        with pytest.raises(RuntimeError, match=r"audio_decode produced non-finite audio \(\d+ of \d+ values"):
            session.generate(REQUEST, progress=False)
    finally:
        handle.remove()


def test_allow_non_finite_must_be_bool(wan):
    with pytest.raises(ValueError, match="allow_non_finite: expected a bool, got str"):
        wan.generate(REQUEST, progress=False, allow_non_finite="yes")
