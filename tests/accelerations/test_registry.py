"""The registry's shape: one list of plugin modules, grouped by kind, each with a typed options dataclass, none
importing another plugin (shared pieces are public helpers of their kind)."""

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest
import torch

import workbench.accelerations as accelerations
from workbench import Request, Session
from workbench.accelerations import PLUGINS, REGISTRY, available, fingerprint

ROOT = Path(accelerations.__file__).parent
KINDS = ("attention", "caching", "fused", "quantization", "memory", "parallel", "compile")


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from workbench.accelerations... import name` in a file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench.accelerations"):
            found += [(node.module, alias.name) for alias in node.names]
    return found


def test_registry_is_the_one_list_of_plugin_modules_grouped_by_kind():
    assert all(module.split(".")[0] in KINDS for module in PLUGINS)
    registering = {
        f"{path.parent.name}.{path.stem}" for path in ROOT.glob("*/*.py") if "\nSPECS = " in path.read_text()
    }
    assert registering == set(PLUGINS)
    names = [spec.name for spec in REGISTRY.values()]
    assert len(names) == len(set(names)) and list(REGISTRY) == names
    for module in PLUGINS:  # each plugin's kind is the subpackage it lives in
        for spec in importlib.import_module(f"workbench.accelerations.{module}").SPECS:
            assert REGISTRY[spec.name].kind == module.split(".")[0]


def test_no_plugin_imports_another_plugin_or_a_private_name():
    plugins = {f"workbench.accelerations.{module}" for module in PLUGINS}
    for path in sorted(ROOT.glob("*/*.py")):
        for module, name in _imports(path):
            where = f"{path.relative_to(ROOT)}: from {module} import {name}"
            assert module not in plugins, where
            assert f"{module}.{name}" not in plugins, where
            assert not name.startswith("_"), where


DEFAULTS_CHOOSE_NOTHING = {"mag_cache", "selective_fp8"}  # mag_ratios or calibrate=True; include globs or groups


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_plugin_options_come_from_a_frozen_config_dataclass(name):
    spec = REGISTRY[name]
    assert dataclasses.is_dataclass(spec.config) and spec.config.__dataclass_params__.frozen, name
    assert [f.name for f in dataclasses.fields(spec.config)] == [o.name for o in spec.options]
    for field, declared in zip(dataclasses.fields(spec.config), spec.options, strict=True):
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        assert default == declared.default, (name, field.name)
    if name in DEFAULTS_CHOOSE_NOTHING:  # a joint rule asks for a choice no default makes: refused the same way
        with pytest.raises(ValueError) as refused:
            spec.validate({})
        for given in (spec.config(), None):
            with pytest.raises(ValueError, match=re.escape(str(refused.value))):
                spec.validate(given)
    elif not any(o.required for o in spec.options):
        assert spec.validate(spec.config()) == spec.validate({}) == spec.validate(None)
        assert isinstance(spec.parse({}), spec.config)


def test_config_instance_validates_like_the_dict_of_its_fields():
    spec = REGISTRY["easycache"]
    config = spec.config(threshold=1, warmup=3)
    assert spec.validate(config) == spec.validate({"threshold": 1, "warmup": 3})
    assert spec.validate(config) == {"threshold": 1.0, "warmup": 3, "final_dense": 1, "per_expert": True}  # defaults
    assert spec.parse({"threshold": 0.5}) == spec.config(threshold=0.5)
    with pytest.raises(ValueError, match=r"easycache.warmup: -1 is below the minimum 0"):
        spec.validate(spec.config(threshold=0.1, warmup=-1))
    with pytest.raises(ValueError, match=r"easycache.threshold: required"):
        spec.validate(spec.config())
    with pytest.raises(ValueError, match=r"easycache: options must be a dict or EasyCacheConfig, got TeaCacheConfig"):
        spec.validate(REGISTRY["teacache"].config(rel_l1_thresh=0.1))
    sparse = REGISTRY["sol_attn"].config(sink_tokens=8)
    assert REGISTRY["sol_attn"].validate(sparse)["tau"] == 1.0 and REGISTRY["block_sparse"].config().tau == 0.0
    with pytest.raises(ValueError, match=r"sol_attn.sink_tokens: -1; allowed: an int >= 0 or 'family'"):
        REGISTRY["sol_attn"].validate(REGISTRY["sol_attn"].config(sink_tokens=-1))


def test_session_accelerate_takes_config_objects(seed):
    session = Session.open("tiny-wan", device="cpu")
    before = fingerprint(session.model.pipeline.transformer)
    request = Request("a red circle", seed=seed, steps=3)
    dense = session.generate(request, progress=False)
    session.accelerate({"easycache": available()["easycache"].config(threshold=0.0)})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    options = {"threshold": 0.0, "warmup": 2, "final_dense": 1, "per_expert": True}
    assert result.receipts["easycache"]["options"] == options
    assert torch.equal(result.latents, dense.latents), f"seed {request.seed}"
    assert fingerprint(session.model.pipeline.transformer) == before
