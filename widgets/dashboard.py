"""One screen for exploring: pick a model, toggle accelerations, generate, and compare the last two results.

Top to bottom: the model row (with the memory cap), the memory plan (only under a cap), the request form, the
acceleration panel, the generate row (together they fit one 1,100 px screen while the plugins are off), then the error
box, the live stage plot, the last result's memory residency (only under a cap) and the A/B area.
"""

from __future__ import annotations

import functools
import html
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ipywidgets
import traitlets
from IPython.display import HTML

from workbench import Request, RequestStopped, Result, Session, environment
from workbench.memory_plan import gib
from workbench.models import SHIPPED_MODELS
from workbench.request import INT_RANGES, integer

from ._common import ErrorBox, StaticCopy
from .audio import ABAudio
from .live import LiveStagePlot
from .memory import MemoryCapField, plan_html, residency_html
from .panel import AccelerationPanel
from .player import ABPlayer

# the trained ones first: an A/B you can see and hear
MODELS = ("demo-av", "demo-av-mini", "tiny-wan", "tiny-wan22", "tiny-ltx2")
_FIELDS = ("frames", "height", "width", "steps")
_STOP_TOOLTIP = "stop the running request at its next stage, denoiser call or decoder block; the model stays loaded"
_INTERRUPT_TOOLTIP = (
    "this request runs from code on the kernel's thread, which takes no click until it ends: "
    "interrupt the kernel to stop it"
)
# The last Dashboard that opened a session of its own: the next one to open one closes that session first, so a cell
# run again (a new Dashboard each time) keeps one model loaded, not one per run.
_last_opener: weakref.ref[Dashboard] | None = None


def model_name(name: str) -> str:
    """How a model shows in the UI: a shipped checkpoint by its name (`demo-av`), a local folder by its folder name.

    `Session.open("demo-av")` loads the shipped folder, and the session's model then carries that folder's path.
    """
    path = Path(name)
    for shipped, folder in SHIPPED_MODELS.items():
        if path == folder or (path.is_absolute() and path.resolve() == folder.resolve()):
            return shipped
    return path.name if path.is_absolute() or len(path.parts) > 1 else name


def _refreshing(action: Callable[..., Any]) -> Callable[..., Any]:
    """A Dashboard action after which, returned or raised, the displays of the dashboard and of its A/B area show its
    outcome in their static copies (`StaticCopy.refresh_static`)."""

    @functools.wraps(action)
    def run(self: Dashboard, *args: Any, **kwargs: Any) -> Any:
        try:
            return action(self, *args, **kwargs)
        finally:
            self.refresh_static()
            self.ab.refresh_static()

    return run


class ABArea(StaticCopy, ipywidgets.VBox):
    """The Dashboard's A/B area: the players of its last two results, or a one-line note of why there are none."""

    def static(self) -> HTML:
        """The area as it stands, as self-contained HTML: `ABPlayer.static`, `ABAudio.static` and its notes."""
        parts = [part.value if isinstance(part, ipywidgets.HTML) else part.static().data for part in self.children]
        return HTML(f'<div class="vflash-ab-area-static">{"".join(parts)}</div>')


class Dashboard(StaticCopy, ipywidgets.VBox):
    """Session picker, request form, acceleration panel, generate button, live stage plot and an A/B area.

    `Dashboard(session)` works on an open session; `Dashboard(["demo-av", ...], device="cpu")` lets the
    user open one (nothing is loaded until `open_model` or the open button), under the memory cap typed in
    `memory` (empty: none; a cap the planner refuses is shown at that field, naming the smallest that fits); the
    plan shows under the model row, and each result's residency receipt under the live plot. Models show by name (`demo-av`,
    not the folder it loads from). Results are numbered per model (`#1 stock`, `#2 cross_kv_cache`; opening
    a model starts again at #1). The A/B area (`ab`, a box that always holds the current comparison: display
    it to follow the latest pair) keeps the last two results: an `ABPlayer` (and an `ABAudio` when both have
    audio at one sample rate) of the older against the newer; a part that cannot be compared says why in one line.
    Every display of the dashboard or of `ab` also carries its static copy (`static()`, `ab.static()`), which is what
    an HTML export without widget state shows in its place; opening, closing and generating bring the copies of the
    displays made so far up to date, so a saved notebook shows the finished requests.
    The buttons run their work on a background thread (the kernel stays responsive) and only set widget
    values from it; `open_model()`/`generate()` called from code run on the caller's thread and return. Every
    failure shows in the error box; none is a traceback. `close()` lets go of the session the dashboard opened and of
    its live plot's thread; opening a model closes the session the last other Dashboard opened (a cell run again).

    Construction refuses, with a ValueError naming the parameter: a bare str for `session_or_model_names` (a
    sequence of names is meant: `Dashboard(["tiny-wan"])`, not `Dashboard("tiny-wan")`), no names, and a `device`
    that `workbench.environment.device` refuses as a value (`bogus`, None, `cpu:7`). A well-formed `cuda` on a
    machine without CUDA is not refused here: the machine is asked when a model is opened, and the error box says so.
    """

    def __init__(self, session_or_model_names: Session | Sequence[str] = MODELS, device: str = "auto"):
        if isinstance(session_or_model_names, str | bytes):
            raise ValueError(
                f"session_or_model_names: a bare {type(session_or_model_names).__name__} "
                f"{session_or_model_names!r}; allowed: a Session or a sequence of model names, e.g. "
                f"[{session_or_model_names!r}]"
            )
        try:
            environment.device(device)  # its ValueError names `device` and the allowed values
        except RuntimeError:  # CUDA asked for on a machine without it: Session.open says so in the error box
            pass
        self.device = device
        self.session: Session | None = None
        self.results: list[tuple[str, Result]] = []  # at most the last two, oldest first
        self.ab_player: ABPlayer | None = None
        self.ab_audio: ABAudio | None = None
        self._busy = threading.Lock()
        self._thread: threading.Thread | None = None
        # guards `_requesting` and the status writes of `stop`: a stop asked for as the request ends never writes
        # "stopping ..." over the request's outcome
        self._stop_lock = threading.Lock()
        self._requesting = False  # a request of `generate` is in `Session.generate`
        self._count = 0
        self._opened_here = False  # the session is the dashboard's own (open_model), closed when replaced
        given = session_or_model_names if isinstance(session_or_model_names, Session) else None
        names = [model_name(given.model.name)] if given is not None else list(session_or_model_names)
        if not names or not all(isinstance(name, str) and name for name in names):
            raise ValueError(f"session_or_model_names: a Session or non-empty model names, got {names!r}")
        short = {"description_width": "initial"}
        self.picker = ipywidgets.Dropdown(
            options=names, value=names[0], description="model", style=short, layout={"width": "240px"}
        )
        self.memory = MemoryCapField()
        self.plan = ipywidgets.HTML(layout={"display": "none"})
        self.residency = ipywidgets.HTML(layout={"display": "none"})
        self.open_button = ipywidgets.Button(description="open", icon="folder-open", layout={"width": "auto"})
        self.close_button = ipywidgets.Button(
            description="close", icon="times", disabled=True, tooltip="let go of the model and the device"
        )
        self.close_button.layout.width = "auto"
        self.session_status = ipywidgets.HTML("no session open", layout={"flex": "1 1 0", "min_width": "0"})
        self.panel = AccelerationPanel()
        self.prompt = ipywidgets.Text(
            "a red circle moves left slow on a dark background, soft low hum",
            description="prompt",
            style=short,
            layout={"width": "100%", "max_width": "720px"},
        )
        self.seed = ipywidgets.IntText(0, description="seed", style=short, layout={"width": "150px"})
        self.fields = {
            name: ipywidgets.IntText(0, description=name, style=short, layout={"width": "150px"}) for name in _FIELDS
        }
        self.generate_button = ipywidgets.Button(description="generate", icon="play", button_style="primary")
        self.stop_button = ipywidgets.Button(
            description="stop",
            icon="stop",
            disabled=True,
            layout={"width": "auto"},
            tooltip=_STOP_TOOLTIP,
        )
        self.request_status = ipywidgets.HTML(layout={"flex": "1 1 0", "min_width": "0"})
        self.live = LiveStagePlot(show_static=True)
        self.ab = ABArea([ipywidgets.HTML("<i>A/B: generate twice to compare the last two results</i>")])
        self.ab.add_class("vflash-ab")
        self.errors = ErrorBox()
        row = {"align_items": "center", "flex_flow": "row wrap", "overflow": "visible"}
        model_row = ipywidgets.HBox(
            [self.picker, self.memory, self.open_button, self.close_button, self.session_status], layout=row
        )
        form = ipywidgets.VBox(
            [self.prompt, ipywidgets.HBox([self.seed, *self.fields.values()], layout=row)],
            layout={"overflow": "visible"},
        )
        form.add_class("vflash-request")
        generate_row = ipywidgets.HBox([self.generate_button, self.stop_button, self.request_status], layout=row)
        generate_row.add_class("vflash-generate")
        self.controls = ipywidgets.VBox(
            [model_row, self.plan, form, self.panel, generate_row], layout={"overflow": "visible"}
        )
        self.controls.add_class("vflash-controls")
        super().__init__(
            [self.controls, self.errors, self.live, self.residency, self.ab], layout={"overflow": "visible"}
        )
        self.add_class("vflash-dashboard")
        self.open_button.on_click(lambda _: self._in_background("open", lambda: self.open_model(self.picker.value)))
        self.close_button.on_click(lambda _: self._in_background("close", self.close_session))
        self.generate_button.on_click(lambda _: self._in_background("generate", self.generate))
        self.stop_button.on_click(lambda _: self.stop())
        if given is not None:
            self._use(given)

    # -- actions ----------------------------------------------------------------------------------
    @_refreshing
    def open_model(self, name: str | None = None) -> Session | None:
        """Open model `name` (default: the picker's) with `Session.open(name, device=..., memory=<the cap field>)`
        and use it. A session this dashboard opened before is closed first (two models need not fit the device
        together, and a memory cap is the whole process's), and so is the one the last other Dashboard to open one
        opened (a notebook cell run again makes a new Dashboard: the previous run's model goes, and that dashboard's
        status says so); one handed to a dashboard stays open. A cap that does not parse is shown at the cap field
        and changes nothing; a refused cap there too, other failures in the error box, and then no session is open.
        While a request runs on a session to be closed (the generate button's, called from code meanwhile) it is
        refused in the error box (`busy: ...`) and the sessions stay."""
        global _last_opener
        name = name or self.picker.value
        self.errors.clear()
        try:
            cap = self.memory.cap()
        except ValueError as error:
            self.memory.refuse(str(error))
            return None
        if self.session is not None and self.session.active_request is not None:
            busy = f"busy: request {self.session.active_request} runs on this session; stop it or wait for it"
            self.errors.show(f"opening {name}", RuntimeError(busy))
            return None
        previous = _last_opener() if _last_opener is not None else None
        if previous is not None and previous is not self and previous._opened_here and previous.session is not None:
            previous.close_session()
            if previous.session is not None:  # refused: a request of its generate button runs on it
                busy = f"busy: request {previous.session.active_request} runs on an earlier Dashboard's session"
                self.errors.show(f"opening {name}", RuntimeError(f"{busy}; stop it or wait for it"))
                return None
            previous.session_status.value = f"no session open: a later Dashboard opened {html.escape(name)}"
        if self._opened_here:
            self.close_session()
            if self.session is not None:  # the close was refused: the error box says why
                return None
        self.session_status.value = f"opening {html.escape(name)} ..."
        try:
            session = Session.open(name, device=self.device, memory=cap)
        except Exception as error:  # a loader's bug too: the status must not stay "opening ..."
            self.session_status.value = "no session open" if self.session is None else self._describe_session()
            if isinstance(error, ValueError) and str(error).startswith("memory"):
                self.memory.refuse(str(error))
            else:
                self.errors.show(f"opening {name}", error)
            return None
        if name not in self.picker.options:
            self.picker.options = [*self.picker.options, name]
        self.picker.value = name
        self._use(session)
        self._opened_here = True
        _last_opener = weakref.ref(self)
        return session

    @_refreshing
    def close_session(self) -> None:
        """Close the session on screen (`Session.close`: the model and the device let go of, a memory cap lifted),
        also one handed to the dashboard; the widgets let go of it and the results shown stay. A close the session
        refuses (a request runs on it) shows in the error box and changes nothing: the widgets stay bound to it."""
        if self.session is None:
            return
        try:
            self.session.close()
        except RuntimeError as error:
            self.errors.show("close", error)
            return
        self._detach()
        self.session = None
        self.close_button.disabled = True
        self.plan.layout.display = "none"
        self.session_status.value = "no session open"

    def close(self) -> None:
        """Let go of everything the dashboard holds, then close its widget (its views leave the page): a request of its
        generate button still running is stopped (`Session.stop`) and waited for, the session it opened is closed (one
        handed to it stays open), and the live plot is detached (its renderer thread ends) and closed. Closing again
        does nothing."""
        if self.comm is None:  # closed already (or never opened: a constructor that refused its arguments)
            return
        with self._stop_lock:
            if self._requesting and self.session is not None:
                self.session.stop()
        self.wait(60)
        if self._opened_here:
            self.close_session()  # refused while a request from code still runs: its error box says so
        self._detach()
        self.live.close()
        super().close()

    def request(self) -> Request:
        """The form as a `Request`; a field left at 0 takes the model's default. Bad values: ValueError."""
        sizes = {name: widget.value or None for name, widget in self.fields.items()}
        return Request(self.prompt.value, seed=self.seed.value, **sizes)

    def set_request(self, prompt: str | None = None, seed: int | None = None, **sizes: int | None) -> None:
        """Fill in the form from code (what a user would type); a field given None keeps the form's value (a size of
        0 there, or given: the model's default).

        Every value is checked before any is set (a refused call changes nothing): `prompt` a str (a blank one is
        refused when generating, as from the form), `seed` and the sizes integers (numpy integers taken, bools and
        floats refused) in `Request`'s ranges (`workbench.request.integer`, `INT_RANGES`), a size also 0. A bad
        value is a ValueError starting `request form: <field>: `."""
        unknown = sorted(set(sizes) - set(_FIELDS))
        if unknown:
            raise ValueError(f"request form: unknown field(s) {unknown}; allowed: {list(_FIELDS)}")
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError(f"request form: prompt: {prompt!r}; allowed: a str")
        checked: dict[str, tuple[traitlets.HasTraits, Any]] = {}
        if prompt is not None:
            checked["prompt"] = (self.prompt, prompt)
        if seed is not None:
            checked["seed"] = (self.seed, integer("request form: seed", seed, *INT_RANGES["seed"]))
        for name, value in sizes.items():
            if value is not None:  # 0: the model's default
                checked[name] = (self.fields[name], integer(f"request form: {name}", value, 0, INT_RANGES[name][1]))
        for widget, value in checked.values():
            widget.value = value

    def generate(self) -> Result | None:
        """Run the form's request on the session (LiveStagePlot attached) and update the A/B area.

        Returns the result, or None when it failed (the error box says why). The generate button is off from the
        start until everything the request updates is shown (the A/B area, the static copies), so an enabled button
        means the dashboard takes the next action. The stop button is on while the request runs off the kernel's main
        thread (the generate button's); one run from code on that thread keeps the kernel from taking the click until
        the cell ends, so the stop button stays off and its tooltip and the status say to interrupt the kernel.
        """
        self.generate_button.disabled = True
        try:
            return self._generate()
        finally:
            self.generate_button.disabled = False

    @_refreshing
    def _generate(self) -> Result | None:
        self.errors.clear()
        if self.session is None:
            self.errors.show("generate", RuntimeError("no session: pick a model and open it first"))
            return None
        on_kernel_thread = threading.current_thread() is threading.main_thread()
        self.request_status.value = (
            "running ... (interrupt the kernel to stop it)" if on_kernel_thread else "running ..."
        )
        try:
            request = self.request()
            with self._stop_lock:
                self._requesting, self.stop_button.disabled = True, on_kernel_thread
                self.stop_button.tooltip = _INTERRUPT_TOOLTIP if on_kernel_thread else _STOP_TOOLTIP
            try:
                result = self.session.generate(request, progress=False)
            finally:  # before the outcome is written, so a late stop cannot overwrite it
                with self._stop_lock:
                    self._requesting, self.stop_button.disabled = False, True
                    self.stop_button.tooltip = _STOP_TOOLTIP
        except RequestStopped as stopped:  # asked for: the status says so, the error box stays empty
            self.request_status.value = (
                f"stopped {stopped.where}, {stopped.steps_done} of {stopped.steps} steps done; the model stays loaded"
            )
            return None
        except Exception as error:  # a plugin's or a model's bug (KeyError, TypeError) too, not only ValueError
            self.errors.show("generate", error)
            self.request_status.value = "failed"
            return None
        except BaseException:  # a kernel interrupt of a request run from code: the status must not say running
            self.request_status.value = "interrupted"
            raise
        self._count += 1
        label = f"#{self._count} " + (" + ".join(self.session.accelerations) or "stock")
        self.request_status.value = f"{html.escape(label)}: {result.timings.get('total', 0.0):.3f} s"
        self.results = [*self.results, (label, result)][-2:]
        self.residency.value = residency_html(result, label)
        self.residency.layout.display = None if self.residency.value else "none"
        self._show_ab()
        return result

    def stop(self) -> None:
        """Ask the session's running request to stop (`Session.stop`): the stop button. The request ends at its next
        stage, denoiser call or decoder block; the results shown before it stay. A request started from code on the
        kernel's own thread keeps the kernel busy, so the button reaches only one started by the generate button;
        interrupt the kernel to stop the other. Once the request has ended (a click as it finishes) it does nothing:
        the status shows the request's outcome, never a "stopping ..." left behind."""
        with self._stop_lock:
            if self._requesting and self.session is not None and self.session.stop() is not None:
                self.request_status.value = "stopping ..."
                self.stop_button.disabled = True

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a button's background work to finish (for code and tests)."""
        if self._thread is not None:
            self._thread.join(timeout)

    # -- internals --------------------------------------------------------------------------------
    def _detach(self) -> None:
        """The widgets let go of the session (nothing shown is bound to it any more)."""
        self.live.detach()
        self.panel.bind(None)

    def _use(self, session: Session) -> None:
        if self.session is not None and self.session is not session:
            self.live.detach()
        self.session = session
        self._opened_here = False
        self.close_button.disabled = False
        self.panel.bind(session)
        self.live.attach(session)
        self.results = []
        self._count = 0  # results are numbered per model
        self.ab.children = [ipywidgets.HTML("<i>A/B: generate twice to compare the last two results</i>")]
        self.ab_player = self.ab_audio = None
        plan = session.memory_plan
        if plan is not None:
            self.memory.show_cap(plan.cap)
        self.plan.value = plan_html(plan)
        self.plan.layout.display = None if plan is not None else "none"
        self.residency.value, self.residency.layout.display = "", "none"
        defaults = session.model.defaults
        for name, widget in self.fields.items():
            widget.value = int(defaults.get(name) or 0)
        self.session_status.value = self._describe_session()

    def _describe_session(self) -> str:
        session = self.session
        name = html.escape(model_name(session.model.name))
        cap = "" if session.memory_plan is None else f" under a {gib(session.memory_plan.cap)} cap"
        return f"<b>{name}</b> on {session.device}{cap}, loaded in {session.init_seconds:.2f} s"

    def static(self) -> HTML:
        """The dashboard as it stands, as self-contained HTML: the session and the last request's status, the
        memory plan, any error, the live plot's figures, the last result's residency and the A/B area's copy. The
        controls are left out: they only work with a running kernel."""
        status = self.session_status.value + (
            f"; last request {self.request_status.value}" if self.request_status.value else ""
        )
        plan, errors, residency = (
            w.value if w.layout.display != "none" else "" for w in (self.plan, self.errors, self.residency)
        )
        body = [plan, errors, self.live.static().data, residency, self.ab.static().data]  # in the screen's order
        return HTML(f'<div class="vflash-dashboard-static"><p><b>Dashboard</b>: {status}</p>{"".join(body)}</div>')

    def _show_ab(self) -> None:
        """The A/B area for the last two results: their videos whenever they are comparable, and their audio when
        both have a track at one sample rate. A part that cannot be compared shows a one-line reason instead (audio
        says nothing when neither result has any); videos that cannot be compared also show in the error box."""
        if len(self.results) < 2:
            return
        (label_a, a), (label_b, b) = self.results
        labels = (label_a, label_b)
        try:  # the players on screen (also where a notebook displayed them again) take the new pair
            if self.ab_player is None:
                self.ab_player = ABPlayer(a, b, labels=labels)
            else:
                self.ab_player.compare(a, b, labels)
            video = self.ab_player
        except ValueError as error:  # other size, frame count or fps, or a clip the encoder refuses
            self.ab_player = None
            video = ipywidgets.HTML(f"<i>A/B video not compared: {html.escape(str(error))}</i>")
            self.errors.show("A/B", error)
        if a.audio is None and b.audio is None:  # video-only models: no audio to compare, nothing to say
            self.ab_audio = audio = None
        else:
            try:
                if self.ab_audio is None:
                    self.ab_audio = ABAudio(a, b, labels=labels)
                else:
                    self.ab_audio.compare(a, b, labels)
                audio = self.ab_audio
            except ValueError as error:  # one side has no audio, or the sample rates differ
                self.ab_audio = None
                audio = ipywidgets.HTML(f"<i>A/B audio not compared: {html.escape(str(error))}</i>")
        self.ab.children = [w for w in (video, audio) if w is not None]

    def _in_background(self, what: str, work: Any) -> None:
        """Run a button's work on a thread; one at a time, errors into the box."""
        if not self._busy.acquire(blocking=False):
            self.errors.show(what, RuntimeError("busy: the previous action is still running"))
            return

        def run() -> None:
            try:
                with self.errors.catching(what):
                    work()
            finally:
                self._busy.release()

        self._thread = threading.Thread(target=run, name=f"dashboard-{what}", daemon=True)
        self._thread.start()
