import dataclasses
import html

import ipywidgets
import pytest

from workbench.accelerations import REGISTRY, available
from workbench.profiles import PROFILES, profile_plan
from workbench.widgets import AccelerationPanel
from workbench.widgets import panel as panel_module
from workbench.widgets.panel import CONTRACT_COLORS, GROUPS, plugin_kind


@pytest.fixture
def wan(sessions):
    """The shared tiny-wan session, handed back with nothing installed whatever the test did."""
    session = sessions("tiny-wan")
    session.accelerate({})
    yield session
    session.accelerate({})


def shown(widget) -> bool:
    return widget.layout.display != "none"


def test_panel_has_one_row_per_registered_plugin(wan):
    panel = AccelerationPanel(wan)
    specs = available()
    assert list(panel.rows) == list(specs)
    for name, row in panel.rows.items():
        spec = specs[name]
        assert row.enabled.description == name
        assert spec.contract in row.badge.value and CONTRACT_COLORS[spec.contract] in row.badge.value
        assert list(row.inputs) == [option.name for option in spec.options]


def test_panel_groups_plugins_by_kind_in_two_columns(wan):
    panel = AccelerationPanel(wan)
    grouped = [name for names in panel.groups.values() for name in names]
    assert sorted(grouped) == sorted(panel.rows)  # every plugin in exactly one group
    assert {"block_sparse", "sol_attn", "attention_backend"} <= set(panel.groups["attention"])
    assert {"easycache", "teacache", "cross_kv_cache"} <= set(panel.groups["caching"])
    assert "selective_fp8" in panel.groups["quantization"] and "group_offload" in panel.groups["memory"]
    assert "context_parallel" in panel.groups["parallel"] and "regional_compile" in panel.groups["compile"]
    assert "other" not in panel.groups  # every registered plugin has a known kind
    assert list(panel.groups) == [kind for kind in GROUPS if kind in panel.groups]  # display order
    columns = panel.columns.children
    assert len(columns) == 2
    rows_in = [sum(len(section.children) for section in column.children) for column in columns]
    assert abs(rows_in[0] - rows_in[1]) <= max(len(names) for names in panel.groups.values()) + 1
    shown_rows = [child for column in columns for section in column.children for child in section.children[1:]]
    assert shown_rows == [panel.rows[name] for names in panel.groups.values() for name in names]


def test_panel_shows_a_plugin_of_an_unknown_kind_under_other(monkeypatch):
    specs = available()
    newcomer = dataclasses.replace(specs["cross_kv_cache"], name="brand_new_cache", kind="")
    monkeypatch.setattr(panel_module, "available", lambda: {**specs, "brand_new_cache": newcomer})
    panel = AccelerationPanel()
    assert plugin_kind(newcomer) == "other" and panel.groups["other"] == ["brand_new_cache"]
    assert list(panel.groups)[-1] == "other"
    assert {name: plugin_kind(spec) for name, spec in specs.items()} == {
        name: spec.describe()["kind"] for name, spec in specs.items()
    }


def test_panel_row_is_one_line_when_off_and_reveals_options_when_on(wan):
    panel = AccelerationPanel(wan)
    row = panel.rows["block_sparse"]
    assert not row.enabled.value and not shown(row.options_box) and not shown(row.details)
    # rows that are off send no option fields to the page (they are made when the row is switched on)
    assert not any(r.options_box.children for r in panel.rows.values())
    assert row.spec.summary in row.note.value and "nowrap" in row.note.value  # one line: the summary ellipsised
    assert [type(child).__name__ for child in row.children[0].children] == ["Checkbox", "HTML", "HTML", "ToggleButton"]
    row.enabled.value = True
    assert shown(row.options_box) and list(row.options_box.children) == list(row.inputs.values())
    row.enabled.value = False
    assert not shown(row.options_box)
    assert not shown(panel.rows["cross_kv_cache"].options_box)  # no options: nothing to reveal
    panel.rows["cross_kv_cache"].enabled.value = True
    assert not shown(panel.rows["cross_kv_cache"].options_box)


def test_panel_expand_shows_the_full_description(wan):
    row = AccelerationPanel(wan).rows["easycache"]
    assert row.details.value == ""  # built on first expand
    row.more.value = True
    assert shown(row.details) and "vflash-description" in row.details.value
    assert "threshold" in row.details.value and "<b>required</b>" in row.details.value
    assert "feature_cache" in row.details.value  # its exclusive group
    assert len(row.details.value) > 3 * len(row.spec.summary)  # more than the summary: the module's text
    row.more.value = False
    assert not shown(row.details)


def test_panel_inputs_follow_option_types(wan):
    rows = AccelerationPanel(wan).rows
    backend = rows["attention_backend"].inputs["backend"].widget
    assert isinstance(backend, ipywidgets.Dropdown) and backend.value == "native"
    assert isinstance(rows["regional_compile"].inputs["fullgraph"].widget, ipywidgets.Checkbox)
    order = rows["taylorseer"].inputs["max_order"]
    assert isinstance(order.widget, ipywidgets.Text) and order.widget.value == "1"  # the default, visible
    assert "0–4" in order.label.value  # its allowed range beside the name
    fbc = rows["first_block_cache"].inputs["threshold"]
    assert fbc.widget.value == "0.05" and "≥ 0" in fbc.label.value
    assert rows["block_sparse"].inputs["sink_tokens"].widget.value == "family"
    required = rows["easycache"].inputs["threshold"]  # required: starts empty, marked, says what it takes
    assert required.widget.value == "" and "*" in required.label.value and "required" in required.label.value
    assert required.widget.placeholder == "required: float ≥ 0"
    include = rows["selective_fp8"].inputs["include"]
    include.set(["blocks.*.ffn.net.0.proj", "blocks.0.*"])
    assert include.value() == ["blocks.*.ffn.net.0.proj", "blocks.0.*"]


def test_panel_every_option_has_a_default_or_a_required_marker(wan):
    for name, row in AccelerationPanel(wan).rows.items():
        for field in row.inputs.values():
            if field.option.required:
                assert "required" in field.label.value, (name, field.option.name)
            else:
                assert field.check() is None, (name, field.option.name, field.error)  # its default is valid


def test_panel_bad_value_is_marked_at_the_field(wan):
    panel = AccelerationPanel(wan)
    panel.enable("taylorseer", max_order=9)
    field = panel.rows["taylorseer"].inputs["max_order"]
    assert field.error is not None and "maximum 4" in field.error  # marked as soon as it is typed
    assert "vflash-invalid" in field._dom_classes and field.widget.style.background
    assert shown(field.message) and "above the maximum 4" in field.message.value
    assert panel.apply() is None and wan.accelerations == {}
    assert "taylorseer.max_order" in panel.errors.value and "marked at the field" in panel.errors.value
    panel.enable("taylorseer", max_order="two")
    assert "expected int" in field.error
    panel.enable("taylorseer", max_order=2)
    assert field.error is None and not shown(field.message) and "vflash-invalid" not in field._dom_classes
    assert panel.apply() == {"taylorseer": {"cache_interval": 5, "disable_cache_before_step": 3, "max_order": 2}}


def test_panel_required_option_left_empty_refuses_apply_and_marks_it(wan):
    panel = AccelerationPanel(wan)
    panel.enable("cross_kv_cache")
    assert panel.apply() == {"cross_kv_cache": {}}
    panel.enable("easycache")  # its threshold is required and left empty
    field = panel.rows["easycache"].inputs["threshold"]
    assert panel.apply() is None
    assert field.error is not None and "required" in field.error and shown(field.message)
    assert "easycache.threshold" in panel.errors.value and "required" in panel.errors.value
    assert wan.accelerations == {"cross_kv_cache": {}}  # nothing half-installed, the old set kept
    panel.enable("easycache", threshold="not a number")
    assert panel.apply() is None and "easycache.threshold" in panel.errors.value
    assert wan.accelerations == {"cross_kv_cache": {}}
    panel.enable("easycache", threshold=0.05)
    assert field.error is None
    panel.enable("first_block_cache")  # two feature caches: a conflict found before anything changes
    assert panel.apply() is None
    assert panel.errors.value and wan.accelerations == {"cross_kv_cache": {}}
    panel.enable("first_block_cache", on=False)
    assert set(panel.apply()) == {"cross_kv_cache", "easycache"}


def test_panel_profiles_install_what_they_say_and_explain_what_is_left_out(wan):
    panel = AccelerationPanel(wan)
    assert list(panel.profiles) == list(PROFILES)
    config, left_out = profile_plan("exact-fast", "wan", wan.device)
    row = panel.profiles["exact-fast"]
    assert row.config == config and row.left_out == left_out
    for plugin in config:
        assert plugin in row.plan.value
    assert left_out  # on a CPU: gelu_epilogue and flash4_attention need CUDA
    for plugin, why in left_out.items():
        assert plugin in row.plan.value and html.escape(why) in row.plan.value
    assert "left out here" in row.plan.value
    row.button.click()
    assert wan.accelerations == {name: REGISTRY[name].validate(o) for name, o in config.items()}  # defaults filled in
    assert panel.errors.value == ""
    assert {name for name, r in panel.rows.items() if r.enabled.value} == set(config)
    panel.rows["easycache"].enabled.value = True  # a preset replaces what was checked by hand
    panel.profiles["stock"].button.click()
    assert wan.accelerations == {} and "nothing" in panel.profiles["stock"].plan.value
    assert not any(r.enabled.value for r in panel.rows.values())
    with pytest.raises(ValueError, match="profile"):
        panel.use_profile("fastest")


def test_panel_approximate_plugins_default_off(wan):
    panel = AccelerationPanel(wan)
    approximate = [name for name, spec in available().items() if spec.contract == "approximate"]
    assert approximate
    assert not any(panel.rows[name].enabled.value for name in approximate)
    assert panel.config() == {}


def test_panel_apply_installs_valid_config(wan):
    panel = AccelerationPanel(wan)
    panel.rows["cross_kv_cache"].enabled.value = True
    panel.enable("first_block_cache", threshold=0.1)
    installed = panel.apply()
    assert installed == wan.accelerations
    assert set(wan.accelerations) == {"cross_kv_cache", "first_block_cache"}
    assert wan.accelerations["first_block_cache"]["threshold"] == pytest.approx(0.1)
    assert panel.errors.value == ""
    assert "cross_kv_cache" in panel.installed.value and "first_block_cache" in panel.installed.value
    # A new panel on the same session starts from what is installed, with the installed options in the fields.
    again = AccelerationPanel(wan)
    assert again.rows["cross_kv_cache"].enabled.value and again.rows["first_block_cache"].enabled.value
    assert again.rows["first_block_cache"].inputs["threshold"].widget.value == "0.1"
    # Binding another session sets the same rows (no new widgets): unchecked, fields back at their defaults, unmarked.
    rows = dict(again.rows)
    again.rows["first_block_cache"].inputs["threshold"].set("not a number")
    again.bind(None)
    assert again.rows == rows and all(again.rows[name] is row for name, row in rows.items())
    assert again.config() == {} and not any(field.error for row in rows.values() for field in row.inputs.values())
    default = available()["first_block_cache"].options[0]
    assert (
        default.name == "threshold" and again.rows["first_block_cache"].inputs["threshold"].value() == default.default
    )
    again.bind(wan)
    assert set(again.config()) == {"cross_kv_cache", "first_block_cache"}
    panel.remove_all()
    assert wan.accelerations == {} and "nothing" in panel.installed.value


def test_panel_plugin_this_machine_cannot_run_is_an_error_in_the_widget(wan):
    if wan.device.type == "cuda":
        pytest.skip("group_offload runs on CUDA; this checks the CPU refusal")
    panel = AccelerationPanel(wan)
    assert "not here: needs cuda" in panel.rows["group_offload"].note.value
    with pytest.MonkeyPatch.context() as patch:  # the plugin's own reason, as profiles read it
        patch.setenv("TRITON_INTERPRET", "0")
        panel.bind(wan)
        assert "not here: Triton kernels on a CPU need TRITON_INTERPRET=1" in panel.rows["fused_block_norms"].note.value
        assert "not here" not in panel.rows["block_sparse"].note.value  # its torch reference serves a CPU
        patch.setenv("TRITON_INTERPRET", "1")
        panel.bind(wan)
        assert "not here" not in panel.rows["fused_block_norms"].note.value
    panel.enable("group_offload")
    assert panel.apply() is None
    assert "RuntimeError" in panel.errors.value and "group_offload" in panel.errors.value
    assert wan.accelerations == {}


def test_panel_without_session_says_so():
    panel = AccelerationPanel()
    assert panel.apply() is None and "no session" in panel.errors.value
    assert all(row.button.disabled and "open a model" in row.plan.value for row in panel.profiles.values())
    with pytest.raises(ValueError, match="not registered"):
        panel.enable("no_such_plugin")
