"""The block ring: bitwise equal to the resident model, its schedule counted, uninstalled exactly, fails closed."""

import pytest
import torch

from workbench import Request
from workbench.accelerations import fingerprint
from workbench.accelerations.memory.ring import module_bytes, streamed_positions

REQUEST = {"tiny-wan": {"height": 32, "width": 32}, "tiny-h3": {}}


def test_streamed_positions_spread_among_resident():
    assert streamed_positions(8, 4) == [1, 3, 5, 7] and streamed_positions(8, 1) == [7]
    assert streamed_positions(5, 5) == [0, 1, 2, 3, 4] and streamed_positions(3, 0) == []


@pytest.mark.parametrize("name", sorted(REQUEST))
def test_block_ring_bitwise_equal_resident(sessions, name):
    session = sessions(name)
    denoiser = session.model.pipeline.transformer
    blocks = session.family.blocks(denoiser)
    before = fingerprint(denoiser)
    request = Request("a red circle moves left", seed=4, **REQUEST[name])
    resident = session.generate(request, progress=False)
    forwards = []
    counting = denoiser.register_forward_pre_hook(lambda *_: forwards.append(1))
    session.accelerate({"block_ring": {"resident_blocks": len(blocks) - 1}})
    try:
        ringed = session.generate(request, progress=False)
    finally:
        session.accelerate({})
        counting.remove()
    assert fingerprint(denoiser) == before, "uninstall did not restore the denoiser exactly"
    assert torch.equal(ringed.latents, resident.latents) and (ringed.frames == resident.frames).all()
    assert resident.audio is None or (ringed.audio == resident.audio).all()
    receipt = ringed.receipts["block_ring"]
    streamed = streamed_positions(len(blocks), 1)
    assert receipt["notes"]["streamed_blocks"] == {"transformer": streamed}
    assert receipt["blocks_streamed"] == receipt["prefetched"] == receipt["released"] == len(forwards) > 0
    assert receipt["bytes_moved"] == len(forwards) * module_bytes(blocks[streamed[0]]) and "late" not in receipt


def test_block_ring_bad_option_raises(sessions):
    session = sessions("tiny-wan")
    with pytest.raises(ValueError, match=r"block_ring.resident_blocks: 3 is more than transformer's 2 blocks"):
        session.accelerate({"block_ring": {"resident_blocks": 3}})
    with pytest.raises(ValueError, match=r"block_ring.resident_blocks: -1 is below the minimum 0"):
        session.accelerate({"block_ring": {"resident_blocks": -1}})


def test_block_ring_refuses_weights_replaced_after_install(sessions):
    session = sessions("tiny-wan")
    session.accelerate({"block_ring": {"resident_blocks": 0}})
    block = session.family.blocks(session.model.pipeline.transformer)[0]
    original = block.ffn.net[2].weight
    try:
        block.ffn.net[2].weight = torch.nn.Parameter(original.detach().clone(), requires_grad=False)
        with pytest.raises(RuntimeError, match=r"block_ring: the weights of streamed block WanTransformerBlock"):
            session.generate(Request("p", height=32, width=32), progress=False)
    finally:
        block.ffn.net[2].weight = original
        session.accelerate({})


@pytest.mark.gpu
def test_block_ring_bitwise_equal_resident_on_cuda():
    from workbench import Session

    session = Session.open("tiny-wan", device="cuda")
    denoiser = session.model.pipeline.transformer
    blocks = session.family.blocks(denoiser)
    before = fingerprint(denoiser)
    request = Request("a red circle moves left", seed=5, height=32, width=32)
    resident = session.generate(request, progress=False)
    session.accelerate({"block_ring": {"resident_blocks": 1}})
    try:
        streamed = next(blocks[1].parameters())
        assert streamed.device.type == "cpu" and streamed.is_pinned()
        bases = {p.untyped_storage().data_ptr() for b in blocks[1:] if b is not blocks[0] for p in b.parameters()
                 if p.device.type == "cpu"}  # fmt: skip
        assert len(bases) == 1, "the streamed weights are views of one pinned buffer"
        assert next(blocks[0].parameters()).device.type == "cuda"
        ringed = session.generate(request, progress=False)
        assert next(blocks[1].parameters()).device.type == "cpu", "a streamed block stayed on the device"
    finally:
        session.accelerate({})
    assert fingerprint(denoiser) == before and all(p.device.type == "cuda" for p in denoiser.parameters())
    assert ringed.receipts["block_ring"]["blocks_streamed"] > 0 and "late" not in ringed.receipts["block_ring"]
    assert torch.equal(ringed.latents, resident.latents) and (ringed.frames == resident.frames).all()
