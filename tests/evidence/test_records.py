import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import workbench
from workbench.evidence.records import read_record, write_record


def test_record_round_trips_and_creates_folders(tmp_path):
    record = {"verdict": "qualified", "metrics": {"psnr_db": "inf", "ratios": [1.5, 1.6, 1.55]}}
    path = write_record(tmp_path / "runs" / "a" / "record.json", record)
    assert path == tmp_path / "runs" / "a" / "record.json"
    assert read_record(path) == record
    assert [p.name for p in path.parent.iterdir()] == ["record.json"]  # no temporary left behind


def test_record_is_strict_json_with_numpy_numbers(tmp_path):
    record = {"psnr_db": math.inf, "ratio": math.nan, "steps": np.int64(4), "loss": np.float32(0.25)}
    text = write_record(tmp_path / "r.json", record).read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"psnr_db": None, "ratio": None, "steps": 4, "loss": 0.25}


def test_record_refuses_unserialisable_and_non_objects(tmp_path):
    with pytest.raises(ValueError, match=r"record: value.when: object is not JSON-serialisable"):
        write_record(tmp_path / "r.json", {"when": object()})
    assert not (tmp_path / "r.json").exists()
    with pytest.raises(ValueError, match="record: must be a dict"):
        write_record(tmp_path / "r.json", [1, 2])
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="list.json holds a JSON list"):
        read_record(tmp_path / "list.json")
    (tmp_path / "torn.json").write_text('{"a": ')
    with pytest.raises(ValueError, match="torn.json is not valid JSON"):
        read_record(tmp_path / "torn.json")
    (tmp_path / "latin1.json").write_bytes(b'{"note": "caf\xe9"}')  # an editor's Latin-1, or a torn disk block
    with pytest.raises(ValueError, match=r"^record: .*latin1.json is not valid JSON \(not UTF-8 text:"):
        read_record(tmp_path / "latin1.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # deeper than the parser goes
    with pytest.raises(ValueError, match=r"^record: .*deep.json is not valid JSON \(nested too deeply\)"):
        read_record(tmp_path / "deep.json")


# The child loads workbench.evidence.records without running workbench/__init__ (which imports torch and
# diffusers): the code under test is the same, the start-up is seconds shorter.
CHILD = """
import sys, types
package = types.ModuleType("workbench")
package.__path__ = [sys.argv[2]]
sys.modules["workbench"] = package
from workbench.evidence.records import write_record
write_record(sys.argv[1], {"version": 1, "payload": "small"})
print("ready", flush=True)
write_record(sys.argv[1], {"version": 2, "payload": "x" * 150_000_000})
"""


def test_record_killed_mid_write_leaves_the_previous_complete_version(tmp_path):
    target = tmp_path / "record.json"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(target), str(Path(workbench.__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        temporary = target.with_name(f".{target.name}.tmp-{child.pid}")
        deadline = time.monotonic() + 30
        while not temporary.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        assert temporary.exists(), "the child never started writing the new version"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    record = json.loads(target.read_bytes())  # never torn: parses completely
    assert record["version"] in (1, 2)  # 2 only if the rename won the race with the kill
    if record["version"] == 2:
        assert len(record["payload"]) == 150_000_000
    assert read_record(target) == record


def test_store_names_a_file_in_its_entries_that_is_not_an_entry(tmp_path):
    """A resumed run reads every entry; one that is not an entry (hand-edited, cut) is named with what to do, instead
    of a KeyError mid-run or a cell taken for finished."""
    from workbench.evidence.store import Store

    store, key = Store(tmp_path), "ab" * 32
    entry = {"key": key, "kind": "generate", "label": "x", "status": "finished", "record": {}, "outputs": None}
    assert store.get(key) is None and store.put(entry) == entry
    assert store.get(key) == entry and store.entries() == {key: entry}
    for bad in (
        {},
        {**entry, "status": "done"},
        {**entry, "key": "cd" * 32},
        {k: v for k, v in entry.items() if k != "record"},
    ):
        write_record(tmp_path / "entries" / f"{key}.json", bad)
        for read in (lambda: store.get(key), store.entries):
            with pytest.raises(ValueError, match=rf"{key}\.json: not a store entry .*delete the file to run its cell"):
                read()


def test_a_finished_cell_whose_outputs_another_cell_replaced_or_someone_deleted_runs_again(tmp_path):
    """Outputs live by name: a batch request edited (seed 1 -> 9), run, then edited back finds its cell finished in
    the store, but `outputs/a/` holds seed 9's files. The cell is not finished any more (a re-run runs it again
    rather than print seed 9's video as seed 1's); nor is one whose files were deleted."""
    from workbench.evidence.fanout import _finished
    from workbench.evidence.store import Store

    store = Store(tmp_path)
    first, second = "ab" * 32, "cd" * 32
    cell = {"kind": "generate", "label": "a", "status": "finished", "record": {}, "outputs": None}
    store.put({**cell, "key": first}, {"a.json": b'{"seed": 1}', "a.mp4": b"one"}, "a")
    assert _finished(store.get(first), store)
    store.put({**cell, "key": second}, {"a.json": b'{"seed": 9}', "a.mp4": b"nine"}, "a")
    assert not _finished(store.get(first), store) and _finished(store.get(second), store)
    (tmp_path / "outputs" / "a" / "a.mp4").unlink()
    assert not _finished(store.get(second), store)
    assert _finished(store.put({**cell, "key": "ef" * 32}), store)  # no outputs: finished is finished
    old = {**store.get(first), "files": None}  # an entry written before digests were kept: its folder decides
    assert store.intact(old) and not store.intact({**old, "outputs": "outputs/gone"})
