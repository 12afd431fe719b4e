"""block_sparse (contract: approximate) on a tiny Wan of head dim 128 under the Triton CPU interpreter.

tiny-wan has head dim 16, which the kernel refuses; these tests build one head of 128 instead. 128x192
frames give 8x12 tokens per latent frame; 9 frames give 3 latent frames: 288 tokens, 5 blocks of 64.
"""

import pytest
import torch
from diffusers import WanTransformer3DModel

from workbench import Request, Session
from workbench.accelerations import REGISTRY, fingerprint
from workbench.models import wan
from workbench.models.loaded import LoadedModel

SIZE = {"frames": 9, "height": 128, "width": 192, "steps": 2, "guidance": 1.0}  # guidance 1: no CFG pass


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _tiny_d128(seed: int = 0) -> LoadedModel:
    pipe = wan.tiny_pipeline(seed)
    torch.manual_seed(seed + 2)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=1,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=wan.TINY_TEXT_DIM,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        cross_attn_norm=True,
        rope_max_seq_len=32,
    ).eval()
    pipe.register_modules(transformer=transformer)
    return LoadedModel("tiny-wan-d128", wan.FAMILY, pipe, dict(wan.TINY_DEFAULTS), {"max_sequence_length": 32})


@pytest.fixture(scope="module")
def session():
    return Session(_tiny_d128(), torch.device("cpu"), torch.float32, 0.0)


def _run(session, config, seed=3):
    session.accelerate(config)
    try:
        result = session.generate(Request("a red circle moves left", seed=seed, **SIZE), progress=False)
        report = session._handles[0].report() if config else None
    finally:
        session.accelerate({})
    return result, report


def test_block_sparse_all_exact_close_to_dense_and_uninstall_restores(interpreter, session):
    before = [fingerprint(d) for d in session.model.denoisers()]
    dense, _ = _run(session, {})
    sparse, report = _run(session, {"block_sparse": {"tau": -1e9}})
    assert [fingerprint(d) for d in session.model.denoisers()] == before, "uninstall did not restore the model"
    assert report["sparse_calls"] == 4 and report["notes"]["mean_density"] == 1.0, report
    err = (sparse.latents.float() - dense.latents.float()).abs().max().item()
    assert err < 1e-3, f"all-exact block_sparse differs from dense by {err}"


def test_block_sparse_large_tau_is_sparse(interpreter, session):
    _, report = _run(session, {"block_sparse": {"tau": 1e9, "protect_prefix": 10}})
    assert report["executed"] and report["sparse_calls"] == 4 and report.get("dense_calls", 0) == 0, report
    assert report["notes"]["mean_density"] < 1.0, report
    assert report["protected_rows"] == 4 * 10, report


def test_block_sparse_dense_steps_and_blocks_count_dense(interpreter, session):
    _, report = _run(session, {"block_sparse": {"tau": 1.0, "dense_steps": 1, "dense_blocks": 1}})
    # 2 steps x 2 blocks: step 0 dense (2 calls), step 1 block 0 dense, step 1 block 1 sparse
    assert report["sparse_calls"] == 1 and report["dense_calls"] == 3, report
    assert report["dense_step_calls"] == 2 and report["dense_block_calls"] == 1, report


def test_block_sparse_refuses_head_dim_16(interpreter):
    tiny = Session.open("tiny-wan", device="cpu")
    with pytest.raises(RuntimeError, match="head dim 128"):
        tiny.accelerate({"block_sparse": {}})
    assert tiny.accelerations == {}


def test_block_sparse_cpu_without_interpreter_raises(monkeypatch, session):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        session.accelerate({"block_sparse": {}})


def test_block_sparse_bad_option_raises(session):
    with pytest.raises(ValueError, match="block_sparse.sink_tokens"):
        session.accelerate({"block_sparse": {"sink_tokens": -1}})
    with pytest.raises(ValueError, match="block_sparse.dense_steps"):
        session.accelerate({"block_sparse": {"dense_steps": 1.5}})
    with pytest.raises(ValueError, match="cannot be installed together"):
        session.accelerate({"block_sparse": {}, "attention_backend": {"backend": "native"}})
    assert REGISTRY["block_sparse"].contract == "approximate"
