"""The record store of fanned-out runs (`workbench.evidence.fanout`): one entry per cell, written by the driver."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from workbench.evidence.records import read_record, write_record
from workbench.io import write_set

_KEY = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class Store:
    """A record store in a directory: `entries/<key>.json` holds one entry per cell (the index: cell key ->
    entry, the entry holding the record), `outputs/<name>/` the files a cell returned (a generated request's
    MP4, JSON and HTML). Only the driver writes. An entry is written atomically after its files, so a reader or a
    resumed run sees a cell whole or not at all. `get`, `put` and `entries` are the whole interface a run uses:
    an object store can stand in for the directory later.

    An entry: {"key", "kind", "label", "status": "finished" | "failed", "attempts", "seconds" (the cell in its
    worker), "wall_seconds" (from handing it to the worker to its result: the difference is the engine's overhead
    per cell; both of the last attempt), "worker" (host,
    pid, device of the worker it last ran on), "error" and "traceback" (None when finished), "record", "outputs"
    (folder relative to the store root, or None), "files" (with outputs: file name -> sha256 of what was written)}.

    Outputs live by name, and two cells may share one (a batch request edited, run, then edited back): the later
    cell's files replace the earlier's. `intact(entry)` tells whether an entry's folder still holds what it wrote,
    so a re-run runs such a cell again rather than point at another cell's files (or at files since deleted).
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        return _read_entry(path) if path.exists() else None

    def put(self, entry: dict[str, Any], files: dict[str, bytes] | None = None, name: str = "") -> dict[str, Any]:
        """Write `entry` (after `files`, into `outputs/<name>/` as one set, when given); returns the entry written."""
        if files:
            if not _NAME.fullmatch(name):
                raise ValueError(f"name: {name!r}; allowed: letters, digits, '.', '_', '-' (first a letter or digit)")
            write_set(self.root / "outputs" / name, files)
            digests = {file: hashlib.sha256(data).hexdigest() for file, data in files.items()}
            entry = {**entry, "outputs": f"outputs/{name}", "files": digests}
        write_record(self._path(entry["key"]), entry)
        return entry

    def intact(self, entry: dict[str, Any]) -> bool:
        """Whether `entry`'s output files are still the ones it wrote (sha256 of each; an entry without outputs is
        intact; one written before digests were kept: when its folder exists)."""
        if not entry.get("outputs"):
            return True
        folder = self.root / entry["outputs"]
        if not isinstance(entry.get("files"), dict):
            return folder.is_dir()
        for file, digest in entry["files"].items():
            path = folder / file
            if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                return False
        return True

    def entries(self) -> dict[str, dict[str, Any]]:
        folder = self.root / "entries"
        return {p.stem: _read_entry(p) for p in sorted(folder.glob("*.json"))} if folder.exists() else {}

    def _path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"key: {key!r} is not a cell key (64 hex digits)")
        return self.root / "entries" / f"{key}.json"


ENTRY_KEYS = ("key", "kind", "label", "status", "record")  # what a run reads of an entry
STATUSES = ("finished", "failed")


def _read_entry(path: Path) -> dict[str, Any]:
    """The entry at `path`; a ValueError naming the file when it is not one (hand-edited, or not written by a run):
    a resumed run would otherwise fail on it with a KeyError, or take it for a finished cell."""
    entry = read_record(path)  # a JSON object, or a ValueError naming the file
    if any(k not in entry for k in ENTRY_KEYS) or entry["key"] != path.stem or entry["status"] not in STATUSES:
        raise ValueError(
            f"{path}: not a store entry (an object with {list(ENTRY_KEYS)}, 'key' its file's name and 'status' one "
            f"of {list(STATUSES)}); delete the file to run its cell again"
        )
    return entry
