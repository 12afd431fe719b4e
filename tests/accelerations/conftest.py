"""Fixtures the plugin tests of several kinds share."""

import json

import pytest
import torch
from diffusers import MiniMaxH3Transformer3DModel

from workbench.accelerations.attention import attention_policy
from workbench.models import h3
from workbench.models.loaded import LoadedModel


def _h3_d128(height: int, width: int, seed: int = 0) -> LoadedModel:
    """tiny-h3 with one head of 128 on a `height` x `width` canvas: 32x64 packs 433 text + audio rows and 74 target
    video rows (8 blocks), 64x128 packs 296 video rows (12 blocks)."""
    components = h3.tiny_components(seed)
    torch.manual_seed(seed + 11)
    components["transformer"] = MiniMaxH3Transformer3DModel(
        num_attention_heads=1,
        attention_head_dim=128,
        hidden_size=24,
        num_layers=2,
        num_refiner_layers=1,
        ffn_dim=32,
        in_channels=4,
        audio_in_channels=4,
        patch_size=(1, 2, 2),
        text_dim=h3.TEXT_HIDDEN,
        freq_dim=8,
        time_embed_hidden_dim=24,
        time_embed_dim=16,
        rope_freq_dim=2,
    ).eval()
    pipeline = h3.assemble(components, canvas_short_edge=min(height, width), canvas_max_pixels=height * width)
    defaults = {**h3.TINY_DEFAULTS, "height": height, "width": width, "steps": 2}  # one transformer call
    return LoadedModel("tiny-h3-d128", h3.FAMILY, pipeline, defaults, {})


@pytest.fixture
def h3_d128():
    """`_h3_d128(height, width, seed=0)`: tiny-h3 with one attention head of dim 128 (what the sparse kernel takes)."""
    return _h3_d128


@pytest.fixture
def qualified_registry(tmp_path):
    """`make(session, verdict="qualified", video_tokens=288, device=None, options=None, candidate=None)`: the path of
    an attention_policy registry with one block_sparse entry (`options`, default tau 1e9) for this session's family,
    device and model at `video_tokens` rows, backed by a qualification record written beside it (its `verdict`,
    `candidate`: what attention_policy checks). Each call writes its own files."""

    def make(session, verdict="qualified", video_tokens=288, device=None, options=None, candidate=None) -> str:
        folder = tmp_path / f"registry{len(list(tmp_path.glob('registry*')))}"
        folder.mkdir()
        options = options or {"tau": 1e9}
        device = device or attention_policy.device_name(session.device)
        key = attention_policy.model_key(session.model)
        record = {"kind": "qualification", "verdict": verdict, "candidate": candidate or {"block_sparse": options},
                  "device": {"name": device}, "model_key": key}  # fmt: skip
        (folder / "record.json").write_text(json.dumps(record))
        entry = {"family": session.model.family.name, "device": device, "model_key": key,
                 "video_tokens": video_tokens, "plugin": "block_sparse", "options": options,
                 "evidence": str(folder / "record.json")}  # fmt: skip
        (folder / "registry.json").write_text(json.dumps({"version": 1, "entries": [entry]}))
        return str(folder / "registry.json")

    return make
