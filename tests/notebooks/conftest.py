import json
import sys
from pathlib import Path

import pytest


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


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """JUPYTER_PATH with the temporary kernelspec, progress bars off (they would become widgets)."""
    path = python3_kernel_of_this_interpreter(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(path))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    return path
