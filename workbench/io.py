"""Atomic writes and strict JSON: every file the workbench produces appears whole or not at all, every set of
files (an MP4 with its record and report) appears as a complete old set or a complete new set, and every JSON
document is strict (no NaN/inf tokens, numpy scalars as numbers).

How a set is published (`write_set`), and why a folder never ends up with a mix:

1. `recover_sets(directory)` first finishes or discards whatever an earlier, killed writer left (below).
2. The new files are written and fsynced into a fresh hidden staging folder `.wbset-<key>.tmp-<pid>-<random>`
   inside the target folder (same file system, so the later moves are renames). A failure here removes the
   staging folder; the published files were not touched.
3. A manifest (`MANIFEST`, the list of names) is written into the staging folder, then the staging folder is
   renamed to `.wbset-<key>.commit`. That directory rename is the commit point: before it the old set is
   intact, after it the new set is decided.
4. Each file is moved (`os.replace`) from the commit folder onto its published name, then the commit folder
   is removed.

A kill during step 4 leaves a commit folder beside a half-published set: `recover_sets` (run by every
`write_set` and available to readers) sees it and moves the remaining files, so the folder then holds the
complete new set; a staging folder without a commit is deleted, which leaves the complete old set. One writer
per set at a time: a second writer that finds another's commit folder mid-publish raises RuntimeError.

A commit folder is trusted only as far as it checks out: a real folder (not a link) whose manifest is a JSON
list of plain file names (one path component each: not hidden, so no `.`/`..`, and no `/`, `\\` or NUL), or
an empty folder (a publish finished but for its removal).
`write_set` never leaves any other kind; for one that fails this, `recover_sets` moves and deletes nothing and
raises ValueError naming the folder and how to clear it, so no file is ever moved across the folder's edge.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import numbers
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePath
from typing import Any

MANIFEST = ".manifest.json"
_PREFIX = ".wbset-"
NAME_MAX = 255  # bytes in one file name where the file system does not say (ext4, XFS, Btrfs, tmpfs, APFS)
SUFFIX_MAX = 8  # bytes of the longest suffix a stem is written with (".json", ".html", ".mp4")
_TEMPORARY = len(".") + len(".tmp-") + 10  # what write_atomic's `.<name>.tmp-<pid>` adds (a pid: <= 10 digits)


def write_atomic(path: Path, data: bytes) -> Path:
    """Write to a temporary name beside `path`, then rename: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        _write_synced(tmp, data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_set(directory: str | Path, files: Mapping[str, bytes]) -> dict[str, Path]:
    """Publish `files` (plain file name -> bytes) into `directory` as one set; returns name -> path.

    After this returns, or after any kill followed by `recover_sets(directory)` (which every `write_set`
    runs first), `directory` holds either all of the previous versions of these files or all of the new
    ones, and no staging folders or temporary files. `directory` is created if missing. Names must be plain
    file names (no folder part, not hidden, not `.`/`..`, no NUL, UTF-8 text, no longer than `directory`'s file
    system takes), and a name whose path exists must be a regular file (not a folder or a link): each is a
    ValueError naming `files` before anything is written. A `directory` that is not a path, or that cannot be
    created (a file in the way, a file as its parent, no permission), is a ValueError naming `directory`, with
    nothing created; so is a leftover commit folder there that `recover_sets` refuses, with nothing written.
    A write that fails before the commit point (a full disk) also removes the folders this call created.
    """
    if not files:
        raise ValueError("files: at least one file is required")
    directory = check_path(directory, "directory")
    for name, data in files.items():
        if not _plain_name(name):
            raise ValueError(f"files: {name!r} is not a plain, non-hidden file name")
        _check_file_name(name, 0, "files", directory)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"files[{name!r}]: expected bytes, got {type(data).__name__}")
    check_targets(directory, files)
    created = _missing_folders(directory)
    try:
        commit = _commit(directory, files)
    except BaseException:
        _remove_empty(created)  # a set that never reached its commit point leaves no folder behind
        raise
    _fsync_directory(directory)
    _publish(commit, sorted(files))
    return {name: directory / name for name in files}


def _commit(directory: Path, files: Mapping[str, bytes]) -> Path:
    """`write_set`'s steps up to its commit point (module docstring, 1-3): `directory` created, its interrupted sets
    recovered, `files` written into a staging folder there, renamed to the set's commit folder, which is returned.
    On failure the staging folder is gone and the published files were not touched."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        reason = getattr(error, "strerror", None) or str(error)
        raise ValueError(f"directory: cannot write to {directory} ({reason})") from error
    recover_sets(directory)
    key = hashlib.sha256("\0".join(sorted(files)).encode()).hexdigest()[:12]
    staging = directory / f"{_PREFIX}{key}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    commit = directory / f"{_PREFIX}{key}.commit"
    staging.mkdir()
    try:
        for name, data in files.items():
            _write_synced(staging / name, bytes(data))
        _write_synced(staging / MANIFEST, json.dumps(sorted(files)).encode())
        _fsync_directory(staging)
        try:
            os.rename(staging, commit)  # the commit point
        except OSError as error:
            if commit.exists():
                raise RuntimeError(f"{directory}: another writer is publishing {sorted(files)} now") from error
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return commit


def check_targets(directory: str | Path, names: Iterable[str], field: str = "files") -> None:
    """ValueError naming `field` when one of `names` in `directory` exists as something other than a regular file
    (a folder, a link): publishing a set onto it would fail after the set's commit point."""
    for name in names:
        target = Path(directory) / name
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise ValueError(f"{field}: {target} exists and is not a regular file; remove it or write elsewhere")


def check_path(path: object, field: str) -> Path:
    """`path` as a Path if it is a str or os.PathLike; else ValueError naming `field`. An empty or blank string is
    refused too (Path("") is the current folder: an unset variable would write there unsaid); "." says it."""
    if not isinstance(path, str | os.PathLike):
        raise ValueError(f"{field}: expected a path (str or os.PathLike), got {type(path).__name__}")
    if isinstance(path, str) and not path.strip():
        raise ValueError(f"{field}: expected a path, got the empty string {path!r}; '.' is the current folder")
    return Path(path)


_NOT_PORTABLE = frozenset('<>:"|?*')  # besides control characters: what Windows file names cannot hold
_DEVICE_NAMES = frozenset(
    ["CON", "PRN", "AUX", "NUL", *(f"{port}{i}" for port in ("COM", "LPT") for i in range(1, 10))]
)


def check_stem(name: object, field: str = "name", directory: str | Path | None = None) -> str:
    """`name` if it is a plain file stem; else ValueError naming `field`. A plain stem is a non-empty str with no
    folder part, not hidden, holding no character a file name cannot (NUL; one UTF-8 cannot encode, such as the
    lone surrogate Python puts for an undecodable byte; one the file-system encoding cannot write), and short
    enough that every file written from it fits one file name: the stem, a suffix of up to SUFFIX_MAX bytes and
    write_atomic's temporary name around them within the limit of `directory`'s file system (NAME_MAX bytes when
    no `directory` is given or the platform cannot say). It is also portable, so the files
    can be copied to any machine: no control character or one of <>:"|?*, no Windows device name (CON, COM1, ...
    before any suffix), and no trailing dot or space (Windows drops them)."""
    if not isinstance(name, str) or not name.strip() or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"{field}: must be a plain file stem (no folder part, not hidden), got {name!r}")
    _check_file_name(name, SUFFIX_MAX + _TEMPORARY, field, directory)
    bad = "".join(sorted({c for c in name if c in _NOT_PORTABLE or ord(c) < 32 or c == "\x7f"}))
    if bad:
        raise ValueError(f'{field}: {name!r} holds {bad!r}; allowed: no control characters and none of <>:"|?*')
    if name.split(".")[0].rstrip(" ").upper() in _DEVICE_NAMES:
        raise ValueError(f"{field}: {name!r} is a device name on Windows; allowed: any other stem")
    if name.endswith((".", " ")):
        raise ValueError(f"{field}: {name!r} ends in a dot or a space, which Windows drops; allowed: any other ending")
    return name


def _check_file_name(name: str, extra: int, field: str, directory: str | Path | None) -> None:
    """ValueError naming `field` when `name` holds a character no file name can (NUL; one UTF-8 cannot encode,
    since names also go into UTF-8 records and pages; one the file-system encoding cannot write), or when `name`
    plus the `extra` bytes a writer adds to it is longer than a file name of `directory`'s file system may be."""
    if "\0" in name:
        raise ValueError(f"{field}: {name!r} holds a NUL character; allowed: file names without NUL")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate, e.g. an undecodable byte of a command line
        bad = error.object[error.start : error.end]
        raise ValueError(f"{field}: {name!r} holds {bad!r}, which UTF-8 cannot encode; allowed: UTF-8 text") from None
    try:
        size = len(os.fsencode(name))
    except UnicodeEncodeError as error:
        bad = error.object[error.start : error.end]
        raise ValueError(f"{field}: {name!r} holds {bad!r}, which file names here cannot encode") from None
    limit = _name_max(directory)
    if size + extra > limit:
        raise ValueError(
            f"{field}: {name[:24]!r}... is {size} bytes, too long for a file name here; allowed: at most "
            f"{limit - extra} bytes"
        )


def _name_max(directory: str | Path | None) -> int:
    """The longest file name, in bytes, that `directory`'s file system takes: asked of its nearest existing
    folder where the platform can say (os.pathconf), else NAME_MAX."""
    if directory is None:
        return NAME_MAX
    folder = Path(directory)
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or a path it cannot ask
        return NAME_MAX
    return limit if limit > 0 else NAME_MAX


def check_writable(directory: str | Path, field: str = "out") -> Path:
    """Refuse, before any work, a `directory` that a run could not write its outputs into: the folders that
    are missing are created, a probe file is written and removed, then the folders this call created are
    removed again (a refused run leaves nothing behind; the writers create them when they publish). Returns
    the path. A path that cannot be created or written (a file in the way, no permission, a read-only file
    system) is a ValueError naming `field`, the path and the reason."""
    directory = Path(directory)
    missing = _missing_folders(directory)
    probe = directory / f".probe.tmp-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _write_synced(probe, b"")
        probe.unlink()
    except OSError as error:
        reason = error.strerror or str(error)
        raise ValueError(f"{field}: cannot write to {directory} ({reason})") from error
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        _remove_empty(missing)
    return directory


def _missing_folders(directory: Path) -> list[Path]:
    """`directory` and those of its parents that do not exist, deepest first: what `mkdir(parents=True)` creates."""
    return [folder for folder in (directory, *directory.parents) if not folder.exists()]


def _remove_empty(folders: list[Path]) -> None:
    """Remove `folders` (deepest first, as `_missing_folders` lists them) while they are empty: the first one that
    holds something (or cannot be removed) stops it, so nothing but folders a failed writer created goes."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


def recover_sets(directory: str | Path) -> list[Path]:
    """Finish every set whose publishing was interrupted after its commit point (moves its remaining files
    into place) and delete staging folders and `write_atomic` temporaries left by writers that no longer
    run. Returns the paths of the sets finished. A missing `directory` is nothing to recover.

    Every commit folder is checked before anything moves: one that is a link, holds files but no manifest, or
    whose manifest is unreadable, not JSON or not a list of plain file names (one path component each, not hidden,
    no `..`, no `/`, `\\` or NUL), was not written by `write_set`. Then nothing is moved or deleted, and a
    ValueError names `directory`, the folder and how to clear it (remove that folder, or write elsewhere)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    entries = sorted(directory.iterdir())
    commits = [
        (entry, _manifest(entry))
        for entry in entries
        if entry.name.startswith(_PREFIX) and entry.name.endswith(".commit") and (entry.is_dir() or entry.is_symlink())
    ]
    finished = []
    for commit, names in commits:
        finished += [directory / n for n in _publish(commit, names)]
    for entry in entries:
        name = entry.name
        if name.startswith(_PREFIX) and name.endswith(".commit"):
            continue  # finished above
        if name.startswith(_PREFIX) and ".tmp-" in name and _dead(name.split(".tmp-")[-1].split("-")[0]):
            shutil.rmtree(entry, ignore_errors=True)
        elif name.startswith(".") and ".tmp-" in name and entry.is_file() and _dead(name.rsplit("-", 1)[-1]):
            entry.unlink(missing_ok=True)  # a write_atomic temporary of a killed writer
    return finished


def json_value(value: Any, where: str = "value") -> Any:
    """The strict-JSON form of `value`: non-finite floats become None, numpy/torch scalars their Python
    number, tuples/sets lists, paths and torch dtypes/devices strings, mapping keys strings. Anything else
    is a TypeError naming `where` (the key path) and the type. Fields that document "inf"/"-inf" strings
    convert them before calling this."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral) and not hasattr(value, "dtype"):
        return int(value)
    if isinstance(value, numbers.Real) and not hasattr(value, "dtype"):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, Mapping):
        return {_key(k, where): json_value(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, set | frozenset):
        return [json_value(v, f"{where}[]") for v in sorted(value, key=repr)]
    if isinstance(value, PurePath):
        return str(value)
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalars/arrays, torch tensors
        return json_value(value.tolist(), where)
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return str(value)
    raise TypeError(f"{where}: {type(value).__name__} is not JSON-serialisable: {value!r}")


class RepeatedKey(ValueError):
    """A JSON object a person wrote that gives one key twice (`json.loads` alone keeps the last without a word)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s `object_pairs_hook` for JSON a person wrote (CLI flags, suites, batch files): the object's dict,
    or RepeatedKey naming the key given twice."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise RepeatedKey(f"{key!r} is given twice in one object; give each key once")
        value[key] = item
    return value


def json_bytes(value: Any, indent: int | None = 2) -> bytes:
    """`json_value(value)` as strict JSON (`allow_nan=False`), UTF-8, with a trailing newline."""
    return (json.dumps(json_value(value), indent=indent, allow_nan=False) + "\n").encode()


def _key(key: Any, where: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool) or key is None or not isinstance(key, numbers.Number):
        raise TypeError(f"{where}: key {key!r} ({type(key).__name__}) is not a string or number")
    return str(json_value(key, where))


def _manifest(commit: Path) -> list[str]:
    """The file names `commit`'s manifest lists; [] when the folder is empty or gone (another process published
    the set and is removing the folder: the manifest is the last file left). ValueError naming `directory` (the
    folder `commit` is in) when `commit` is a link, holds files but no manifest, or its manifest is unreadable, not
    JSON, or not a list of plain file names: not a set `write_set` wrote."""
    clear = f"it was not written by workbench.io.write_set, so nothing was moved: remove {commit} or write elsewhere"
    if commit.is_symlink():
        raise ValueError(f"directory: {commit} is a link, not a set folder; {clear}")
    try:
        names = json.loads((commit / MANIFEST).read_bytes())
    except FileNotFoundError:
        try:
            left = next(commit.iterdir(), None)
        except OSError:  # the folder is gone too
            return []
        if left is None:
            return []
        raise ValueError(f"directory: {commit} holds {left.name!r} but no {MANIFEST}; {clear}") from None
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8
        raise ValueError(f"directory: {commit / MANIFEST} is not a readable JSON manifest ({error}); {clear}") from None
    if not isinstance(names, list) or not all(_plain_name(n) and "\\" not in n and "\0" not in n for n in names):
        raise ValueError(
            f"directory: {commit / MANIFEST} holds {json.dumps(names)[:80]}; allowed: a JSON list of plain file "
            f"names (one path component each, not hidden, no '..', no '/', '\\' or NUL); {clear}"
        )
    return names


def _plain_name(name: object) -> bool:
    """Whether `name` is a plain file name: a non-empty str that is one path component and not hidden (so not `.`
    or `..`)."""
    return isinstance(name, str) and bool(name) and name == Path(name).name and not name.startswith(".")


def _publish(commit: Path, names: list[str]) -> list[str]:
    """Move a committed set's files (`names`, as `_manifest` checked them) into place and remove its folder;
    returns `names`. Idempotent, and safe when another process (a `recover_sets` elsewhere) publishes the same
    commit at the same time: every file it moves is the new version, and a file already gone was moved by the
    other."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.replace(commit / name, commit.parent / name)
    _fsync_directory(commit.parent)
    shutil.rmtree(commit, ignore_errors=True)
    return names


def _write_synced(path: Path, data: bytes) -> None:
    """Write and fsync `path`; an OSError (a full disk, a quota) says which file and how many bytes it was writing."""
    try:
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        reason = error.strerror or str(error)
        raise OSError(error.errno, f"writing {len(data):,} bytes to {path}: {reason}") from error


def _fsync_directory(path: Path) -> None:
    try:
        handle = os.open(path, os.O_RDONLY)
    except OSError:  # a platform without directory handles: the renames are still atomic
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _dead(pid: str) -> bool:
    """Whether `pid` (a decimal string from a temporary's name) names a process that no longer runs."""
    if not pid.isdigit():
        return False  # not a name this module made: left alone
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False
