"""block_sparse on H3 (packed joint self-attention, family-supplied prefix) and LTX-2 (video stream), under the
Triton CPU interpreter, with tiny models of one attention head of dim 128 (what the kernel takes).

Also the family adapters' layout functions: where the text / conditioning / audio rows sit.
"""

import pytest
import torch
from diffusers import LTX2VideoTransformer3DModel

from workbench import Request, Session
from workbench.accelerations import fingerprint
from workbench.models import h3, ltx2, wan
from workbench.models.loaded import LoadedModel


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _ltx2_d128(seed: int = 0) -> LoadedModel:
    pipe = ltx2.tiny_pipeline(seed)
    torch.manual_seed(seed + 11)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=1,
        attention_head_dim=128,
        cross_attention_dim=128,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        caption_channels=ltx2.TEXT_HIDDEN,
        rope_double_precision=False,
        rope_type="split",
    ).eval()
    pipe.register_modules(transformer=transformer)
    defaults = {**ltx2.TINY_DEFAULTS, "frames": 1, "height": 32, "width": 32}  # 256 video rows: 4 blocks
    return LoadedModel("tiny-ltx2-d128", ltx2.FAMILY, pipe, defaults, dict(ltx2.TINY_CALL))


def _layouts(session):
    """(sequence rows, text rows, audio rows, video rows) of each H3 transformer call, read from its arguments."""
    seen = []

    def hook(module, args, kwargs):
        seen.append(
            (kwargs["position_ids"].shape[0], *(kwargs[f"{m}_indices"].numel() for m in ("text", "audio", "video")))
        )

    return seen, session.model.pipeline.transformer.register_forward_pre_hook(hook, with_kwargs=True)


def _generate(session, config, **fields):
    session.accelerate(config)
    try:
        result = session.generate(Request("a red circle moves left, low hum", seed=4, **fields), progress=False)
    finally:
        session.accelerate({})
    return result


def test_block_sparse_h3_all_exact_close_to_dense_prefix_is_text_and_audio(interpreter, h3_d128):
    h3_session = Session(h3_d128(32, 64), torch.device("cpu"), torch.float32, 0.0)
    before = fingerprint(h3_session.model.pipeline.transformer)
    seen, handle = _layouts(h3_session)
    try:
        dense = _generate(h3_session, {})
        sparse = _generate(h3_session, {"block_sparse": {"tau": -1e9}})
    finally:
        handle.remove()
    assert fingerprint(h3_session.model.pipeline.transformer) == before, "uninstall did not restore H3"
    rows, text, audio, video = seen[-1]
    assert rows == text + audio + video  # t2va: no keyframe rows
    report = sparse.receipts["block_sparse"]
    assert report["notes"]["prefix_rows"] == text + audio, (report, seen[-1])
    assert report["notes"]["mean_density"] == 1.0 and report["sparse_calls"] == 2, report
    assert report["protected_rows"] == 2 * (text + audio), report  # protect_prefix="family" by default
    assert not sparse.exact and dense.exact
    for name, a, b in (("latents", sparse.latents, dense.latents), ("audio", sparse.audio, dense.audio)):
        err = (torch.as_tensor(a) - torch.as_tensor(b)).abs().max().item()
        assert err < 1e-5, f"all-exact block_sparse moves H3 {name} by {err}"


def test_block_sparse_h3_sparse_video_rows_with_family_sink(interpreter, h3_d128):
    """Large tau: only the band and the sink (text + audio key blocks) stay exact, so video rows are sparse."""
    h3_session = Session(h3_d128(64, 128), torch.device("cpu"), torch.float32, 0.0)
    sparse = _generate(h3_session, {"block_sparse": {"tau": 1e9, "protect_prefix": 0}})
    report = sparse.receipts["block_sparse"]
    assert report["sparse_calls"] == 2 and report.get("protected_rows", 0) == 0, report
    assert report["notes"]["mean_density"] < 1.0, report
    no_sink = _generate(h3_session, {"block_sparse": {"tau": 1e9, "protect_prefix": 0, "sink_tokens": 0}})
    assert no_sink.receipts["block_sparse"]["notes"]["mean_density"] < report["notes"]["mean_density"]


def test_h3_target_video_start_from_packed_layout():
    # [text 5 | keyframe 2 | audio 4 | target video 9]: the target video starts at 11
    video = torch.cat([torch.arange(5, 7), torch.arange(11, 20)])
    kwargs = {"position_ids": torch.zeros(20, 3), "video_indices": video[torch.randperm(video.numel())]}
    assert h3.target_video_start((), kwargs) == 11
    kwargs["video_indices"] = torch.arange(5, 9)  # the sequence ends with audio rows: no target video at the end
    with pytest.raises(RuntimeError, match="does not end with video rows"):
        h3.target_video_start((), kwargs)
    with pytest.raises(RuntimeError, match="position_ids"):
        h3.target_video_start((), {})


def test_families_name_their_self_attention():
    assert wan.FAMILY.self_attention.prefix_rows((), {}) == 0
    assert ltx2.FAMILY.self_attention.prefix_rows((), {}) == 0
    model = wan.tiny(0)
    modules = wan.FAMILY.self_attention.modules(model.pipeline.transformer)
    assert modules == [block.attn1 for block in model.pipeline.transformer.blocks]
    h3_modules = h3.FAMILY.self_attention.modules(h3.tiny(0).pipeline.transformer)
    assert all(type(m).__name__ == "MiniMaxH3Attention" for m in h3_modules) and len(h3_modules) == 2


def test_block_sparse_ltx2_video_self_attention(interpreter):
    session = Session(_ltx2_d128(), torch.device("cpu"), torch.float32, 0.0)
    dense = _generate(session, {})
    exact = _generate(session, {"block_sparse": {"tau": -1e9}})
    sparse = _generate(session, {"block_sparse": {"tau": 1e9}})
    report = exact.receipts["block_sparse"]
    assert report["sparse_calls"] == 4 and report["notes"] == {
        "prefix_rows": 0,
        "mean_density": 1.0,
        "video_tokens": [256],
        "path": "triton kernel",
    }, report
    for name in ("latents", "audio"):
        err = (torch.as_tensor(getattr(exact, name)) - torch.as_tensor(getattr(dense, name))).abs().max().item()
        assert err < 1e-5, f"all-exact block_sparse moves LTX-2 {name} by {err}"
    assert sparse.receipts["block_sparse"]["notes"]["mean_density"] < 1.0
    assert not torch.equal(sparse.latents, dense.latents)
