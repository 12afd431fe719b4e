import html
import re
import threading

import numpy as np
import pytest

from workbench import Session
from workbench.memory_plan import MemoryBudget, gib
from workbench.models import SHIPPED_MODELS
from workbench.widgets import ABAudio, ABPlayer, AccelerationPanel, Dashboard, _common
from workbench.widgets.dashboard import MODELS, model_name

WIDGET = "application/vnd.jupyter.widget-view+json"

TINY = {"frames": 9, "height": 32, "width": 32, "steps": 2}


@pytest.fixture
def wan(sessions):
    session = sessions("tiny-wan")
    session.accelerate({})
    yield session
    session.accelerate({})


def test_dashboard_on_a_session_generates_and_compares_the_last_two(wan, monkeypatch):
    copies = {}  # display id -> the static copy its outputs show now
    monkeypatch.setattr(_common, "display", lambda bundle, raw, display_id: copies.update({display_id: bundle}))
    monkeypatch.setattr(_common, "update_display", lambda bundle, raw, display_id: copies.update({display_id: bundle}))
    dash = Dashboard(wan)
    try:
        assert dash.session is wan and dash.picker.options == ("tiny-wan",)
        dash._ipython_display_()  # the notebook shows the dashboard and its A/B area before any request
        dash.ab._ipython_display_()
        assert "waiting for a request" in copies[dash._static_display_id]["text/html"]
        assert isinstance(dash.panel, AccelerationPanel) and dash.panel.session is wan
        dash.set_request(prompt="a red circle", seed=3, **TINY)
        baseline = dash.generate()
        assert baseline is not None and dash.ab_player is None and len(dash.results) == 1
        dash.panel.enable("cross_kv_cache")
        assert dash.panel.apply() == {"cross_kv_cache": {}}
        candidate = dash.generate()
        assert candidate is not None and dash.errors.value == ""
        assert candidate.receipts["cross_kv_cache"]["executed"]
        assert np.array_equal(baseline.frames, candidate.frames)  # bitwise contract
        assert isinstance(dash.ab_player, ABPlayer) and dash.ab.children == (dash.ab_player,)
        assert dash.ab_player.labels == ("#1 stock", "#2 cross_kv_cache")
        assert dash.ab_audio is None  # Wan makes no audio
        # what a saved notebook keeps of the outputs displayed before the requests: the dashboard as it stands now
        assert copies[dash._static_display_id]["text/html"] == dash.static().data
        assert "last request #2 cross_kv_cache" in dash.static().data and "waiting for" not in dash.static().data
        assert copies[dash.ab._static_display_id]["text/html"] == dash.ab.static().data
        assert "#1 stock and #2 cross_kv_cache are identical</b>" in dash.ab.static().data  # bitwise: said, not drawn
        assert dash.live.png  # the live plot followed the requests
        third = dash.generate()
        assert [label for label, _ in dash.results] == ["#2 cross_kv_cache", "#3 cross_kv_cache"]
        assert dash.results[-1][1] is third
        # `ab` follows the latest pair: it now shows #2 against #3.
        assert dash.ab.children == (dash.ab_player,)
        assert dash.ab_player.labels == ("#2 cross_kv_cache", "#3 cross_kv_cache")
    finally:
        dash.live.detach()


def test_dashboard_bad_request_shows_error_not_traceback(wan):
    dash = Dashboard(wan)
    try:
        dash.set_request(frames=8, height=32, width=32, steps=2)  # Wan needs 4n+1 frames
        assert dash.generate() is None
        assert "frames" in dash.errors.value and dash.request_status.value == "failed"
        dash.set_request(prompt="  ")
        assert dash.generate() is None and "prompt" in dash.errors.value
        assert dash.results == []
        with pytest.raises(ValueError, match=r"request form: frames: must be an integer in \[0, 1025\], got str 'abc'"):
            dash.set_request(frames="abc")  # what code (not the form) may hand it
    finally:
        dash.live.detach()


def test_dashboard_request_raising_an_unforeseen_error_says_failed_and_generates_again(wan, monkeypatch):
    """A request that raises what no check foresaw (a plugin's KeyError) shows in the error box and the status says
    "failed" (it said "running ..." for good), from code and from the button; the next request runs."""

    def broken(*args, **kwargs):
        raise KeyError("cache slot")

    dash = Dashboard(wan)
    try:
        dash.set_request(**TINY)
        with monkeypatch.context() as patch:
            patch.setattr(wan, "generate", broken)
            assert dash.generate() is None
            assert dash.request_status.value == "failed" and "generate failed:</b> KeyError" in dash.errors.value
            dash.request_status.value = ""
            dash.generate_button.click()
            dash.wait(60)
            assert dash.request_status.value == "failed" and "cache slot" in dash.errors.value
            assert not dash.generate_button.disabled and dash.stop_button.disabled
        assert dash.generate() is not None and dash.errors.value == "" and dash.results[0][0] == "#1 stock"
    finally:
        dash.live.detach()


def test_dashboard_ab_with_audio_shows_both_players(sessions):
    ltx = sessions("tiny-ltx2")
    dash = Dashboard(ltx)
    try:
        dash.set_request(frames=9, height=32, width=32, steps=2)
        assert dash.generate() is not None and dash.generate() is not None
        assert isinstance(dash.ab_audio, ABAudio) and dash.ab.children == (dash.ab_player, dash.ab_audio)
    finally:
        dash.live.detach()


def test_dashboard_ab_compares_the_videos_and_says_why_the_audio_is_not_compared(make_result):
    dash = Dashboard(["tiny-wan"], device="cpu")  # no model needed: the A/B area shows the last two results
    a = make_result(frames=(3, 16, 16), sample_rate=16000)
    dash.results = [("#1 stock", a), ("#2 x", make_result(like=a, noise=3, sample_rate=48000))]
    dash._show_ab()
    video, audio = dash.ab.children
    assert isinstance(video, ABPlayer) and video is dash.ab_player and video.labels == ("#1 stock", "#2 x")
    assert dash.ab_audio is None and "sample_rate: #1 stock is 16000 Hz, #2 x is 48000 Hz" in audio.value
    dash.results = [dash.results[1], ("#3 y", make_result(like=a, noise=3, audio_samples=None))]
    dash._show_ab()
    video, audio = dash.ab.children
    assert video is dash.ab_player and video.labels == ("#2 x", "#3 y")
    assert "#3 y has no audio track" in audio.value and dash.errors.value == ""
    copy = dash.ab.static().data  # the area as an offline HTML export keeps it: each part's own copy, in order
    assert copy.index(video.static().data) < copy.index(audio.value)
    bundle = dash.ab._repr_mimebundle_()  # displaying the area carries that copy beside the widget view
    assert bundle["text/html"] == copy and bundle[WIDGET]["model_id"] == dash.ab.model_id
    assert copy in dash._repr_mimebundle_()["text/html"]  # and so does displaying the whole dashboard


def test_dashboard_figures_keep_their_drawn_size(make_result):
    """The PNG figures under the controls (the live plot's two, the A/B audio's) opt out of the stretch of their VBox
    to its width: stretched, they grew with the window and pushed the A/B area down (measured in the browser by
    tests/browser/test_dashboard_layout.py)."""
    dash = Dashboard(["tiny-wan"], device="cpu")
    a = make_result(frames=(3, 16, 16))
    dash.results = [("#1 stock", a), ("#2 x", make_result(like=a, noise=3))]
    dash._show_ab()
    figures = [dash.live.timeline, dash.live.memory, dash.ab_audio.figure]
    assert [figure.layout.align_self for figure in figures] == ["flex-start"] * 3


def test_dashboard_picker_opens_by_name_and_reports_unknown_models(wan, monkeypatch):
    dash = Dashboard(["tiny-wan", "no-such-model"], device="cpu")
    assert dash.session is None and dash.picker.value == "tiny-wan"
    assert dash.generate() is None and "no session" in dash.errors.value
    assert dash.open_model("no-such-model") is None
    assert "no-such-model" in dash.errors.value and dash.session is None
    # a loader failing with what no check foresaw: in the error box, and the status no longer says "opening ..."
    monkeypatch.setattr(Session, "open", classmethod(lambda cls, *args, **kwargs: {}["transformer"]))
    dash.open_button.click()
    dash.wait(60)
    assert dash.session is None and dash.session_status.value == "no session open"
    assert "opening tiny-wan failed" in dash.errors.value and "KeyError" in dash.errors.value


def test_dashboard_buttons_run_in_the_background_and_stop_stops_the_request(wan):
    """The buttons' work runs on a thread, so the kernel stays free for the stop button's click; a stopped request
    leaves the results shown before it, an empty error box and a session that generates again. A request run from code
    on the kernel's thread keeps the stop button off (the kernel would take its click only once the cell ends): its
    tooltip and the status say to interrupt the kernel."""
    dash = Dashboard(wan)
    armed, first_step, clicked = threading.Event(), threading.Event(), threading.Event()
    seen = []  # (stop button disabled, its tooltip, the status) at each step

    def hold_at_first_step(event):  # on the request thread, once armed: wait there until the test has clicked stop
        if event.kind == "step":
            seen.append((dash.stop_button.disabled, dash.stop_button.tooltip, dash.request_status.value))
        if event.kind == "step" and armed.is_set() and not first_step.is_set():
            first_step.set()
            clicked.wait(60)

    unsubscribe = wan.subscribe(hold_at_first_step)
    try:
        dash.set_request(**TINY)
        assert dash.stop_button.disabled
        dash.generate_button.click()
        dash.wait(120)
        assert len(dash.results) == 1 and dash.errors.value == ""
        assert seen and all(not off and "interrupt" not in tip + status for off, tip, status in seen)
        assert not dash.generate_button.disabled and dash.stop_button.disabled
        armed.set()
        dash.generate_button.click()  # returns at once: the request runs on the dashboard's thread
        assert first_step.wait(60) and not dash.stop_button.disabled and dash.generate_button.disabled
        dash.stop_button.click()
        assert dash.request_status.value == "stopping ..." and dash.stop_button.disabled
        clicked.set()
        dash.wait(120)
        assert dash.request_status.value == "stopped in denoise, 1 of 2 steps done; the model stays loaded"
        assert dash.errors.value == "" and [label for label, _ in dash.results] == ["#1 stock"]
        assert not dash.generate_button.disabled and dash.stop_button.disabled
        assert re.fullmatch(r"request stopped after [\d.]+ s, 1 step", dash.live.status.value)
        assert wan.active_request is None
        dash.generate_button.click()
        dash.wait(120)
        assert [label for label, _ in dash.results] == ["#1 stock", "#2 stock"] and dash.errors.value == ""
        assert np.array_equal(dash.results[0][1].frames, dash.results[1][1].frames)
        seen.clear()
        assert dash.generate() is not None  # from code, on this (the main) thread
        assert seen and all(off and "interrupt the kernel" in tip + status for off, tip, status in seen)
        assert dash.stop_button.tooltip.startswith("stop the running request")  # the button's own again
    finally:
        clicked.set()
        unsubscribe()
        dash.live.detach()


def test_dashboard_close_or_open_from_code_while_the_button_request_runs_is_refused_in_the_error_box(wan):
    """`close_session()` / `open_model()` typed in a cell while the generate button's request runs: each refusal shows
    in the error box (no traceback) and changes nothing, the panel and the live plot stay bound to the session (a
    refused close had unbound them), no other model is swapped in under the request, and the request's result shows."""
    dash = Dashboard(wan)
    first_step, release = threading.Event(), threading.Event()

    def hold_at_first_step(event):
        if event.kind == "step" and not first_step.is_set():
            first_step.set()
            release.wait(60)

    unsubscribe = wan.subscribe(hold_at_first_step)
    try:
        dash.set_request(**TINY)
        dash.generate_button.click()
        assert first_step.wait(60)
        dash.close_session()
        assert "close failed:</b> RuntimeError" in dash.errors.value and "refused while request" in dash.errors.value
        assert dash.session is wan and dash.panel.session is wan and not dash.close_button.disabled
        assert dash.open_model("tiny-ltx2") is None
        assert "opening tiny-ltx2 failed:</b> RuntimeError(&#x27;busy: request" in dash.errors.value
        assert dash.session is wan and "tiny-wan" in dash.session_status.value
        release.set()
        dash.wait(60)
        assert [label for label, _ in dash.results] == ["#1 stock"] and dash.request_status.value.startswith("#1 stock")
        assert dash.live.status.value.startswith("request done")  # the live plot followed the request to its end
    finally:
        release.set()
        dash.wait(60)
        unsubscribe()
        dash.live.detach()


def test_dashboard_stop_as_the_request_ends_leaves_its_outcome_not_stopping(wan, monkeypatch):
    """A stop click whose `Session.stop` returns only after the request has ended (the kernel's thread paused there)
    must not write "stopping ..." over the request's outcome: the status said "stopping ..." for good."""
    dash = Dashboard(wan)
    first_step, release, outcome = threading.Event(), threading.Event(), threading.Event()

    def hold_at_first_step(event):
        if event.kind == "step" and not first_step.is_set():
            first_step.set()
            release.wait(60)

    real_stop = wan.stop

    def stop_then_pause():  # asks, then lets the request run to its outcome before returning (0.5 s at most)
        request_id = real_stop()
        release.set()
        outcome.wait(0.5)  # the fixed dashboard writes its outcome only after this stop is done: the wait runs out
        return request_id

    monkeypatch.setattr(wan, "stop", stop_then_pause)
    dash.request_status.observe(lambda change: change["new"].startswith("stopped") and outcome.set(), "value")
    unsubscribe = wan.subscribe(hold_at_first_step)
    try:
        dash.set_request(**TINY)
        dash.generate_button.click()
        assert first_step.wait(60)
        dash.stop_button.click()
        dash.wait(60)
        assert dash.request_status.value == "stopped in denoise, 1 of 2 steps done; the model stays loaded"
        assert dash.stop_button.disabled and not dash.generate_button.disabled and wan.active_request is None
    finally:
        release.set()
        dash.wait(60)
        unsubscribe()
        dash.live.detach()


def test_dashboard_rejects_no_models():
    with pytest.raises(ValueError, match="session_or_model_names"):
        Dashboard([])


def test_dashboard_refuses_a_bare_name_a_bad_device_and_non_integer_sizes_up_front():
    """A str is not a sequence of model names (it would list its letters), a device that is no device is refused at
    construction (not later in the error box on open), and the form takes no float or bool where an integer is
    meant (2.7 would be stored as 2, True as 1): each a ValueError naming the parameter or field, nothing changed."""
    with pytest.raises(ValueError, match=r"session_or_model_names: a bare str 'tiny-wan'; allowed: .*\['tiny-wan'\]"):
        Dashboard("tiny-wan", device="cpu")
    for device in ("bogus", None, "cpu:7"):
        with pytest.raises(ValueError, match=r"^device: .*allowed: auto, cpu, cuda, cuda:N"):
            Dashboard(["tiny-wan"], device=device)
    assert Dashboard(["tiny-wan"], device="cuda").device == "cuda"  # a machine without CUDA says so on open
    dash = Dashboard(["tiny-wan"], device="cpu")
    dash.set_request(seed=5, frames=np.int64(9), steps=0)  # numpy integers taken; 0: the model's default
    assert (dash.seed.value, dash.fields["frames"].value, dash.fields["steps"].value) == (5, 9, 0)
    assert type(dash.fields["frames"].value) is int
    for field, bad in (("frames", 2.7), ("frames", True), ("steps", np.float32(4)), ("seed", -1), ("width", 5000)):
        with pytest.raises(ValueError, match=rf"^request form: {field}: .*\[0, \d+\]"):
            dash.set_request(**{"prompt": "changed", "seed": 7, field: bad})
    assert dash.seed.value == 5 and dash.fields["frames"].value == 9 and dash.prompt.value != "changed"


def test_dashboard_defaults_to_demo_av_and_lays_out_controls_first():
    dash = Dashboard(device="cpu")
    assert MODELS[0] == "demo-av" and dash.picker.value == "demo-av" and dash.session is None
    model_row, plan, form, panel, generate_row = dash.controls.children
    assert dash.picker in model_row.children and dash.memory in model_row.children and dash.prompt in form.children
    assert dash.close_button in model_row.children and dash.close_button.disabled  # nothing to close yet
    assert plan is dash.plan and plan.layout.display == "none"  # no cap, no plan
    assert panel is dash.panel and dash.generate_button in generate_row.children
    assert dash.children[0] is dash.controls and dash.children[-1] is dash.ab


def test_dashboard_numbers_results_per_model_and_closes_the_sessions_it_opened(wan):
    dash = Dashboard(["tiny-wan"], device="cpu")
    try:
        first = dash.open_model()
        assert first is not None
        dash.set_request(**TINY)
        assert dash.generate() is not None and dash.generate() is not None
        assert [label for label, _ in dash.results] == ["#1 stock", "#2 stock"]
        assert dash.open_model("tiny-wan") is not None  # a model opened again starts at #1 with an empty A/B
        assert dash.results == [] and dash.ab_player is None
        assert first.closed and dash.session is not first  # the dashboard's own session is let go of
        dash.set_request(**TINY)
        assert dash.generate() is not None and dash.results[0][0] == "#1 stock"
    finally:
        dash.live.detach()
    given = Dashboard(wan)
    try:
        assert given.open_model("tiny-wan") is not None and not wan.closed  # a session handed over stays open
        given.open_model("no-such-model")  # a failed open after closing its own: no session, nothing bound
        assert given.session is None and given.panel.session is None and "no-such-model" in given.errors.value
        assert given.close_button.disabled and given.open_model("tiny-wan") is not None
        opened = given.session
        given.close_button.click()  # the close button lets go of the session on screen
        given.wait(60)
        assert opened.closed and given.session is None and given.session_status.value == "no session open"
        assert given.generate() is None and "no session" in given.errors.value
    finally:
        given.live.detach()


def test_a_dashboard_made_again_closes_the_last_ones_session_and_its_renderer_thread(wan):
    """A cell that makes a Dashboard and opens a model, run three times: each opening closes the session the previous
    dashboard opened and ends its live plot's renderer thread (every run kept its model loaded and a thread running,
    the first ones never closed). `close()` lets go of the last one's; a session handed to a dashboard stays open."""
    dashes, sessions, renderers = [], [], []
    for _ in range(3):
        dash = Dashboard(["tiny-wan"], device="cpu")
        sessions.append(dash.open_model())
        dashes.append(dash)
        renderers.append(dash.live._renderer)
    assert all(session is not None for session in sessions)
    assert [session.closed for session in sessions] == [True, True, False]
    assert [renderer.is_alive() for renderer in renderers] == [False, False, True]
    for dash in dashes[:2]:
        assert dash.session is None and "a later Dashboard opened tiny-wan" in dash.session_status.value
    dashes[-1].close()
    assert sessions[-1].closed and not renderers[-1].is_alive() and dashes[-1].comm is None
    given = Dashboard(wan)
    renderer = given.live._renderer
    given.close()
    assert not wan.closed and not renderer.is_alive()


@pytest.mark.skipif(not (SHIPPED_MODELS["demo-av"] / "model_index.json").is_file(), reason="demo-av is not shipped")
def test_dashboard_shows_models_by_name_not_path(sessions):
    demo = sessions("demo-av")
    assert demo.model.name == "demo-av"  # a shipped checkpoint goes by its name
    dash = Dashboard(demo)
    try:
        assert dash.picker.options == ("demo-av",)
        assert (
            "<b>demo-av</b> on cpu" in dash.session_status.value and "models/demo-av" not in dash.session_status.value
        )
    finally:
        dash.live.detach()
    assert model_name(str(SHIPPED_MODELS["demo-av"])) == "demo-av"
    assert model_name("/data/models/wan-1.3b") == "wan-1.3b" and model_name("tiny-wan") == "tiny-wan"


def test_dashboard_memory_cap_refusal_at_field_then_smallest_cap_plans_and_shows_residency():
    dash = Dashboard(["tiny-wan"], device="cpu")
    try:
        dash.memory.widget.value = "48 gigs"  # marked as typed; open refuses it at the field, nothing loads
        assert "48 gigs" in dash.memory.message.value and "vflash-invalid" in dash.memory._dom_classes
        assert dash.open_model() is None and dash.session is None and dash.errors.value == ""
        dash.memory.widget.value = "rtx4090-48gb"  # a card preset is offered and parses
        assert "rtx4090-48gb" in dash.memory.widget.options and dash.memory.error is None
        dash.memory.widget.value = "1KiB"  # parses, but no plan fits: the planner's refusal shows at the field
        assert dash.memory.error is None and dash.open_model() is None and dash.errors.value == ""
        smallest = re.search(r"the smallest cap that fits is .* \((\d+) bytes\)", dash.memory.error)
        assert smallest is not None and "Traceback" not in dash.memory.message.value
        dash.memory.widget.value = smallest[1]  # the cap the refusal named fits
        session = dash.open_model()
        assert session is not None and dash.memory.error is None
        plan = session.memory_plan
        assert plan.offloaded and plan.denoisers_offloaded  # the tightest plan offloads components and the denoiser
        assert str(plan) in html.unescape(dash.plan.value) and dash.plan.layout.display is None
        given = Dashboard(session)  # a dashboard on a capped session shows its cap and plan
        given.live.detach()
        assert MemoryBudget.of(given.memory.widget.value).cap_bytes == plan.cap and given.plan.value == dash.plan.value
        assert f"under a {gib(plan.cap)} cap" in given.session_status.value
        dash.set_request(**TINY)
        result = dash.generate()
        assert result is not None and dash.errors.value == ""
        receipt = result.receipts["memory_residency"]
        counts = [receipt.get(key, 0) for key in ("blocks_streamed", "prefetched", "late", "component_onloads")]
        assert (
            counts[3] > 0
            and "ring {} blocks streamed ({} prefetched, {} late)".format(*counts[:3]) in dash.residency.value
            and f"{counts[3]} component onloads" in dash.residency.value
        )
        assert all(gib(peak) in dash.residency.value for peak in plan.stage_peaks.values())
        dash.memory.fp8.value = True  # the box reaches the budget; this plan streams no block, so nothing is FP8
        session = dash.open_model()
        assert session is not None and session.memory_plan.ring_transfer == "fp8" and dash.memory.error is None
        assert not session.memory_plan.approximate and "FP8" not in dash.plan.value
        result = dash.generate()
        assert result is not None and result.exact and "FP8" not in dash.residency.value
        dash.memory.widget.value = ""  # FP8 without a cap is refused at the field
        assert "FP8 ring transfers move the blocks a cap streams" in dash.memory.message.value
        assert dash.open_model() is None
        dash.memory.fp8.value = False  # empty: no cap, no plan, no residency block
        assert dash.open_model().memory_plan is None
        assert dash.plan.layout.display == dash.residency.layout.display == "none"
    finally:
        dash.live.detach()
