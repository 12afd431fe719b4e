"""The quickstart notebook runs top to bottom under papermill with tiny parameters."""

from pathlib import Path

import nbformat
import papermill

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "00_quickstart.ipynb"


def test_quickstart_notebook_runs_without_error(tmp_path, kernel_env):
    executed = tmp_path / "00_quickstart.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK),
        str(executed),
        parameters={"frames": 9, "seed": 0, "device": "cpu", "out": str(tmp_path / "out"), "held_out": 4},
        kernel_name="python3",
        cwd=str(tmp_path),
        progress_bar=False,
        execution_timeout=300,
    )
    notebook = nbformat.read(executed, as_version=4)
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    assert not [output.text for output in outputs if output.output_type == "stream" and output.name == "stderr"]
    assert any("injected-parameters" in cell.metadata.get("tags", []) for cell in notebook.cells)
    mimes = {mime for output in outputs for mime in output.get("data", {})}
    assert {"text/html", "image/png"} <= mimes  # the embedded video/audio and the static timeline
    assert (tmp_path / "out" / "result.mp4").stat().st_size > 0


def test_quickstart_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.outputs and cell.execution_count is None for cell in notebook.cells if cell.cell_type == "code")
    assert "parameters" in notebook.cells[1].metadata.get("tags", [])
