"""A plugin's activation and uninstall are all or nothing: fault injection at the last (and a middle) mutation.

Every mutation a plugin makes goes through one of the calls `_Faults` counts (a module attribute set or deleted,
a torch hook registered or removed, a diffusers hook registered or removed, an attention-backend registry entry
swapped). A clean install counts them; then the same install is made to raise at the last one and at one in the
middle, and the model must be stock again: its fingerprint, every module's attributes (forwards, processors), the
processors' attributes, the backend registry and the pipeline class, and what it generates.
"""

import pickle

import numpy as np
import pytest
import torch
from diffusers.hooks.hooks import HookRegistry
from diffusers.models.attention_dispatch import _AttentionBackendRegistry
from torch.utils.hooks import RemovableHandle

from workbench import Request, RequestStopped, Session
from workbench.accelerations import available, fingerprint
from workbench.accelerations.undo import Snapshot

# Every plugin that installs on the tiny model on CPU (under TRITON_INTERPRET=1), with options it needs.
INSTALLS = {
    "tiny-wan": (
        "attention_backend",
        "attention_policy",
        "block_sparse",
        "fp8_attention",
        "fused_qkv",
        "cross_kv_cache",
        "easycache",
        "first_block_cache",
        "taylorseer",
        "pyramid_attention_broadcast",
        "regional_compile",
        "teacache",
        "mag_cache",
        "cache_dit",
        "fused_block_ops",
        "fused_block_norms",
        "adaln_precompute",
        "block_ring",
        "fp8_ring",
        "fused_vae_decode",
    ),
    "tiny-ltx2": (
        "attention_backend",
        "attention_policy",
        "block_sparse",
        "fp8_attention",
        "cross_kv_cache",
        "easycache",
        "taylorseer",
        "pyramid_attention_broadcast",
        "regional_compile",
        "teacache",
        "fused_block_ops",
        "block_ring",
        "fp8_ring",
        "fused_vae_decode",
    ),
}
OPTIONS = {
    "easycache": {"threshold": 0.1},
    "teacache": {"rel_l1_thresh": 0.1},
    "mag_cache": {"calibrate": True},
    "selective_fp8": {"include": ["blocks.*"]},
    "fused_vae_decode": {"channels_last": True},  # rebinds weights too: a fault after that must put them back
}
PROMPT, SIZE = "a red circle moves left", {"frames": 9, "height": 32, "width": 32}


@pytest.fixture(scope="module")
def two_step_request(seed: int) -> Request:
    """The request the tests generate: two denoise steps of PROMPT at SIZE, on the run's seed."""
    return Request(PROMPT, seed=seed, steps=2, **SIZE)


class InjectedFault(RuntimeError):
    pass


class _CountingDict(dict):
    def __init__(self, items, faults):
        super().__init__(items)
        self.faults = faults

    def __setitem__(self, key, value):
        self.faults.tick(f"registry[{key}] =")
        super().__setitem__(key, value)


class _Faults:
    """Counts mutation calls; raises InjectedFault at call number `fail_at` (1-based), once."""

    def __init__(self, monkeypatch):
        self.count, self.fail_at, self.failed_on = 0, None, None
        faults = self

        def counted(owner, name):
            original = getattr(owner, name)

            def wrapper(*args, **kwargs):
                faults.tick(f"{owner.__name__}.{name}")
                return original(*args, **kwargs)

            monkeypatch.setattr(owner, name, wrapper)

        for owner, name in (
            (torch.nn.Module, "__setattr__"),
            (torch.nn.Module, "__delattr__"),
            (torch.nn.Module, "register_forward_pre_hook"),
            (torch.nn.Module, "register_forward_hook"),
            (RemovableHandle, "remove"),
            (HookRegistry, "register_hook"),
            (HookRegistry, "remove_hook"),
        ):
            counted(owner, name)
        monkeypatch.setattr(
            _AttentionBackendRegistry, "_backends", _CountingDict(_AttentionBackendRegistry._backends, self)
        )

    def tick(self, what):
        if self.fail_at is None:
            return
        self.count += 1
        if self.count == 1:
            self.failed_on = None
        if self.count == self.fail_at:
            self.failed_on = what
            raise InjectedFault(f"injected at mutation {self.count} ({what})")

    def arm(self, fail_at):
        self.count, self.fail_at = 0, fail_at

    def counting(self):
        self.arm(10**9)


def _identity(value):
    """Numbers and flags by value, lists by length (a VAE's per-request feature maps are new lists each request),
    dicts by identity and keys, anything else (forwards, processors, modules, tensors) by identity."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return (type(value).__name__, len(value))
    if isinstance(value, dict):
        return id(value), list(value)
    return id(value)


def _surface(session):
    """What a plugin may change besides weights: each module's attribute names and identities, its processor's
    attributes, the backend registry entries, the pipeline class's attributes."""
    pipe = session.model.pipeline
    modules = {}
    for key, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            for name, module in component.named_modules():
                attrs = {k: _identity(v) for k, v in vars(module).items()}
                processor = vars(module).get("processor")
                if processor is not None and hasattr(processor, "__dict__"):
                    attrs["processor.__dict__"] = {k: _identity(v) for k, v in vars(processor).items()}
                attrs["hooks"] = (list(module._forward_hooks), list(module._forward_pre_hooks))
                modules[f"{key}.{name}"] = attrs
    return {
        "modules": modules,
        "registry": {k: id(v) for k, v in _AttentionBackendRegistry._backends.items()},
        "active": _AttentionBackendRegistry._active_backend,
        "pipeline_class": {k: id(v) for k, v in vars(type(pipe)).items()},
    }


def _state(session):
    return [fingerprint(d) for d in session.model.denoisers()], _surface(session)


def _diff(state, want):
    """The parts of `state` that differ from `want`, for a failure message."""
    (prints, surface), (want_prints, want_surface) = state, want
    found = [f"denoiser {i} fingerprint" for i, (a, b) in enumerate(zip(prints, want_prints, strict=True)) if a != b]
    for name in sorted(set(surface["modules"]) | set(want_surface["modules"])):
        a, b = surface["modules"].get(name, {}), want_surface["modules"].get(name, {})
        found += [f"{name}.{key}" for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    return found + [key for key in ("registry", "active", "pipeline_class") if surface[key] != want_surface[key]]


@pytest.fixture(scope="module")
def stock(two_step_request):
    """`stock(model)`: a session on the tiny model (one per model for the module), its stock state and its output
    for `two_step_request`."""
    cache = {}

    def get(model):
        if model not in cache:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("TRITON_INTERPRET", "1")
                session = Session.open(model, device="cpu")
                result = session.generate(two_step_request, progress=False)  # the first request makes lazy state
                cache[model] = session, _state(session), result
        return cache[model]

    return get


def _options(plugin, session, qualified_registry):
    """The plugin's options here. attention_policy gets a registry with a qualified entry for this model (at a size
    the request never has, so its calls stay dense and the output stock): with the committed, empty registry it
    would install nothing, leaving no mutation to fail."""
    if plugin == "attention_policy":
        return {"registry": qualified_registry(session, video_tokens=10**9)}
    return OPTIONS.get(plugin, {})


def _cases():
    return [(model, plugin) for model, plugins in INSTALLS.items() for plugin in plugins]


def _mutations(session, faults, config):
    """How many counted mutations `session.accelerate(config)` makes (run it once before: a first install may
    also make lazy state, such as diffusers' hook registries, that later ones find in place)."""
    faults.counting()
    session.accelerate(config)
    total = faults.count
    faults.arm(None)
    return total


def _prints(session):
    return _state(session)[0]


@pytest.mark.parametrize("model, plugin", _cases())
def test_failed_activation_leaves_model_as_before(
    stock, model, plugin, monkeypatch, qualified_registry, two_step_request
):
    session, stock_state, stock_result = stock(model)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    faults = _Faults(monkeypatch)
    config = {plugin: _options(plugin, session, qualified_registry)}
    session.accelerate(config)
    session.accelerate({})
    total = _mutations(session, faults, config)
    session.accelerate({})
    assert _prints(session) == stock_state[0], f"{plugin}: a clean install and uninstall did not restore the model"
    assert total > 0, f"{plugin}: its install made no mutation to fail"
    for fail_at in sorted({total, total // 2 + 1}):
        before = _state(session)
        faults.arm(fail_at)
        with pytest.raises(InjectedFault):
            session.accelerate(config)
        faults.arm(None)
        where = f"{plugin}: fault at mutation {fail_at} of {total} ({faults.failed_on})"
        assert session.accelerations == {}, where
        assert not _diff(_state(session), before), where
        assert _prints(session) == stock_state[0], where
    result = session.generate(two_step_request, progress=False)
    assert torch.equal(result.latents, stock_result.latents) and np.array_equal(result.frames, stock_result.frames)
    session.accelerate(config)  # installs cleanly afterwards: nothing half-made was left behind
    session.accelerate({})
    assert _prints(session) == stock_state[0]


@pytest.mark.parametrize("model, plugin", _cases())
def test_failed_uninstall_keeps_plugin_installed_and_recorded(stock, model, plugin, monkeypatch, qualified_registry):
    session, stock_state, _ = stock(model)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    faults = _Faults(monkeypatch)
    config = {plugin: _options(plugin, session, qualified_registry)}
    session.accelerate(config)
    session.accelerate({})
    session.accelerate(config)
    recorded = session.accelerations
    total = _mutations(session, faults, {})
    assert _prints(session) == stock_state[0]
    assert total > 0, f"{plugin}: its install made no mutation to fail"
    for fail_at in sorted({total, total // 2 + 1}):
        session.accelerate(config)
        installed = _state(session)
        faults.arm(fail_at)
        with pytest.raises(RuntimeError, match=f"could not uninstall '{plugin}'.*it is still installed"):
            session.accelerate({})
        faults.arm(None)
        where = f"{plugin}: fault at mutation {fail_at} of {total} ({faults.failed_on})"
        assert session.accelerations == recorded, where
        assert not _diff(_state(session), installed), where
        session.accelerate({})
        assert session.accelerations == {} and _prints(session) == stock_state[0], where


@pytest.mark.parametrize("model", sorted(INSTALLS))
def test_install_list_is_complete(stock, model, monkeypatch):
    """Every registered plugin not in INSTALLS refuses this tiny model on CPU before changing it (so a plugin that
    starts installing here must join the fault-injection tests)."""
    session, stock_state, _ = stock(model)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in sorted(set(available()) - set(INSTALLS[model])):
        with pytest.raises((RuntimeError, ValueError)):
            session.accelerate({name: OPTIONS.get(name, {})})
        assert session.accelerations == {} and _prints(session) == stock_state[0], name


def test_failed_uninstall_in_a_set_puts_the_removed_ones_back(monkeypatch):
    session = Session.open("tiny-wan", device="cpu")
    stock_prints = _prints(session)
    session.accelerate({"cross_kv_cache": {}, "easycache": {"threshold": 0.1}})
    installed_prints = _prints(session)
    easycache = session._handles[-1]
    assert easycache.spec.name == "easycache"

    def broken():
        raise OSError("uninstall exploded")

    cross_kv = session._handles[0]
    monkeypatch.setattr(cross_kv, "_remove", broken)  # cross_kv_cache, removed after easycache
    with pytest.raises(RuntimeError, match=r"could not uninstall 'cross_kv_cache'.*removed: \['easycache'\]"):
        session.accelerate({})
    assert session.accelerations == {
        "cross_kv_cache": {},
        "easycache": {"threshold": 0.1, "warmup": 2, "final_dense": 1, "per_expert": True},
    }
    assert _prints(session) == installed_prints  # easycache is back (a new handle), cross_kv_cache never left
    assert session._handles[0] is cross_kv and session._handles[1] is not easycache
    monkeypatch.undo()
    session.accelerate({})
    assert _prints(session) == stock_prints


def test_undo_that_cannot_restore_makes_session_refuse(monkeypatch):
    session = Session.open("tiny-wan", device="cpu")
    session.accelerate({"cross_kv_cache": {}})

    def restore_fails(self):
        return ["cross_kv_cache left a forward behind"]

    def broken():
        raise OSError("uninstall exploded")

    monkeypatch.setattr(Snapshot, "restore", restore_fails)
    monkeypatch.setattr(session._handles[0], "_remove", broken)
    with pytest.raises(RuntimeError, match="could not be undone; the model is in an unknown state"):
        session.accelerate({})
    assert session.accelerations == {"cross_kv_cache": {}}  # still there, in part: the record does not drop it
    with pytest.raises(RuntimeError, match="session: the model is in an unknown state"):
        session.generate(Request("p"), progress=False)
    with pytest.raises(RuntimeError, match="session: the model is in an unknown state"):
        session.accelerate({})


def test_interrupted_request_keeps_record_and_model(monkeypatch, two_step_request):
    session = Session.open("tiny-wan", device="cpu", accelerations={"cross_kv_cache": {}})
    good = session.generate(two_step_request, progress=False)
    installed_state = _state(session)  # after a first request (which makes lazy state)
    transformer = session.model.pipeline.transformer
    original = type(transformer).forward
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(transformer), "forward", interrupted)
    with pytest.raises(KeyboardInterrupt):
        session.generate(two_step_request, progress=False)
    monkeypatch.undo()
    assert session.accelerations == {"cross_kv_cache": {}} and session.active_request is None
    assert not _diff(_state(session), installed_state)
    again = session.generate(two_step_request, progress=False)
    assert torch.equal(again.latents, good.latents) and again.receipts == good.receipts


def test_stop_ends_the_request_at_a_checkpoint_and_only_that_request(two_step_request):
    session = Session.open("tiny-wan", device="cpu", accelerations={"cross_kv_cache": {}})
    good = session.generate(two_step_request, progress=False)
    installed_state = _state(session)
    assert session.stop() is None  # no request runs: nothing to stop, nothing kept for a later one
    seen, stopped_ids = [], []

    def stop_after_first_step(event):  # on the request thread; the dashboard's button calls stop() from another
        seen.append(event)
        if event.kind == "step" and event.data["index"] == 0:
            stopped_ids.append(session.stop())

    unsubscribe = session.subscribe(stop_after_first_step)
    with pytest.raises(RequestStopped, match="in denoise, 1 of 2 denoise steps done") as stopped:
        session.generate(two_step_request, progress=False)
    unsubscribe()
    request_id = good.metadata["request_id"] + 1
    assert stopped_ids == [request_id] and stopped.value.request_id == request_id
    assert not isinstance(stopped.value, Exception)  # Ctrl-C's kind: `except Exception` lets it through
    assert seen[-1].kind == "request_failed" and seen[-1].data["stopped"]
    assert [e.stage for e in seen if e.kind == "stage_start"] == ["text_encode", "denoise"]  # no decode
    copy = pickle.loads(pickle.dumps(stopped.value))  # crosses to a Ray driver whole
    assert (copy.request_id, copy.where, copy.steps_done, copy.steps) == (request_id, "in denoise", 1, 2)
    assert session.accelerations == {"cross_kv_cache": {}} and session.active_request is None
    assert not _diff(_state(session), installed_state)
    # the stop was for the request before: this one runs whole
    again = session.generate(two_step_request, progress=False)
    assert torch.equal(again.latents, good.latents) and again.receipts == good.receipts


@pytest.mark.parametrize(
    "device, model, component, stage, plugin",
    [
        ("cpu", "tiny-wan", "vae", "video_decode", None),
        ("cpu", "tiny-wan", "vae", "video_decode", "fused_vae_decode"),  # its own decode loop calls the blocks it keeps
        ("cpu", "tiny-ltx2", "audio_vae", "audio_decode", None),
        pytest.param("cuda", "tiny-wan", "vae", "video_decode", "fused_vae_decode", marks=pytest.mark.gpu),
    ],
)
def test_stop_during_a_decode_ends_it_at_the_next_module_call(
    stock, device, model, component, stage, plugin, two_step_request
):
    """A stop asked while a decoder runs ends the request before the decoder's next module call, not when the decode
    ends (which, for a long clip, is seconds later); the next request is the one before, bit for bit."""
    session = stock(model)[0] if device == "cpu" else Session.open(model, device="cuda")
    session.accelerate({} if plugin is None else {plugin: {}})
    try:
        good = session.generate(two_step_request, progress=False)
        installed = _state(session)
        called = []

        def stop_at_first_call(module, _):  # a decoder block starts: the dashboard's stop button is pressed
            called.append(module)
            if len(called) == 1:
                session.stop()

        decoder = getattr(session.model.pipeline, component)
        hooks = [m.register_forward_pre_hook(stop_at_first_call) for m in list(decoder.modules())[1:]]
        try:
            with pytest.raises(RequestStopped, match=f"in {stage}, 2 of 2 denoise steps done"):
                session.generate(two_step_request, progress=False)
        finally:
            for hook in hooks:
                hook.remove()
        assert len(called) == 1  # the session's checkpoint on that same module raised before it computed
        assert not _diff(_state(session), installed)
        again = session.generate(two_step_request, progress=False)
        assert torch.equal(again.latents, good.latents) and np.array_equal(again.frames, good.frames)
        assert (again.audio is None and good.audio is None) or np.array_equal(again.audio, good.audio)
    finally:
        session.accelerate({})
        if device == "cuda":
            session.close()


STATEFUL = ("easycache", "first_block_cache", "taylorseer", "pyramid_attention_broadcast", "teacache", "mag_cache",
            "cache_dit", "block_ring")  # fmt: skip
# on CUDA: stock, and weights streamed on side streams (group offload's prefetch, block_ring's ring), maybe mid-copy
STOPPED = [("cpu", plugin) for plugin in STATEFUL] + [
    pytest.param("cuda", plugin, marks=pytest.mark.gpu) for plugin in (None, "group_offload", "block_ring")
]


@pytest.mark.parametrize("device, plugin", STOPPED)
def test_a_stopped_request_leaves_no_state_behind(stock, device, plugin, seed):
    """Stopped after its first step, a cache has computed and stored one step's state, a weight stream may be
    mid-copy; the next request must not see it: it equals, bit for bit, the request before the stop."""
    session = stock("tiny-wan")[0] if device == "cpu" else Session.open("tiny-wan", device="cuda")
    request = Request(PROMPT, seed=seed, steps=4, **SIZE)
    session.accelerate({} if plugin is None else {plugin: OPTIONS.get(plugin, {})})
    try:
        good = session.generate(request, progress=False)
        unsubscribe = session.subscribe(lambda e: e.kind == "step" and e.data["index"] == 0 and session.stop())
        with pytest.raises(RequestStopped, match="in denoise, 1 of 4 denoise steps done"):
            session.generate(request, progress=False)
        unsubscribe()
        again = session.generate(request, progress=False)
        assert torch.equal(again.latents, good.latents) and np.array_equal(again.frames, good.frames)
        assert again.receipts == good.receipts
    finally:
        session.accelerate({})
        if device == "cuda":
            session.close()
