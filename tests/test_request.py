import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from workbench import Request
from workbench import request as request_module
from workbench.models import h3, ltx2, wan


@pytest.mark.parametrize(
    "field, value",
    [
        ("frames", 0),
        ("height", -64),
        ("width", 0),
        ("steps", -1),
        ("seed", -3),
        ("fps", 0),
        ("guidance", -1.0),
        ("frames", 2.5),
        ("steps", True),
    ],
)
def test_request_bad_field_raises_naming_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        Request("a prompt", **{field: value})


def test_request_empty_prompt_raises():
    for blank in ("   ", "\x00", "\u200b\n"):
        with pytest.raises(ValueError, match="^prompt: must hold a visible character"):
            Request(blank)


def test_request_keeps_a_str_subclass_own_text_not_what_its_str_returns():
    class Sly(str):
        def __str__(self):
            return "\ud800" * 10

    request = Request(Sly("a red circle"))
    assert request.prompt == "a red circle" and type(request.prompt) is str


@pytest.mark.parametrize("bad", ["image.png", np.zeros((8, 8, 3), np.float32), np.zeros((8, 8), np.uint8), [1, 2]])
def test_request_wrong_keyframe_type_raises(bad):
    with pytest.raises(ValueError, match="^image: must be a PIL.Image.Image or a uint8 numpy array"):
        Request("a prompt", image=bad)


def test_request_frames_the_vae_cannot_take_raise_with_rule():
    with pytest.raises(ValueError, match=r"frames: 10 .* 4\*n \+ 1"):
        Request("p", frames=10).resolved(wan.FAMILY, wan.TINY_DEFAULTS)
    with pytest.raises(ValueError, match=r"frames: 13 .* 8\*n \+ 1"):
        Request("p", frames=13).resolved(ltx2.FAMILY, ltx2.TINY_DEFAULTS)


def test_request_size_not_a_multiple_raises():
    with pytest.raises(ValueError, match="height: 72 must be a multiple of 32"):
        Request("p", height=72).resolved(ltx2.FAMILY, ltx2.TINY_DEFAULTS)


def test_request_mode_and_keyframe_checked_against_family():
    with pytest.raises(ValueError, match="mode: 'i2va' is not supported by wan"):
        Request("p", mode="i2va").resolved(wan.FAMILY, wan.TINY_DEFAULTS)
    with pytest.raises(ValueError, match="image: mode 't2v' takes no keyframe"):
        Request("p", image=np.zeros((64, 64, 3), np.uint8)).resolved(wan.FAMILY, wan.TINY_DEFAULTS)


def test_request_defaults_filled_from_model():
    request = Request("p", frames=17).resolved(wan.FAMILY, wan.TINY_DEFAULTS)
    assert (request.frames, request.height, request.steps, request.mode) == (17, 64, 2, "t2v")


# --- type, finiteness and size (issue 20) ---------------------------------------------------------------------------

FIELD_TYPES = {
    "seed": int,
    "frames": int,
    "height": int,
    "width": int,
    "steps": int,
    "fps": int,
    "guidance": float,
    "mode": str,
    "negative_prompt": str,
    "prompt": str,
}

# What a hostile or careless caller passes: every Python/numpy number kind, NaN/inf, huge and negative values,
# bools, strings with lone surrogates, containers.
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63), 10**400, 10**6 + 1, 2**20, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -0.0]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(np.int64),
    st.integers(min_value=0, max_value=2**64 - 1).map(np.uint64),
    st.integers(min_value=-128, max_value=127).map(np.int8),
    st.floats(width=32).map(np.float32),
    st.floats().map(np.float64),
    st.booleans().map(np.bool_),
    st.text(max_size=8),
    st.sampled_from(["", " ", "\ud800", "a\udfffb", "t2v", "17"]),
    st.lists(st.integers(), max_size=2),
)


def _assert_refused_naming(field, call):
    """`call()` returns, or raises ValueError whose message starts with `field`; any other exception fails."""
    try:
        return call()
    except ValueError as error:
        assert str(error).startswith(f"{field}: "), str(error)
        return None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(FIELD_TYPES)), value=ANY_VALUE)
def test_request_any_field_value_is_accepted_as_plain_json_or_refused_naming_field(field, value):
    kwargs = {"prompt": "a prompt", field: value}
    request = _assert_refused_naming(field, lambda: Request(**kwargs))
    if request is None:
        return
    stored = getattr(request, field)
    if stored is not None:
        assert type(stored) is FIELD_TYPES[field], (field, value, stored)
    if isinstance(stored, float):
        assert np.isfinite(stored)
    if field in request_module.INT_RANGES and stored is not None:
        low, high = request_module.INT_RANGES[field]
        assert low <= stored <= high
    record = json.dumps(request.to_dict(), allow_nan=False)  # records serialise strictly ...
    assert Request(**json.loads(record)) == request  # ... and read back as the same request


@settings(max_examples=60, deadline=None)
@given(
    family_module=st.sampled_from([wan, ltx2, h3]),
    field=st.sampled_from(["frames", "height", "width", "steps", "fps", "guidance", "mode", "seed"]),
    value=ANY_VALUE,
)
def test_request_resolved_against_each_family_accepts_or_refuses_naming_a_field(family_module, field, value):
    try:
        request = Request("a prompt", **{field: value}).resolved(family_module.FAMILY, family_module.TINY_DEFAULTS)
    except ValueError as error:
        assert str(error).split(":")[0] in set(FIELD_TYPES) | {"image", "last_image"}, str(error)
        return
    json.dumps(request.to_dict(), allow_nan=False)


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("guidance", float("nan"), "finite"),
        ("guidance", float("inf"), "finite"),
        ("guidance", np.float32("inf"), "finite"),
        ("guidance", 10**400, "finite"),
        ("seed", 2**63, r"\[0, 9223372036854775807\]"),
        ("seed", np.uint64(2**64 - 1), r"\[0, 9223372036854775807\]"),
        ("seed", -1, r"\[0, "),
        pytest.param("seed", 10**5000, "bits", id="seed-5000-digits"),
        ("frames", 10**6 + 1, rf"\[1, {request_module.MAX_FRAMES}\]"),
        ("height", 2**20, rf"\[1, {request_module.MAX_SIDE}\]"),
        ("steps", 10**9, rf"\[1, {request_module.MAX_STEPS}\]"),
        ("fps", 10**9, rf"\[1, {request_module.MAX_FPS}\]"),
        ("fps", 24.0, "integer"),
        ("frames", np.bool_(True), "integer"),
        ("mode", "", "non-empty"),
        ("mode", 3, "non-empty"),
        ("negative_prompt", b"bytes", "string"),
    ],
)
def test_request_bad_number_or_text_raises_naming_field_value_and_allowed(field, value, allowed):
    with pytest.raises(ValueError, match=rf"^{field}: .*{allowed}"):
        Request("a prompt", **{field: value})


def test_request_numpy_scalars_become_python_numbers_that_serialise():
    request = Request("p", seed=np.int64(7), frames=np.int32(17), steps=np.uint8(2), guidance=np.float32(3.5))
    assert (type(request.seed), type(request.frames), type(request.steps), type(request.guidance)) == (
        int,
        int,
        int,
        float,
    )
    assert json.loads(json.dumps(request.to_dict()))["guidance"] == 3.5


def test_request_lone_surrogate_in_prompt_is_named_not_a_tokenizer_traceback():
    with pytest.raises(ValueError, match=r"^prompt: holds a lone surrogate '\\ud800' at index 1"):
        Request("a\ud800b")
    with pytest.raises(ValueError, match=r"^negative_prompt: holds a lone surrogate"):
        Request("a prompt", negative_prompt="\udfff")


def test_request_prompt_longer_than_limit_raises():
    with pytest.raises(ValueError, match=rf"^prompt: .* at most {request_module.MAX_PROMPT_CHARS}"):
        Request("x" * (request_module.MAX_PROMPT_CHARS + 1))


def test_request_video_larger_than_limit_raises_before_allocation():
    # each side within its own maximum, together far over the element budget
    with pytest.raises(ValueError, match=r"^frames: 1025 frames of 4096x4096 .* at most 1,073,741,824"):
        Request("p", frames=1025, height=4096, width=4096)
    Request("p", frames=121, height=2160, width=3840)  # 4K at the stated limit is accepted
    # the limit also holds when the sizes come from the model's defaults
    with pytest.raises(ValueError, match=r"^frames: 1025 frames of 4096x4096"):
        Request("p", frames=1025).resolved(wan.FAMILY, {**wan.TINY_DEFAULTS, "height": 4096, "width": 4096})


@pytest.mark.parametrize("mode", ["L", "I;16", "RGBA", "P", "CMYK", "1", "F"])
def test_request_keyframe_pil_mode_other_than_rgb_raises_naming_mode(mode):
    image = Image.new(mode, (32, 32))
    with pytest.raises(ValueError, match=rf"^image: a PIL image in mode '{mode}'; allowed modes: \['RGB'\]"):
        Request("p", image=image)


@pytest.mark.parametrize(
    "keyframe", [np.zeros((0, 0, 3), np.uint8), np.zeros((0, 8, 3), np.uint8), Image.new("RGB", (0, 0))]
)
def test_request_empty_keyframe_raises(keyframe):
    with pytest.raises(ValueError, match=r"^last_image: a \d+x\d+ keyframe; allowed: height and width in \[1, "):
        Request("p", last_image=keyframe)


def test_request_rgb_keyframes_accepted_and_recorded_by_shape():
    request = Request("p", image=Image.new("RGB", (5, 3)), last_image=np.zeros((3, 5, 3), np.uint8)[:, ::-1])
    record = json.loads(json.dumps(request.to_dict(), allow_nan=False))
    assert record["image"] == record["last_image"] == {"shape": [3, 5, 3]}


KEY = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ({"image": KEY}, {"image": KEY.copy()}, True),
        ({"last_image": KEY}, {"last_image": np.asfortranarray(KEY)}, True),  # same pixels, another memory layout
        ({"image": Image.fromarray(KEY)}, {"image": Image.fromarray(KEY.copy())}, True),
        ({"image": KEY}, {"image": KEY + 1}, False),
        ({"image": KEY}, {"image": KEY[:3]}, False),
        ({"image": KEY}, {"image": Image.fromarray(KEY)}, False),
        ({"image": KEY}, {"last_image": KEY}, False),
        ({"image": KEY}, {}, False),
        ({"image": KEY, "seed": 1}, {"image": KEY.copy()}, False),
    ],
)
def test_request_equality_compares_keyframes_by_content_and_hash_agrees(a, b, equal):
    """Not numpy's 'truth value of an array is ambiguous' or 'unhashable type': keyframes compare by content, and
    requests that are equal hash alike (the hash leaves the keyframes out)."""
    first, second = Request("p", **a), Request("p", **b)
    assert (first == second, second == first, first != second) == (equal, equal, not equal)
    assert hash(first) == hash(Request("p", **a))
    if equal:
        assert hash(first) == hash(second) and len({first, second}) == 1


def test_request_mode_given_is_kept_when_defaults_name_none():
    request = Request("p", mode="fl2va", image=Image.new("RGB", (8, 8)), last_image=Image.new("RGB", (8, 8)))
    assert request.resolved(h3.FAMILY, h3.TINY_DEFAULTS).mode == "fl2va"
    with pytest.raises(ValueError, match=r"^mode: 'x2v' is not supported by wan"):
        Request("p", mode="x2v").resolved(wan.FAMILY, wan.TINY_DEFAULTS)


@pytest.mark.parametrize(
    "defaults, message",
    [
        ({**wan.TINY_DEFAULTS, "frames": "nine"}, "^frames: must be an integer"),
        ({**wan.TINY_DEFAULTS, "guidance": float("nan")}, "^guidance: nan"),
        ({**wan.TINY_DEFAULTS, "sampler": "x"}, r"^defaults: unknown field\(s\) \['sampler'\]"),
        ({**wan.TINY_DEFAULTS, 3: 1}, r"^defaults: unknown field\(s\) \[3\]"),
        ({k: v for k, v in wan.TINY_DEFAULTS.items() if k != "steps"}, "^steps: not given and wan has no default"),
    ],
)
def test_request_bad_model_defaults_are_refused_like_fields(defaults, message):
    with pytest.raises(ValueError, match=message):
        Request("p").resolved(wan.FAMILY, defaults)
