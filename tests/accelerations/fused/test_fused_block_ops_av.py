"""fused_block_ops on the audio+video families: LTX-2 and MiniMax-H3 blocks with the in-dtype modulation and
gated-residual kernels equal stock diffusers bit for bit under the Triton CPU interpreter, block by block
(random weights and inputs, bf16 and fp32, several shapes) and over whole tiny-model requests."""

import inspect

import numpy as np
import pytest
import torch
from diffusers import LTX2VideoTransformer3DModel, MiniMaxH3Transformer3DModel
from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

from workbench import Request, Session
from workbench.accelerations import fingerprint
from workbench.accelerations.base import Receipt
from workbench.models.fused import h3 as _fused_h3
from workbench.models.fused import ltx2 as _fused_ltx2
from workbench.models.fused.guards import InDtypeOps

DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["float32", "bfloat16"]


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _randomize(model, dtype, seed):
    """Random tables everywhere (not the near-zero defaults), cast like from_pretrained(torch_dtype=dtype)."""
    torch.manual_seed(seed)
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "scale_shift_table" in name:
                tensor.normal_()
            tensor.data = tensor.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model.eval()


def _capture(model, blocks, call):
    """Every block call's (args, kwargs) during one model forward."""
    seen = []
    hooks = [b.register_forward_pre_hook(lambda m, a, k: seen.append((m, a, k)), with_kwargs=True) for b in blocks]
    try:
        with torch.no_grad():
            out = call()
    finally:
        for hook in hooks:
            hook.remove()
    return seen, out


# ---------------------------------------------------------------- LTX-2


def _ltx2(dtype, seed, cross_attn_mod):
    torch.manual_seed(seed)
    model = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=6,
        audio_cross_attention_dim=12,
        num_layers=2,
        caption_channels=12,
        rope_double_precision=False,
        rope_type="split",
        cross_attn_mod=cross_attn_mod,
        audio_cross_attn_mod=cross_attn_mod,
    )
    return _randomize(model, dtype, seed)


def _ltx2_call(model, dtype, rng, batch, frames, height, width, audio_frames, per_token):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    tokens = frames * height * width

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    timestep = torch.rand(batch, tokens if per_token else 1, generator=g) * 1000
    audio_timestep = torch.rand(batch, audio_frames if per_token else 1, generator=g) * 1000
    kwargs = {
        "hidden_states": randn(batch, tokens, 4),
        "audio_hidden_states": randn(batch, audio_frames, 4),
        "encoder_hidden_states": randn(batch, 7, 12),
        "audio_encoder_hidden_states": randn(batch, 7, 12),
        "timestep": timestep.squeeze(1) if not per_token else timestep,
        "audio_timestep": audio_timestep.squeeze(1) if not per_token else audio_timestep,
        "sigma": timestep.flatten()[:batch] / 1000,
        "audio_sigma": audio_timestep.flatten()[:batch] / 1000,
        "num_frames": frames,
        "height": height,
        "width": width,
        "audio_num_frames": audio_frames,
        "return_dict": False,
    }
    return lambda: model(**kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "shape, cross_attn_mod",
    [((1, 1, 2, 3, 5, False), False), ((2, 3, 2, 2, 7, True), False), ((1, 2, 3, 2, 9, False), True)],
)
def test_fused_block_ops_ltx2_block_rounding_equal_stock(interpreter, rng, dtype, shape, cross_attn_mod):
    seed = int(rng.integers(2**31))
    model = _ltx2(dtype, seed, cross_attn_mod)
    blocks = list(model.transformer_blocks)
    seen, _ = _capture(model, blocks, _ltx2_call(model, dtype, rng, *shape))
    assert len(seen) == 2
    for block, args, kwargs in seen:
        receipt = Receipt(("adaln_modulate_calls",))
        with torch.no_grad():
            want = block(*args, **kwargs)
            got = _fused_ltx2.forward_for(block, receipt, {})(*args, **kwargs)
        for name, g, w in zip(("video", "audio"), got, want, strict=True):
            assert g.dtype == w.dtype == dtype
            assert torch.equal(g, w), f"seed {seed} {name}: {(g != w).sum()} of {g.numel()} elements differ"
        # per stream: self-attention, a2v, v2a, FFN modulations; self-attention, cross-modal, FFN residuals;
        # with cross_attn_mod also the text query and key/value modulations and the gated text residual
        extra = 2 if cross_attn_mod else 0
        assert receipt.counters["adaln_modulate_calls"] == 2 * (4 + extra), f"seed {seed}"
        assert receipt.counters["gated_residual_calls"] == 2 * (3 + extra // 2), f"seed {seed}"
        assert receipt.fallbacks == {} and receipt.counters["blocks_fused"] == 1


def test_fused_block_ops_ltx2_glue_is_not_one_rounding(interpreter, rng):
    """LTX-2 rounds every op to bf16. On inputs where computing the modulation glue in fp32 and rounding once gives
    another value (checked first, so the comparison below can tell the two orders apart), the fused block still
    equals stock bit for bit: it rounds as stock does."""
    seed = int(rng.integers(2**31))
    model = _ltx2(torch.bfloat16, seed, False)
    seen, _ = _capture(model, model.transformer_blocks[:1], _ltx2_call(model, torch.bfloat16, rng, 1, 2, 3, 3, 9, True))
    block, args, kwargs = seen[0]
    with torch.no_grad():
        n = block.norm1(kwargs["hidden_states"])
        shift, scale = block.get_mod_params(block.scale_shift_table, kwargs["temb"], n.shape[0])[:2]
        once = (n.float() * (1 + scale.float()) + shift.float()).to(torch.bfloat16)
        assert not torch.equal(once, n * (1 + scale) + shift), f"seed {seed}: inputs do not separate the orders"
        receipt = Receipt(("adaln_modulate_calls",))
        got = _fused_ltx2.forward_for(block, receipt, {})(*args, **kwargs)
        want = block(*args, **kwargs)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), f"seed {seed}"
    assert receipt.counters["adaln_modulate_calls"] > 0 and receipt.fallbacks == {}


def test_fused_block_ops_ltx2_knows_the_stock_signature():
    stock = list(inspect.signature(LTX2VideoTransformerBlock.forward).parameters)[1:]
    assert list(_fused_ltx2.PARAMETERS) == stock


def test_fused_block_ops_ltx2_grad_mode_runs_stock_with_reason(interpreter, rng):
    seed = int(rng.integers(2**31))
    model = _ltx2(torch.float32, seed, False)
    seen, _ = _capture(model, model.transformer_blocks[:1], _ltx2_call(model, torch.float32, rng, 1, 1, 2, 2, 5, False))
    block, args, kwargs = seen[0]
    receipt = Receipt(("adaln_modulate_calls",))
    got = _fused_ltx2.forward_for(block, receipt, {})(*args, **kwargs)  # grad mode on: parameters require grad
    want = block(*args, **kwargs)
    assert all(torch.equal(g, w) and g.requires_grad for g, w in zip(got, want, strict=True)), f"seed {seed}"
    assert receipt.fallbacks == {"autograd: the kernels have no backward": 1} and not receipt.executed


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_block_ops_odd_operands_run_torch_and_are_counted(interpreter, rng, dtype):
    # a call the in-dtype kernels cannot take runs the stock expression (same value) and names its reason
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    n = torch.randn(2, 5, 8, generator=g).to(dtype)
    scale, shift = torch.randn(2, 1, 8, generator=g).to(dtype), torch.randn(2, 1, 8, generator=g).to(dtype)
    receipt = Receipt(("adaln_modulate_calls",))
    ops = InDtypeOps(receipt)
    mixed = ops.modulate(n, scale.double(), shift.double())
    assert torch.equal(mixed, n * (1 + scale.double()) + shift.double())
    wide = ops.modulate(n, scale[:, :, None], shift[:, :, None])  # would broadcast to (2, 2, 5, 8)
    assert torch.equal(wide, n * (1 + scale[:, :, None]) + shift[:, :, None])
    assert torch.equal(ops.residual(n, n.double(), scale), n + n.double() * scale)
    assert torch.equal(ops.residual(n, n, scale), n + n * scale)  # this one runs the kernel
    assert receipt.fallbacks == {
        f"adaln_modulate: mixed dtypes {dtype} and torch.float64": 1,
        "adaln_modulate: modulation of shape (2, 1, 1, 8) for hidden states (2, 5, 8)": 1,
        "gated_residual: branch output of shape (2, 5, 8) and dtype torch.float64": 1,
    }
    assert receipt.counters["gated_residual_calls"] == 1 and receipt.counters["adaln_modulate_calls"] == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_block_ops_ltx2_full_request_equal_dense(interpreter, rng, dtype):
    session = Session.open("tiny-ltx2", device="cpu", dtype=dtype)
    seed = int(rng.integers(2**20))
    request = Request("a red circle moves left", seed=seed, steps=2, frames=9, height=32, width=32)
    dense = session.generate(request, progress=False)
    before = fingerprint(session.model.pipeline.transformer)
    session.accelerate({"fused_block_ops": {}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(session.model.pipeline.transformer) == before, "uninstall did not restore the model"
    assert torch.equal(result.latents, dense.latents), f"seed {seed}"
    assert np.array_equal(result.frames, dense.frames) and np.array_equal(result.audio, dense.audio), f"seed {seed}"
    receipt = result.receipts["fused_block_ops"]
    assert receipt["executed"] and receipt["fallbacks"] == {} and result.exact
    # tiny-ltx2: 2 blocks x 2 steps (CFG branches batched in one call); 8 modulations, 6 gated residuals per block
    assert receipt["blocks_fused"] == 4 and receipt["adaln_modulate_calls"] == 32
    assert receipt["gated_residual_calls"] == 24 and receipt.get("rope_calls", 0) == 0


# ---------------------------------------------------------------- MiniMax-H3


def _h3(dtype, seed):
    torch.manual_seed(seed)
    model = MiniMaxH3Transformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        hidden_size=24,
        num_layers=2,
        num_refiner_layers=1,
        ffn_dim=40,
        in_channels=4,
        audio_in_channels=4,
        patch_size=(1, 2, 2),
        text_dim=12,
        freq_dim=8,
        time_embed_hidden_dim=24,
        time_embed_dim=16,
        rope_freq_dim=2,
    )
    return _randomize(model, dtype, seed)


def _h3_call(model, dtype, rng, batch, video, audio, text, timesteps):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    total = video + audio + text
    order = torch.randperm(total, generator=g)
    video_indices, audio_indices, text_indices = order[:video], order[video : video + audio], order[video + audio :]
    tags = torch.empty(total, dtype=torch.long)
    tags[video_indices], tags[audio_indices], tags[text_indices] = 0, 2, 1
    kwargs = {
        "hidden_states": torch.randn(batch, video, 16, generator=g),
        "audio_hidden_states": torch.randn(batch, audio, 4, generator=g),
        "encoder_hidden_states": torch.randn(batch, text, 12, generator=g).to(dtype),
        "timestep": torch.rand(timesteps, generator=g),
        "timestep_indices": torch.randint(0, timesteps, (total,), generator=g),
        "token_tags": tags,
        "position_ids": torch.randint(0, 9, (total, 3), generator=g),
        "video_indices": video_indices,
        "audio_indices": audio_indices,
        "text_indices": text_indices,
        "return_dict": False,
    }
    return lambda: model(**kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(1, 3, 2, 2, 1), (2, 11, 5, 4, 2), (1, 29, 13, 6, 3)])
def test_fused_block_ops_h3_block_rounding_equal_stock(interpreter, rng, dtype, shape):
    seed = int(rng.integers(2**31))
    model = _h3(dtype, seed)
    seen, _ = _capture(model, list(model.transformer_blocks), _h3_call(model, dtype, rng, *shape))
    assert len(seen) == 2
    for block, args, kwargs in seen:
        receipt = Receipt(("adaln_modulate_calls",))
        with torch.no_grad():
            want = block(*args, **kwargs)
            got = _fused_h3.forward_for(block, receipt, {})(*args, **kwargs)
        assert got.dtype == want.dtype == dtype
        assert torch.equal(got, want), f"seed {seed}: {(got != want).sum()} of {got.numel()} elements differ"
        assert receipt.counters["adaln_modulate_calls"] == 2 and receipt.counters["gated_residual_calls"] == 2
        assert receipt.fallbacks == {}


def test_fused_block_ops_h3_out_of_range_index_runs_stock_and_raises_as_stock(interpreter, rng):
    seed = int(rng.integers(2**31))
    model = _h3(torch.float32, seed)
    seen, _ = _capture(model, model.transformer_blocks[:1], _h3_call(model, torch.float32, rng, 1, 3, 2, 2, 1))
    block, (hidden, temb, indices, rotary), _ = seen[0]
    bad = indices.clone()
    bad[-1] = 3 * temb.shape[0]  # one past the table
    receipt = Receipt(("adaln_modulate_calls",))
    with torch.no_grad(), pytest.raises(IndexError):
        _fused_h3.forward_for(block, receipt, {})(hidden, temb, bad, rotary)
    assert receipt.fallbacks == {"adaln_indices out of range of the modulation table": 1}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_block_ops_h3_full_request_equal_dense(interpreter, rng, dtype):
    session = Session.open("tiny-h3", device="cpu", dtype=dtype)
    seed = int(rng.integers(2**20))
    request = Request("a red circle moves left, low hum", seed=seed, steps=3)
    dense = session.generate(request, progress=False)
    before = fingerprint(session.model.pipeline.transformer)
    session.accelerate({"fused_block_ops": {}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(session.model.pipeline.transformer) == before, "uninstall did not restore the model"
    assert torch.equal(result.latents, dense.latents), f"seed {seed}"
    assert np.array_equal(result.frames, dense.frames) and np.array_equal(result.audio, dense.audio), f"seed {seed}"
    receipt = result.receipts["fused_block_ops"]
    assert receipt["executed"] and receipt["fallbacks"] == {} and result.exact
    # tiny-h3: 2 blocks x 2 transformer calls (3 steps), two modulations and two gated residuals each
    assert receipt["blocks_fused"] == 4 and receipt["adaln_modulate_calls"] == 8
    assert receipt["gated_residual_calls"] == 8


def test_fused_block_ops_composes_with_teacache_on_h3(interpreter, rng, sessions):
    # teacache hooks the fused forwards; at threshold 0 the pair is dense bit for bit and uninstalls cleanly
    session = sessions("tiny-h3")
    seed = int(rng.integers(2**20))
    request = Request("a red circle moves left, low hum", seed=seed, steps=3)
    dense = session.generate(request, progress=False)
    before = fingerprint(session.model.pipeline.transformer)
    session.accelerate({"fused_block_ops": {}, "teacache": {"rel_l1_thresh": 0.0}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(session.model.pipeline.transformer) == before, "uninstall did not restore the model"
    assert torch.equal(result.latents, dense.latents) and np.array_equal(result.audio, dense.audio), f"seed {seed}"
    assert result.receipts["fused_block_ops"]["blocks_fused"] == 4
    assert result.receipts["teacache"]["computed"] == 2
