"""Every notebook runs headless under papermill with tiny parameters, and under `pytest --nbval-lax`.

The assertions live in the notebooks' own code cells; here a run must finish without an error output
and leave the content a reader expects (the executed copy is what CI keeps).

Each run is its own process with its own fresh kernel (`python -m papermill ...`, and the nbval run's pytest).
The test process only waits on them, so `runs` keeps one run per CPU core going (at most `LANES`), started in
the order the tests ask for them: each test waits for its own run, and the runs behind it go on meanwhile.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LANES = max(1, min(2, len(os.sched_getaffinity(0))))  # concurrent runs: the notebooks' tiny work is one core each
NBVAL = "nbval"  # the name of the nbval run among the runs


def parameters(name: str, folder: Path) -> dict:
    out = str(folder / "out")
    return {
        "00_quickstart": {"out": out},
        "10_explore": {"device": "cpu"},
        "20_qualify": {"out": out},
        "30_kernels": {"device": "cuda"},  # on a machine without CUDA this is the clean skip
        "40_review": {"record_a": "", "record_b": "", "out": out, "device": "cpu", "rounds": 3},
        "50_calibrate": {
            "model": "demo-av",
            "suite": "../data_manifests/demo-av-smoke.json",
            "plugins": ["easycache"],
            "budget": {"latent_rel_l2": 0.2, "psnr_db": 20.0, "min_ssim": 0.7},
            "out": out,
            "device": "cpu",
            "max_evals": 3,
        },
    }[name]


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


@dataclass
class Run:
    """One notebook run as a subprocess: `command` in `cwd`, its output in `folder` (log.txt holds its stdout
    and stderr)."""

    command: list[str]
    cwd: Path
    folder: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    log: object = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        self.log = (self.folder / "log.txt").open("w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(self.command, cwd=self.cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def done(self) -> bool:
        if self.process is None or self.process.poll() is None:
            return False
        self.log.close()
        return True

    def output(self) -> str:
        return (self.folder / "log.txt").read_text()


class Runs:
    """The module's runs, `LANES` at a time, started in `order`; `wait(name)` keeps the lanes full until that one
    ends and returns (its folder, its exit status)."""

    def __init__(self, runs: dict[str, Run], order: list[str], env: dict[str, str], timeout: float = 900) -> None:
        self.runs, self.pending, self.env, self.timeout = runs, list(order), env, timeout

    def fill(self) -> None:
        running = [run for run in self.runs.values() if run.process is not None and not run.done()]
        while self.pending and len(running) < LANES:
            run = self.runs[self.pending.pop(0)]
            run.start(self.env)
            running.append(run)

    def wait(self, name: str) -> tuple[Path, int]:
        run = self.runs[name]
        if name in self.pending:  # asked for before its turn: it goes next
            self.pending.remove(name)
            self.pending.insert(0, name)
        while True:
            self.fill()
            if run.done():
                self.fill()
                return run.folder, run.process.returncode
            if run.process is not None and time.monotonic() - run.started > self.timeout:
                run.process.kill()
                pytest.fail(f"{name}: still running after {self.timeout} s:\n{run.output()[-4000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        for run in self.runs.values():
            if run.process is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait()
            if run.log is not None:
                run.log.close()


def papermill_run(name: str, folder: Path) -> Run:
    """`python -m papermill` of notebook `name` from folder/notebooks, beside a copy of data_manifests (so a suite's
    default path `../data_manifests/...` resolves as it does in the repository), writing folder/NAME.ipynb."""
    (folder / "notebooks").mkdir(parents=True)
    shutil.copytree(ROOT / "data_manifests", folder / "data_manifests")
    command = [sys.executable, "-m", "papermill", str(NOTEBOOKS / f"{name}.ipynb"), str(folder / f"{name}.ipynb")]
    command += ["-y", json.dumps(parameters(name, folder)), "-k", "python3", "--no-progress-bar"]
    command += ["--execution-timeout", "300"]
    return Run(command, folder / "notebooks", folder)


def nbval_run(folder: Path) -> Run:
    """`pytest --nbval-lax` over every notebook with its own (tiny CPU) defaults, on a copy of the tree (except
    `RUN_WITH_DEFAULTS`, which their papermill tests run with their defaults).

    The copy keeps what the notebooks write (out/...) away from the repository, and keeps the relative
    suite path of 20_qualify (`../data_manifests/...`) working. 30_kernels runs its no-CUDA stop here.
    """
    shutil.copytree(NOTEBOOKS, folder / "notebooks")
    shutil.copytree(ROOT / "data_manifests", folder / "data_manifests")
    names = [p.name for p in sorted((folder / "notebooks").glob("*.ipynb")) if p.stem not in RUN_WITH_DEFAULTS]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", *names]
    command += ["--rootdir", str(folder / "notebooks"), "--nbval-cell-timeout", "300"]
    return Run(command, folder / "notebooks", folder)


def needs(*names: str):
    """Marks a test as waiting for the runs `names` (so `runs` starts only what the selected tests need)."""

    def mark(test):
        test.needs_runs = names
        return test

    return mark


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The runs the selected tests of this module need, in the order those tests come, with a temporary
    `python3` kernelspec of this interpreter and progress bars off (they would become widgets)."""
    order = []
    for item in request.session.items:
        for name in getattr(getattr(item, "function", None), "needs_runs", ()):
            if item.module is request.module and name not in order:
                order.append(name)
    kernels = python3_kernel_of_this_interpreter(tmp_path_factory.mktemp("jupyter"))
    env = {**os.environ, "JUPYTER_PATH": str(kernels), "TQDM_DISABLE": "1"}
    if LANES > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # two runs on two cores: one thread each, not two fighting
    made = {
        name: nbval_run(tmp_path_factory.mktemp(name))
        if name == NBVAL
        else papermill_run(name, tmp_path_factory.mktemp(name))
        for name in order
    }
    pool = Runs(made, order, env)
    yield pool
    pool.stop()


def executed(runs: Runs, name: str) -> tuple[nbformat.NotebookNode, Path]:
    """Notebook `name` as its papermill run executed it, checked for errors and stderr output; (notebook, folder)."""
    folder, status = runs.wait(name)
    assert status == 0, runs.runs[name].output()[-6000:]
    notebook = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    errors = [
        o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"
    ]
    assert not errors
    assert not stderr_outputs(notebook)
    assert any("injected-parameters" in cell.metadata.get("tags", []) for cell in notebook.cells)
    return notebook, folder


def stderr_outputs(notebook: nbformat.NotebookNode) -> list[str]:
    """Every stderr stream of the executed notebook, as "cell N: text": a clean run writes none (warnings,
    tracebacks and progress bars on stderr read as trouble to whoever opens the notebook)."""
    return [
        f"cell {index}: {output.text[:500]}"
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stderr"
    ]


def mimes(notebook: nbformat.NotebookNode) -> set[str]:
    return {m for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs for m in o.get("data", {})}


def text(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts += [str(value) for value in output.get("data", {}).values()]
    return "\n".join(parts)


@needs("00_quickstart")
def test_quickstart_notebook_plays_the_demo_and_writes_the_video(runs):
    notebook, folder = executed(runs, "00_quickstart")
    assert {"text/html", "image/png"} <= mimes(notebook)  # the embedded video/audio and the static timeline
    assert (folder / "out" / "result.mp4").stat().st_size > 0


@needs("10_explore")
def test_explore_notebook_runs_the_dashboard(runs):
    notebook, _ = executed(runs, "10_explore")
    assert {"application/vnd.jupyter.widget-view+json", "image/png"} <= mimes(notebook)  # widgets + static timelines
    assert "cross_kv_cache: bitwise" in text(notebook)


@needs("20_qualify")
def test_qualify_notebook_writes_record_and_report(runs):
    notebook, folder = executed(runs, "20_qualify")
    record = json.loads((folder / "out" / "qualification.json").read_text())
    assert record["verdict"] in text(notebook) and len(record["cases"]) == 1
    report = (folder / "out" / "qualification.html").read_text()
    assert f"Qualification: {record['verdict']}" in report and "data:video/mp4;base64," in report
    assert "text/html" in mimes(notebook)


@needs("30_kernels")
def test_kernels_notebook_stops_cleanly_or_lists_kernels(runs):
    import torch

    notebook, _ = executed(runs, "30_kernels")
    if not torch.cuda.is_available():
        assert "skipped: no CUDA device; kernel micro-benchmarks need the GPU" in text(notebook)


@needs("40_review")
def test_review_notebook_makes_and_compares_two_executed_records_and_writes_its_report(runs):
    notebook, folder = executed(runs, "40_review")
    records = [json.loads((folder / "out" / f"{name}.json").read_text()) for name in ("cross_kv_cache", "easycache")]
    assert all(Path(r["model"]).name == "demo-av" for r in records)
    assert all(x["executed"] for r in records for case in r["cases"] for x in case["receipts"].values())
    assert records[1]["cases"][0]["receipts"]["easycache"]["reused"] > 0  # the approximate arm really skipped work
    report = (folder / "out" / "review.html").read_text()
    assert report.count("data:video/mp4;base64,") == 4 and "<script" not in report and "<title>Review: " in report
    shown = text(notebook)
    assert "CI95" in shown and "latent_rel_l2" in shown and "verdict" in shown


@needs("50_calibrate")
def test_calibrate_notebook_writes_its_record_and_shows_the_panel(runs):
    notebook, folder = executed(runs, "50_calibrate")
    record = json.loads((folder / "out" / "calibration.json").read_text())
    assert record["plugin"] == "easycache" and record["status"] in text(notebook)
    assert record["status"] == "quality_confirmed", record["reason"]
    assert {"application/vnd.jupyter.widget-view+json", "text/html"} <= mimes(notebook)


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_is_committed_clean_with_title_and_parameters(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")
    assert "parameters" in notebook.cells[1].metadata.get("tags", [])
    assert all(not c.outputs and c.execution_count is None for c in notebook.cells if c.cell_type == "code")


# Notebooks whose papermill test passes their own defaults (only the output folder differs): that test is their run
# with defaults, so the nbval run below leaves them out instead of executing them twice. 50_calibrate's papermill
# test sets a budget; nbval runs its defaults.
RUN_WITH_DEFAULTS = {"00_quickstart", "10_explore", "20_qualify", "30_kernels", "40_review"}


def test_run_with_defaults_really_passes_the_defaults(tmp_path):
    for name in RUN_WITH_DEFAULTS:
        notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        defaults: dict = {}
        exec(notebook.cells[1].source, {}, defaults)  # the parameters cell: plain assignments
        given = {k: v for k, v in parameters(name, tmp_path).items() if k != "out"}
        assert given.items() <= defaults.items(), name


@needs(NBVAL)
def test_notebooks_pass_nbval_lax(runs):
    """The nbval run (`nbval_run`) passes."""
    folder, status = runs.wait(NBVAL)
    output = runs.runs[NBVAL].output()
    assert status == 0, output[-6000:]
    assert " passed" in output and "failed" not in output
