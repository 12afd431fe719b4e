import re
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
import torch

from workbench import Request, Session
from workbench import session as session_module
from workbench.memory_estimate import estimate_activation
from workbench.memory_plan import gib
from workbench.models import ltx2, resolve, wan
from workbench.session import _to_uint8


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-wan22", "tiny-ltx2"])
def test_tiny_model_generates_end_to_end_and_repeats_exactly(sessions, name, seed):
    session = sessions(name)
    request = Request("a red circle moves left, low hum", seed=seed)
    first = session.generate(request, progress=False)
    second = session.generate(request, progress=False)
    assert first.frames.dtype == np.uint8 and first.frames.shape == (9, 64, 64, 3)
    assert np.array_equal(first.frames, second.frames)
    assert torch.equal(first.latents, second.latents)
    assert first.frames.std() > 0  # not a constant image
    if session.family.has_audio:
        assert first.audio.dtype == np.float32 and first.audio.shape[0] == 2 and first.sample_rate == 16000
        assert np.isfinite(first.audio).all() and np.array_equal(first.audio, second.audio)
    else:
        assert first.audio is None


def test_different_seeds_give_different_frames(sessions, seed):
    session = sessions("tiny-wan")
    a = session.generate(Request("p", seed=seed), progress=False)
    b = session.generate(Request("p", seed=seed + 1), progress=False)
    assert not np.array_equal(a.frames, b.frames)


@pytest.mark.parametrize("name, module", [("tiny-wan", wan), ("tiny-ltx2", ltx2)])
def test_session_equals_plain_diffusers_call(sessions, name, module, seed):
    """The workbench adds measurement, not drift: same components + seed = same output as diffusers."""
    session = sessions(name)
    request = Request("a blue square moves up", seed=seed)
    result = session.generate(request, progress=False)
    plain = module.tiny(0)  # same seed -> identical random weights, built independently
    resolved = request.resolved(plain.family, plain.defaults)
    output = plain.pipeline(
        **plain.family.call_kwargs(resolved),
        **plain.call_overrides,
        generator=torch.Generator("cpu").manual_seed(seed),
        output_type="np",
    )
    assert np.array_equal(_to_uint8(output.frames[0]), result.frames)
    if plain.family.has_audio:
        assert np.array_equal(output.audio[0].numpy(), result.audio)


def test_stage_timings_and_events(sessions):
    session = sessions("tiny-ltx2")
    events = []
    unsubscribe = session.subscribe(events.append)
    try:
        result = session.generate(Request("p", steps=3), progress=False)
    finally:
        unsubscribe()
    for stage in ("text_encode", "denoise", "video_decode", "audio_decode", "total"):
        assert result.timings[stage] > 0, stage
    assert len(result.step_seconds) == 3 and all(s > 0 for s in result.step_seconds)
    assert sum(result.step_seconds) <= result.timings["denoise"] * 1.0001
    kinds = [(e.kind, e.stage) for e in events]
    assert kinds[0] == ("stage_start", "text_encode")
    assert kinds[-1] == ("request_end", None)
    assert [e.data["index"] for e in events if e.kind == "step"] == [0, 1, 2]
    order = [e.stage for e in events if e.kind == "stage_start"]
    assert order.index("denoise") < order.index("video_decode") < order.index("audio_decode")
    assert events == result.events


def test_second_request_does_not_rebuild_components(sessions, monkeypatch):
    session = sessions("tiny-wan")
    session.generate(Request("p"), progress=False)
    before = {name: id(c) for name, c in session.model.pipeline.components.items()}

    def refuse(*args, **kwargs):
        raise AssertionError("a component was rebuilt during a request")

    for cls in (wan.WanTransformer3DModel, wan.AutoencoderKLWan, wan.UMT5EncoderModel):
        monkeypatch.setattr(cls, "__init__", refuse)
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    session.generate(Request("p"), progress=False)
    assert before == {name: id(c) for name, c in session.model.pipeline.components.items()}


def test_failed_request_leaves_session_usable(monkeypatch, seed):
    session = Session.open("tiny-wan", device="cpu")
    vae = session.model.pipeline.vae
    good = session.generate(Request("p", seed=seed), progress=False)

    def broken(*args, **kwargs):
        raise RuntimeError("decoder exploded")

    monkeypatch.setattr(type(vae), "decode", broken)
    with pytest.raises(RuntimeError, match="decoder exploded"):
        session.generate(Request("p", seed=seed), progress=False)
    monkeypatch.undo()
    # probes were removed, no request is active, and the same request reproduces
    assert "decode" not in vae.__dict__ and "encode_prompt" not in session.model.pipeline.__dict__
    assert not session.model.pipeline.transformer._forward_pre_hooks
    assert session.active_request is None
    again = session.generate(Request("p", seed=seed), progress=False)
    assert np.array_equal(good.frames, again.frames)


def test_request_during_request_is_refused(sessions):
    session = sessions("tiny-wan")
    errors = []

    def reenter(event):
        if event.kind == "step" and not errors:
            with pytest.raises(
                RuntimeError, match=r"^session is busy with request \d+; one request at a time"
            ) as caught:
                session.generate(Request("q"), progress=False)
            errors.append(caught.value)

    unsubscribe = session.subscribe(reenter)
    try:
        result = session.generate(Request("p"), progress=False)
    finally:
        unsubscribe()
    assert errors and not result.metadata["subscriber_errors"]
    with session._lock:  # held as accelerate() holds it while it changes the plugins: no request is active yet
        with pytest.raises(RuntimeError, match=r"^session is busy \(changing accelerations or another request\); one"):
            session.generate(Request("q"), progress=False)


@pytest.mark.parametrize("short", [1, 0], ids=["over", "exactly-free"])
def test_a_request_whose_estimated_activations_exceed_free_memory_is_refused_before_it_runs(
    sessions, monkeypatch, short
):
    """The audit's 4096x4096 request, which on a CPU ends the process out of memory: with the host's available
    memory read as its largest stage estimate less `short` bytes, it is refused naming its size, the stage and both
    amounts, and nothing runs; with exactly enough it runs (here: reaches the request, stubbed)."""
    session = sessions("tiny-wan")
    huge = Request("a red circle", frames=9, height=4096, width=4096, steps=1)
    estimate = estimate_activation(session.model, session.resolve(huge))[0]
    assert max(estimate, key=estimate.get) == "video_decode"
    peak = max(estimate.values())
    free = peak - short
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=free))

    class Ran(Exception):
        pass

    def run(*args, **kwargs):
        raise Ran

    monkeypatch.setattr(session, "_run", run)
    if short:
        message = (
            rf"^request: frames=9, height=4096, width=4096: its video_decode needs about {re.escape(gib(peak))} of "
            rf"activations \(estimated\), more than the {re.escape(gib(free))} cpu has free; allowed: .*fewer frames "
            r"or a smaller height and width, or a session opened with memory=MemoryBudget"
        )
        with pytest.raises(ValueError, match=message):
            session.generate(huge, progress=False)
    else:
        with pytest.raises(Ran):
            session.generate(huge, progress=False)
    monkeypatch.undo()  # the host's own reading: a tiny request runs
    assert session.generate(Request("p", steps=1), progress=False).finite


def test_open_takes_a_loaded_model_no_open_session_holds_nor_left_changed_and_runs_it_in_its_own_dtype():
    """A LoadedModel another open session holds is refused (that session's plugins would run unrecorded in the new
    one, or crash it); so, once that session is collected without close(), is the model it left its plugin on, naming
    what is left; closed, it opens again with nothing installed. A dtype other than the model's is refused rather than
    recorded; without one, the model's own is the session's."""
    first = Session.open("tiny-wan", device="cpu")
    model = first.model
    first.accelerate({"cross_kv_cache": {}})  # module-local state only: dropping the session leaves no global state
    with pytest.raises(ValueError, match=r"^model: 'tiny-wan' is held by an open session \(Session\(model='tiny-wan'"):
        Session.open(model, device="cpu")
    del first  # dropped without close(): the plugin stays on the model
    with pytest.raises(
        ValueError,
        match=r"^model: 'tiny-wan' carries what was installed on it and never removed \(transformer.blocks.0.attn2.to_k: "
        r"instance forward; transformer.blocks.0.attn2.to_v: instance forward; .*\); allowed: a model without hooks",
    ):
        Session.open(model, device="cpu")

    second = Session.open(wan.tiny(), device="cpu")
    model = second.model
    second.accelerate({"block_sparse": {}})
    second.close()
    again = Session.open(model, device="cpu")
    assert again.accelerations == {} and again.generate(Request("p", steps=1), progress=False).exact
    again.close()

    with pytest.raises(
        ValueError,
        match=r"^dtype: 'bfloat16', but model 'tiny-wan' holds its weights in float32; allowed: 'float32' or None",
    ):
        Session.open(model, device="cpu", dtype="bfloat16")
    assert Session.open(model, device="cpu", dtype=torch.float32).dtype == torch.float32
    assert Session.open(resolve("tiny-wan", dtype=torch.bfloat16), device="cpu").dtype == torch.bfloat16


def test_open_rejects_bad_arguments():
    with pytest.raises(ValueError, match="model: 'tiny-nope' is neither a known name"):
        Session.open("tiny-nope")
    for dtype in ("int8", [], torch.int8):
        with pytest.raises(ValueError, match=r"^dtype: .*; allowed: \["):
            Session.open("tiny-wan", dtype=dtype)
    with pytest.raises(ValueError, match="device: 'tpu'"):
        Session.open("tiny-wan", device="tpu")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": 123}, r"^model: 123 \(int\); allowed: a model name"),
        ({"model": None}, r"^model: None \(NoneType\); allowed"),
        ({"model": ""}, r"^model: '' \(str\); allowed"),
        ({"model": "tiny-wan", "seed": -1}, r"^seed: -1 is out of range; allowed: integers in \[0, "),
        ({"model": "tiny-wan", "seed": 1.5}, r"^seed: must be an integer"),
        ({"model": "tiny-wan", "device": None}, r"^device: None \(NoneType\); allowed: auto, cpu, cuda, cuda:N$"),
        ({"model": "tiny-wan", "device": "cpu:7"}, r"^device: 'cpu:7'; allowed: auto, cpu, cuda, cuda:N$"),
        ({"model": "tiny-wan", "accelerations": {"banana": {}}}, r"^accelerations: unknown \['banana'\]; available"),
        ({"model": "tiny-wan", "adapters": ["x"]}, r"^adapters\[0\]: 'x'; allowed: a workbench.Adapter"),
        (
            {"model": "tiny-wan", "memory": "8GiB", "accelerations": {"group_offload": {}}},
            r"^accelerations: \['group_offload'\] move the denoiser's weights, which this session's memory plan",
        ),
    ],
)
def test_open_refuses_a_bad_argument_before_loading(monkeypatch, kwargs, message):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad argument was refused")

    monkeypatch.setattr(session_module, "resolve", load)
    with pytest.raises(ValueError, match=message):
        Session.open(**{"device": "cpu", **kwargs})


def test_subscribe_refuses_a_non_callable_and_resolve_a_non_request(sessions):
    session = sessions("tiny-wan")
    with pytest.raises(ValueError, match=r"^request: expected a workbench.Request, got dict"):
        session.resolve({"prompt": "p"})
    with pytest.raises(ValueError, match=r"^callback: 5 is not callable"):
        session.subscribe(5)
    assert session.subscribe(print)() is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_open_cuda_without_gpu_is_runtime_error():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        Session.open("tiny-wan", device="cuda")


@pytest.mark.gpu
def test_gpu_request_memory_returns_to_baseline():
    session = Session.open("tiny-ltx2", device="cuda")
    session.generate(Request("p"), progress=False)
    before = torch.cuda.memory_allocated()
    result = session.generate(Request("p"), progress=False)
    assert torch.cuda.memory_allocated() == before
    assert result.memory["denoise"] > 0


def test_nvml_summary_separates_invalidating_throttle_reasons():
    from workbench.telemetry import summarize_samples

    base = {"t": 0.0, "used_bytes": 1, "temperature_c": 50, "sm_clock_mhz": 1980, "processes": 1}
    samples = [{**base, "throttle_reasons": r} for r in (0x0, 0x4, 0x4, 0x20 | 0x4, 0x1)]
    summary = summarize_samples(samples)
    assert summary["throttled_samples"] == 1  # only the thermal one invalidates timing
    assert summary["throttle_reason_samples"] == {"gpu_idle": 1, "sw_power_cap": 3, "sw_thermal_slowdown": 1}
    assert summarize_samples([]) == {}


def test_close_removes_the_accelerations_lets_go_of_the_model_and_refuses_later_calls():
    import gc
    import weakref

    from workbench.accelerations.base import fingerprint

    session = Session.open(wan.tiny(), device="cpu")
    pipeline = weakref.ref(session.model.pipeline)
    stock = fingerprint(session.model.pipeline.transformer)
    session.accelerate({"cross_kv_cache": {}})
    transformer = session.model.pipeline.transformer
    session.close()
    assert fingerprint(transformer) == stock and session.closed and repr(session) == "Session(closed, device=cpu)"
    calls = (
        lambda: session.generate(Request("x")),
        lambda: session.accelerate({}),
        lambda: session.family,
        lambda: session.subscribe(print),
    )
    for call in calls:
        with pytest.raises(RuntimeError, match="session: closed"):
            call()
    session.close()  # again: nothing
    del transformer
    gc.collect()
    assert pipeline() is None  # nothing of the session holds the model any more


def test_a_device_cap_is_lifted_by_its_last_holder_only(monkeypatch):
    """The allocator's cap is one per device: a holder replaced by a newer one lifts nothing when it goes; the current
    holder's collection (a session dropped without close) lifts it."""
    import gc

    from workbench import session as session_module
    from workbench.accelerations.memory import residency
    from workbench.memory_plan import LIBRARY_RESERVE

    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, index: calls.append((f, index)))
    monkeypatch.setattr(residency, "_release_cached", lambda index: calls.append(("release", index)))
    monkeypatch.setattr(residency, "_outside_allocator", lambda index: 6 << 30)  # e.g. the CUDA context
    monkeypatch.setattr(residency, "_CAPS", {})
    cuda7 = torch.device("cuda", 7)

    class Holder:
        pass

    first, second = Holder(), Holder()
    residency.hold_cap(first, 7, 48 << 30, 96 << 30)
    lift_second = residency.hold_cap(second, 7, 24 << 30, 96 << 30)
    # each cap comes after the cached blocks went back (torch checks a cap only when it reserves more); the allocator
    # gets the cap less what the device spends outside it and the libraries' reserve
    assert residency.cap_holder(cuda7) == 24 << 30
    reserve = LIBRARY_RESERVE / 2**30
    assert calls == [("release", 7), ((42 - reserve) / 96, 7), ("release", 7), ((18 - reserve) / 96, 7)]
    with pytest.raises(ValueError, match=r"cuda:7 already spends 6.00 GiB outside .* leaves nothing of the cap of"):
        residency.hold_cap(Holder(), 7, (6 << 30) + LIBRARY_RESERVE, 96 << 30)
    assert residency.cap_holder(cuda7) == 24 << 30 and len(calls) == 5  # refused: the held cap stays
    with pytest.warns(UserWarning, match="cuda:7 is capped at 24.00 GiB by an open session's memory budget"):
        session_module._warn_if_capped(cuda7, replacing=False)  # what Session.open says before loading
    del first
    gc.collect()
    assert residency.cap_holder(cuda7) == 24 << 30 and len(calls) == 5  # the replaced holder lifts nothing
    del second
    gc.collect()
    assert residency.cap_holder(cuda7) is None and calls[-1] == (1.0, 7) and not lift_second.alive


@pytest.mark.gpu
def test_the_nvml_sampler_finds_the_sessions_gpu():
    """NVML numbers the host's GPUs, torch the visible ones: the sampler finds the session's device by its UUID (a
    failed lookup would be a `sample` event with an error and no samples)."""
    result = Session.open(wan.tiny(), device="cuda").generate(Request("x", frames=5, height=32, width=32, steps=2))
    assert result.metadata["nvml"]["count"] >= 1
    assert not [event for event in result.events if event.kind == "sample" and "error" in event.data]


def test_a_float16_session_on_the_cpu_runs_without_diffusers_warning_that_it_cannot(monkeypatch):
    """diffusers warns, once per float16 module moved to a CPU, that such a pipeline "cannot run" there; it runs."""
    from diffusers.pipelines import pipeline_utils

    warned = []
    monkeypatch.setattr(pipeline_utils.logger, "warning", lambda message, *args, **kwargs: warned.append(message))
    session = Session.open("tiny-wan", device="cpu", dtype=torch.float16)
    result = session.generate(Request("a red kite", steps=2, frames=1, height=16, width=16), progress=False)
    assert result.finite and session.dtype == torch.float16
    assert not [m for m in warned if "cannot run with" in m]
