"""Cells fanned out over a local Ray instance with 2 CPU workers (issue 26): the store of a Ray sweep holds what
the single-process sweep computes, a re-run runs nothing, a killed worker's cell is retried elsewhere, a cell that
raises is recorded as failed while the run completes."""

import dataclasses

import pytest
import torch

from workbench import Request, Session
from workbench.cli import main
from workbench.evidence import fanout_jobs
from workbench.evidence.calibrate import calibrate
from workbench.evidence.fanout import Cell, Fanout, Store
from workbench.evidence.harness import MIN_ROUNDS
from workbench.evidence.harness import qualify as qualify_here
from workbench.evidence.sweep import sweep
from workbench.quality import Budget

ray = pytest.importorskip("ray")

REQUEST = Request("a red circle moves left", seed=42, frames=5, steps=4, height=16, width=16)
BASE = {"warmup": 1, "final_dense": 1}
VALUES = [0.0, 10.0]  # threshold 0 skips nothing (not_executed); 10 reuses steps and leaves the budget


@pytest.fixture(scope="module")
def fanout():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with Fanout("tiny-wan", workers=2, device="cpu") as pool:
            yield pool
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_sweep(fanout, tmp_path_factory):
    """The sweep on Ray, with the worker of the first cell killed as the cell is handed to it (a timer could fire
    after a tiny cell had finished); (store, result, events, killed pid)."""
    events, killed = [], []

    def kill_first_worker(event):
        events.append(event)
        if event.kind == "cell_started" and not killed:
            killed.append(fanout.identities[event.worker]["pid"])
            ray.kill(fanout.actors[event.worker])

    store = Store(tmp_path_factory.mktemp("sweep-store"))
    stop = fanout.subscribe(kill_first_worker)
    try:
        result = fanout_jobs.sweep(fanout, store, [REQUEST], "easycache", "threshold", VALUES, BASE)
    finally:
        stop()
    return store, result, events, killed[0]


def test_ray_sweep_store_equals_single_process_sweep(ray_sweep):
    store, result, _, _ = ray_sweep
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs (Ray gives a num_cpus=1 actor one thread): the same arithmetic
    try:
        session = Session.open("tiny-wan", device="cpu")
        single = sweep(session, [REQUEST], "easycache", "threshold", VALUES, BASE, progress=False)
    finally:
        torch.set_num_threads(threads)
    entries = list(store.entries().values())
    assert len(entries) == 2 and all(entry["status"] == "finished" for entry in entries)
    for entry in entries:  # each record names where it ran
        worker = entry["record"]["worker"]
        assert worker["host"] and worker["pid"] and worker["device"]["type"] == "cpu" and worker == entry["worker"]
    by_value = {e["record"]["candidate"]["easycache"]["threshold"]: e for e in entries}
    for value, record in zip(VALUES, single.records, strict=True):
        case, stored = record["cases"][0], by_value[value]["record"]["cases"][0]
        assert stored["verdict"] == case["verdict"] and stored["quality"] == case["quality"]
        assert stored["receipts"] == case["receipts"]
    assert [row.verdict for row in result.rows] == ["not_executed", "rejected_quality"]
    timing = ("speedup", "speedup_low", "speedup_high")
    for ours, theirs in zip(result.rows, single.rows, strict=True):
        assert {k: v for k, v in vars(ours).items() if k not in timing} == {
            k: v for k, v in vars(theirs).items() if k not in timing
        }
    assert (result.knee, result.cliff, result.recommended) == (single.knee, single.cliff, single.recommended)
    assert result.records[1]["cases"][0]["worker"] == by_value[10.0]["worker"]


def test_ray_killed_worker_cell_is_retried_elsewhere(ray_sweep):
    store, _, events, killed = ray_sweep
    kinds = [e.kind for e in events]
    assert kinds.count("worker_lost") == 1 and kinds.count("cell_retried") == 1 and kinds.count("cell_finished") == 2
    lost = next(e for e in events if e.kind == "worker_lost")
    (entry,) = [e for e in store.entries().values() if e["key"] == lost.key]
    assert entry["status"] == "finished" and entry["attempts"] == 2 and entry["worker"]["pid"] != killed
    assert events[-1].kind == "end" and events[-1].progress.retried == 1 and events[-1].progress.failed == 0


def test_ray_rerun_with_same_store_runs_nothing(fanout, ray_sweep):
    store, first, _, _ = ray_sweep
    events = []
    stop = fanout.subscribe(events.append)
    try:
        again = fanout_jobs.sweep(fanout, store, [REQUEST], "easycache", "threshold", VALUES, BASE)
    finally:
        stop()
    assert not [e for e in events if e.kind.startswith("cell_")]
    assert events[-1].kind == "end" and events[-1].progress.skipped == 2 and events[-1].progress.done == 0
    assert again.to_record() == first.to_record()


def test_ray_raising_cell_is_recorded_failed_and_run_completes(fanout, tmp_path):
    bad = Request("frames the family refuses", seed=1, frames=6, steps=4, height=16, width=16)  # Wan: 4k+1 frames
    store = Store(tmp_path)
    with pytest.raises(RuntimeError, match=r"1 of 2 cells failed .*bad: .*frames"):
        fanout_jobs.batch(fanout, store, [("good", REQUEST), ("bad", bad)], {})
    entries = {e["label"].split(":")[0]: e for e in store.entries().values()}
    assert entries["bad"]["status"] == "failed" and entries["bad"]["error"].startswith("ValueError:")
    assert "frames" in entries["bad"]["error"] and entries["bad"]["worker"]["host"]
    assert entries["good"]["status"] == "finished" and entries["good"]["outputs"] == "outputs/good"
    assert sorted(p.name for p in (store.root / "outputs" / "good").iterdir()) == ["good.html", "good.json", "good.mp4"]


def test_ray_cell_whose_worker_dies_every_time_is_recorded_failed_after_its_retries(fanout, tmp_path, monkeypatch):
    """A cell that kills every worker it lands on is retried `retries` more times, then recorded failed with the
    count; the run ends instead of retrying forever."""
    monkeypatch.setattr(fanout, "retries", 1)
    killed = []

    def kill_every_worker(event):
        if event.kind == "cell_started":
            killed.append(fanout.identities[event.worker]["pid"])
            ray.kill(fanout.actors[event.worker])

    store = Store(tmp_path)
    stop = fanout.subscribe(kill_every_worker)
    try:
        with pytest.raises(RuntimeError, match=r"1 of 1 cells failed"):
            fanout_jobs.batch(fanout, store, [("doomed", REQUEST)], {})
    finally:
        stop()
    (entry,) = store.entries().values()
    assert entry["status"] == "failed" and entry["error"].endswith("gave up after 2 attempts"), entry
    assert "died" in entry["error"] and len(killed) == 2


def test_ray_calibrate_and_qualify_equal_the_single_process_ones(fanout, tmp_path):
    """calibrate over Ray (the search in one cell, the confirmation one cell per test request) tries the same knob
    values with the same quality as the single-process calibrate and reaches the same knee, cliff and verdicts;
    a qualification over Ray holds the single-process one's verdict and quality."""
    calibration, test = [REQUEST], [dataclasses.replace(REQUEST, seed=43)]
    budget = {"latent_rel_l2": 0.5, "psnr_db": None, "min_ssim": None}
    ours = fanout_jobs.calibrate(fanout, Store(tmp_path / "cal"), calibration, test, ["easycache"], budget,
                                 base_profile="stock", max_evals=3)  # fmt: skip
    candidate = {"easycache": {"threshold": 10.0, **BASE}}
    qualified = fanout_jobs.qualify(fanout, Store(tmp_path / "q"), test, {}, candidate, budget=Budget(**budget))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs: the same arithmetic
    try:
        session = Session.open("tiny-wan", device="cpu")
        single = calibrate(session, calibration, test, "easycache", Budget(**budget), max_evals=3, progress=False)
        single_q = qualify_here(session, test, {}, candidate, MIN_ROUNDS, Budget(**budget), False)[0]
    finally:
        torch.set_num_threads(threads)
    assert [(p.value, p.spent, p.failures) for p in ours.points] == [
        (p.value, p.spent, p.failures) for p in single.points
    ]
    assert (ours.knee, ours.cliff, ours.status) == (single.knee, single.cliff, single.status), ours.reason
    assert ours.status == "quality_confirmed" and ours.confirmation["cases"][0]["worker"]["pid"]
    assert [c["verdict"] for c in ours.confirmation["cases"]] == [c["verdict"] for c in single.confirmation["cases"]]
    (case,), (single_case,) = qualified["cases"], single_q["cases"]
    assert (case["verdict"], case["quality"]) == (single_case["verdict"], single_case["quality"])


def test_fanout_duplicate_cells_and_bad_options_raise(fanout, tmp_path):
    cell = Cell("generate", {"request": REQUEST, "accelerations": {}, "name": "a"}, "a", "a")
    with pytest.raises(ValueError, match="same work"):
        fanout.run([cell, cell], Store(tmp_path))
    with pytest.raises(ValueError, match="workers: 0"):
        Fanout("tiny-wan", workers=0, device="cpu")
    with pytest.raises(ValueError, match="workers: 3 needs 3 CPUs"):
        Fanout("tiny-wan", workers=3, device="cpu")
    with pytest.raises(ValueError, match="48 gigs"):
        Fanout("tiny-wan", workers=1, device="cpu", memory="48 gigs")
    with pytest.raises(ValueError, match="memory: 'device' .* needs GPU workers"):
        Fanout("tiny-wan", workers=1, device="cpu", memory="device")
    with pytest.raises(ValueError, match=r"dtype: 'bogus'; allowed: \['bfloat16', 'float16', 'float32'\]"):
        Fanout("tiny-wan", workers=1, device="cpu", dtype="bogus")  # on the driver, before a worker loads


def test_a_store_entry_of_other_code_is_not_finished_for_this_run(fanout, tmp_path, monkeypatch):
    """A cell's key holds the code (git revision, package versions) and device type: a store entry made at another
    commit is other work, run again, never merged into this run's record under this run's commit."""
    cell = Cell("generate", {"request": REQUEST, "accelerations": {}, "name": "a"}, "a", "a")
    store = Store(tmp_path)
    store.put(
        {"key": cell.key(fanout.session_key), "kind": "generate", "label": "a", "status": "finished", "record": {}}
    )
    assert fanout.pending([cell], store) == [] and fanout.session_key["device"] == "cpu"
    monkeypatch.setenv("WORKBENCH_COMMIT", "deadbeefcafe")
    with Fanout("tiny-wan", workers=1, device="cpu") as other:  # joins the module's instance; starts no worker
        assert other.session_key["code"]["git"]["commit"] == "deadbeefcafe"
        assert other.pending([cell], store) == [cell]


def test_merge_refuses_records_of_other_code():
    """Cells that ran other code (workers of one cluster on two checkouts) are not merged under the first's commit."""
    record = {"cases": [{"verdict": "qualified"}], "worker": {"host": "a"}, "init_seconds": 1.0}
    record |= {"git": {"commit": "0f45a4d", "dirty": False}, "versions": {"torch": "2.8.0"}}
    assert fanout_jobs.merge([record, {**record, "worker": {"host": "b"}}])["git"] == record["git"]
    for field, other in (("git", {"commit": "deadbeefcafe", "dirty": None}), ("versions", {"torch": "2.9.0"})):
        with pytest.raises(RuntimeError, match=rf"cell 1 \(on b\) ran other code than cell 0 \(on a\): {field} "):
            fanout_jobs.merge([record, {**record, field: other, "worker": {"host": "b"}}])


def test_batch_checks_its_accelerations_on_a_worker_before_any_cell(fanout, tmp_path):
    """An acceleration the workers' device cannot run is refused once, before any cell, with the worker's own
    exception (not Ray's wrapper and its traceback text); no cell is recorded."""
    store = Store(tmp_path)
    with pytest.raises(RuntimeError, match=r"^flash4_attention: needs a device of type") as raised:
        fanout_jobs.batch(fanout, store, [("a", REQUEST)], {"flash4_attention": {}})
    assert not isinstance(raised.value, ray.exceptions.RayTaskError) and store.entries() == {}


def test_a_worker_places_its_model_under_the_runs_cap_and_asks_to_be_replaced_when_its_session_is_stuck():
    """What a Ray actor runs, in this process: the session planned under the cap, the plan in the worker's identity
    (every record names it); a failed cell after which the session cannot go back to stock says `replace`."""
    from workbench.evidence.fanout import Worker

    worker = Worker("tiny-wan", "cpu", None, 0, memory="1GiB")
    identity = worker.open()
    assert identity["memory_plan"]["cap"] == 2**30 and identity["pid"] and identity["device"]["type"] == "cpu"
    assert Worker("tiny-wan", "cpu", None, 0).open()["memory_plan"] is None

    # a cell that raises and leaves the session unusable: recorded failed, the worker asks to be replaced
    def stuck(config):
        raise RuntimeError("session: the model is in an unknown state (an uninstall failed)")

    worker.session.accelerate = stuck
    bad = Request("frames the family refuses", seed=1, frames=6, steps=4, height=16, width=16)
    out = worker.run(Cell("generate", {"request": bad, "accelerations": {}, "name": "bad"}, "bad", "bad"))
    assert out["status"] == "failed" and out["replace"] and "left unusable: session: the model is in" in out["error"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["sweep", "--plugin", "easycache", "--option", "threshold", "--values", "0", "--workers", "2"],
            "go with --ray",
        ),
        (["qualify", "--candidate", "{}", "--store", "s"], "go with --ray"),
        (["qualify", "--candidate", "{}", "--memory", "48GiB"], "--memory: goes with --ray"),
        (["batch", "--requests", "data_manifests/tiny-smoke.json", "--accelerate", "{x"], "--accelerate"),
        # refused on the driver before Ray starts, as `generate` refuses them
        (
            ["batch", "--requests", "data_manifests/tiny-smoke.json", "--dtype", "bogus"],
            "error: --dtype: 'bogus'; allowed: ['bfloat16', 'float16', 'float32']",
        ),
        (
            ["batch", "--requests", "data_manifests/tiny-smoke.json", "--model", "tiny-wann", "--ray"],
            "error: --model: 'tiny-wann' is neither a known name",
        ),
        (["qualify", "--candidate", "{}", "--ray", "--store", __file__], f"error: --store: cannot write to {__file__}"),
    ],
)
def test_cli_ray_options_bad_input_exits_2(tmp_path, capsys, argv, message):
    suite = [] if argv[0] == "batch" else ["--suite", "data_manifests/tiny-smoke.json"]
    model = [] if "--model" in argv else ["--model", "tiny-wan"]
    assert main([*argv, *model, *suite, "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_read_requests_names_the_entry_and_the_field(tmp_path):
    """A batch file is checked whole before Ray starts: each problem names the entry and its field."""
    path = tmp_path / "requests.json"
    with pytest.raises(ValueError, match=r"requests: .* is not readable"):
        fanout_jobs.read_requests(path)
    cases = {
        '[{"prompt": "p", "frames": "9"}]': r"requests\[0\]: frames: must be an integer",
        '[{"prompt": "p", "name": "../x"}]': r"requests\[0\]\.name: must be a plain file stem",
        '[{"prompt": "p", "fps": 8, "bogus": 1}]': r"requests\[0\]: unknown field\(s\) \['bogus'\]; allowed: \['name', 'prompt'",
        '[{"prompt": "p", "name": "a"}, {"prompt": "q", "name": "a"}]': r"requests\[1\]\.name: 'a' is taken",
        '[{"name": "a", "seed": 1}]': r"requests\[0\]\.prompt: missing \(required: \['prompt'\]; allowed: \['name'",
        "[" * 100_000 + "]" * 100_000: r"requests: .*requests.json is not valid JSON \(nested too deeply\)",
        b'[{"prompt": "caf\xe9"}]': r"requests: .*requests.json is not UTF-8 text \(invalid continuation byte",
        '[{"prompt": "p", "seed": 1, "seed": 2}]': r"requests: .*requests.json: 'seed' is given twice in one object",
    }
    for text, message in cases.items():
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
        with pytest.raises(ValueError, match=message):
            fanout_jobs.read_requests(path)
