"""fp8_attention (contract: approximate) on tiny models of head dim 128 under the Triton CPU interpreter (and once on
the torch reference path a CPU takes without it): installs through the attention dispatcher, counts its calls, keeps
the family's prefix rows dense, uninstalls exactly, and refuses what it cannot run."""

import pytest
import torch
from diffusers.models.attention_dispatch import _AttentionBackendRegistry

from workbench import Request, Session
from workbench.accelerations import REGISTRY, fingerprint
from workbench.accelerations.attention import fp8_attention as plugin
from workbench.accelerations.attention.sparse_kernels import block_sparse_attend
from workbench.accelerations.attention.sparse_routing import Call, Router, Settings
from workbench.accelerations.base import Receipt
from workbench.kernels import _runtime
from workbench.kernels.fp8_attention import fp8_attention
from workbench.models import wan

SIZE = {"frames": 9, "height": 128, "width": 192, "steps": 2, "guidance": 1.0}  # 288 tokens, 2 steps x 2 blocks


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _run(session, config, seed: int, steps: int = SIZE["steps"]):
    session.accelerate(config)
    try:
        request = Request("a red circle moves left", seed=seed, **{**SIZE, "steps": steps})
        return session.generate(request, progress=False)
    finally:
        session.accelerate({})


def test_fp8_attention_wan_counts_calls_is_close_to_dense_and_uninstalls_exactly(interpreter, monkeypatch, seed):
    """... close to dense: the latents move by more than 1e-6 relative L2 (fp32 rounding moves them less: the FP8
    calls ran) and by less than 3e-3, over an order under the kernel's own error per call (a few 1e-2, the bounds of
    tests/kernels/test_fp8_attention.py), which reaches the latents only through attention's share of each block's
    residual update. On a CPU outside the interpreter the calls take the kernel's torch reference, which gives the
    kernel's request up to fp32 order and the rare P that exp2's last bit moves across a rounding boundary: under a
    tenth of the FP8 move. Each receipt names its path."""
    session = Session(wan.tiny_d128(), torch.device("cpu"), torch.float32, 0.0)
    before = [fingerprint(d) for d in session.model.denoisers()]
    backends = dict(_AttentionBackendRegistry._backends)
    dense = _run(session, {}, seed)
    fp8 = _run(session, {"fp8_attention": {}}, seed)
    partly = _run(session, {"fp8_attention": {"qk": "e4m3", "pv": "bf16", "dense_blocks": 1}}, seed)
    assert [fingerprint(d) for d in session.model.denoisers()] == before, "uninstall did not restore the model"
    assert _AttentionBackendRegistry._backends == backends
    report = fp8.receipts["fp8_attention"]
    assert report["executed"] and report["fp8_calls"] == 4 and report.get("dense_calls", 0) == 0, report
    assert report["notes"]["pv"] == "fp8" and report["notes"]["qk"] == "int8", report  # the defaults
    assert report.get("protected_rows", 0) == 0, report  # Wan: video rows only
    assert partly.receipts["fp8_attention"]["notes"]["qk"] == "e4m3"
    assert partly.receipts["fp8_attention"]["fp8_calls"] == 2 and partly.receipts["fp8_attention"]["dense_calls"] == 2
    assert not fp8.exact and dense.exact
    err = ((fp8.latents - dense.latents).norm() / dense.latents.norm()).item()
    assert 1e-6 < err < 3e-3, f"fp8 attention moves the latents by {err} (relative L2; allowed: 1e-6 to 3e-3)"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch_ref = _run(session, {"fp8_attention": {}}, seed)
    paths = (report["notes"]["path"], torch_ref.receipts["fp8_attention"]["notes"]["path"])
    assert paths == ("triton kernel", "torch reference") and torch_ref.receipts["fp8_attention"]["fp8_calls"] == 4
    gap = ((torch_ref.latents - fp8.latents).norm() / fp8.latents.norm()).item()
    # a tenth: per call the reference is within 5e-4 relative L2 of the kernel (kernels/fp8_attention.py's contract:
    # fp32 order, and a P that exp2's last bit moves across a rounding boundary) and the default int8 Q.K^T at least
    # 5e-3 from dense attention (tests/kernels/test_fp8_attention.py's lower bound); both reach the latents alike
    assert gap < err / 10, (
        f"the reference path differs from the kernel by {gap} (relative L2; allowed: under err / 10, {err / 10:.1e})"
    )


def test_fp8_attention_stacks_on_a_dense_backend_plugin_which_keeps_the_other_calls(monkeypatch, seed):
    """With a dense-backend plugin (attention_backend here; flash4_attention on the exact-fast profile) the routed
    self-attention still takes the kernel and every other call (Wan's cross-attention) reaches that plugin's backend,
    whatever the config's order; uninstall restores the dispatcher. Two routing plugins still conflict."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the kernel's torch reference: fast, the same routing
    session = Session(wan.tiny_d128(), torch.device("cpu"), torch.float32, 0.0)
    backends = dict(_AttentionBackendRegistry._backends)
    alone = _run(session, {"fp8_attention": {}}, seed)
    stacked = _run(session, {"fp8_attention": {}, "attention_backend": {"backend": "native"}}, seed)
    assert torch.equal(stacked.latents, alone.latents)  # the backend's own function, counted: the same maths
    assert stacked.receipts["fp8_attention"]["fp8_calls"] == 4  # self-attention: 2 blocks x 2 steps
    assert stacked.receipts["attention_backend"]["attention_calls"] == 4  # cross-attention, the same count
    assert _AttentionBackendRegistry._backends == backends and session.accelerations == {}
    for other in ("block_sparse", "attention_policy"):
        with pytest.raises(ValueError, match=rf"'{other}' and 'fp8_attention' both modify attention_processor.routed"):
            session.accelerate({"fp8_attention": {}, other: {}})


@pytest.mark.parametrize("pv", ["bf16", "int8"])
def test_fp8_attention_protected_rows_are_dense_attention(interpreter, seed, pv):
    """Router.run with the plugin's kernel: rows [0, protect) are the backend's dense attention (H3's text /
    conditioning / audio queries with protect_prefix="family"), the rest the low-bit kernel's output at the
    plugin's `pv`."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 150, 2, 128, generator=generator) for _ in range(3))  # dispatcher layout (B, T, H, D)
    backend = _AttentionBackendRegistry._backends[_AttentionBackendRegistry._active_backend]
    receipt = Receipt(("fp8_calls",))
    router = Router("fp8_attention", wan.tiny_d128(), receipt, plugin.fp8_attend, None)
    settings = Settings(tau=0.0, sink_tokens=0, protect_prefix="family", extra={"pv": pv, "qk": "int8"})
    call = Call(router, settings, 0, prefix=40)
    call.kwargs, call.backend_fn = {"query": q, "key": k, "value": v, "attn_mask": None, "scale": None}, backend
    out = router.run(call)
    dense = backend(query=q, key=k, value=v)
    q_, k_, v_ = (x.transpose(1, 2) for x in (q, k, v))
    kernel = fp8_attention(q_, k_, v_, pv=pv, qk="int8").transpose(1, 2)
    assert torch.equal(out[:, :40], dense[:, :40]) and torch.equal(out[:, 40:], kernel[:, 40:])
    assert (out[:, 40:] - dense[:, 40:]).abs().max() > 1e-3  # the other rows really are FP8
    assert receipt.counters["protected_rows"] == 40 and receipt.counters["fp8_calls"] == 1


@pytest.mark.parametrize(
    "attend, q, message",
    [(plugin.fp8_attend, torch.zeros(1, 8, 2, 256), r"fp8_attention: attention of head dim 256 in torch\.float32"),
     (block_sparse_attend, torch.zeros(1, 8, 2, 64, dtype=torch.float16),
      r"block_sparse: attention of head dim 64 in torch\.float16")],
)  # fmt: skip
def test_routed_kernels_refuse_a_call_outside_their_limits(attend, q, message):
    """The shared adapter (`kernel_attend`) refuses a call the plugin's kernel does not take, naming the plugin and
    the kernel's limits, before any kernel runs."""
    router = Router("test", wan.tiny_d128(), Receipt(("sparse_calls",)), attend, None)
    call = Call(router, Settings(extra={"pv": "fp8", "qk": "int8"}), 0, prefix=0)
    call.kwargs = {"query": q, "key": q, "value": q, "scale": None}
    with pytest.raises(RuntimeError, match=rf"^{message} reached the kernel; it supports head dims up to 128 in "):
        attend(call)


def test_fp8_attention_refuses_what_it_cannot_run(monkeypatch):
    session = Session(wan.tiny_d128(), torch.device("cpu"), torch.float32, 0.0)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="fp8_attention.pv"):
        session.accelerate({"fp8_attention": {"pv": "fp4"}})
    with pytest.raises(ValueError, match="fp8_attention.qk"):
        session.accelerate({"fp8_attention": {"qk": "int4"}})
    monkeypatch.setattr(plugin, "MAX_HEAD_DIM", 64)
    with pytest.raises(RuntimeError, match="fp8_attention: the kernel supports head dims up to 64; block 0 has 128"):
        session.accelerate({"fp8_attention": {}})
    with pytest.raises(ValueError, match="cannot be installed together"):
        session.accelerate({"fp8_attention": {}, "block_sparse": {}})
    assert session.accelerations == {} and REGISTRY["fp8_attention"].contract == "approximate"
    assert plugin.unusable(torch.device("cpu")) is None  # the CPU runs the kernel's torch reference
    assert "runs on cuda" in plugin.unusable(torch.device("meta"))
    monkeypatch.setattr(_runtime, "capability", lambda device: 86)
    assert plugin.unusable(torch.device("cuda")) == (
        "FP8 (e4m3) needs compute capability 8.9 or newer (Ada, Hopper); this GPU is sm_86"
    )  # the kernels' own refusal (`_runtime.fp8_problem`)


def test_fp8_attention_h3_keeps_text_and_audio_queries_dense(interpreter, h3_d128, seed):
    """H3 packs [text | audio | video] in one self-attention: with protect_prefix="family" the prefix queries take
    dense attention, so the audio moves only through FP8 video rows: by less than a tenth of what it moves when every
    query runs FP8 (the audio queries' own attention then takes the quantization), yet by something."""
    session = Session(h3_d128(32, 64), torch.device("cpu"), torch.float32, 0.0)
    request = Request("a red circle moves left, low hum", seed=seed)

    def audio_error(config):
        session.accelerate(config)
        try:
            result = session.generate(request, progress=False)
        finally:
            session.accelerate({})
        return result, (torch.as_tensor(result.audio) - dense).norm() / dense.norm()

    dense = torch.as_tensor(session.generate(request, progress=False).audio)
    protected, protected_error = audio_error({"fp8_attention": {}})
    everything, everything_error = audio_error({"fp8_attention": {"protect_prefix": 0}})
    report = protected.receipts["fp8_attention"]
    prefix = report["notes"]["prefix_rows"]
    assert report["fp8_calls"] == 2 and prefix > 0 and report["protected_rows"] == 2 * prefix, report
    assert everything.receipts["fp8_attention"].get("protected_rows", 0) == 0
    assert 0 < protected_error < 0.1 * everything_error, (protected_error, everything_error)


def test_fp8_attention_under_fused_wan_blocks_keeps_the_fused_attention_path(interpreter, seed):
    """A fused block forward takes attn1 through the router's wrapper (sparse_routing.routing): the self-attention
    still reaches the FP8 kernel, and the block keeps its rotary / q-k norm kernels instead of falling back to the
    stock processor (which cost the exact-fast profile its fused q/k path under fp8_attention on the H200).
    fused_block_ops keeps torch's rounding on these fp32 inputs, so its request equals fp8_attention alone."""
    session = Session(wan.tiny_d128(), torch.device("cpu"), torch.float32, 0.0)
    alone = _run(session, {"fp8_attention": {}}, seed, steps=1)  # 1 step x 2 blocks: 2 self-attention calls
    for fused, counter in (("fused_block_ops", "rope_calls"), ("fused_block_norms", "qk_norm_rope_calls")):
        both = _run(session, {"fp8_attention": {}, fused: {}}, seed, steps=1)
        receipt = both.receipts[fused]
        assert receipt[counter] == 4 and not receipt.get("fallbacks"), receipt  # q and k in 2 blocks
        assert both.receipts["fp8_attention"]["fp8_calls"] == 2, both.receipts["fp8_attention"]
        if fused == "fused_block_ops":
            assert torch.equal(both.latents, alone.latents)
        else:
            err = ((both.latents - alone.latents).norm() / alone.latents.norm()).item()
            assert err < 1e-4, f"fused norms move the fp8 request by {err} (relative L2)"


def test_receipts_name_the_cute_kernel_for_every_low_bit_pair_it_serves_on_sm90(interpreter, monkeypatch):
    """On sm_90 with the CuTe DSL, fp8_attention's one-byte P.V modes (fp8 and int8) and block_sparse's low-precision
    pairs of `block_sparse_attend.SM90_PAIRS` run the CuTe kernel (`fp8_attention.sm90_kernel`, `sm90_sparse`): the
    receipt's path says so; bf16 P.V, exact blocks and pairs the CuTe kernel lacks keep the Triton kernel's name.
    Checked on the prepared handles (the kernels' sm90_ready patched true; no call is made)."""
    from workbench.accelerations.attention.sparse_kernels import CUTE, KERNEL
    from workbench.kernels import fp8_attention as kernel
    from workbench.kernels.block_sparse_attend import SM90_PAIRS

    monkeypatch.setattr(kernel, "sm90_ready", lambda device: True)
    model = wan.tiny_d128()
    cases = [("fp8_attention", {"pv": pv}, pv != "bf16") for pv in ("fp8", "int8", "bf16")]
    cases += [("block_sparse", {}, False)]
    cases += [
        ("block_sparse", {"precision": qk, "pv": pv}, (qk, pv) in SM90_PAIRS)
        for qk in ("int8", "e4m3")
        for pv in ("fp8", "int8", "bf16")
    ]
    for name, options, cute in cases:
        handle = REGISTRY[name].prepare(model, options, torch.device("cpu")).activate()
        try:
            named = handle.report()["notes"]["path"]
        finally:
            handle.uninstall()
        assert named.startswith(CUTE) == cute and KERNEL in named, (name, options, named)
