"""Group offloading: refused without CUDA; on CUDA bitwise equal to dense and uninstalled exactly."""

import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import fingerprint

SIZE = {"frames": 9, "height": 32, "width": 32, "steps": 2}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_blocks_per_group": 0}, r"group_offload.num_blocks_per_group: 0 is below the minimum 1"),
        ({"num_blocks_per_group": 1.5}, r"group_offload.num_blocks_per_group: expected int"),
        ({"use_stream": "yes"}, r"group_offload.use_stream: expected bool"),
        ({"prefetch": True}, r"group_offload: unknown option\(s\) \['prefetch'\]"),
    ],
)
def test_bad_option_is_value_error(sessions, options, message):
    with pytest.raises(ValueError, match=message):
        sessions("tiny-wan").accelerate({"group_offload": options})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_refused_without_cuda(sessions):
    session = sessions("tiny-wan")
    before = fingerprint(session.model.pipeline.transformer)
    with pytest.raises(RuntimeError, match=r"group_offload: needs a device of type \('cuda',\)"):
        session.accelerate({"group_offload": {}})
    assert fingerprint(session.model.pipeline.transformer) == before


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{}, {"use_stream": False, "num_blocks_per_group": 2}])
def test_group_offload_bitwise_equal_dense_on_cuda(options, seed):
    session = Session.open("tiny-wan", device="cuda")
    denoisers = session.model.denoisers()
    before = [fingerprint(d) for d in denoisers]
    request = Request("a red circle moves left", seed=seed, **SIZE)
    dense = session.generate(request, progress=False)
    session.accelerate({"group_offload": options})
    try:
        assert next(denoisers[0].blocks[0].parameters()).device.type == "cpu"
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert [fingerprint(d) for d in denoisers] == before, "uninstall did not restore the model exactly"
    assert all(p.device.type == "cuda" for d in denoisers for p in d.parameters())
    receipt = result.receipts["group_offload"]
    assert receipt["executed"] and receipt["onloads"] >= receipt["groups"] > 1
    assert torch.equal(result.latents, dense.latents) and (result.frames == dense.frames).all()


@pytest.mark.gpu
def test_stream_with_several_blocks_per_group_is_refused():
    session = Session.open("tiny-wan", device="cuda")
    with pytest.raises(ValueError, match="must be 1 with use_stream=True"):
        session.accelerate({"group_offload": {"num_blocks_per_group": 2}})


def test_refuses_forwards_computing_from_their_own_weight_copies_only():
    """group_offload moves every denoiser weight: a layer whose forward computes from weight copies of its own (marked
    `own_copy`, as selective_fp8's fused path marks its FP8 forwards) is refused, naming both plugins and the layer,
    before anything moves; cross_kv_cache's forwards, which call the projections' own, are not. Built on the CPU
    without streams: the handle itself, not the plugin's CUDA check."""
    from workbench.accelerations.base import own_copy
    from workbench.accelerations.memory import group_offload

    session = Session.open("tiny-wan", device="cpu")
    denoisers = session.model.denoisers()
    options = {"num_blocks_per_group": 1, "use_stream": False}
    before = fingerprint(denoisers[0])
    layer = denoisers[0].blocks[1].ffn.net[2]
    layer.forward = own_copy(lambda x: x, "selective_fp8")  # never called: refused before a request
    try:
        with pytest.raises(
            RuntimeError,
            match=r"group_offload: selective_fp8's forwards on layers it moves \(denoiser 0: blocks\.1\.ffn\.net\.2\) "
            r"compute from weight copies of their own, not from the weights group_offload moves; install "
            r"group_offload without selective_fp8$",
        ):
            group_offload._Installed(group_offload.SPEC, options, denoisers, torch.device("cpu"))
    finally:
        del layer.forward
    assert fingerprint(denoisers[0]) == before
    session.accelerate({"cross_kv_cache": {}})
    group_offload._Installed(group_offload.SPEC, options, denoisers, torch.device("cpu")).uninstall()
    session.accelerate({})
    assert fingerprint(denoisers[0]) == before


def test_uninstall_frees_the_host_copies_at_once():
    """diffusers' hooks and groups hold each other in reference cycles; uninstall collects them, so the groups' host
    copies of the weights (pinned on CUDA, the whole model) are gone before the next install, even with the
    collector's automatic passes off. Built on the CPU without streams: the handle itself, not the plugin's CUDA check."""
    import gc
    import weakref

    from diffusers.hooks.group_offloading import _GROUP_OFFLOADING

    from workbench.accelerations.memory import group_offload

    session = Session.open("tiny-wan", device="cpu")
    denoisers = session.model.denoisers()
    gc.disable()
    try:
        handle = group_offload._Installed(
            group_offload.SPEC, {"num_blocks_per_group": 1, "use_stream": False}, denoisers, torch.device("cpu")
        )
        hooks = [m._diffusers_hook.get_hook(_GROUP_OFFLOADING) for d in denoisers for m in d.modules()
                 if getattr(m, "_diffusers_hook", None) is not None]  # fmt: skip
        groups = [weakref.ref(hook.group) for hook in hooks if hook is not None]
        del hooks
        assert groups and all(group() is not None for group in groups)
        handle.uninstall()
        assert [group() for group in groups] == [None] * len(groups)
    finally:
        gc.enable()
