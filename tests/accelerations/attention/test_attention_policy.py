"""attention_policy (auto): dense unless a qualified sparse setting exists for exactly this family, device, model
and size; both branches, the evidence check on registry entries, and the committed registry itself.
"""

import json

import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import REGISTRY, fingerprint
from workbench.accelerations.attention import attention_policy
from workbench.models import wan

SIZE = {"frames": 9, "height": 128, "width": 192, "steps": 2, "guidance": 1.0}  # 3 x 8 x 12 = 288 video rows
OTHER_SIZE = {**SIZE, "height": 64, "width": 64}  # 3 x 4 x 4 = 48 video rows


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def session():
    return Session(wan.tiny_d128(), torch.device("cpu"), torch.float32, 0.0)


def _run(session, config, seed: int, size=SIZE):
    session.accelerate(config)
    try:
        return session.generate(Request("a red circle moves left", seed=seed, **size), progress=False)
    finally:
        session.accelerate({})


def test_attention_policy_auto_without_qualified_sparse_setting_is_stock(session, qualified_registry, seed):
    """The committed registry, and one whose only entry is for another device: dense, bitwise stock, exact."""
    stock = _run(session, {}, seed)
    for registry in ("", qualified_registry(session, device="NVIDIA H200")):
        result = _run(session, {"attention_policy": {"registry": registry}}, seed)
        report = result.receipts["attention_policy"]
        assert report["policy"] == "dense" and report["contract"] == "bitwise" and report["executed"], report
        assert result.exact and torch.equal(result.latents, stock.latents)


def test_attention_policy_auto_runs_the_qualified_sparse_setting_only_at_its_size(
    interpreter, session, qualified_registry, seed
):
    before = fingerprint(session.model.pipeline.transformer)
    registry = qualified_registry(session)
    sparse = _run(session, {"attention_policy": {"registry": registry}}, seed)
    report = sparse.receipts["attention_policy"]
    assert report["policy"] == "block_sparse" and report["contract"] == "approximate", report
    assert report["sparse_calls"] == 4 and report.get("dense_calls", 0) == 0, report
    assert report["entries"][0]["video_tokens"] == 288 and report["notes"]["mean_density"] < 1.0, report
    assert not sparse.exact
    # another size on the same model and device: every call dense, output bitwise stock
    stock_other = _run(session, {}, seed, OTHER_SIZE)
    other = _run(session, {"attention_policy": {"registry": registry}}, seed, OTHER_SIZE)
    report = other.receipts["attention_policy"]
    assert report["policy"] == "dense" and report["unqualified_calls"] == 4 and report["contract"] == "bitwise"
    assert other.exact and torch.equal(other.latents, stock_other.latents)
    assert fingerprint(session.model.pipeline.transformer) == before


def test_attention_policy_sparse_entry_without_qualified_evidence_is_refused(session, qualified_registry, tmp_path):
    cases = [
        (qualified_registry(session, verdict="no_speed_claim"), "verdict 'no_speed_claim'"),
        (qualified_registry(session, candidate={"block_sparse": {"tau": 0.5}}), "candidate"),
    ]
    data = json.loads(open(qualified_registry(session)).read())
    data["entries"][0]["evidence"] = str(tmp_path / "missing.json")
    (tmp_path / "gone.json").write_text(json.dumps(data))
    cases.append((str(tmp_path / "gone.json"), "not a readable record"))
    data["entries"][0]["plugin"] = "easycache"
    (tmp_path / "plugin.json").write_text(json.dumps(data))
    cases.append((str(tmp_path / "plugin.json"), "plugin 'easycache'"))
    for registry, match in cases:
        with pytest.raises(ValueError, match=match):
            session.accelerate({"attention_policy": {"registry": registry}})
        assert session.accelerations == {}


def test_attention_policy_sparse_committed_registry_is_backed_by_qualified_records():
    """Every committed entry names a qualification record with verdict `qualified` for exactly its plugin,
    options and device (load_registry raises otherwise)."""
    committed = json.loads(attention_policy.REGISTRY_FILE.read_text())["entries"]
    entries = attention_policy.load_registry(attention_policy.REGISTRY_FILE)
    assert len(entries) == len(committed)  # none dropped (an empty registry is the committed state: dense everywhere)
    for entry in entries:
        assert entry["plugin"] in attention_policy.ROUTABLE


def test_attention_policy_explicit_dense_and_bad_options_of_the_sparse_policy(session, tmp_path, seed):
    result = _run(session, {"attention_policy": {"policy": "dense"}}, seed)
    assert result.receipts["attention_policy"]["policy"] == "dense" and result.exact
    with pytest.raises(ValueError, match="attention_policy.policy"):
        session.accelerate({"attention_policy": {"policy": "sparse"}})
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    for registry in ("/nonexistent/registry.json", "/dev/zero", "a\x00b", str(tmp_path / "deep.json")):
        with pytest.raises(ValueError, match=r"^attention_policy.registry: .* is not a readable JSON file"):
            session.accelerate({"attention_policy": {"registry": registry}})
    with pytest.raises(ValueError, match="cannot be installed together"):
        session.accelerate({"attention_policy": {}, "block_sparse": {}})
    assert REGISTRY["attention_policy"].contract == "approximate"
