"""Evidence records: one JSON document per run, written so that a crash never leaves half a record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.io import json_bytes, write_atomic


def write_record(path: str | Path, record: dict[str, Any]) -> Path:
    """Write `record` as strict JSON (`record_bytes`) to `path`, atomically; returns the path.

    The bytes go to a temporary name beside `path` and are renamed over it when complete, so a reader (or
    a later run after a crash) sees either the previous complete record or the new one, never a mix.
    Missing parent folders are created. A record published with other files (its HTML report) goes
    through `workbench.io.write_set` with `record_bytes` instead.
    """
    data = record_bytes(record)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, data)


def record_bytes(record: dict[str, Any]) -> bytes:
    """`record` as strict JSON bytes (`workbench.io.json_bytes`): non-finite numbers become null, numpy
    scalars numbers; a record that is not a dict, or holds a value JSON cannot express, is refused."""
    if not isinstance(record, dict):
        raise ValueError(f"record: must be a dict, got {type(record).__name__}")
    try:
        return json_bytes(record)
    except TypeError as error:
        raise ValueError(f"record: {error}") from error


def read_record(path: str | Path) -> dict[str, Any]:
    """Read a record written by `write_record`; a file that is not a JSON object (not UTF-8 text included) is a
    ValueError naming it."""
    path = Path(path)
    try:
        record = json.loads(path.read_bytes())
    except json.JSONDecodeError as error:
        raise ValueError(f"record: {path} is not valid JSON ({error})") from error
    except UnicodeDecodeError as error:  # its own words name no file
        raise ValueError(f"record: {path} is not valid JSON (not UTF-8 text: {error.reason})") from None
    except RecursionError:  # its own words name no file
        raise ValueError(f"record: {path} is not valid JSON (nested too deeply)") from None
    if not isinstance(record, dict):
        raise ValueError(f"record: {path} holds a JSON {type(record).__name__}, expected an object")
    return record
