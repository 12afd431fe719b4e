import numpy as np
import pytest

from workbench import Request
from workbench.models import ltx2, wan


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
    with pytest.raises(ValueError, match="^prompt: "):
        Request("   ")


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
