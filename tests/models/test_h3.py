import dataclasses
import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import workbench.session
from workbench import Request
from workbench.models import h3, resolve
from workbench.models.tokenizer import build_tokenizer
from workbench.session import _to_uint8

KEY = np.random.default_rng(0).integers(0, 256, (32, 64, 3), dtype=np.uint8)
MODES = {
    "t2va": {},
    "i2va": {"image": KEY},
    "l2va": {"last_image": Image.fromarray(KEY[::-1].copy())},
    "fl2va": {"image": Image.fromarray(KEY), "last_image": KEY[:, ::-1].copy()},
}


@pytest.fixture(scope="module")
def session(sessions):
    return sessions("tiny-h3")


@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_runs_end_to_end_with_stereo_audio_and_repeats(session, mode, seed):
    request = Request("a red circle, low hum", seed=seed, mode=mode, **MODES[mode])
    first = session.generate(request, progress=False)
    assert first.frames.dtype == np.uint8 and first.frames.shape == (124, 32, 64, 3)
    assert first.frames.std() > 0
    assert first.audio.dtype == np.float32 and first.audio.shape == (2, 207 * 800)
    assert np.isfinite(first.audio).all() and first.sample_rate == 32000
    if mode in ("t2va", "fl2va"):  # repeatability, on one text-only and one two-keyframe mode
        second = session.generate(request, progress=False)
        assert np.array_equal(first.frames, second.frames) and np.array_equal(first.audio, second.audio)
        assert torch.equal(first.latents, second.latents)
    assert first.metadata["request"]["mode"] == mode
    stages = ("text_encode", "denoise", "video_decode", "audio_decode")
    stages += ("image_encode",) if mode != "t2va" else ()
    for stage in stages:
        assert first.timings[stage] > 0, stage
    assert len(first.step_seconds) == 2  # 3 steps = 2 transformer calls


def test_different_seeds_give_different_frames(session, seed):
    a = session.generate(Request("p", seed=seed), progress=False)
    b = session.generate(Request("p", seed=seed + 1), progress=False)
    assert not np.array_equal(a.frames, b.frames)


@pytest.mark.parametrize("mode", ["t2va", "fl2va"])
def test_session_equals_plain_modular_pipeline_call(session, mode, seed):
    """Same components + seed = same media as calling the modular pipeline directly (wrappers change nothing)."""
    request = Request("a blue square moves up", seed=seed, mode=mode, **MODES[mode])
    result = session.generate(request, progress=False)
    plain = h3.tiny(0)
    kwargs = plain.family.call_kwargs(request.resolved(plain.family, plain.defaults))
    state = plain.pipeline(**kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    assert np.array_equal(_to_uint8(state.get("videos")[0]), result.frames)
    assert np.array_equal(state.get("audio")[0].numpy(), result.audio)


def test_step_callbacks_run_inside_a_cache_context_and_base16_gives_16_evaluations(session, monkeypatch):
    transformer = session.model.pipeline.transformer
    contexts, calls = [], []
    original = transformer.cache_context

    def recording(name, **kwargs):
        contexts.append((name, kwargs["step_index"]))
        return original(name, **kwargs)

    monkeypatch.setattr(transformer, "cache_context", recording)
    hook = transformer.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        result = session.generate(Request("p", seed=0, **h3.BASE16), progress=False)
    finally:
        hook.remove()
    assert len(calls) == 16 and len(result.step_seconds) == 16
    assert contexts == [("cond", i) for i in range(16)]
    assert result.metadata["request"]["steps"] == 17
    assert sum(result.step_seconds) <= result.timings["denoise"] * 1.0001


def test_loop_blocks_are_restored_after_a_request(session):
    loops = h3._denoise_loops(session.model.pipeline._blocks)
    before = [dict(loop.sub_blocks) for loop in loops]
    session.generate(Request("p"), progress=False)
    assert [dict(loop.sub_blocks) for loop in loops] == before
    assert all(type(b).__module__.startswith("diffusers") for loop in loops for b in loop.sub_blocks.values())
    assert all("progress_bar" not in loop.__dict__ for loop in loops)  # the session's bar was lent for the request


def test_a_request_shows_the_sessions_labelled_bar_and_the_build_warns_nothing(session, monkeypatch):
    """The denoise loop's own (unlabelled diffusers) bar is replaced by the session's "denoise steps" bar for the
    request; building an H3 warns nothing (diffusers' audio VAE builds with the old `weight_norm` spelling)."""
    import diffusers.modular_pipelines.modular_pipeline as modular

    def unlabelled(*args, **kwargs):
        raise AssertionError("diffusers' unlabelled bar was drawn")

    monkeypatch.setattr(modular, "tqdm", unlabelled)
    shown = []
    real = workbench.session.progress_bar
    monkeypatch.setattr(workbench.session, "progress_bar", lambda *a: shown.append(a[1:3]) or real(*a))
    session.generate(Request("p", steps=3), progress=False)
    assert shown == [(2, "denoise steps")]  # N steps run N - 1 transformer calls
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h3.tiny_components()
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"mode": "i2va"}, "image"),
        ({"mode": "l2va"}, "last_image"),
        ({"mode": "fl2va", "image": KEY}, "last_image"),
        ({"mode": "i2va", "image": KEY, "last_image": KEY}, "last_image"),
        ({"mode": "l2va", "image": KEY, "last_image": KEY}, "image"),
        ({"mode": "t2va", "image": KEY}, "image"),
        ({"image": KEY}, "image"),  # default mode t2va
        ({"mode": "ref2va"}, "mode"),
        ({"frames": 100}, "frames"),  # not 17n+5
        ({"frames": 107}, "frames"),  # 17n+5 but shorter than 5 s
        ({"frames": 362}, "frames"),  # 17n+5 but longer than 15 s
        ({"fps": 16}, "fps"),
        ({"guidance": 4.0}, "guidance"),
        ({"negative_prompt": "blurry"}, "negative_prompt"),
        ({"height": 48}, "height"),
        ({"steps": 1}, "steps"),  # N steps run N - 1 transformer calls: one step would run none
    ],
)
def test_bad_requests_are_refused_naming_the_field(session, fields, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        session.generate(Request("p", **fields), progress=False)


@pytest.mark.parametrize("bad", [np.zeros((32, 64, 3), np.float32), np.zeros((32, 64), np.uint8), "frame.png"])
def test_bad_keyframes_are_refused(bad):
    with pytest.raises(ValueError, match="^image:"):
        Request("p", mode="i2va", image=bad)


def test_frame_range_error_lists_the_allowed_counts():
    with pytest.raises(ValueError, match=r"frames: 107 .* allowed: \[124, 141, .*, 345\]"):
        Request("p", frames=107).resolved(h3.FAMILY, h3.TINY_DEFAULTS)
    for frames in h3.ALLOWED_FRAMES:
        assert Request("p", frames=frames).resolved(h3.FAMILY, h3.TINY_DEFAULTS).frames == frames
    assert h3.ALLOWED_FRAMES[0] == 124 and h3.ALLOWED_FRAMES[-1] == 345


def test_save_and_strict_local_load_round_trip(tmp_path):
    model = h3.tiny(0)
    model.pipeline.save_pretrained(str(tmp_path), overwrite_modular_index=True)
    loaded = resolve(tmp_path, dtype=torch.float32)
    assert loaded.family is h3.FAMILY and loaded.pipeline.config.canvas_short_edge == 32
    for name in ("transformer", "vae", "audio_vae", "text_encoder"):
        ours, theirs = getattr(model.pipeline, name).state_dict(), getattr(loaded.pipeline, name).state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), name
    (tmp_path / "vae" / "diffusion_pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="vae: pickled weights"):
        resolve(tmp_path, dtype=torch.float32)


def test_strict_load_refuses_foreign_classes_and_path_keys_in_the_modular_index(tmp_path):
    h3.tiny(0).pipeline.save_pretrained(str(tmp_path), overwrite_modular_index=True)
    index_file = tmp_path / h3.INDEX_FILE
    index = json.loads(index_file.read_text())
    spec = index["processor"][2]
    for key, value, message in (
        ("processor", ["os", "system", spec], r"component 'processor' names class os.system, which is not allowed"),
        ("transformer_ref", ["transformers", "AutoModel", spec], r"'transformer_ref' names class transformers.Auto"),
        ("../vae", index["vae"], r"component key '../vae' is not a plain folder name"),
    ):
        index_file.write_text(json.dumps({**index, key: value}))
        with pytest.raises(ValueError, match=message):
            resolve(tmp_path, dtype=torch.float32)


def test_tokenizer_extra_special_tokens_keep_default_ids():
    plain, extended = build_tokenizer(128), build_tokenizer(128, extra_special_tokens=h3.VISION_TOKENS)
    assert len(plain) == len(extended) == 128
    assert plain("a red circle!")["input_ids"] == extended("a red circle!")["input_ids"]
    pad = extended.convert_tokens_to_ids("<|image_pad|>")
    assert extended("<|vision_start|><|image_pad|>x")["input_ids"][:2] == [124, pad]
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(72, extra_special_tokens=h3.VISION_TOKENS)


def test_family_contract():
    family = h3.FAMILY
    assert family.modes == ("t2va", "i2va", "l2va", "fl2va") and family.has_audio
    assert (family.frame_step, family.frame_offset, family.size_multiple) == (17, 5, 32)
    assert dataclasses.replace(family).check_request is not None
    assert h3.tiny(0).pipeline.text_encoder.config.text_config.num_hidden_layers > 50
