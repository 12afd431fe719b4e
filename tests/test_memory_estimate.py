"""The planner's activation estimates against what was measured: the denoiser formula bounds every committed H200
activation peak from above within 10 %, and a transformer VAE decoder (MiniMax-H3's ViT) gets a decode estimate
that grows with the video."""

import json
from pathlib import Path

import pytest
import torch

from workbench import Request
from workbench.accelerations.memory.ring import module_bytes
from workbench.memory_estimate import WORKSPACE, denoise_activation, estimate_activation
from workbench.models import h3, resolve, wan
from workbench.models.loaded import cast_module

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
BAND = (1.0, 1.1)  # estimate / measured: an upper bound, at most 10 % above


def _h3_33b_ring():
    """(estimate, measured) of `ring.json`: the 33.1B transformer's resident forward over `shape.rows` rows, its
    allocated peak less its weights."""
    from diffusers import MiniMaxH3Transformer3DModel

    shape = json.loads((RESULTS / "ring.json").read_text())["shape"]
    assert shape["activation_source"] == "measured"
    with torch.device("meta"):
        transformer = MiniMaxH3Transformer3DModel()  # the ring scenario's configuration (the class defaults)
    cast_module(transformer, torch.bfloat16)
    assert module_bytes(transformer) == shape["weight_bytes"]
    return denoise_activation(h3.FAMILY, transformer, shape["rows"]), shape["activation_bytes"]


def _wan_1_3b_request(name):
    """(estimate, measured) of the stock arm of `name`.json, a random-wan-1.3b request: its denoise stage's allocated
    peak less the weights of every component (all resident)."""
    record = json.loads((RESULTS / f"{name}.json").read_text())
    assert record["shape"]["model"] == "random-wan-1.3b" and not record["smoke"]
    model = wan.random_1_3b(device="meta")
    modules = [c for c in model.pipeline.components.values() if isinstance(c, torch.nn.Module)]
    for module in modules:
        cast_module(module, torch.bfloat16)
    request = Request(**record["shape"]["request"]).resolved(model.family, model.defaults)
    measured = record["arms"]["stock"]["peak_bytes"]["denoise"] - sum(map(module_bytes, modules))
    return estimate_activation(model, request)[0]["denoise"], measured


@pytest.mark.parametrize(
    "measurement",
    [_h3_33b_ring, lambda: _wan_1_3b_request("memory"), lambda: _wan_1_3b_request("request-wan")],
    ids=["h3-33b-ring", "wan-1.3b-memory", "wan-1.3b-request-wan"],
)
def test_denoise_estimate_bounds_measured_activation_within_band(measurement):
    estimate, measured = measurement()
    assert BAND[0] <= estimate / measured <= BAND[1], f"estimate {estimate:,} / measured {measured:,}"


def test_vit_decode_estimate_positive_and_grows_with_frames_and_resolution():
    model = resolve("tiny-h3")
    assert not any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.pipeline.vae.decoder.modules())

    def decode(**size):
        request = Request("a red circle", **size).resolved(model.family, model.defaults)
        return estimate_activation(model, request)[0]["video_decode"] - WORKSPACE

    base = decode()
    assert base > 0
    assert decode(frames=model.defaults["frames"] + 51) > base
    assert decode(height=2 * model.defaults["height"], width=2 * model.defaults["width"]) > base
