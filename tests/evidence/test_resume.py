"""Resumable calibration (workbench.evidence.resume): a stack killed mid-bisection and again before its
confirmation, then finished under `max_seconds=0`, ends with the record an uninterrupted run writes, timing fields
aside; `max_seconds` stops cleanly after one new step; a partial record of other arguments or other dense
references is refused; the CLI prints the command that continues a stopped run. Resumable qualify, sweep and
search (one step per finished case): a CLI run interrupted after its first case, then resumed with the command its
Ctrl-C line prints, runs only the rest and writes an uninterrupted run's record; a resume of other arguments is
refused naming the field; `--max-seconds 0` makes every call run one case, and the calls end with the same
record. A qualification's pilots are kept beside its partial record, so the resumed report embeds every case's."""

import json
import re
import shlex
import time

import numpy as np
import pytest

from workbench import Request, Session
from workbench.cli import main
from workbench.evidence import harness
from workbench.evidence.calibrate import calibrate, stack
from workbench.evidence.records import read_record
from workbench.evidence.resume import PARTIAL, Journal, Partial, Paused, outputs_folder, partial_path, read_partial
from workbench.quality import Budget
from workbench.result import Result

SIZE = {"frames": 5, "height": 16, "width": 16, "steps": 6, "guidance": 1.0}
CALIBRATION = [Request("a red fox runs through snow", seed=7, **SIZE)]
TEST = [Request("a blue kite over a beach", seed=1_000_007, **SIZE)]
BUDGET = Budget(latent_rel_l2=0.03, psnr_db=None, min_ssim=None)  # teacache crosses it inside its range on tiny-wan
TIMING = {"seconds", "speedup", "session", "baseline_seconds", "candidate_seconds", "warmup_seconds"}
TIMING |= {"install_seconds", "stage_speedups", "nvml", "init_seconds"}


def untimed(value):
    """`value` (a record) without the fields a run's timing decides."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in TIMING}
    return [untimed(v) for v in value] if isinstance(value, list) else value


@pytest.fixture(scope="module")
def tiny():
    return Session.open("tiny-wan", device="cpu")


def test_stack_killed_twice_then_resumed_equals_the_uninterrupted_run(tiny, tmp_path, monkeypatch):
    kwargs = {"max_evals": 3, "progress": False}
    plugins = ["teacache", "easycache"]  # one feature-cache group: easycache's re-search over teacache is refused
    whole = stack(tiny, CALIBRATION, TEST, plugins, BUDGET, **kwargs)
    assert whole.status == "quality_confirmed", whole.reason
    assert [p.spent <= whole.margin for p in whole.singles[0].points] == [True, False, True], "needs a bisection"
    real_step = Journal.step

    def killed(when):
        """Run the stack until `when(journal, kind)` holds before a new step, then kill it there."""

        def step(self, kind, key, run, expected):
            if self.cursor == len(self.steps) and when(self, kind):
                raise KeyboardInterrupt
            return real_step(self, kind, key, run, expected)

        with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
            patch.setattr(Journal, "step", step)
            stack(tiny, CALIBRATION, TEST, plugins, BUDGET, resume=tmp_path, **kwargs)
        return json.loads((tmp_path / PARTIAL).read_text())

    record = killed(lambda journal, kind: journal.new == 2)  # mid-bisection: base point and teacache's low value
    assert record["status"] == "partial" and len(record["steps"]) == 2
    record = killed(lambda journal, kind: kind == "confirmation")
    assert [step["kind"] for step in record["steps"]] == ["point"] * len(record["steps"])
    result = stack(tiny, CALIBRATION, TEST, plugins, BUDGET, resume=tmp_path, max_seconds=0, **kwargs)
    assert untimed(result.to_record()) == untimed(whole.to_record())  # its one new step was the last
    sessions = [p.session for run in [*result.singles, *result.members] for p in run.points]
    assert len(set(sessions)) == 2 and len({p.session for p in whole.singles[0].points}) == 1


def test_resume_refuses_other_arguments_other_references_and_a_bad_time_budget(tiny, tmp_path):
    kwargs = {"max_evals": 3, "progress": False, "resume": tmp_path}
    first = calibrate(tiny, CALIBRATION, None, "teacache", BUDGET, max_seconds=0, **kwargs)
    assert isinstance(first, Partial) and first.path == tmp_path / PARTIAL and first.remaining["done"] == 1
    assert "step boundary" in first.reason and first.remaining["next"].startswith("point value 0.6")  # after 0
    with pytest.raises(ValueError, match="made by another run \\(margin: 0.8 recorded, 0.5 now"):
        calibrate(tiny, CALIBRATION, None, "teacache", BUDGET, margin=0.5, **kwargs)
    record = json.loads(first.path.read_text())
    record["references"][0]["frames"] = "0" * 64
    first.path.write_text(json.dumps(record))
    with pytest.raises(RuntimeError, match="dense output of calibration seed 7 differs"):
        calibrate(tiny, CALIBRATION, None, "teacache", BUDGET, **kwargs)
    for field, value, message in [
        ("run", None, "'run' must be an object"),
        ("steps", "oops", "'steps' must be a list"),
        ("steps", [{"x": 1}], r"steps\[0\] must be an object with 'kind', 'key' and 'value'"),
    ]:  # a hand-edited or damaged record: its form is refused by name, before anything runs
        first.path.write_text(json.dumps(record | {field: value}))
        with pytest.raises(ValueError, match=f"resume: {tmp_path / PARTIAL}: {message}"):
            read_partial(first.path)
    first.path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="max_seconds: needs resume="):
        calibrate(tiny, CALIBRATION, None, "teacache", BUDGET, max_seconds=10)
    with pytest.raises(ValueError, match="max_seconds: -1"):
        calibrate(tiny, CALIBRATION, None, "teacache", BUDGET, max_seconds=-1, **kwargs)


def test_journal_counts_max_seconds_from_started_and_quotes_the_limit_given(tmp_path):
    """A caller that spent time before the search (the CLI loads the model) passes its own start: the limit is the
    one its user gave, and the reason of a stop says that limit and the seconds since that start."""
    journal = Journal(tmp_path, "calibration", {"a": 1}, at_most=3, max_seconds=60, started=time.perf_counter() - 50)
    journal.step("plan", {"part": 0}, lambda: {"x": 1}, expected=100)  # the first new step runs whatever it takes
    with pytest.raises(Paused) as stopped:  # 50 s spent + 20 s expected (a kind not timed yet) > 60 s
        journal.step("measure", {"part": 1}, lambda: {"x": 2}, expected=20)
    assert re.search(r"stopped at a step boundary: 5\d s spent of max_seconds=60, ", stopped.value.partial.reason)
    for started in (time.perf_counter() + 100, True, "now"):
        with pytest.raises(ValueError, match="started: "):
            Journal(tmp_path, "calibration", {"a": 1}, at_most=3, max_seconds=60, started=started)


def test_cli_calibrate_stops_at_max_seconds_and_prints_the_command_that_finishes_it(tmp_path, capsys):
    suite = tmp_path / "suite.json"
    fields = ("prompt", "seed", "frames", "height", "width", "steps")  # a manifest case: the default guidance
    cases = {
        split: [{"mode": "t2v", **{f: getattr(r, f) for f in fields}} for r in requests]
        for split, requests in (("calibration", CALIBRATION), ("test", TEST))
    }
    suite.write_text(json.dumps({"name": "resume", "version": 1, "model": "tiny-wan", **cases}))
    out = tmp_path / "cal"
    args = ["calibrate", "--model", "tiny-wan", "--suite", str(suite), "--plugin", "teacache", "--device", "cpu"]
    args += ["--budget", '{"latent_rel_l2": 0.1, "psnr_db": null, "min_ssim": null}', "--max-evals", "2"]
    assert main([*args, "--out", str(out), "--max-seconds", "0.001"]) == 0
    printed = capsys.readouterr().out
    assert "partial: stopped at a step boundary" in printed and (out / PARTIAL).exists()
    assert " s spent of max_seconds=0.001, " in printed  # the flag's limit, counted from the call's start
    command = shlex.split(printed.split("resume: ", 1)[1].splitlines()[0])
    assert command[0] == "workbench" and command[-2:] == ["--resume", str(out)]
    assert main([*args, "--out", str(out)]) == 2  # a partial record in --out is continued only when asked
    assert "continue it with --resume" in capsys.readouterr().err
    while "partial:" in printed:
        assert main(command[1:]) == 0
        printed = capsys.readouterr().out
    record = json.loads((out / "calibration.json").read_text())
    assert record["status"] == "quality_confirmed" and len(record["points"]) == 2 and not (out / PARTIAL).exists()
    assert main([*args, "--out", str(tmp_path / "other"), "--resume", str(tmp_path / "none")]) == 2
    assert "holds no partial calibration record" in capsys.readouterr().err


CASE_SIZE = {"frames": 1, "height": 16, "width": 16, "steps": 2}
CASE = {**CASE_SIZE, "mode": "t2v"}  # a manifest case: the default guidance
QUALIFY_ONE = harness._qualify_one


def cli_suite(path, seeds=(1, 2)):
    """A tiny-wan suite of one test case per seed, at the smallest size; its path."""
    cases = [{"prompt": f"a red kite, take {seed}", "seed": seed, **CASE} for seed in seeds]
    path.write_text(json.dumps({"name": "resume", "version": 1, "model": "tiny-wan", "calibration": [], "test": cases}))
    return path


@pytest.fixture
def loads(tiny, monkeypatch):
    """`Session.open` gives the module's tiny-wan (a CLI run here loads no model again); the list counts the loads."""
    opened = []
    monkeypatch.setattr(Session, "open", classmethod(lambda cls, *args, **kwargs: opened.append(1) or tiny))
    return opened


def counted(monkeypatch, interrupt_at=None):
    """The seeds of the cases `harness._qualify_one` runs from now on; Ctrl-C (KeyboardInterrupt) instead of the
    `interrupt_at`-th."""
    seeds = []

    def one(session, request, *args):
        seeds.append(request.seed)
        if len(seeds) == interrupt_at:
            raise KeyboardInterrupt
        return QUALIFY_ONE(session, request, *args)

    monkeypatch.setattr(harness, "_qualify_one", one)
    return seeds


def interrupted(argv, out, capsys, monkeypatch, what):
    """Run `argv --out out`, Ctrl-C at its second case; check what the Ctrl-C line says was kept (`what`) and
    return the command it gives to continue."""
    assert counted(monkeypatch, interrupt_at=2) == [] and main([*argv, "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    partial = partial_path(out, argv[0])
    assert f"interrupted; {what} finished and recorded in {partial}; continue: workbench {argv[0]} " in err, err
    kept = [outputs_folder(partial).name] if argv[0] == "qualify" else []  # a qualification's pilots: 0.npz
    assert read_partial(partial)["status"] == "partial" and sorted(p.name for p in out.iterdir()) == sorted(
        [*kept, partial.name]
    )
    assert not kept or [p.name for p in outputs_folder(partial).iterdir()] == ["0.npz"]
    command = shlex.split(err.split("continue: ")[1])
    assert command[-2:] == ["--resume", str(out)]
    assert main([*argv, "--out", str(out)]) == 2  # a partial record in --out is continued only when asked
    assert f"holds a partial {argv[0].replace('qualify', 'qualification')} record" in capsys.readouterr().err
    return command[1:]


RECORD_AND_REPORT = ["qualification.html", "qualification.json"]


def stopped_and_resumed(argv, out, capsys, monkeypatch):
    """Run `argv --out out --max-seconds 0`, then the command each stop prints, until the run finishes; the seeds of
    the cases each call ran (each call runs exactly one new case, since every call runs at least one)."""
    command, calls = [*argv, "--out", str(out), "--max-seconds", "0"], []
    capsys.readouterr()  # what earlier calls printed
    while True:
        ran = counted(monkeypatch)
        assert main(command) == 0
        calls.append(ran)
        printed = capsys.readouterr().out
        if "partial:" not in printed:
            return calls
        stop = (
            r"partial: stopped at a step boundary: \d+ s spent of max_seconds=0, and the next step \(the case of seed "
        )
        assert re.search(stop, printed), printed
        command = shlex.split(printed.split("resume: ", 1)[1].splitlines()[0])[1:]
        assert command[-2:] == ["--resume", str(out)] and partial_path(out, argv[0]).exists()


def test_cli_qualify_interrupted_after_a_case_resumes_with_the_other_case_only(tmp_path, capsys, monkeypatch, loads):
    argv = ["qualify", "--model", "tiny-wan", "--suite", str(cli_suite(tmp_path / "suite.json"))]
    argv += ["--candidate", '{"cross_kv_cache": {}}']
    assert counted(monkeypatch) == [] and main([*argv, "--out", str(tmp_path / "whole")]) == 0
    whole = read_record(tmp_path / "whole" / "qualification.json")
    out = tmp_path / "q"
    resume = interrupted(argv, out, capsys, monkeypatch, "1 of 2 case(s)")
    ran = counted(monkeypatch)
    assert main(resume) == 0 and ran == [2]  # the case of seed 1 is not run again
    resumed = read_record(out / "qualification.json")
    assert [c["verdict"] for c in resumed["cases"]] == [c["verdict"] for c in whole["cases"]] == ["no_speed_claim"] * 2
    assert untimed(resumed) == untimed(whole) and sorted(p.name for p in out.iterdir()) == RECORD_AND_REPORT
    report = (out / "qualification.html").read_text()  # both cases' pilots: the earlier process's kept on disk
    assert report.count("data:video/mp4;base64,") == 4 and "finished by an earlier process" not in report
    assert stopped_and_resumed(argv, tmp_path / "limited", capsys, monkeypatch) == [[1], [2]]
    assert untimed(read_record(tmp_path / "limited" / "qualification.json")) == untimed(whole)


@pytest.mark.parametrize("command", ["sweep", "search"])
def test_cli_sweep_and_search_interrupted_after_a_case_resume_with_the_rest_only(
    command, tmp_path, capsys, monkeypatch, loads
):
    argv = [command, "--model", "tiny-wan", "--suite", str(cli_suite(tmp_path / "suite.json", seeds=(1,)))]
    if command == "sweep":
        argv += ["--plugin", "easycache", "--option", "threshold", "--values", "0,10", "--base", '{"warmup": 1}']
    else:
        argv += ["--candidates", '[{"cross_kv_cache": {}}, {"easycache": {"threshold": 10, "warmup": 1}}]']
    assert counted(monkeypatch) == [] and main([*argv, "--out", str(tmp_path / "whole")]) == 0
    whole = read_record(tmp_path / "whole" / f"{command}.json")
    out = tmp_path / command
    unit = "value" if command == "sweep" else "candidate"
    resume = interrupted(argv, out, capsys, monkeypatch, f"1 of 2 ({unit}, case) pair(s)")
    ran = counted(monkeypatch)
    assert main(resume) == 0 and ran == [1]  # the second configuration's case only
    resumed = read_record(out / f"{command}.json")
    assert [r["verdict"] for r in resumed["rows"]] == [r["verdict"] for r in whole["rows"]]
    assert untimed(resumed) == untimed(whole) and not partial_path(out, command).exists()
    assert stopped_and_resumed(argv, tmp_path / "limited", capsys, monkeypatch) == [[1], [1]]
    assert untimed(read_record(tmp_path / "limited" / f"{command}.json")) == untimed(whole)


def test_cli_resume_of_another_run_is_refused_naming_the_field_and_both_values(tmp_path, capsys, monkeypatch, loads):
    """The fields the command line decides are checked before the model loads, the rest (the budget) once loaded;
    `--resume` of a folder without a partial record, or with `--ray`, is refused too."""
    argv = ["qualify", "--model", "tiny-wan", "--suite", str(cli_suite(tmp_path / "suite.json"))]
    argv += ["--candidate", '{"cross_kv_cache": {}}']
    out = tmp_path / "q"
    resume = interrupted(argv, out, capsys, monkeypatch, "1 of 2 case(s)")
    other_suite = str(cli_suite(tmp_path / "other.json", seeds=(1, 3)))
    refused = [
        (["--rounds", "4"], "(rounds: 3 recorded, 4 now)"),
        (["--candidate", '{"fused_qkv": {}}'], "(candidate: {'cross_kv_cache': {}} recorded, {'fused_qkv': {}} now)"),
        (["--suite", other_suite], "; suite: {'name': 'resume', 'sha256': '"),  # and its requests
    ]
    for flags, message in refused:
        del loads[:]
        assert main([*resume, *flags]) == 2 and not loads  # refused before the model loads
        err = capsys.readouterr().err
        assert f"error: --resume: {out / 'qualify.partial.json'} was made by another run (" in err and message in err
    assert main([*resume, "--budget", '{"latent_rel_l2": 0.5}']) == 2 and loads
    err = capsys.readouterr().err
    assert re.search(r"\(budget: \{[^}]*'latent_rel_l2': 0.03[^}]*\} recorded, \{[^}]*'latent_rel_l2': 0.5", err), err
    none = tmp_path / "none"
    assert main([*argv, "--out", str(tmp_path / "o"), "--resume", str(none)]) == 2
    err = capsys.readouterr().err
    assert f"--resume: {none} holds no partial qualification record ({none / 'qualify.partial.json'})" in err
    assert main([*resume, "--ray"]) == 2
    assert "--resume: not with --ray (its --store resumes a Ray run cell by cell" in capsys.readouterr().err
    assert read_partial(partial_path(out, "qualify"))["steps"][0]["key"]["request"]["seed"] == 1  # kept as it was


def test_journal_keeps_each_steps_outputs_losslessly_and_a_fresh_run_clears_old_ones(tmp_path):
    """`keep` saves the outputs of the step it runs in, `kept` reads them back bit for bit (frames, audio, sample rate,
    fps), None where nothing readable was kept; a run started afresh in the folder removes what an earlier one left."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 8, 10, 3), dtype=np.uint8)
    pair = (
        Result(frames, rng.standard_normal((2, 64)).astype(np.float32), 16_000, 24, None, {}, {}),
        Result(frames[::-1].copy(), None, None, 12, None, {}, {}),
    )
    journal = Journal(tmp_path, "qualification", {"a": 1}, 2, None, name="qualify", keep_outputs=True)
    journal.step("case", {"n": 0}, lambda: journal.keep(pair) or {"x": 0}, 0.0)
    again = Journal(tmp_path, "qualification", {"a": 1}, 2, None, name="qualify", keep_outputs=True)
    assert again.step("case", {"n": 0}, lambda: pytest.fail("replayed, not run"), 0.0) == {"x": 0}
    for kept, made in zip(again.kept(0), pair, strict=True):
        assert np.array_equal(kept.frames, made.frames) and (kept.fps, kept.sample_rate) == (made.fps, made.sample_rate)
        assert (kept.audio is None and made.audio is None) or np.array_equal(kept.audio, made.audio)
    assert again.kept(1) is None
    (outputs_folder(again.path) / "0.npz").write_bytes(b"not a zip")
    assert again.kept(0) is None
    partial_path(tmp_path, "qualify").unlink()
    Journal(tmp_path, "qualification", {"a": 1}, 2, None, name="qualify", keep_outputs=True)
    assert not outputs_folder(again.path).exists()


def test_qualify_stopped_at_max_seconds_leaves_the_session_as_it_was_and_resumes_with_the_first_cases_pilots(
    tiny, tmp_path
):
    """`harness.qualify` with `max_seconds=0` runs one case and returns `(Partial, [])`, the session holding the
    accelerations it held before the call (not the baseline, installed last); the same call finishes the run, the
    first case's pilots read back from disk equal to what a fresh run of that case makes (a pilot is one request
    under its arm)."""
    requests = [Request(f"a red kite, take {seed}", seed=seed, **CASE_SIZE) for seed in (1, 2)]
    arms = ({"fused_qkv": {}}, {"cross_kv_cache": {}})
    callers = tiny.accelerate({"easycache": {"threshold": 0.0}})
    try:
        stopped, pilots = harness.qualify(tiny, requests, *arms, progress=False, resume=tmp_path, max_seconds=0)
        assert tiny.accelerations == callers
    finally:
        tiny.accelerate({})
    assert isinstance(stopped, Partial) and pilots == []
    assert "the next step (the case of seed 2 under " in stopped.reason
    record, pilots = harness.qualify(tiny, requests, *arms, progress=False, resume=tmp_path, max_seconds=0)
    assert record["kind"] == "qualification" and len(record["cases"]) == 2
    for kept, arm in zip(pilots[0], arms, strict=True):
        tiny.accelerate(arm)
        try:
            made = tiny.generate(requests[0], progress=False)
        finally:
            tiny.accelerate({})
        assert np.array_equal(kept.frames, made.frames) and kept.fps == made.fps
