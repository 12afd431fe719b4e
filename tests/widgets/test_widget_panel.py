import ipywidgets
import pytest

from workbench.accelerations import available
from workbench.widgets import AccelerationPanel
from workbench.widgets.panel import CONTRACT_COLORS


@pytest.fixture
def wan(sessions):
    """The shared tiny-wan session, handed back with nothing installed whatever the test did."""
    session = sessions("tiny-wan")
    session.accelerate({})
    yield session
    session.accelerate({})


def test_panel_has_one_row_per_registered_plugin(wan):
    panel = AccelerationPanel(wan)
    specs = available()
    assert list(panel.rows) == list(specs)
    assert list(panel.rows_box.children) == list(panel.rows.values())
    for name, row in panel.rows.items():
        spec = specs[name]
        assert row.enabled.description == name
        assert spec.contract in row.badge.value and CONTRACT_COLORS[spec.contract] in row.badge.value
        assert list(row.inputs) == [option.name for option in spec.options]


def test_panel_inputs_follow_option_types():
    rows = AccelerationPanel().rows
    backend = rows["attention_backend"].inputs["backend"].widget
    assert isinstance(backend, ipywidgets.Dropdown) and backend.value == "native"
    assert isinstance(rows["regional_compile"].inputs["fullgraph"].widget, ipywidgets.Checkbox)
    interval = rows["taylorseer"].inputs["max_order"].widget
    assert isinstance(interval, ipywidgets.BoundedIntText) and (interval.min, interval.max) == (0, 4)
    fbc = rows["first_block_cache"].inputs["threshold"].widget
    assert isinstance(fbc, ipywidgets.BoundedFloatText) and fbc.min == 0.0 and fbc.value == 0.05
    required = rows["easycache"].inputs["threshold"].widget  # required: starts empty
    assert isinstance(required, ipywidgets.Text) and required.value == ""


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
    # A new panel on the same session starts from what is installed.
    assert AccelerationPanel(wan).rows["cross_kv_cache"].enabled.value
    panel.remove_all()
    assert wan.accelerations == {} and "nothing" in panel.installed.value


def test_panel_bad_option_shows_error_and_leaves_session_unchanged(wan):
    panel = AccelerationPanel(wan)
    panel.enable("cross_kv_cache")
    assert panel.apply() == {"cross_kv_cache": {}}
    panel.enable("easycache")  # its threshold is required and left empty
    assert panel.apply() is None
    assert "easycache.threshold" in panel.errors.value and "required" in panel.errors.value
    assert wan.accelerations == {"cross_kv_cache": {}}
    panel.enable("easycache", threshold="not a number")
    assert panel.apply() is None
    assert "easycache.threshold" in panel.errors.value
    assert wan.accelerations == {"cross_kv_cache": {}}
    panel.enable("easycache", threshold=0.05)
    panel.enable("first_block_cache")  # two feature caches: a conflict found before anything changes
    assert panel.apply() is None
    assert panel.errors.value and wan.accelerations == {"cross_kv_cache": {}}


def test_panel_plugin_this_machine_cannot_run_is_an_error_in_the_widget(wan):
    if wan.device.type == "cuda":
        pytest.skip("group_offload runs on CUDA; this checks the CPU refusal")
    panel = AccelerationPanel(wan)
    assert "not on this session" in panel.rows["group_offload"].note.value
    panel.enable("group_offload")
    assert panel.apply() is None
    assert "RuntimeError" in panel.errors.value and "group_offload" in panel.errors.value
    assert wan.accelerations == {}


def test_panel_without_session_says_so():
    panel = AccelerationPanel()
    assert panel.apply() is None and "no session" in panel.errors.value
    with pytest.raises(ValueError, match="not registered"):
        panel.enable("no_such_plugin")
