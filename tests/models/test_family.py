"""What plugins ask of a family lives in the family: a new family reaches every plugin without a plugin edit."""

import ast
import dataclasses
from pathlib import Path

import pytest

import workbench.accelerations as accelerations
import workbench.models as models
from workbench.accelerations import available
from workbench.models import families, wan
from workbench.models.family import COMPONENT_NAME

ASKING = ("cross_kv_cache", "teacache", "fused_block_ops", "fused_block_norms", "block_sparse", "sol_attn")


def test_plugins_hold_no_family_names_or_block_classes():
    """No string in a plugin's code (docstrings aside) is a family name or a family's block class."""
    registered = families()
    knowledge = set(registered) | {name for family in registered.values() for name in family.block_classes}
    for path in sorted(Path(accelerations.__file__).parent.glob("*/*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                assert node.value not in knowledge, f"{path.name}:{node.lineno}: {node.value!r}"


def test_a_new_family_reaches_the_plugins_through_the_family_object(monkeypatch):
    twin = dataclasses.replace(wan.FAMILY, name="wan-twin")
    registered = families()
    monkeypatch.setattr(models, "families", lambda: {**registered, twin.name: twin})
    for name, spec in available().items():
        assert spec.families is None or ("wan" in spec.families) == ("wan-twin" in spec.families), name
        assert spec.refusal(twin) == spec.refusal(wan.FAMILY), name


def test_a_family_without_what_a_plugin_needs_is_refused_with_the_reason():
    bare = dataclasses.replace(
        wan.FAMILY, name="bare", text_cross_attention=(), teacache=None, fused=None, self_attention=None
    )
    specs = available()
    for plugin in ASKING:
        assert specs[plugin].refusal(bare), plugin
    assert specs["easycache"].refusal(bare) is None  # streams default to the video stream
    refusing = dataclasses.replace(wan.FAMILY, name="refusing", unsupported={"easycache": "a reason stated here"})
    assert specs["easycache"].refusal(refusing) == "a reason stated here"


@pytest.mark.parametrize("name", ["wan", "ltx2", "h3"])
def test_family_tables_are_consistent(name):
    family = families()[name]
    assert family.streams[0] == "hidden_states" and family.block_streams[0] == ("hidden_states", 0)
    if family.teacache is not None:
        assert all(len(c) >= 2 for c in family.teacache.coefficients.values())
    registered = set(available())
    assert set(family.unsupported) <= registered, "unsupported names an unregistered plugin"
    assert {plugin for plugin, _ in family.exact_fast} <= registered
    # the loader's table: plain component names, each allowed (library, class name) mapped to a class object
    assert family.components and all(COMPONENT_NAME.fullmatch(name) for name in family.components)
    for allowed in family.components.values():
        assert allowed and all(isinstance(cls, type) and isinstance(lib, str) for (lib, _), cls in allowed.items())
