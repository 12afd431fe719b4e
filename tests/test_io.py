import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import workbench
from workbench.io import check_stem, check_writable, json_bytes, json_value, recover_sets, write_atomic, write_set


def test_write_atomic_replaces_whole_file(tmp_path):
    target = tmp_path / "a.json"
    target.write_bytes(b"old")
    assert write_atomic(target, b'{"new": 1}') == target
    assert target.read_bytes() == b'{"new": 1}'
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_write_atomic_leaves_nothing_on_failure(tmp_path, monkeypatch):
    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        write_atomic(tmp_path / "a.json", b"{}")
    assert list(tmp_path.iterdir()) == []


# --- sets -------------------------------------------------------------------------------------------------------


NAMES = ("clip.mp4", "clip.json", "clip.html")


def _payload(version: int, size: int = 64) -> dict[str, bytes]:
    return {name: f"{version}:{name}:".encode() + bytes(size) for name in NAMES}


def _versions(folder: Path) -> set[str]:
    return {(folder / name).read_bytes().split(b":")[0].decode() for name in NAMES if (folder / name).exists()}


def test_write_set_publishes_every_file_and_leaves_nothing_else(tmp_path):
    paths = write_set(tmp_path / "out", _payload(1))
    assert paths == {name: tmp_path / "out" / name for name in NAMES}
    write_set(tmp_path / "out", _payload(2))
    assert _versions(tmp_path / "out") == {"2"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(NAMES)


def test_write_set_failure_keeps_the_old_set_and_no_staging(tmp_path, monkeypatch):
    write_set(tmp_path, _payload(1))
    calls = []

    def full_disk(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        Path(path).write_bytes(data)

    monkeypatch.setattr("workbench.io._write_synced", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_set(tmp_path, _payload(2))
    assert _versions(tmp_path) == {"1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NAMES)


def test_write_set_failing_in_new_folders_removes_the_folders_it_created_only(tmp_path, monkeypatch):
    """A set written into folders that do not exist yet, failing before its commit point, leaves none of the folders
    it created; the folder that existed before stays, and so does an existing folder a failure happens in."""
    (tmp_path / "kept").mkdir()
    writes = []

    def full_disk(path, data):
        writes.append(path)
        if len(writes) % 2 == 0:
            raise OSError(28, "No space left on device")
        Path(path).write_bytes(data)

    monkeypatch.setattr("workbench.io._write_synced", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_set(tmp_path / "kept" / "a" / "b", _payload(1))
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []
    with pytest.raises(OSError, match="No space"):
        write_set(tmp_path / "kept", _payload(1))
    assert (tmp_path / "kept").is_dir() and list((tmp_path / "kept").iterdir()) == []


def test_a_full_disk_names_the_file_and_its_size_and_keeps_the_old_set(tmp_path, monkeypatch):
    """The OSError of a failed write says which file (and how many bytes) was being written, keeping its errno."""
    write_set(tmp_path, _payload(1))

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("workbench.io.os.fsync", no_space)
    with pytest.raises(OSError, match=r"writing \d+ bytes to \S+/[^/]+: No space left on device") as failed:
        write_set(tmp_path, _payload(2))
    assert failed.value.errno == 28 and Path(failed.value.strerror.split(" to ")[1].split(":")[0]).name in NAMES
    assert _versions(tmp_path) == {"1"} and sorted(p.name for p in tmp_path.iterdir()) == sorted(NAMES)


def test_write_set_bad_names_raise_before_writing(tmp_path):
    for name in ("../x", ".hidden", "a/b", ""):
        with pytest.raises(ValueError, match="plain, non-hidden file name"):
            write_set(tmp_path / "o", {name: b"x"})
    with pytest.raises(ValueError, match="expected bytes"):
        write_set(tmp_path / "o", {"a.json": "text"})
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("stem", "message"),
    [
        ("x\x00y", "holds a NUL character"),
        ("\ud800", "cannot encode"),
        ("a\udc80", "holds '\\\\udc80', which UTF-8 cannot encode; allowed: UTF-8 text"),  # $'a\x80' on a command line
        ("a" * 300, "bytes, too long for a file name"),
    ],
)
def test_stems_and_names_no_file_system_takes_are_refused_by_name_before_writing(tmp_path, stem, message):
    """What Result.save and the CLI's --name check run on: a NUL, a character UTF-8 or the file system cannot encode
    (an undecodable byte arrives as a lone surrogate the file system takes, but no UTF-8 record can) or a name longer
    than a file name may be is a ValueError naming the field (not an OS error after the work), and write_set refuses
    the same file names before it creates the folder. The longest stem accepted leaves room for a suffix and the
    temporary name of write_atomic."""
    with pytest.raises(ValueError, match=f"^--name: .*{message}"):
        check_stem(stem, "--name")
    with pytest.raises(ValueError, match=f"^files: .*{message}"):
        write_set(tmp_path / "o", {f"{stem}.json": b"{}"})
    assert not (tmp_path / "o").exists()
    longest = check_stem("a" * 231)  # 251 bytes as write_atomic's `.<stem>.html.tmp-<pid>` with a 10-digit pid
    assert write_atomic(tmp_path / f"{longest}.html", b"").exists()
    with pytest.raises(ValueError, match="232 bytes"):
        check_stem(longest + "a")


@pytest.mark.parametrize(
    ("stem", "message"),
    [
        ("run:1", "holds ':'; allowed: no control characters and none of <>:"),
        ('a<b>"c|d?e*', """holds '"*<>?|'"""),
        ("tab\there", "holds '\\t'"),
        ("con", "is a device name on Windows"),
        ("LPT9.final", "is a device name on Windows"),
        ("draft.", "ends in a dot or a space"),
        ("draft ", "ends in a dot or a space"),
    ],
)
def test_stems_other_systems_cannot_hold_are_refused_by_name(stem, message):
    """Saved results are copied between machines: a stem Windows cannot hold (its reserved characters, control
    characters, device names, a trailing dot or space) is refused by name; near misses are plain stems."""
    with pytest.raises(ValueError, match=f"^--name: {re.escape(repr(stem))} .*{re.escape(message)}"):
        check_stem(stem, "--name")
    for fine in ("console", "com10", "nul-run", "run 1.final", "x-y_z (2)"):
        assert check_stem(fine) == fine


@pytest.mark.parametrize("directory", ["a-file", "a-file/sub", None, 5])
def test_write_set_into_a_bad_directory_is_a_value_error_naming_it(tmp_path, monkeypatch, directory):
    monkeypatch.chdir(tmp_path)
    Path("a-file").write_text("in the way")
    with pytest.raises(ValueError, match=r"^directory: (cannot write to a-file|expected a path)"):
        write_set(directory, {"a.json": b"{}"})
    assert os.listdir(tmp_path) == ["a-file"] and Path("a-file").read_text() == "in the way"


def test_write_set_onto_a_folder_or_link_raises_before_its_commit_point(tmp_path):
    """A folder (or a link) where a file of the set goes would fail the publish after the commit point, leaving the
    set half-published and every later write_set into the folder stuck on it: refused first, nothing written."""
    out = tmp_path / "o"
    write_set(out, {"a.json": b"old", "a.mp4": b"old"})
    (out / "a.html").mkdir()
    with pytest.raises(ValueError, match=r"a\.html exists and is not a regular file"):
        write_set(out, {"a.json": b"new", "a.mp4": b"new", "a.html": b"new"})
    (out / "b.json").symlink_to(out / "a.json")
    with pytest.raises(ValueError, match=r"b\.json exists and is not a regular file"):
        write_set(out, {"b.json": b"new"})
    assert sorted(p.name for p in out.iterdir()) == ["a.html", "a.json", "a.mp4", "b.json"]
    assert (out / "a.json").read_bytes() == b"old"
    assert write_set(out, {"c.json": b"c"}) and (out / "c.json").read_bytes() == b"c"  # the folder is not stuck


# The child imports workbench.io without workbench/__init__ (torch, diffusers): the same code, a start in
# milliseconds. With a stop point K it blocks forever at the K-th rename (staging -> commit is rename 0, then
# one os.replace per file); without one it saves in a loop until killed.
CHILD = """
import os, sys, time, types
package = types.ModuleType("workbench")
package.__path__ = [sys.argv[2]]
sys.modules["workbench"] = package
from workbench import io
names = ("clip.mp4", "clip.json", "clip.html")
stop = int(sys.argv[3])
count = [0]
def hook(real):
    def renamed(*args):
        if count[0] == stop:
            print("stopped", flush=True)
            time.sleep(3600)
        count[0] += 1
        return real(*args)
    return renamed
os.rename, os.replace = hook(os.rename), hook(os.replace)
version = 2
print("ready", flush=True)
while True:
    io.write_set(sys.argv[1], {n: f"{version}:{n}:".encode() + bytes(200_000) for n in names})
    version += 1
"""


def _kill_child(folder: Path, stop: int, delay: float | None = None) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder), str(Path(workbench.__file__).parent), str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        if delay is None:
            assert child.stdout.readline().strip() == "stopped"
        else:
            time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()


def test_write_set_killed_at_every_rename_leaves_one_complete_set(tmp_path):
    for stop in range(1 + len(NAMES)):
        folder = tmp_path / f"stop{stop}"
        write_set(folder, _payload(1))
        _kill_child(folder, stop)
        versions = _versions(folder)
        hidden = [p.name for p in folder.iterdir() if p.name.startswith(".")]
        if stop == 0:  # killed before the commit point: the old set, untouched
            assert versions == {"1"}
        else:  # killed mid-publish (stop - 1 files moved): the commit folder marks it, recovery finishes it
            published = [name for name in NAMES if (folder / name).read_bytes().startswith(b"2:")]
            assert len(published) == stop - 1 and versions <= {"1", "2"}
            assert any(name.endswith(".commit") for name in hidden)
        recover_sets(folder)
        assert _versions(folder) == ({"1"} if stop == 0 else {"2"})
        assert all((folder / name).exists() for name in NAMES)
        write_set(folder, _payload(9))
        assert sorted(p.name for p in folder.iterdir()) == sorted(NAMES)
        assert _versions(folder) == {"9"}


def test_write_set_killed_at_random_times_never_leaves_a_mix(tmp_path):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    folder = tmp_path / "random"
    write_set(folder, _payload(1))
    for _ in range(4):
        _kill_child(folder, stop=-1, delay=rng.uniform(0.0, 0.3))
        recover_sets(folder)
        assert len(_versions(folder)) == 1, f"seed {seed}: {_versions(folder)}"
        assert sorted(p.name for p in folder.iterdir()) == sorted(NAMES), f"seed {seed}"
    write_set(folder, _payload(9))
    assert _versions(folder) == {"9"}


@pytest.mark.parametrize(
    "manifest", ['["../victim.txt"]', "garbage", "5", '[".."]', '["a/b"]', '["a\\\\b"]', '[""]', "[1]", "none", "link"]
)
def test_a_leftover_commit_folder_write_set_did_not_write_is_refused_and_nothing_moves(tmp_path, manifest):
    """A commit folder whose manifest is not a JSON list of plain file names (or is missing, or that is a link) is
    not a set write_set left: recover_sets, and so write_set and Result.save, refuse it naming the folder and how to
    clear it, and move nothing (no file leaves the folder or enters it from elsewhere); once it is removed, writes go
    on."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    commit = out / ".wbset-zzz.commit"
    elsewhere.mkdir()
    (elsewhere / "victim.txt").write_text("outside")
    if manifest == "link":  # a valid manifest, in a folder outside `out`
        (elsewhere / ".manifest.json").write_text('["victim.txt"]')
        out.mkdir()
        commit.symlink_to(elsewhere, target_is_directory=True)
    else:
        commit.mkdir(parents=True)
        (commit / "b").write_text("leftover")
        if manifest != "none":
            (commit / ".manifest.json").write_text(manifest)
    (out / "victim.txt").write_text("inside")
    before = {p.relative_to(tmp_path): p.is_file() and p.read_text() for p in tmp_path.rglob("*")}
    clear = (
        rf"^directory: {re.escape(str(commit))}.*not written by workbench\.io\.write_set, so nothing was moved: remove"
    )
    with pytest.raises(ValueError, match=clear):
        recover_sets(out)
    with pytest.raises(ValueError, match=clear):
        write_set(out, {"victim.txt": b"new"})
    with pytest.raises(ValueError, match=clear):
        workbench.Result(np.zeros((2, 16, 16, 3), np.uint8), None, None, 8, None, {}, {}).save(out)
    assert {p.relative_to(tmp_path): p.is_file() and p.read_text() for p in tmp_path.rglob("*")} == before
    if manifest == "link":
        commit.unlink()
    else:
        shutil.rmtree(commit)
    write_set(out, {"victim.txt": b"new"})
    assert sorted(os.listdir(out)) == ["victim.txt"] and (out / "victim.txt").read_text() == "new"


def test_recover_sets_removes_write_atomic_leftovers_of_dead_writers(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".a.json.tmp-{dead.stdout.strip()}"
    stale.write_bytes(b"half")
    mine = tmp_path / ".notes.tmp-keep"  # not a name this module makes: left alone
    mine.write_bytes(b"user")
    write_set(tmp_path, {"a.json": b"{}"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.tmp-keep", "a.json"]


# --- strict JSON ------------------------------------------------------------------------------------------------


def test_json_value_numpy_scalars_are_numbers_and_non_finite_is_null():
    value = {
        "n": np.int64(3),
        "x": np.float32(0.5),
        "flag": np.bool_(True),
        "bad": [math.nan, math.inf, -np.inf, np.float64("nan")],
        "shape": (2, np.int32(4)),
        "path": Path("/tmp/a"),
        np.int64(7): "key",
    }
    assert json_value(value) == {
        "n": 3,
        "x": 0.5,
        "flag": True,
        "bad": [None, None, None, None],
        "shape": [2, 4],
        "path": "/tmp/a",
        "7": "key",
    }
    text = json_bytes(value).decode()
    assert "NaN" not in text and "Infinity" not in text and '"3"' not in text
    assert json.loads(text)["n"] == 3


def test_json_value_unknown_type_names_where():
    with pytest.raises(TypeError, match=r"value.outer\[1\]: object is not JSON-serialisable"):
        json_value({"outer": [1, object()]})


def test_check_writable_probes_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    assert check_writable(target, "--out") == target
    assert list(tmp_path.iterdir()) == []  # the folders it made for the probe are gone again
    (tmp_path / "kept").mkdir()
    check_writable(tmp_path / "kept")
    assert list((tmp_path / "kept").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"--out: cannot write to .*file/sub \(Not a directory\)"):
        check_writable(tmp_path / "file" / "sub", "--out")
