import pytest
import torch

from workbench import Request, Session
from workbench.accelerations import CONTRACTS, available, fingerprint


@pytest.fixture
def wan_session():
    return Session.open("tiny-wan", device="cpu")


def test_registry_lists_specs_with_contracts_and_options():
    specs = available()
    assert {"attention_backend", "fused_qkv", "cross_kv_cache", "easycache", "first_block_cache"} <= set(specs)
    for name, spec in specs.items():
        assert spec.contract in CONTRACTS, name
        assert spec.describe()["contract"] == spec.contract


@pytest.mark.parametrize(
    "config, message",
    [
        ({"nope": {}}, r"accelerations: unknown \['nope'\]; available"),
        ({"easycache": {"treshold": 0.1}}, r"easycache: unknown option\(s\) \['treshold'\]"),
        ({"easycache": {}}, r"easycache.threshold: required"),
        ({"easycache": {"threshold": "high"}}, r"easycache.threshold: expected float, got str"),
        ({"easycache": {"threshold": -0.1}}, r"easycache.threshold: -0.1 is below the minimum 0.0"),
        ({"easycache": {"threshold": 0.1, "warmup": 1.5}}, r"easycache.warmup: expected int"),
        ({"attention_backend": {"backend": "warp"}}, r"attention_backend.backend: 'warp' is not allowed; allowed"),
        ({"easycache": "fast"}, r"easycache: options must be a dict"),
    ],
)
def test_bad_option_raises_value_error_naming_it(wan_session, config, message):
    before = fingerprint(wan_session.model.pipeline.transformer)
    with pytest.raises(ValueError, match=message):
        wan_session.accelerate(config)
    assert fingerprint(wan_session.model.pipeline.transformer) == before


def test_bad_option_is_value_error_even_when_machine_cannot_run_plugin(wan_session):
    # cudnn cannot run on CPU, but a bad option is reported first, as a ValueError
    with pytest.raises(ValueError, match="attention_backend: unknown option"):
        wan_session.accelerate({"attention_backend": {"backend": "cudnn", "speed": 2}})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_valid_option_this_machine_cannot_run_is_runtime_error(wan_session):
    with pytest.raises(RuntimeError, match=r"attention_backend.backend='cudnn' needs CUDA"):
        wan_session.accelerate({"attention_backend": {"backend": "cudnn"}})


def test_two_feature_caches_conflict_before_any_change(wan_session):
    transformer = wan_session.model.pipeline.transformer
    before = fingerprint(transformer)
    with pytest.raises(ValueError, match=r"'easycache' and 'first_block_cache' are both feature_cache plugins"):
        wan_session.accelerate({"easycache": {"threshold": 0.1}, "first_block_cache": {}})
    assert fingerprint(transformer) == before


def test_projection_plugins_conflict(wan_session):
    with pytest.raises(ValueError, match=r"both modify attention.projections"):
        wan_session.accelerate({"fused_qkv": {}, "cross_kv_cache": {}})


def test_failure_in_a_later_plugin_rolls_back_the_whole_set(wan_session, monkeypatch):
    transformer = wan_session.model.pipeline.transformer
    wan_session.accelerate({"cross_kv_cache": {}})
    installed = fingerprint(transformer)

    def explode(self, config):
        raise RuntimeError("hook registry exploded")

    monkeypatch.setattr(type(transformer), "enable_cache", explode)
    with pytest.raises(RuntimeError, match="hook registry exploded"):
        wan_session.accelerate({"attention_backend": {"backend": "_native_math"}, "pyramid_attention_broadcast": {}})
    # the previous set is back, exactly, and still works
    assert wan_session.accelerations == {"cross_kv_cache": {}}
    assert fingerprint(transformer) == installed
    result = wan_session.generate(Request("p"), progress=False)
    assert result.receipts["cross_kv_cache"]["hits"] > 0


def test_install_during_request_is_refused(wan_session):
    refused = []

    def try_install(event):
        if event.kind == "step" and not refused:
            with pytest.raises(RuntimeError, match="accelerate: refused while request"):
                wan_session.accelerate({"cross_kv_cache": {}})
            refused.append(True)

    wan_session.subscribe(try_install)
    wan_session.generate(Request("p"), progress=False)
    assert refused and wan_session.accelerations == {}


def test_installed_plugin_that_did_not_execute_has_zero_receipt(wan_session):
    wan_session.accelerate({"easycache": {"threshold": 0.0}})
    result = wan_session.generate(Request("p", steps=4), progress=False)
    receipt = result.receipts["easycache"]
    assert receipt["executed"] is False and receipt.get("reused", 0) == 0 and receipt["computed"] == 8
    assert result.exact is True


def test_open_with_accelerations_installs_them():
    session = Session.open("tiny-wan", device="cpu", accelerations={"cross_kv_cache": {}})
    assert session.accelerations == {"cross_kv_cache": {}}
    assert session.generate(Request("p"), progress=False).receipts["cross_kv_cache"]["executed"]
