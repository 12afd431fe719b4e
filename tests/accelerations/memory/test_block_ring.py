"""The block ring: bitwise equal to the resident model, its schedule counted, its streamed blocks taking turns in fixed
device slots, uninstalled exactly, fails closed. Its FP8 transfers (fp8_ring): equal to the resident model on the FP8
round trip of the streamed matrices, their bytes counted, the round trip's error bounded."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import Request
from workbench.accelerations import fingerprint
from workbench.accelerations.base import Receipt
from workbench.accelerations.memory.ring import (
    RING_IN_FLIGHT,
    Ring,
    RowwiseFP8,
    Slots,
    chunk_layout,
    dequantize,
    module_bytes,
    pin_on_host,
    quantize_rows,
    store_on_host,
    streamed_positions,
    tensors_of,
)
from workbench.kernels.fp8_rowwise import EPS, FP8_MAX
from workbench.kernels.fp8_rowwise import reference as fp8_reference

REQUEST = {"tiny-wan": {"height": 32, "width": 32}, "tiny-h3": {}}


def test_streamed_positions_spread_among_resident():
    assert streamed_positions(8, 4) == [1, 3, 5, 7] and streamed_positions(8, 1) == [7]
    assert streamed_positions(5, 5) == [0, 1, 2, 3, 4] and streamed_positions(3, 0) == []


def _ringed(session, request, config) -> tuple:
    """`request` generated with `config` installed (uninstalled after), and the denoiser forwards it ran."""
    forwards = []
    counting = session.model.pipeline.transformer.register_forward_pre_hook(lambda *_: forwards.append(1))
    session.accelerate(config)
    try:
        return session.generate(request, progress=False), len(forwards)
    finally:
        session.accelerate({})
        counting.remove()


@pytest.mark.parametrize("name", sorted(REQUEST))
def test_block_ring_bitwise_equal_resident(sessions, name, seed):
    session = sessions(name)
    denoiser = session.model.pipeline.transformer
    blocks = session.family.blocks(denoiser)
    before = fingerprint(denoiser)
    request = Request("a red circle moves left", seed=seed, **REQUEST[name])
    resident = session.generate(request, progress=False)
    ringed, forwards = _ringed(session, request, {"block_ring": {"resident_blocks": len(blocks) - 1}})
    assert fingerprint(denoiser) == before, "uninstall did not restore the denoiser exactly"
    assert torch.equal(ringed.latents, resident.latents) and (ringed.frames == resident.frames).all()
    assert resident.audio is None or (ringed.audio == resident.audio).all()
    receipt = ringed.receipts["block_ring"]
    streamed = streamed_positions(len(blocks), 1)
    assert receipt["notes"]["streamed_blocks"] == {"transformer": streamed}
    assert receipt["blocks_streamed"] == receipt["prefetched"] == receipt["released"] == forwards > 0
    assert receipt["bytes_moved"] == forwards * module_bytes(blocks[streamed[0]]) and "late" not in receipt


@pytest.mark.parametrize("ring", ["block_ring", "fp8_ring"])
def test_a_ring_with_cross_kv_cache_equals_the_ring_alone(sessions, ring):
    """cross_kv_cache's wrappers on the streamed blocks' K/V projections call the projections' own forwards, which read
    the weights the ring moves: the pair installs and gives exactly the ring's output, the cache hitting."""
    session = sessions("tiny-wan")
    request = Request("a red circle moves left", seed=4, height=32, width=32)
    alone, _ = _ringed(session, request, {ring: {"resident_blocks": 0}})
    both, _ = _ringed(session, request, {ring: {"resident_blocks": 0}, "cross_kv_cache": {}})
    assert torch.equal(both.latents, alone.latents) and (both.frames == alone.frames).all()
    assert both.receipts["cross_kv_cache"]["hits"] > 0 and both.receipts[ring]["blocks_streamed"] > 0


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


def _linear_weights(blocks: list[torch.nn.Module]) -> list[torch.Tensor]:
    """The Linear layers' weight matrices of `blocks`: what an FP8 transfer moves as FP8."""
    return [m.weight for block in blocks for m in block.modules() if isinstance(m, torch.nn.Linear)]


def _fp8_bytes(block: torch.nn.Module) -> int:
    """What one FP8 transfer of `block` moves: a byte per element and a float32 scale per row of each Linear weight,
    every other tensor (modulation tables included) as stored."""
    fp8 = {id(w) for w in _linear_weights([block])}
    return sum(t.numel() + 4 * t.shape[0] if id(t) in fp8 else t.numel() * t.element_size() for t in tensors_of(block))


def test_fp8_ring_equals_resident_on_round_tripped_matrices(sessions, seed):
    """fp8_ring streaming both of tiny-wan's blocks gives exactly (torch.equal) the resident model's output once the
    streamed blocks' matrices are replaced by their FP8 round trip (`quantize_rows` -> `dequantize`), and not the
    unquantized output; it is approximate (the Result is not exact), its bytes moved are the FP8 bytes and scales plus
    the tensors moved as stored, per forward; uninstall gives back the original weights exactly (kept on the host)."""
    _check_fp8_ring(sessions("tiny-wan"), seed)


@pytest.mark.gpu
def test_fp8_ring_equals_resident_on_round_tripped_matrices_on_cuda(seed):
    """The same on CUDA: the FP8 copies staged and dequantized on the ring's side stream give the round trip exactly,
    and a ringed request makes no more device allocations than the resident one."""
    from workbench import Session

    session = Session.open("tiny-wan", device="cuda")
    request = Request("a red circle moves left", seed=seed, height=32, width=32)

    def allocations() -> int:
        start = torch.cuda.memory_stats()["allocation.all.allocated"]
        session.generate(request, progress=False)
        return torch.cuda.memory_stats()["allocation.all.allocated"] - start

    resident = allocations()
    _check_fp8_ring(session, seed)
    session.accelerate({"fp8_ring": {"resident_blocks": 0}})
    try:
        assert allocations() == resident, "the FP8 ring allocated device memory during a request"
    finally:
        session.accelerate({})


def _check_fp8_ring(session, seed: int) -> None:
    denoiser = session.model.pipeline.transformer
    blocks = session.family.blocks(denoiser)
    before = fingerprint(denoiser)
    request = Request("a red circle moves left", seed=seed, height=32, width=32)
    resident = session.generate(request, progress=False)
    matrices = _linear_weights(blocks)
    originals = [t.data for t in matrices]
    try:
        for t in matrices:
            t.data = dequantize(quantize_rows(t.data), t.dtype, t.device)
        round_tripped = session.generate(request, progress=False)
    finally:
        for t, original in zip(matrices, originals, strict=True):
            t.data = original
    ringed, forwards = _ringed(session, request, {"fp8_ring": {"resident_blocks": 0}})
    assert fingerprint(denoiser) == before, "uninstall did not restore the denoiser exactly"
    assert torch.equal(ringed.latents, round_tripped.latents) and (ringed.frames == round_tripped.frames).all()
    assert not torch.equal(ringed.latents, resident.latents), "the FP8 round trip changed nothing: vacuous"
    receipt = ringed.receipts["fp8_ring"]
    per_forward = sum(_fp8_bytes(block) for block in blocks)
    assert receipt["contract"] == "approximate" and not ringed.exact and resident.exact
    assert receipt["blocks_streamed"] == forwards * len(blocks) and "late" not in receipt
    # e4m3 is a quarter of fp32 (the CPU's tiny-wan), half of bf16 (CUDA's); vectors and scales move as stored
    share = 0.35 if matrices[0].dtype == torch.float32 else 0.6
    assert receipt["bytes_moved"] == forwards * per_forward and per_forward < share * sum(map(module_bytes, blocks))
    assert receipt["notes"]["transfer"] == "fp8" and receipt["notes"]["bytes_per_forward"] == {
        "transformer": per_forward
    }


def test_fp8_round_trip_error_bounded_and_zero_rows_exact(rng):
    """`quantize_rows` -> `dequantize` on rows of magnitudes 1e-3 to 1e3 (odd shapes, a 3-D tensor, a non-contiguous
    view; fp32, bf16, fp16): per row the largest error is at most 2^-4 of the row's largest magnitude (e4m3's half
    step in its top binade is 1/28 of it); dequantized in float32, an element in e4m3's normal range (|w| / scale >=
    2^-6) is off by at most 2^-4 of itself (3 mantissa bits), and in the weight's dtype it is that float32 value
    rounded once; an all-zero row comes back zero. The quantizer is the FP8 kernels' (`fp8_rowwise.reference`): the
    same bytes and scales, an all-zero row's scale included (EPS / 448, finite)."""
    torch.manual_seed(int(rng.integers(2**31)))
    cases = [torch.randn(37, 53), torch.randn(5, 3, 7), torch.randn(64, 29).t(), torch.randn(2, 1)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for w in cases:
            where = (dtype, tuple(w.shape))
            magnitude = 10.0 ** torch.empty(w.shape[0], *[1] * (w.ndim - 1)).uniform_(-3, 3)
            w = (w * magnitude).to(dtype)
            w[w.shape[0] // 2] = 0
            packed = quantize_rows(w)
            back, exact = dequantize(packed, dtype, w.device), dequantize(packed, torch.float32, w.device)
            assert packed.q.dtype == torch.float8_e4m3fn and packed.q.shape == w.shape, where
            assert packed.scale.shape == (w.shape[0], 1) and back.dtype == dtype and back.shape == w.shape, where
            assert torch.equal(back, exact.to(dtype)), where
            rows = w.float().reshape(w.shape[0], -1)
            err = (back.float() - w.float()).reshape(w.shape[0], -1).abs()
            assert (err.amax(dim=1) <= rows.abs().amax(dim=1) * 2**-4).all(), where
            err = (exact - w.float()).reshape(w.shape[0], -1).abs()
            normal = rows.abs() >= packed.scale * 2**-6
            assert normal.any() and (err <= rows.abs() * (2**-4 + 2**-20))[normal].all(), where
            want_q, want_scale = fp8_reference(w.reshape(w.shape[0], -1))
            assert torch.equal(packed.scale, want_scale), where
            assert torch.equal(packed.q.view(torch.uint8), want_q.reshape(w.shape).view(torch.uint8)), where
            zero = w.shape[0] // 2
            assert packed.scale[zero].item() == pytest.approx(EPS / FP8_MAX) and not back[zero].any(), where


def test_fp8_ring_with_block_ring_or_bad_option_raises(sessions):
    session = sessions("tiny-wan")
    with pytest.raises(ValueError, match=r"'block_ring' and 'fp8_ring' both modify denoiser.weights_device"):
        session.accelerate({"block_ring": {}, "fp8_ring": {}})
    with pytest.raises(ValueError, match=r"fp8_ring.resident_blocks: 3 is more than transformer's 2 blocks"):
        session.accelerate({"fp8_ring": {"resident_blocks": 3}})
    assert session.accelerations == {}


class _Stack(torch.nn.Module):
    """A toy denoiser: residual blocks of different layouts (hidden widths, with or without a norm and a bias) applied
    in order; `run` names the blocks a forward runs (the others skipped, as a feature cache skips blocks)."""

    def __init__(self, width: int, hidden: list[int]):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.LayerNorm(width) if i % 2 else torch.nn.Identity(),
                torch.nn.Linear(width, h),
                torch.nn.GELU(),
                torch.nn.Linear(h, width, bias=i % 3 != 0),
            )
            for i, h in enumerate(hidden)
        )

    def forward(self, x: torch.Tensor, run: tuple[int, ...] | None = None) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if run is None or i in run:
                x = x + block(x)
        return x


def _spans(module: torch.nn.Module) -> list[tuple[int, int]]:
    """Where a module's weights are now: (first byte, end) of each."""
    return [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors_of(module)]


def _in_slot(spans: list[tuple[int, int]], slot: torch.Tensor) -> bool:
    return all(slot.data_ptr() <= start and end <= slot.data_ptr() + slot.numel() for start, end in spans)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_ring_slots_bitwise_equal_resident(rng, device):
    """5 of 7 blocks of different layouts stream through 3 slots: during its forward streamed block j's weights are
    views of slot j % 3, outside it they are the host tensors again; the output is torch.equal to the resident stack's
    for a full forward, one that skips every block (block 0 prefetched, never run), one that runs only ring blocks
    3 and 4 (block 3 late: it takes slot 0 from block 0, which must be released, not left reading block 3's weights)
    and a full one again. On CUDA the weights are large enough (MiB) that a copy racing its kernels would show."""
    torch.manual_seed(int(rng.integers(2**31)))
    scale = 64 if device == "cuda" else 1  # widths 1024 and up to 2560 on CUDA
    stack = _Stack(16 * scale, [h * scale for h in (24, 8, 16, 40, 12, 16, 32)]).to(device).eval()
    x = torch.randn(33, 16 * scale, device=device)
    positions = [0, 2, 3, 4, 6]
    runs = [None, (), (4, 6), None]
    with torch.inference_mode():
        expected = [stack(x, run) for run in runs]
    streamed = [stack.blocks[i] for i in positions]
    if device == "cuda":
        pin_on_host([t for block in streamed for t in tensors_of(block)])
    receipt = Receipt(proof=("blocks_streamed",))
    slots = Slots(streamed, RING_IN_FLIGHT, torch.device(device))
    ring = Ring(stack, streamed, receipt, slots)
    host = [_spans(block) for block in streamed]
    seen = []
    capture = [block.register_forward_pre_hook(lambda m, _, j=j: seen.append((j, _spans(m))))
               for j, block in enumerate(streamed)]  # fmt: skip
    try:
        with torch.inference_mode():
            for run, want in zip(runs, expected, strict=True):
                assert torch.equal(stack(x, run), want), f"run {run}"
                for j, block in enumerate(streamed):  # between forwards: a prefetched block in its slot, others on host
                    now = _spans(block)
                    assert _in_slot(now, slots.buffers[j % RING_IN_FLIGHT]) if ring.on_device[j] else now == host[j]
        ring.release_all()
    finally:
        for hook in capture:
            hook.remove()
        ring.remove()
    assert [j for j, _ in seen] == [0, 1, 2, 3, 4, 3, 4, 0, 1, 2, 3, 4]
    assert all(_in_slot(spans, slots.buffers[j % RING_IN_FLIGHT]) for j, spans in seen)
    assert all(t.device.type == device and not t.is_pinned() for t in tensors_of(stack))
    with torch.inference_mode():
        assert torch.equal(stack(x), expected[0]), "remove() did not restore the weights"
    onloads = [0, 1, 2, 3, 4, 0, 3, 4, 0, 1, 2, 3, 4]
    assert receipt.counters["late"] == 1 and receipt.counters["prefetched"] == len(onloads) - 1
    assert receipt.counters["blocks_streamed"] == receipt.counters["released"] == len(onloads)
    assert receipt.counters["bytes_moved"] == sum(module_bytes(streamed[j]) for j in onloads)


@pytest.mark.gpu
def test_block_ring_bitwise_equal_resident_on_cuda(seed):
    """tiny-wan with both blocks streamed on CUDA: bitwise equal to resident; during a forward each streamed block's
    weights are views of its device slot; a ringed request makes exactly as many device allocations as the resident
    one (the streamed weights never touch the caching allocator after install); uninstall restores the model."""
    from workbench import Session

    session = Session.open("tiny-wan", device="cuda")
    denoiser = session.model.pipeline.transformer
    blocks = session.family.blocks(denoiser)
    before = fingerprint(denoiser)
    request = Request("a red circle moves left", seed=seed, height=32, width=32)

    def allocations() -> int:
        start = torch.cuda.memory_stats()["allocation.all.allocated"]
        session.generate(request, progress=False)
        return torch.cuda.memory_stats()["allocation.all.allocated"] - start

    resident = session.generate(request, progress=False)
    resident_allocations = allocations()
    session.accelerate({"block_ring": {"resident_blocks": 0}})
    try:
        streamed = next(blocks[1].parameters())
        assert streamed.device.type == "cpu" and streamed.is_pinned()
        handle = session._handles[0]
        chunks = {c.untyped_storage().data_ptr() for c in handle.rings[0].chunks}
        bases = {p.untyped_storage().data_ptr() for b in blocks for p in b.parameters()}
        assert bases <= chunks, "the streamed weights are views of the ring's pinned chunks"
        assert handle.host_bytes == sum(c.numel() for c in handle.rings[0].chunks) < 2 * sum(map(module_bytes, blocks))
        assert denoiser.proj_out.weight.device.type == "cuda"
        slots = handle.rings[0].slots.buffers
        seen = []
        capture = [b.register_forward_pre_hook(lambda m, _, j=j: seen.append((j, _spans(m))))
                   for j, b in enumerate(blocks)]  # fmt: skip
        try:
            ringed = session.generate(request, progress=False)
        finally:
            for hook in capture:
                hook.remove()
        assert len(slots) == 2 and seen and all(_in_slot(spans, slots[j]) for j, spans in seen)
        assert next(blocks[1].parameters()).device.type == "cpu", "a streamed block stayed on the device"
        assert allocations() == resident_allocations, "the ring allocated device memory during a request"
    finally:
        session.accelerate({})
    assert fingerprint(denoiser) == before and all(p.device.type == "cuda" for p in denoiser.parameters())
    assert ringed.receipts["block_ring"]["blocks_streamed"] > 0 and "late" not in ringed.receipts["block_ring"]
    assert torch.equal(ringed.latents, resident.latents) and (ringed.frames == resident.frames).all()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**20), min_size=1, max_size=40), st.sampled_from([1, 16, 512]))
def test_chunk_layout_packs_tensors_into_power_of_two_chunks(sizes, alignment):
    """Every tensor lies inside one chunk at an aligned offset, without overlap; every chunk is a power of two (what
    torch's pinned allocator takes at its size) and none is larger than the one before; a chunk other than the last
    leaves unused less than the smallest tensor placed after it, the last one at most its content."""
    chunks, where = chunk_layout(sizes, alignment)
    aligned = [-(-n // alignment) * alignment for n in sizes]
    assert len(where) == len(sizes) and all(c > 0 and c & (c - 1) == 0 for c in chunks)
    assert chunks == sorted(chunks, reverse=True)
    for k, chunk in enumerate(chunks):
        spans = sorted((o, o + n) for (c, o), n in zip(where, aligned, strict=True) if c == k)
        assert spans and all(o % alignment == 0 for o, _ in spans) and spans[-1][1] <= chunk
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
        used = sum(end - start for start, end in spans)
        later = [n for (c, _), n in zip(where, aligned, strict=True) if c > k]
        assert chunk - used < min(later) if later else chunk - used <= max(used, alignment)


def test_store_on_host_moves_tensors_into_chunks_unchanged(seed):
    """The tensors (and an FP8 one's bytes and scales) become views of the power-of-two chunks, values unchanged."""
    torch.manual_seed(seed)
    tensors = [torch.randn(n, 48) for n in (300, 7, 1000, 64, 129)]
    values = [t.clone() for t in tensors]
    chunks, stored = store_on_host(tensors, {id(tensors[2])}, pin=False, keep=True)
    starts = [(c.untyped_storage().data_ptr(), c.numel()) for c in chunks]
    for t, value in zip(tensors, values, strict=True):
        assert torch.equal(t, value)
        held = stored[id(t)]
        for part in (held.q, held.scale) if isinstance(held, RowwiseFP8) else (held,):
            assert any(a <= part.data_ptr() < a + n for a, n in starts)
    assert all(c.numel() & (c.numel() - 1) == 0 for c in chunks)
    assert sum(c.numel() for c in chunks) < 2 * sum(t.numel() * t.element_size() for t in tensors)
