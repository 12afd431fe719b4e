"""Triton kernels, each beside its pure-torch reference (imported as `workbench.kernels`).

From the repository root this folder is also reachable as a top-level `kernels` (`python -m ...` puts the working
directory first on sys.path). That name belongs to Hugging Face's `kernels` package, which transformers imports
(a required dependency from transformers 5.25). Imported under that name, this module hands it over to the installed
package when there is one; without one it stays this folder, which carries no version, so transformers treats the
name as absent.
"""

import importlib.util
import sys
from importlib.machinery import PathFinder
from pathlib import Path

if __name__ == "kernels":
    _root = Path(__file__).resolve().parents[1]
    _elsewhere = [entry for entry in sys.path if Path(entry or ".").resolve() != _root]
    _spec = PathFinder.find_spec("kernels", _elsewhere)
    if _spec is not None and _spec.loader is not None:
        _installed = importlib.util.module_from_spec(_spec)
        sys.modules["kernels"] = _installed  # the import statement returns what sys.modules holds when this ends
        _spec.loader.exec_module(_installed)
