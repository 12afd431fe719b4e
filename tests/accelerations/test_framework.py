import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import Request, Session
from workbench.accelerations import CONTRACTS, Option, available, fingerprint
from workbench.accelerations.base import option


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


@pytest.mark.parametrize(
    ("config", "resource"),
    [
        ({"fused_qkv": {}, "cross_kv_cache": {}}, "attention.projections"),
        # the epilogue reads the up-projection's weight itself: selective_fp8's FP8 forward on it would never run
        ({"gelu_epilogue": {}, "selective_fp8": {"groups": 1}}, "linear.weights"),
    ],
)
def test_plugins_that_modify_one_resource_conflict(wan_session, config, resource):
    with pytest.raises(ValueError, match=rf"both modify {resource}"):
        wan_session.accelerate(config)


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


# --- option values: type, finiteness and size (issue 20) -----------------------------------------------------------


def _numeric_options() -> list[tuple[str, Option]]:
    """(plugin, option) for every registered option that takes an int or a float."""
    found = []
    for name, spec in sorted(available().items()):
        for opt in spec.options:
            kinds = opt.kind if isinstance(opt.kind, tuple) else (opt.kind,)
            if int in kinds or float in kinds:
                found.append((name, opt))
    return found


NUMERIC_OPTIONS = _numeric_options()
HOSTILE_NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([2**63, -(2**63) - 1, 10**400, -(10**400), 0, -1, 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e-300]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(np.int64),
    st.integers(min_value=0, max_value=2**64 - 1).map(np.uint64),
    st.floats(width=32, allow_nan=True).map(np.float32),
    st.floats(allow_nan=True).map(np.float64),
    st.booleans(),
    st.booleans().map(np.bool_),
    st.sampled_from(["1", "family", "", None, [1], {"a": 1}]),
)


def test_registry_has_numeric_options_to_check():
    plugins = {plugin for plugin, _ in NUMERIC_OPTIONS}
    assert {"easycache", "first_block_cache", "mag_cache"} <= plugins


@settings(max_examples=100, deadline=None)
@given(choice=st.sampled_from(NUMERIC_OPTIONS), value=HOSTILE_NUMBERS)
def test_every_numeric_option_accepts_plain_json_or_refuses_naming_itself(choice, value):
    plugin, opt = choice
    try:
        checked = opt.check(plugin, value)
    except ValueError as error:
        assert str(error).startswith(f"{plugin}.{opt.name}: "), str(error)
        return
    assert not isinstance(checked, np.generic), (plugin, opt.name, value)
    if isinstance(checked, float) and not opt.allow_inf:
        assert math.isfinite(checked)
    if isinstance(checked, int | float) and not isinstance(checked, bool):
        assert opt.minimum is None or checked >= opt.minimum
        assert opt.maximum is None or checked <= opt.maximum
    json.dumps(checked, allow_nan=opt.allow_inf)


@pytest.mark.parametrize(
    "plugin, name",
    [("easycache", "threshold"), ("first_block_cache", "threshold"), ("mag_cache", "retention_ratio")],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), np.float32("nan")])
def test_non_finite_float_option_raises_naming_it(plugin, name, bad):
    spec = available()[plugin]
    required = {o.name: 0.1 for o in spec.options if o.required}
    with pytest.raises(ValueError, match=rf"^{plugin}.{name}: -?(nan|inf) is not allowed; allowed: finite numbers"):
        spec.validate({**required, name: bad})


def test_numpy_option_values_become_python_numbers():
    spec = available()["easycache"]
    options = spec.validate({"threshold": np.float32(0.25), "warmup": np.int64(1)})
    assert (type(options["threshold"]), type(options["warmup"])) == (float, int)
    json.dumps(options, allow_nan=False)


def test_option_declared_allow_inf_takes_inf_never_nan():
    declared = Option("limit", float, math.inf, minimum=0.0, allow_inf=True)
    assert declared.check("plugin", math.inf) == math.inf
    with pytest.raises(
        ValueError,
        match=r"^plugin.limit: nan is not allowed; allowed: numbers \(inf allowed, NaN not\) in \[0.0, inf\]",
    ):
        declared.check("plugin", math.nan)


def test_int_option_without_range_is_bounded_to_int64():
    unbounded = Option("count", int, 0)
    assert unbounded.check("plugin", 2**63 - 1) == 2**63 - 1
    with pytest.raises(
        ValueError, match=r"^plugin.count: 9223372036854775808 is above the maximum .* integers in \[-9"
    ):
        unbounded.check("plugin", 2**63)


@pytest.mark.parametrize("bounds", [{"minimum": math.nan}, {"maximum": math.inf}, {"minimum": 2, "maximum": 1}])
def test_option_declaration_with_bad_bounds_is_a_type_error(bounds):
    with pytest.raises(TypeError, match=r"^option\(\): "):
        option(0.0, **bounds)


def test_options_dataclass_with_a_default_its_check_refuses_is_a_type_error():
    from dataclasses import dataclass

    from workbench.accelerations.base import options_of

    @dataclass(frozen=True)
    class BadConfig:
        ratio: float = option(math.nan, minimum=0.0)

    with pytest.raises(TypeError, match=r"^BadConfig.ratio: the default fails its own check \(BadConfig.ratio: nan"):
        options_of(BadConfig)


@pytest.mark.parametrize(
    "config, message",
    [
        ({1: {}, "easycache": {}}, r"^accelerations: key 1 \(int\); allowed: plugin names"),
        ({"easycache": 5}, r"^easycache: options must be a dict or EasyCacheConfig, got int"),
        ({"easycache": {3: 1, "threshold": 0.1}}, r"^easycache: unknown option\(s\) \[3\]"),
        (["easycache"], r"^accelerations: expected a dict"),
    ],
)
def test_malformed_config_raises_naming_the_key(wan_session, config, message):
    with pytest.raises(ValueError, match=message):
        wan_session.accelerate(config)
