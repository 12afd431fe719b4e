"""Every benchmark scenario's CPU smoke runs in-process and writes a complete envelope with finite ratios."""

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.__main__ import main, run_scenario
from benchmarks.envelope import FIELDS, FORMAT
from benchmarks.scenarios import SCENARIOS, portability
from benchmarks.scenarios import fp8_attention as fp8_scenario

REQUIRED = {"forward-wan", "forward-h3", "request-wan", "sparse-attention", "kernels", "relayout", "parallel", "memory"}


def test_harness_lists_the_required_scenarios(capsys):
    """`list` prints each scenario's summary as it is, no template field left to fill; the fp8-attention summary names
    every Q.K^T and P.V precision its record holds arms for."""
    import re

    from workbench.kernels import fp8_attention as fa

    assert REQUIRED <= set(SCENARIOS)
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in REQUIRED)
    assert "{" not in listed and "CALIBRATE_WAN_PLUGINS (default block_sparse,easycache)" in listed
    for step, modes in (("QK", fa.QK_MODES), ("PV", fa.PV_MODES)):
        assert set(re.search(rf"{step} ([\w/]+)", fp8_scenario.SUMMARY).group(1).split("/")) == set(modes), step


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the fan-out scenarios' smokes (their pools join it instead of each starting and
    stopping one: ~10 s a start on 2 cores); `Fanout` starting its own is tested in tests/evidence."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_smoke_writes_a_complete_envelope(name, tmp_path, monkeypatch, request):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if name in ("fanout", "fanout-scaling"):
        request.getfixturevalue("ray_instance")
    pairs_by_q: dict[int, tuple] = {}  # fp8-attention: id(q) -> (q, its calls' (qk, pv)); q kept, so ids stay unique
    if name == "fp8-attention":
        call = fp8_scenario.fa.fp8_attention

        def recorded(q, *args, pv="fp8", qk="e4m3", **kwargs):
            pairs_by_q.setdefault(id(q), (q, set()))[1].add((qk, pv))
            return call(q, *args, pv=pv, qk=qk, **kwargs)

        monkeypatch.setattr(fp8_scenario.fa, "fp8_attention", recorded)
    lowbit_sparse: set = set()  # portability: the (qk, pv) of each low-precision block_sparse call and reference
    if name == "portability":
        attend, reference = portability.bsa.attend, portability.bsa.reference

        def attend_recorded(q, k, v, route, launch=None, quantized=None, kernel="auto"):
            if quantized is not None:
                lowbit_sparse.add((quantized.qk, quantized.pv))
            return attend(q, k, v, route, launch, quantized, kernel)

        def reference_recorded(*args, **kwargs):
            if "precision" in kwargs:
                lowbit_sparse.add((kwargs["precision"], kwargs["pv"]))
            return reference(*args, **kwargs)

        monkeypatch.setattr(portability.bsa, "attend", attend_recorded)
        monkeypatch.setattr(portability.bsa, "reference", reference_recorded)
    path = run_scenario(name, tmp_path, smoke=True, rounds=3)
    if name == "portability":  # its low-precision block_sparse arm runs and checks the pair it is named for
        assert lowbit_sparse == {portability.LOWBIT}, lowbit_sparse
    assert "TRITON_INTERPRET" not in os.environ  # the smoke's interpreter ends with it, not in the tests after it
    assert path == tmp_path / f"{name}.json"
    record = json.loads(path.read_text())
    assert tuple(record) == FIELDS
    assert record["format"] == FORMAT and record["scenario"] == name and record["smoke"] is True
    assert record["what"] and record["date"] and record["device"]["type"] == "cpu"
    # a smoke record says what it is: not the production shapes its scenario names, no speed claim
    assert record["what"].startswith("Smoke run at tiny shapes on the CPU of the scenario that measures: ")
    assert any("say nothing about speed" in note for note in record["notes"]), record["notes"]
    assert {"torch", "triton", "diffusers", "cuda"} <= set(record["versions"])
    assert isinstance(record["notes"], list)
    for ratio in record["ratios"].values():
        assert all(math.isfinite(ratio[k]) for k in ("median", "low", "high")), ratio
        assert ratio["n_pairs"] == 3 and ratio["low"] <= ratio["median"] <= ratio["high"]
    for arm, row in record["arms"].items():
        if isinstance(row, dict) and "median_s" in row:
            assert math.isfinite(row["median_s"]) and row["median_s"] > 0, arm
    if name == "fp8-attention":  # per call on the trained demo-av's own q/k/v (heads of 48, padded): small, not zero
        rows = [row for row in record["arms"].values() if isinstance(row, dict)]
        captured = [row["captured_rel_l2_vs_dense"] for row in rows if "captured_rel_l2_vs_dense" in row]
        assert len(captured) == len(fp8_scenario.PAIRS) == 6 and all(
            c["calls"] == 2 and 0 < c["median"] <= c["max"] < 0.1 for c in captured
        )
        sweeps = [entry for row in rows for entry in row.get("launch_sweep", {}).values()]  # A/B/A against shipped
        dense_sweeps = len(fp8_scenario.SWEEP_PAIRS) * len(fp8_scenario.LAUNCHES)
        sparse = [row for key, row in record["arms"].items() if key.startswith("block_sparse@") and "[" in key]
        assert len(sparse) == len(fp8_scenario.SPARSE_PRECISIONS)
        assert all(row["kernel_path"] in ("cute", "triton") for row in sparse)
        # the Triton kernel is swept beside an arm whose default path is the CuTe kernel (never on the CPU)
        sparse_sweeps = sum(row["kernel_path"] == "cute" for row in sparse) * len(fp8_scenario.SPARSE_LAUNCHES)
        assert len(sweeps) == dense_sweeps + sparse_sweeps
        assert all(len(e["seconds"]) == 3 and e["vs_shipped"]["n_pairs"] == 3 for e in sweeps), sweeps[0]
        # every input runs every pair but the dispatcher-layout copy, whose timed calls run the plugin's pair only
        partial = [pairs for _, pairs in pairs_by_q.values() if pairs != set(fp8_scenario.PAIRS)]
        assert partial == [{fp8_scenario.DISPATCHER_PAIR}], partial
    if name == "relayout":  # an op that copies nothing (a view on both sides) is recorded as such, never timed
        arms = record["arms"]
        assert arms["split_result"] == {"equal_to_reference": True, "copies": False}, arms["split_result"]
        assert not any(key.startswith("split_result ") for key in record["ratios"] if "batch" not in key)
        assert all(arms[op]["copies"] and arms[op]["bytes_moved"] > 0 for op in arms if op != "split_result")
    if not record["ratios"]:  # a smoke that measures no pair must say what it skipped
        assert any("smoke" in note.lower() for note in record["notes"]), record["notes"]


def test_run_writes_into_benchmarks_out_when_set_and_no_out_is_given(tmp_path, monkeypatch):
    """On the device, setup.sh sets BENCHMARKS_OUT to the call's $OUT: a `run` without --out writes there (its record
    comes back), an explicit --out still wins, and unset or empty means benchmarks/results for a full run but the
    git-ignored out/benchmarks-smoke for a smoke (a CPU smoke record never replaces a committed GPU record)."""
    import benchmarks.__main__ as harness

    root = Path(harness.__file__).resolve().parents[1]
    assert harness.SMOKE_OUT.resolve() == root / "out" / "benchmarks-smoke"
    assert harness.RESULTS.resolve() not in (harness.SMOKE_OUT.resolve(), *harness.SMOKE_OUT.resolve().parents)
    assert "out/" in (root / ".gitignore").read_text().splitlines()
    monkeypatch.setattr(harness, "RESULTS", tmp_path / "results")  # the defaults' folders, not the repository's
    monkeypatch.setattr(harness, "SMOKE_OUT", tmp_path / "smoke")
    written = []
    monkeypatch.setattr(harness, "run_scenario", lambda name, out, *rest: written.append(out) or out / f"{name}.json")
    monkeypatch.setattr(harness.torch.cuda, "is_available", lambda: True)  # kernels sets no allocator: no restart
    monkeypatch.setenv("BENCHMARKS_OUT", str(tmp_path / "device-out"))
    assert main(["run", "kernels", "--smoke"]) == 0
    assert main(["run", "kernels", "--smoke", "--out", str(tmp_path / "mine")]) == 0
    monkeypatch.setenv("BENCHMARKS_OUT", "")
    assert main(["run", "kernels", "--smoke"]) == 0
    monkeypatch.delenv("BENCHMARKS_OUT")
    assert main(["run", "kernels", "--smoke"]) == 0
    assert main(["run", "kernels"]) == 0
    assert written == [tmp_path / "device-out", tmp_path / "mine", *[tmp_path / "smoke"] * 2, tmp_path / "results"]


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        (["--rounds", "0"], "--rounds"),
        (["--max-seconds", "nan"], "--max-seconds"),
        (["--max-seconds", "inf"], "--max-seconds"),
        (["--max-seconds", "-1"], "--max-seconds"),
        (["--max-seconds", "5"], "--max-seconds"),  # kernels does not read it
        (["--out", "{file}/results"], "--out"),
        (["--out", ""], "--out"),  # not the current folder
        ([], "BENCHMARKS_OUT"),  # the folder came from the environment: named as such
    ],
)
def test_run_refuses_a_bad_option_with_one_usage_line_before_anything_runs(
    options, flag, tmp_path, monkeypatch, capsys
):
    """`--rounds 0`, a NaN/inf/negative `--max-seconds` or one the scenario does not read, an empty `--out` and an
    `--out` (or BENCHMARKS_OUT) under a regular file exit 2 with one line naming the flag, before any scenario starts
    (no traceback, nothing created)."""
    import benchmarks.__main__ as harness

    (tmp_path / "file").write_text("in the way")
    started = []
    monkeypatch.setattr(SCENARIOS["kernels"], "run", lambda context: started.append(context))
    monkeypatch.setenv("BENCHMARKS_OUT", str(tmp_path / "file" / "results"))
    options = [option.format(file=tmp_path / "file") for option in options]
    out = [] if flag in ("--out", "BENCHMARKS_OUT") else ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as usage:
        harness.main(["run", "kernels", "--smoke", *out, *options])
    error = capsys.readouterr().err
    assert usage.value.code == 2 and not started and "Traceback" not in error
    assert error.strip().splitlines()[-1].startswith(f"python -m benchmarks: error: {flag}: "), error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]


def test_smoke_interprets_during_the_scenario_and_restores_the_callers_value_when_it_raises(tmp_path, monkeypatch):
    """run_scenario's TRITON_INTERPRET=1 holds while the scenario runs (Triton reads it at each kernel's first
    launch) and the caller's earlier value comes back afterwards, also when the scenario raises."""
    from workbench.kernels._runtime import interpreting

    seen = []

    def run(context):
        seen.append((os.environ.get("TRITON_INTERPRET"), interpreting(), context.device.type))
        raise RuntimeError("scenario failed")

    monkeypatch.setitem(SCENARIOS, "failing", SimpleNamespace(run=run))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="scenario failed"):
        run_scenario("failing", tmp_path, smoke=True, rounds=3)
    assert seen == [("1", True, "cpu")]
    assert os.environ["TRITON_INTERPRET"] == "0" and not interpreting()


def test_unknown_scenario_and_bad_rounds_raise(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="scenario: unknown 'nope'"):
        run_scenario("nope", tmp_path, smoke=True, rounds=3)
    with pytest.raises(ValueError, match="--rounds"):
        run_scenario("kernels", tmp_path, smoke=True, rounds=0)
    monkeypatch.setattr(SCENARIOS["kernels"], "run", lambda context: pytest.fail("ran with a bad option"))
    with pytest.raises(ValueError, match=r"--max-seconds: must be a finite number of seconds >= 0.*got nan"):
        run_scenario("kernels", tmp_path, smoke=True, rounds=3, max_seconds=math.nan)
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(ValueError, match=r"--out: cannot write to .*file/results"):
        run_scenario("kernels", tmp_path / "file" / "results", smoke=True, rounds=3)


def test_full_run_without_cuda_refuses_and_parallel_needs_two_gpus(tmp_path, monkeypatch, capsys):
    """Without CUDA a full run is one usage line before any scenario starts; parallel's own refusal of one GPU is
    reported and the run goes on."""
    import torch

    import benchmarks.__main__ as harness
    from benchmarks.envelope import Context
    from benchmarks.scenarios import parallel

    if torch.cuda.device_count() >= 2:
        pytest.skip("checks the refusals of a machine without two GPUs")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="kernels: needs a CUDA device"):
            run_scenario("kernels", tmp_path, smoke=False, rounds=3)
    monkeypatch.setattr(harness.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(SCENARIOS["kernels"], "run", lambda context: pytest.fail("ran without CUDA"))
    with pytest.raises(SystemExit) as usage:
        main(["run", "kernels", "forward-wan", "--out", str(tmp_path)])
    error = capsys.readouterr().err
    assert usage.value.code == 2 and "Traceback" not in error
    assert (
        error.strip()
        .splitlines()[-1]
        .endswith("error: kernels, forward-wan: needs a CUDA device, this machine has none; run with --smoke on a CPU")
    )
    with pytest.raises(RuntimeError, match="parallel: needs at least 2 CUDA devices"):
        parallel.run(Context(smoke=False, rounds=3, device=torch.device("cuda")))
    monkeypatch.setattr(harness.torch.cuda, "is_available", lambda: True)  # past the harness's check
    monkeypatch.setattr(harness.torch.cuda, "device_count", lambda: 1)
    assert main(["run", "parallel", "--out", str(tmp_path)]) == 1  # reported, not raised; nothing written
    assert not (tmp_path / "parallel.json").exists()


def test_run_says_what_few_rounds_give_and_which_scenarios_ignore_max_seconds(tmp_path, monkeypatch, capsys):
    """`--rounds 2` runs (a capped scenario's long requests may afford no more) but says, on stderr and in the
    record's notes, that it gives no ratios; `--max-seconds` with a scenario that reads it and one that does not
    names the one it does not limit."""
    from benchmarks.envelope import Measurement

    for name in ("kernels", "fanout"):
        monkeypatch.setattr(SCENARIOS[name], "run", lambda context: Measurement("w", {"n": 1}))
    assert (
        main(["run", "fanout", "kernels", "--smoke", "--rounds", "2", "--max-seconds", "9", "--out", str(tmp_path)])
        == 0
    )
    error = capsys.readouterr().err
    assert "note: --max-seconds does not limit ['kernels']" in error
    said = "--rounds 2: fewer than the 3 paired rounds a CI95 needs, so times but no ratios"
    assert f"note: {said}" in error
    for name in ("kernels", "fanout"):
        assert f"Run with {said}." in json.loads((tmp_path / f"{name}.json").read_text())["notes"]


def test_ctrl_c_during_run_ends_with_one_line_saying_what_was_written(tmp_path, monkeypatch, capsys):
    """Ctrl-C inside a scenario: exit 130, no traceback, one line naming the scenario interrupted, the records
    written before it and its partial state when it keeps one."""
    from benchmarks.envelope import Measurement
    from workbench.evidence.resume import partial_path

    def interrupted(context):
        partial_path(context.out / "kernels").parent.mkdir()
        partial_path(context.out / "kernels").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(SCENARIOS["relayout"], "run", lambda context: Measurement("w", {"n": 1}))
    monkeypatch.setattr(SCENARIOS["kernels"], "run", interrupted)
    assert main(["run", "relayout", "kernels", "memory", "--smoke", "--out", str(tmp_path)]) == 130
    error = capsys.readouterr().err
    assert "Traceback" not in error and not (tmp_path / "memory.json").exists()
    assert error.strip().splitlines() == [
        f"python -m benchmarks run: interrupted during kernels; its partial state {partial_path(tmp_path / 'kernels')} "
        f"is kept: the same command continues it; wrote {tmp_path / 'relayout.json'}"
    ]


def test_envelope_names_the_commit_the_sender_gives(monkeypatch):
    import torch

    from benchmarks.envelope import Measurement, envelope

    measurement = Measurement("w", {"n": 1})
    monkeypatch.delenv("WORKBENCH_COMMIT", raising=False)
    from_git = envelope("kernels", measurement, torch.device("cpu"), smoke=True)
    monkeypatch.setenv("WORKBENCH_COMMIT", "0123456789ab")  # a copy on another machine may carry a stale .git
    given = envelope("kernels", measurement, torch.device("cpu"), smoke=True)
    assert given["commit"] == "0123456789ab" and given["dirty"] is None
    assert from_git["commit"] != "0123456789ab" and set(given) == set(FIELDS)
    monkeypatch.setenv("RING_CAPS", "48GiB")  # a scenario's setting that is set leads the command; one unset does not
    monkeypatch.delenv("RING_ARMS", raising=False)
    command = envelope("ring", measurement, torch.device("cpu"), True, ("RING_CAPS", "RING_ARMS"))["command"]
    assert command.startswith("RING_CAPS=48GiB ") and "RING_ARMS" not in command


def test_a_smoke_envelope_says_it_is_one_and_that_its_numbers_say_nothing_about_speed():
    """A smoke record's `what` does not claim the production shapes, and its notes carry the smoke note once (the
    scenario's own when it has one); a full run's record keeps the scenario's words."""
    import torch

    from benchmarks.envelope import SMOKE_NOTE, Measurement, envelope

    cpu = torch.device("cpu")
    measurement = Measurement("Wan2.1-1.3B transformer forward, 32,760 tokens bf16", {}, notes=["Ratios are A/B."])
    smoke = envelope("forward-wan", measurement, cpu, smoke=True)
    assert smoke["what"] == (
        "Smoke run at tiny shapes on the CPU of the scenario that measures: Wan2.1-1.3B transformer forward, "
        "32,760 tokens bf16"
    )
    assert smoke["notes"] == ["Ratios are A/B.", SMOKE_NOTE] and measurement.notes == ["Ratios are A/B."]
    own = Measurement("w", {}, notes=["Smoke: tiny-wan; the numbers say nothing about speed."])
    assert envelope("forward-wan", own, cpu, smoke=True)["notes"] == own.notes
    full = envelope("forward-wan", measurement, cpu, smoke=False)
    assert full["what"] == measurement.what and full["notes"] == measurement.notes


def test_calibrate_wan_stops_unfinished_at_max_seconds_and_the_same_command_finishes_it(tmp_path, capsys):
    """The chunked scenario: `--max-seconds 0` records one step, writes no envelope and exits 0 saying how to go on;
    the same command (without the limit here) continues from the partial record and writes the envelope."""
    command = ["run", "calibrate-wan", "--smoke", "--out", str(tmp_path)]
    assert main([*command, "--max-seconds", "0"]) == 0
    assert "unfinished calibrate-wan: stopped at a step boundary" in capsys.readouterr().out
    partial = json.loads((tmp_path / "calibrate-wan" / "calibrate.partial.json").read_text())
    assert len(partial["steps"]) == 1 and not (tmp_path / "calibrate-wan.json").exists()
    assert main(command) == 0
    record = json.loads((tmp_path / "calibrate-wan.json").read_text())
    assert any("over 2 process(es)" in note for note in record["notes"]), record["notes"]
    assert "calibrate + stack block_sparse and easycache to the default budget" in record["what"]  # the run's plugins
    assert (tmp_path / "calibrate-wan" / "stack.json").exists()
    assert not (tmp_path / "calibrate-wan" / "calibrate.partial.json").exists()


def test_scenarios_declare_the_environment_they_read():
    """A scenario's knobs in the environment (`os.environ.get("RING_CAPS")`) are listed in its `SETTINGS`, so the
    record's command repeats the run; the harness's own variables are not knobs."""
    import inspect
    import re

    harness = {"PYTORCH_CUDA_ALLOC_CONF", "TRITON_INTERPRET", "WORKBENCH_COMMIT", "TQDM_DISABLE"}
    for name, module in SCENARIOS.items():
        source = inspect.getsource(module)
        read = set(re.findall(r'environ(?:\.get)?[\(\[]\s*"([A-Z0-9_]+)"', source)) - harness
        assert read <= set(getattr(module, "SETTINGS", ())), (name, read)
        # --max-seconds is refused unless a scenario given reads it: the flag says which do
        assert ("context.max_seconds" in source) == getattr(module, "STOPS_AT_MAX_SECONDS", False), name


def test_calibrate_wan_takes_its_plugins_from_the_environment_and_refuses_a_partial_of_others(
    tmp_path, capsys, monkeypatch
):
    from benchmarks.scenarios import calibrate_wan

    assert calibrate_wan.plugins_from_environment() == ["block_sparse", "easycache"]
    monkeypatch.setenv("CALIBRATE_WAN_PLUGINS", "block_sparse,easycache,selective_fp8")
    assert calibrate_wan.plugins_from_environment() == ["block_sparse", "easycache", "selective_fp8"]
    for bad in ("easycache,easycache", "fused_block_norms", ","):
        monkeypatch.setenv("CALIBRATE_WAN_PLUGINS", bad)
        with pytest.raises(ValueError, match=r"CALIBRATE_WAN_PLUGINS: .*; allowed: a comma list of"):
            calibrate_wan.plugins_from_environment()
    monkeypatch.delenv("CALIBRATE_WAN_PLUGINS")
    command = ["run", "calibrate-wan", "--smoke", "--out", str(tmp_path)]
    assert main([*command, "--max-seconds", "0"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("CALIBRATE_WAN_PLUGINS", "easycache")
    assert main(command) != 0  # the partial record names the plugins it was made with
    shown = capsys.readouterr()
    assert "was made by another run (plugins: ['block_sparse', 'easycache'] recorded, ['easycache'] now)" in (
        shown.out + shown.err
    )


def test_allocator_setting_is_added_once_and_never_mixed():
    """The capped scenarios' `ALLOCATOR` reaches the restarted process's environment (after the caller's own
    settings), is not added twice, and scenarios with and without one are refused together (torch reads it once)."""
    from benchmarks.__main__ import allocator_env

    assert allocator_env(["ring", "request-capped"], {"PATH": "/bin"}) == {
        "PATH": "/bin",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "pinned_max_round_threshold_mb:64"}
    assert allocator_env(["ring"], mine)["PYTORCH_CUDA_ALLOC_CONF"] == (
        "pinned_max_round_threshold_mb:64,expandable_segments:True"
    )
    assert allocator_env(["ring"], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) is None
    assert allocator_env(["forward-wan", "kernels"], {}) is None
    with pytest.raises(ValueError, match=r"own process.*ring: expandable_segments:True.*forward-wan: none"):
        allocator_env(["ring", "forward-wan"], {})


def test_scenario_with_an_allocator_setting_refuses_cuda_without_it(tmp_path, monkeypatch):
    """Called in-process on a CUDA device without the setting (the harness's restart bypassed), the run refuses
    before the scenario starts, naming the variable."""
    import benchmarks.__main__ as harness

    monkeypatch.setattr(harness.torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    started = []
    monkeypatch.setattr(SCENARIOS["ring"], "run", lambda context: started.append(context))
    with pytest.raises(RuntimeError, match=r"ring: run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"):
        run_scenario("ring", tmp_path, smoke=False, rounds=3)
    assert not started


def test_run_restarts_itself_with_the_allocator_setting_on_a_gpu(monkeypatch, tmp_path):
    """On a GPU, `run ring` without the setting execs the same command with PYTORCH_CUDA_ALLOC_CONF added (nothing
    runs in this process), and a mix of scenarios with and without one is a usage error."""
    import benchmarks.__main__ as harness

    monkeypatch.setattr(harness.torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8")
    calls = []

    def execvpe(file, args, env):
        calls.append((file, args, env))
        raise SystemExit(0)  # exec does not return

    monkeypatch.setattr(harness.os, "execvpe", execvpe)
    monkeypatch.setattr(SCENARIOS["ring"], "run", lambda context: pytest.fail("ran before the restart"))
    argv = ["run", "ring", "--out", str(tmp_path)]
    with pytest.raises(SystemExit):
        main(argv)
    ((file, args, env),) = calls
    assert args[1:] == ["-m", "benchmarks", *argv] and file == args[0]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.8,expandable_segments:True"
    with pytest.raises(SystemExit) as usage:
        main(["run", "ring", "kernels", "--out", str(tmp_path)])
    assert usage.value.code == 2 and len(calls) == 1


def test_calibrate_wan_resumes_with_the_base_it_started_with(tmp_path):
    """A partial record keeps its run's base: resuming after the exact-fast profile changed continues the recorded
    run (and says so) instead of refusing it as another run; without a record the current base holds."""
    from benchmarks.scenarios.calibrate_wan import _started_with
    from workbench.evidence.resume import partial_path

    folder = tmp_path / "calibrate-wan"
    now = {"fused_block_norms": {}, "fused_vae_decode": {}}
    assert _started_with(folder, now, notes := []) == now and notes == []
    folder.mkdir()
    recorded = {"fused_block_norms": {}, "gelu_epilogue": {}}
    partial_path(folder).write_text(json.dumps({"kind": "stack", "status": "partial", "run": {"base": recorded}}))
    assert _started_with(folder, now, notes) == recorded and "the run started with" in notes[0]
    assert _started_with(folder, recorded, more := []) == recorded and more == []


def test_ring_ends_its_rounds_before_max_seconds(tmp_path, monkeypatch):
    """A run that may take no time keeps its first round (one visit per capped arm) and says why it stopped; a run
    without a limit says nothing of stopping."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    record = json.loads(run_scenario("ring", tmp_path, smoke=True, rounds=3, max_seconds=0.0).read_text())
    assert any(note.startswith("Stopped after 1 of 3 rounds") for note in record["notes"]), record["notes"]
    capped = {name: row for name, row in record["arms"].items() if name != "resident"}
    assert capped and all(len(row["seconds"]) == 1 for row in capped.values())
    record = json.loads(run_scenario("ring", tmp_path, smoke=True, rounds=2, max_seconds=1e6).read_text())
    assert not any(note.startswith("Stopped") for note in record["notes"])
    assert all(len(row["seconds"]) == 2 for name, row in record["arms"].items() if name != "resident")


def test_forward_h3_measures_the_arms_h3_arms_names_against_stock(tmp_path, monkeypatch):
    """H3_ARMS picks a subset (stock always runs; no block_sparse arm: no tau calibration) and the record's command
    says so; an unknown or empty list is refused with the allowed names."""
    from benchmarks.scenarios import forward_h3

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("H3_ARMS", "exact-fast+fp8_attention")
    record = json.loads(run_scenario("forward-h3", tmp_path, smoke=True, rounds=3).read_text())
    assert list(record["arms"]) == ["stock", "exact-fast+fp8_attention"]
    assert list(record["ratios"]) == ["stock/exact-fast+fp8_attention"] and "calibration" not in record["arms"]["stock"]
    assert record["command"].startswith("H3_ARMS=exact-fast+fp8_attention ")  # the record repeats the subset
    for bad in ("exact-fast,stock", ","):
        monkeypatch.setenv("H3_ARMS", bad)
        with pytest.raises(ValueError, match=r"H3_ARMS: .*allowed: a comma list of exact-fast, exact-fast\+fp8"):
            forward_h3.chosen_arms()
