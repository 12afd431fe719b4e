"""Frozen prompt/seed suites (`data_manifests/*.json`): what a qualification run generates and compares.

Schema: {"name": str, "version": int >= 1, "model": str, optional "description": str,
"calibration": [case, ...], "test": [case, ...]}; a case is {"prompt": str, "seed": int >= 0,
"frames", "height", "width", "steps": int >= 1, "mode": str, optional "reference": {"path": str,
"size": int, "sha256": str}}. Reference paths are relative to the manifest file and must resolve (symlinks
followed) inside the manifest's folder.

A suite names the model its cases and references were made for: `load_manifest(path, model=...)` refuses a
suite pinned to another model unless `allow_other_model=True` (the CLI's `--allow-other-model`).

Calibration cases tune a technique (thresholds, FP8 scales); test cases judge it. A seed in both would
let a technique be judged on what it was tuned on, so loading refuses a manifest where they overlap.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from workbench.io import RepeatedKey, unique_keys
from workbench.request import Request

_TOP = {"name", "version", "model", "description", "calibration", "test"}
_CASE_INTS = {"seed": 0, "frames": 1, "height": 1, "width": 1, "steps": 1}  # field -> minimum
_CASE = {"prompt", "mode", "reference", *_CASE_INTS}
_REFERENCE = {"path", "size", "sha256"}
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Reference:
    """A reference output file a case is compared against, pinned by size and SHA-256."""

    path: Path  # resolved against the manifest's folder
    size: int
    sha256: str


@dataclass(frozen=True)
class Case:
    """One request of a suite: everything that decides the output except the model."""

    prompt: str
    seed: int
    frames: int
    height: int
    width: int
    steps: int
    mode: str
    reference: Reference | None = None

    def to_request(self) -> Request:
        """The `workbench.Request` this case stands for (guidance, fps etc. left to the model's defaults)."""
        return Request(
            self.prompt,
            seed=self.seed,
            frames=self.frames,
            height=self.height,
            width=self.width,
            steps=self.steps,
            mode=self.mode,
        )


@dataclass(frozen=True)
class Manifest:
    """A loaded, validated suite; `sha256` is the hash of the manifest file's bytes, for records."""

    name: str
    version: int
    model: str
    description: str
    calibration: tuple[Case, ...]
    test: tuple[Case, ...]
    path: Path
    sha256: str

    def check_model(self, model: str, allow_other_model: bool = False) -> None:
        """Refuse (ValueError) to run this suite against `model` unless it is the suite's model: the same
        name, or a local folder with the same last path component (`/models/Wan2.1-T2V-1.3B-Diffusers` for
        `Wan-AI/Wan2.1-T2V-1.3B-Diffusers`). `allow_other_model=True` lets a caller compare on purpose."""
        if allow_other_model or _same_model(str(model), self.model):
            return
        raise ValueError(
            f"model: suite {self.path} is pinned to {self.model!r}, got {str(model)!r}; "
            "pass allow_other_model=True (CLI: --allow-other-model) to run it against another model"
        )


def load_manifest(path: str | Path, model: str | None = None, allow_other_model: bool = False) -> Manifest:
    """Read and validate a manifest, and verify every referenced file's size and SHA-256.

    A missing or unreadable file, or one that is not JSON, is a ValueError naming it (and the line of a
    JSON error); a bad or unknown field, or a value `workbench.Request` refuses, is a ValueError naming it (e.g.
    `test[1].seed`); a missing, absolute, escaping or changed reference file is a ValueError naming its path; so
    is a seed used by both calibration and test cases. With `model` (the name or folder the suite is about to run
    against), a suite pinned to another model is a ValueError unless `allow_other_model` (see
    `Manifest.check_model`).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"suite: cannot read {path} ({error.strerror or error})") from error
    try:
        raw = json.loads(data, object_pairs_hook=unique_keys)
    except UnicodeDecodeError as error:
        raise ValueError(f"suite: {path} is not UTF-8 text ({error.reason})") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"suite: {path}: {error.msg} at line {error.lineno} column {error.colno}") from error
    except RecursionError:  # its own words name no file
        raise ValueError(f"suite: {path} is not valid JSON (nested too deeply)") from None
    except RepeatedKey as error:
        raise ValueError(f"suite: {path}: {error}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"suite: {path} must hold a JSON object, got {type(raw).__name__}")
    _check_keys("manifest", raw, _TOP, required=_TOP - {"description"})
    for name in ("name", "model"):
        _check_str(name, raw[name])
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"description: must be a string, got {description!r}")
    _check_int("version", raw["version"], minimum=1)
    splits = {}
    for split in ("calibration", "test"):
        cases = raw[split]
        if not isinstance(cases, list) or (split == "test" and not cases):
            raise ValueError(f"{split}: must be a list of cases{' (at least one)' if split == 'test' else ''}")
        splits[split] = tuple(_case(f"{split}[{i}]", case, path.parent) for i, case in enumerate(cases))
    shared = sorted({c.seed for c in splits["calibration"]} & {c.seed for c in splits["test"]})
    if shared:
        raise ValueError(f"seed: calibration and test cases share seed(s) {shared}; keep calibration seeds apart")
    manifest = Manifest(
        name=raw["name"],
        version=raw["version"],
        model=raw["model"],
        description=description,
        calibration=splits["calibration"],
        test=splits["test"],
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
    )
    if model is not None:
        manifest.check_model(model, allow_other_model)
    return manifest


def _case(where: str, raw: Any, folder: Path) -> Case:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be an object, got {type(raw).__name__}")
    _check_keys(where, raw, _CASE, required=_CASE - {"reference"})
    _check_str(f"{where}.prompt", raw["prompt"])
    _check_str(f"{where}.mode", raw["mode"])
    for name, minimum in _CASE_INTS.items():
        _check_int(f"{where}.{name}", raw[name], minimum)
    reference = None
    if "reference" in raw:
        reference = _reference(f"{where}.reference", raw["reference"], folder)
    case = Case(**{k: v for k, v in raw.items() if k != "reference"}, reference=reference)
    try:
        case.to_request()  # what a Request refuses (frames past MAX_FRAMES, a seed past int64, a lone surrogate)
    except ValueError as error:  # its message starts with the field: `test[1].frames: 100000 is out of range`
        raise ValueError(f"{where}.{error}") from None
    return case


def _reference(where: str, raw: Any, folder: Path) -> Reference:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be an object, got {type(raw).__name__}")
    _check_keys(where, raw, _REFERENCE, required=_REFERENCE)
    _check_str(f"{where}.path", raw["path"])
    _check_int(f"{where}.size", raw["size"], minimum=0)
    if not isinstance(raw["sha256"], str) or not _SHA256.fullmatch(raw["sha256"]):
        raise ValueError(f"{where}.sha256: must be 64 lowercase hex digits, got {raw['sha256']!r}")
    if Path(raw["path"]).is_absolute():
        raise ValueError(f"{where}.path: must be relative to the manifest's folder, got {raw['path']!r}")
    file = folder / raw["path"]
    if not file.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"{where}.path: {raw['path']!r} resolves outside the manifest's folder {folder}")
    if not file.is_file():
        raise ValueError(f"{where}.path: reference file {file} is missing")
    size = file.stat().st_size
    if size != raw["size"]:
        raise ValueError(f"{where}: reference file {file} has {size} bytes, the manifest pins {raw['size']}")
    digest = _sha256_file(file)
    if digest != raw["sha256"]:
        raise ValueError(f"{where}: reference file {file} has SHA-256 {digest}, the manifest pins {raw['sha256']}")
    return Reference(path=file, size=size, sha256=digest)


def _same_model(model: str, pinned: str) -> bool:
    return model == pinned or PurePosixPath(model.rstrip("/")).name == PurePosixPath(pinned.rstrip("/")).name


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_keys(where: str, raw: dict[str, Any], allowed: set[str], required: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(required - set(raw))
    if missing:
        raise ValueError(f"{where}.{missing[0]}: missing (required: {sorted(required)})")


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: must be a non-empty string, got {value!r}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
