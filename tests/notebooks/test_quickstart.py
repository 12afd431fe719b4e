"""The quickstart notebook runs top to bottom under papermill with tiny parameters."""

import json
import sys
from pathlib import Path

import nbformat
import papermill

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "00_quickstart.ipynb"


def python3_kernel_of_this_interpreter(root: Path) -> Path:
    """A `python3` kernelspec that starts this very interpreter, found first through JUPYTER_PATH.

    `kernel_name="python3"` otherwise resolves to whichever spec comes first on the machine (a user's
    ~/.local one may point at another Python without the workbench). JUPYTER_PATH has the highest
    priority, and the spec lives in a temporary folder, so nothing is installed anywhere.
    """
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    kernel = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (this interpreter)",
        "language": "python",
    }
    (spec / "kernel.json").write_text(json.dumps(kernel))
    return root


def test_quickstart_notebook_runs_without_error(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(python3_kernel_of_this_interpreter(tmp_path / "jupyter")))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    executed = tmp_path / "00_quickstart.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK),
        str(executed),
        parameters={"frames": 9, "steps": 2, "seed": 0, "device": "cpu", "out": str(tmp_path / "out")},
        kernel_name="python3",
        cwd=str(tmp_path),
        progress_bar=False,
        execution_timeout=300,
    )
    notebook = nbformat.read(executed, as_version=4)
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    assert any("injected-parameters" in cell.metadata.get("tags", []) for cell in notebook.cells)
    mimes = {mime for output in outputs for mime in output.get("data", {})}
    assert {"text/html", "image/png"} <= mimes  # the embedded video/audio and the static timeline
    assert (tmp_path / "out" / "result.mp4").stat().st_size > 0


def test_quickstart_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.outputs and cell.execution_count is None for cell in notebook.cells if cell.cell_type == "code")
    assert "parameters" in notebook.cells[1].metadata.get("tags", [])
