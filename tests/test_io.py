import os

import pytest

from workbench.io import write_atomic


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
