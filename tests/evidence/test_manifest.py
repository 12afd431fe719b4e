import hashlib
import json
import re
from pathlib import Path

import pytest

from workbench.evidence.manifest import load_manifest

SHIPPED = Path(__file__).resolve().parents[2] / "data_manifests"


def _case(seed, **extra):
    return {"prompt": "a red circle moves left", "seed": seed, "frames": 9, "height": 64, "width": 64, "steps": 2,
            "mode": "t2v", **extra}  # fmt: skip


def _write(folder, calibration=None, test=None, **top):
    raw = {
        "name": "unit",
        "version": 1,
        "model": "tiny-wan",
        "calibration": [_case(11), _case(12)] if calibration is None else calibration,
        "test": [_case(42), _case(43)] if test is None else test,
        **top,
    }
    path = folder / "suite.json"
    path.write_text(json.dumps(raw))
    return path


def _pinned(folder, rng, name="ref_42.bin", size=4096):
    reference = folder / "refs" / name
    reference.parent.mkdir(exist_ok=True)
    reference.write_bytes(rng.bytes(size))
    data = reference.read_bytes()
    return reference, {"path": f"refs/{name}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize(
    ("name", "frames", "height", "width", "steps", "mode"),
    [
        ("tiny-smoke", 9, 64, 64, 2, "t2v"),
        ("demo-av-smoke", 49, 128, 128, 8, "t2va"),
        ("demo-av-calibrate", 49, 128, 128, 16, "t2va"),
        ("demo-av-mini-smoke", 9, 64, 64, 8, "t2va"),
        ("wan-1.3b-480p", 81, 480, 832, 16, "t2v"),
    ],
)
def test_shipped_manifests_load_with_apart_seeds(name, frames, height, width, steps, mode):
    manifest = load_manifest(SHIPPED / f"{name}.json")
    assert manifest.name == name
    assert [c.seed for c in manifest.calibration] == [11, 12] and [c.seed for c in manifest.test] == [42, 43]
    for case in manifest.calibration + manifest.test:
        assert (case.frames, case.height, case.width, case.steps, case.mode) == (frames, height, width, steps, mode)
        request = case.to_request()
        assert (request.prompt, request.seed, request.frames) == (case.prompt, case.seed, frames)
    assert manifest.sha256 == hashlib.sha256((SHIPPED / f"{name}.json").read_bytes()).hexdigest()


def test_manifest_verifies_references_and_refuses_an_edited_file(tmp_path, rng):
    reference, pin = _pinned(tmp_path, rng)
    path = _write(tmp_path, test=[_case(42, reference=pin), _case(43)])
    manifest = load_manifest(path)
    assert manifest.test[0].reference.path == tmp_path / "refs" / "ref_42.bin"
    assert manifest.test[0].reference.sha256 == pin["sha256"] and manifest.test[1].reference is None
    edited = bytearray(reference.read_bytes())
    edited[1234] ^= 0xFF  # same size, one byte changed
    reference.write_bytes(bytes(edited))
    with pytest.raises(
        ValueError, match=rf"test\[0\].reference: reference file {re.escape(str(reference))} has SHA-256"
    ):
        load_manifest(path)
    reference.write_bytes(bytes(edited[:-1]))
    with pytest.raises(ValueError, match=rf"{re.escape(str(reference))} has 4095 bytes, the manifest pins 4096"):
        load_manifest(path)
    reference.unlink()
    with pytest.raises(
        ValueError, match=rf"test\[0\].reference.path: reference file {re.escape(str(reference))} is missing"
    ):
        load_manifest(path)


def test_manifest_refuses_absolute_reference_paths(tmp_path, rng):
    reference, pin = _pinned(tmp_path, rng)
    path = _write(tmp_path, test=[_case(42, reference={**pin, "path": str(reference)})])
    with pytest.raises(ValueError, match=r"test\[0\].reference.path: must be relative"):
        load_manifest(path)


def test_manifest_refuses_overlapping_calibration_and_test_seeds(tmp_path):
    path = _write(tmp_path, calibration=[_case(11), _case(42)])
    with pytest.raises(ValueError, match=r"seed: calibration and test cases share seed\(s\) \[42\]"):
        load_manifest(path)


@pytest.mark.parametrize(
    ("top", "test", "field"),
    [
        ({"version": 0}, None, "version"),
        ({"model": ""}, None, "model"),
        ({"owner": "me"}, None, r"manifest: unknown field\(s\) \['owner'\]"),
        ({}, [], "test"),
        ({}, [_case(42, frames="9")], r"test\[0\].frames"),
        ({}, [_case(-1)], r"test\[0\].seed"),
        ({}, [_case(42, prompt=" ")], r"test\[0\].prompt"),
        # what a Request refuses is said under the case, not as a bare field the command line has no flag for
        ({}, [_case(42), _case(43, frames=100_000)], r"test\[1\].frames: 100000 is out of range; allowed"),
        ({}, [_case(2**63)], r"test\[0\].seed: 9223372036854775808 is out of range; allowed"),
        ({}, [_case(42, prompt="a \ud800")], r"test\[0\].prompt: holds a lone surrogate"),
        ({}, [_case(42, guidance=5.0)], r"test\[0\]: unknown field\(s\) \['guidance'\]"),
        ({}, [_case(42, reference={"path": "x", "size": 1, "sha256": "ABC"})], r"test\[0\].reference.sha256"),
    ],
)
def test_manifest_bad_field_raises_naming_it(tmp_path, top, test, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        load_manifest(_write(tmp_path, test=test, **top))


def test_manifest_refuses_a_key_given_twice_in_one_object(tmp_path):
    """JSON alone keeps the last of a repeated key: a suite someone edited by hand would run another seed unsaid."""
    path = _write(tmp_path, test=[_case(42)])
    path.write_text(path.read_text().replace('"seed": 42', '"seed": 42, "seed": 43'))
    with pytest.raises(ValueError, match=r"^suite: .*: 'seed' is given twice in one object"):
        load_manifest(path)


def test_manifest_missing_field_raises_naming_it(tmp_path):
    case = _case(42)
    del case["steps"]
    with pytest.raises(ValueError, match=r"^test\[0\].steps: missing"):
        load_manifest(_write(tmp_path, test=[case]))


def test_manifest_refuses_reference_paths_that_escape_the_suite_folder(tmp_path, rng):
    suite = tmp_path / "suite"
    suite.mkdir()
    outside, pin = _pinned(tmp_path, rng, name="secret.bin")  # tmp_path/refs/secret.bin, beside the suite
    path = _write(suite, test=[_case(42, reference={**pin, "path": "../refs/secret.bin"})])
    with pytest.raises(ValueError, match=r"test\[0\].reference.path: '../refs/secret.bin' resolves outside"):
        load_manifest(path)
    (suite / "refs").mkdir()
    (suite / "refs" / "link.bin").symlink_to(outside)  # a symlink inside the folder pointing out of it
    path = _write(suite, test=[_case(42, reference={**pin, "path": "refs/link.bin"})])
    with pytest.raises(ValueError, match=r"test\[0\].reference.path: 'refs/link.bin' resolves outside"):
        load_manifest(path)


def test_manifest_missing_or_torn_file_names_it(tmp_path):
    missing = tmp_path / "nowhere.json"
    with pytest.raises(ValueError, match=rf"suite: cannot read {re.escape(str(missing))} \(No such file"):
        load_manifest(missing)
    path = _write(tmp_path)
    path.write_text(path.read_text() + "\n}")
    with pytest.raises(ValueError, match=rf"suite: {re.escape(str(path))}: Extra data at line 2 column 1"):
        load_manifest(path)


def test_manifest_pinned_model_refuses_another_unless_allowed(tmp_path):
    path = _write(tmp_path)  # pinned to tiny-wan
    assert load_manifest(path, model="tiny-wan").model == "tiny-wan"
    assert load_manifest(path, model="/models/tiny-wan/").model == "tiny-wan"  # a local folder of that model
    with pytest.raises(ValueError, match=r"model: suite .* is pinned to 'tiny-wan', got 'tiny-ltx2'.*allow_other"):
        load_manifest(path, model="tiny-ltx2")
    assert load_manifest(path, model="tiny-ltx2", allow_other_model=True).model == "tiny-wan"
    manifest = load_manifest(path)
    with pytest.raises(ValueError, match="--allow-other-model"):
        manifest.check_model("tiny-wan22")
    manifest.check_model("tiny-wan22", allow_other_model=True)
