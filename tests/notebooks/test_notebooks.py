"""Every notebook runs headless under papermill with tiny parameters, and under `pytest --nbval-lax`.

The assertions live in the notebooks' own code cells; here a run must finish without an error output
and leave the content a reader expects (the executed copy is what CI keeps).

Each run is its own process with its own fresh kernel (`python -m papermill ...`, and the nbval run's pytest),
started in the background when the session starts (conftest.py); a test waits for its run and checks it.
"""

import html
import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter
from traitlets.config import Config

from workbench.quality import Budget

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
NBVAL = "nbval"  # the name of the nbval run among the runs
WIDGET = "application/vnd.jupyter.widget-view+json"
LIVE = 'class="vflash-live-static"'  # LiveStagePlot's figures, displayed under the cell that ran the request


def parameters(name: str, folder: Path) -> dict:
    out = str(folder / "out")
    return {
        "00_quickstart": {"out": out},
        "10_explore": {"device": "cpu"},
        "20_qualify": {"out": out},
        "30_kernels": {"rounds": 3},  # on a machine without CUDA: the smoke run on the CPU
        "40_review": {"record_a": "", "record_b": "", "out": out, "device": "cpu", "rounds": 3},
        "50_calibrate": {"out": out, **CALIBRATE_SMALL},
    }[name]


# 50_calibrate's defaults are a real search at demo-av's own size (minutes on 2 cores; README), which
# tests/evidence/test_calibrate.py's `test_stack_on_demo_av_at_the_default_budget_...` runs (the same captions, size and
# default budget; calibration seed 11, test seeds 42 and 43). CI runs the notebook once, on demo-av-mini at its suite's
# size, not in nbval: a latent limit looser than the default's (under which three evaluations find no setting there)
# puts easycache's knee inside its range, so its three evaluations find a knee and a cliff; one test request confirms.
CALIBRATE_SMALL = {
    "model": "demo-av-mini",
    "suite": "../data_manifests/demo-av-mini-smoke.json",
    "budget": {"latent_rel_l2": 0.1},
    "max_evals": 3,
    "height": None,
    "width": None,
    "max_cases": 1,
}


def papermill_run(name: str, folder: Path) -> tuple[list[str], Path]:
    """`python -m papermill` of notebook `name` from folder/notebooks, beside a copy of data_manifests (so a suite's
    default path `../data_manifests/...` resolves as it does in the repository), writing folder/NAME.ipynb."""
    (folder / "notebooks").mkdir()
    shutil.copytree(ROOT / "data_manifests", folder / "data_manifests")
    command = [sys.executable, "-m", "papermill", str(NOTEBOOKS / f"{name}.ipynb"), str(folder / f"{name}.ipynb")]
    command += ["-y", json.dumps(parameters(name, folder)), "-k", "python3", "--no-progress-bar"]
    command += ["--execution-timeout", "300"]
    return command, folder / "notebooks"


def nbval_run(folder: Path) -> tuple[list[str], Path]:
    """`pytest --nbval-lax` over every notebook with its own (tiny CPU) defaults, on a copy of the tree (except
    `RUN_WITH_DEFAULTS`, which their papermill tests run with their defaults, and 50_calibrate, whose defaults take
    minutes: `CALIBRATE_SMALL`).

    The copy keeps what the notebooks write (out/...) away from the repository, and keeps the relative
    suite path (`../data_manifests/...`) working.
    """
    shutil.copytree(NOTEBOOKS, folder / "notebooks")
    shutil.copytree(ROOT / "data_manifests", folder / "data_manifests")
    left_out = RUN_WITH_DEFAULTS | {"50_calibrate"}
    names = [p.name for p in sorted((folder / "notebooks").glob("*.ipynb")) if p.stem not in left_out]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", *names]
    command += ["--rootdir", str(folder / "notebooks"), "--nbval-cell-timeout", "300"]
    return command, folder / "notebooks"


def make_run(name: str, folder: Path) -> tuple[list[str], Path]:
    """The run `name` (a notebook's papermill run, or `NBVAL`) with its files in `folder`: (command, working
    folder); conftest.py starts it."""
    return nbval_run(folder) if name == NBVAL else papermill_run(name, folder)


def executed(runs, name: str) -> tuple[nbformat.NotebookNode, Path]:
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


def shown_report(notebook: nbformat.NotebookNode) -> str:
    """The report the notebook shows (its one HTML output of a `.vflash-report`): a body fragment with its styles
    inline, never a whole document, whose <title> JupyterLab shows as a stray line and whose <style> it drops."""
    (report,) = [
        html_output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if 'class="vflash-report"' in (html_output := output.get("data", {}).get("text/html", ""))
    ]
    assert not re.search(r"<(!doctype|html|head|title|style)\b", report, re.IGNORECASE)
    return report


@pytest.mark.notebook_run("00_quickstart")
def test_quickstart_notebook_plays_the_demo_and_writes_the_video(runs):
    notebook, folder = executed(runs, "00_quickstart")
    assert "text/html" in mimes(notebook)  # the embedded video/audio, the frame strip and the timeline
    assert (folder / "out" / "result.mp4").stat().st_size > 0
    page, _ = HTMLExporter(config=Config({"ClearMetadataPreprocessor": {"enabled": True}})).from_notebook_node(notebook)
    assert '<img alt="frames [0, ' in page and '<img alt="stage timeline: one row per stage' in page
    assert "No description has been provided" not in page  # an image's alt text survives the README's export
    # The caption checks read as tables (HTML, with aligned text for a terminal), not as dumped dicts and lists
    datas = [o.get("data", {}) for c in notebook.cells for o in c.get("outputs", [])]
    heads = [data["text/plain"].split()[0] for data in datas if data.get("text/html", "").startswith("<table>")]
    assert heads == ["attribute", "attribute", "seed"] and "{'" not in text(notebook)
    assert '<th style="text-align:left">detected</th>' in page


@pytest.mark.notebook_run("10_explore")
def test_explore_notebook_runs_the_dashboard(runs):
    notebook, _ = executed(runs, "10_explore")
    assert "cross_kv_cache: bitwise" in text(notebook)
    datas = [o.get("data", {}) for c in notebook.cells for o in c.get("outputs", [])]
    widgets = [data for data in datas if WIDGET in data]
    assert len(widgets) == 2 and all("text/html" in data for data in widgets)  # the dashboard, then its A/B area
    dashboard, ab = (data["text/html"] for data in widgets)  # each copy as it last stood, after both requests
    assert 'class="vflash-dashboard-static"' in dashboard and "last request #2 cross_kv_cache" in dashboard
    assert "waiting for a request" not in dashboard  # displayed before the requests, brought up to date after them
    for copy in (dashboard, ab):  # the dashboard holds the A/B area too
        assert copy.count("data:video/mp4;base64,") == 2 and copy.count("data:audio/wav;base64,") == 2
        assert "#1 stock and #2 cross_kv_cache are identical</b>" in copy  # bitwise: said, not drawn black and empty
    lives = [data["text/html"] for data in datas if WIDGET not in data and LIVE in data.get("text/html", "")]
    assert len(lives) == 2 and all(page.count('<img alt="') == 2 for page in lives)  # each request's two figures
    # The README's offline export (papermill saves widget state, which nbconvert would draw with JavaScript from a
    # CDN; without it the copies show): each copy in its widget's place, no widget repr, every image's own alt text.
    page, _ = HTMLExporter(config=Config({"ClearMetadataPreprocessor": {"enabled": True}})).from_notebook_node(notebook)
    assert page.count(WIDGET) == 0 and "Dashboard(children=" not in page
    assert page.count("data:video/mp4;base64,") == 4 and page.count("data:audio/wav;base64,") == 4
    assert page.count('<img alt="stage timeline of the last request"') == 3  # each request's, and the dashboard's
    assert "No description has been provided" not in page


@pytest.mark.notebook_run("20_qualify")
def test_qualify_notebook_writes_record_and_report(runs):
    notebook, folder = executed(runs, "20_qualify")
    record = json.loads((folder / "out" / "qualification.json").read_text())
    assert record["verdict"] in text(notebook) and len(record["cases"]) == 1
    report = (folder / "out" / "qualification.html").read_text()
    assert f"Qualification: {record['verdict']}" in report and "data:video/mp4;base64," in report
    assert html.escape(Budget.from_dict(record["budget"]).describe()) in report  # the limits in words, not JSON
    assert f"<h1>Qualification: {record['verdict']}</h1>" in shown_report(notebook)


@pytest.mark.notebook_run("30_kernels")
def test_kernels_notebook_checks_and_times_every_kernel(runs):
    """The notebook runs `kernel_bench.benchmark` (without CUDA, its smoke run) and shows every kernel checked and
    timed: a row per kernel with a speed-up and its CI95, none outside its contract."""
    import torch

    from workbench.kernel_bench import all_cases

    notebook, _ = executed(runs, "30_kernels")
    table = next(
        v
        for v in (o.get("data", {}).get("text/html", "") for c in notebook.cells for o in c.get("outputs", []))
        if "vflash-kernels" in v
    )
    for case in all_cases("cpu", smoke=True):
        assert re.search(
            rf"<td[^>]*>{case.name}</td><td[^>]*>(equal|rel L2 [^<]+)</td>(<td[^>]*>[0-9.]+</td>){{2}}<td[^>]*>[0-9.]+x \[",
            table,
        )
    assert "outside its contract" not in table
    assert ("Smoke run" in table) == (not torch.cuda.is_available())
    assert not re.search(r" 0(\.0*)? T(B|FLOP)/s", table)  # the ceilings in a unit they read in (a CPU's: M or G)
    assert ("host launch ms" in table) == torch.cuda.is_available()  # timed on CUDA only: no column of blanks


@pytest.mark.notebook_run("40_review")
def test_review_notebook_makes_and_compares_two_executed_records_and_writes_its_report(runs):
    notebook, folder = executed(runs, "40_review")
    records = [json.loads((folder / "out" / f"{name}.json").read_text()) for name in ("cross_kv_cache", "easycache")]
    assert all(Path(r["model"]).name == "demo-av-mini" for r in records)
    assert all(x["executed"] for r in records for case in r["cases"] for x in case["receipts"].values())
    assert records[1]["cases"][0]["receipts"]["easycache"]["reused"] > 0  # the approximate arm really skipped work
    report = (folder / "out" / "review.html").read_text()
    assert report.count("data:video/mp4;base64,") == 4 and "<script" not in report and "<title>Review: " in report
    shown = shown_report(notebook)
    assert "CI95" in shown and "latent rel-L2" in shown and "verdict" in shown
    cases = [case for r in records for case in r["cases"]]
    assert report.count("; not a speed claim (see the verdict)") == len(cases)  # CPU times: no case claims speed
    for case in cases:  # why a case is in or out of the budget
        assert html.escape("; ".join(case["quality"]["failures"]) or "none") in report


@pytest.mark.notebook_run("50_calibrate")
def test_calibrate_notebook_writes_its_record_and_shows_the_panel(runs):
    notebook, folder = executed(runs, "50_calibrate")
    record = json.loads((folder / "out" / "calibration.json").read_text())
    assert record["plugin"] == "easycache" and record["status"] in text(notebook)
    assert record["status"] == "quality_confirmed", record["reason"]
    assert "application/vnd.jupyter.widget-view+json" in mimes(notebook)
    assert f">{record['status']}</td>" in shown_report(notebook)  # its status row


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_is_committed_clean_with_title_and_parameters(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")
    assert "parameters" in notebook.cells[1].metadata.get("tags", [])
    assert all(not c.outputs and c.execution_count is None for c in notebook.cells if c.cell_type == "code")


# Notebooks whose papermill test passes their own defaults (only the output folder differs): that test is their run
# with defaults, so the nbval run below leaves them out instead of executing them twice. nbval runs 30_kernels with its
# default rounds, whose papermill test passes fewer.
RUN_WITH_DEFAULTS = {"00_quickstart", "10_explore", "20_qualify", "40_review"}


def test_run_with_defaults_really_passes_the_defaults(tmp_path):
    """The papermill test of a notebook in RUN_WITH_DEFAULTS passes its defaults, and every papermill test passes only
    parameters its notebook's parameters cell assigns (papermill injects an unknown one, a typo such as "max_eval",
    beside the default it meant to replace: 50_calibrate would run its defaults, minutes instead of seconds)."""
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        defaults: dict = {}
        exec(notebook.cells[1].source, {}, defaults)  # the parameters cell: plain assignments
        given = {k: v for k, v in parameters(path.stem, tmp_path).items() if k != "out"}
        assert given.keys() <= defaults.keys(), path.stem
        assert path.stem not in RUN_WITH_DEFAULTS or given.items() <= defaults.items(), path.stem


def test_papermill_finds_every_parameter_of_every_notebook():
    """Each name the parameters cell assigns is one papermill reads as a parameter (a line it cannot parse, say a
    comment with "=" in it, makes it warn that a passed parameter is unknown and leaves it out of --help-notebook)."""
    import ast

    import papermill

    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
        assigned = {target.id for node in ast.parse(cell.source).body for target in getattr(node, "targets", [])}
        assert assigned and assigned == set(papermill.inspect_notebook(str(path))), path.name


@pytest.mark.notebook_run(NBVAL)
def test_notebooks_pass_nbval_lax(runs):
    """The nbval run (`nbval_run`) passes."""
    folder, status = runs.wait(NBVAL)
    output = runs.runs[NBVAL].output()
    assert status == 0, output[-6000:]
    assert " passed" in output and "failed" not in output
