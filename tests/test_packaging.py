import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "workbench").rglob("__init__.py")}
    found |= {f"workbench.{name}" for name in config["package-dir"] and ("kernels", "widgets")}
    assert found <= listed, f"missing from pyproject packages: {sorted(found - listed)}"


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"```bash\n{ci}\n```" in (ROOT / "README.md").read_text()


def test_every_repository_path_the_docs_and_docstrings_name_exists():
    """A path into this repository named in the README, docs/ or any Python file (a script, a results file, a test,
    a kernel, a notebook; `*` as a glob) exists: files moved or removed leave no dangling pointers behind."""
    import re
    import subprocess

    pattern = re.compile(
        r"\b((?:benchmarks|tests|kernels|workbench|widgets|notebooks|docs|data_manifests)/[\w/*.-]+"
        r"\.(?:py|json|md|ipynb|sh|png|html))"
    )
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    sources = [
        p for p in tracked if p.endswith(".py") or p == "README.md" or (p.startswith("docs/") and p.endswith(".md"))
    ]
    missing = sorted(
        f"{source}: {name}"
        for source in sources
        for name in set(pattern.findall((ROOT / source).read_text()))
        if not list(ROOT.glob(name))
    )
    assert not missing, missing


def test_the_kernels_folder_does_not_shadow_an_installed_kernels_package_from_the_repository_root(tmp_path):
    """`python -m ...` from the repository root puts the folder `kernels/` first on sys.path; the top-level name
    `kernels` still resolves to an installed package of that name (transformers >= 5.25 imports Hugging Face's), so
    transformers' model code and the workbench import side by side from there."""
    import importlib.metadata
    import subprocess
    import sys

    def run(probe: str, **env: str) -> str:
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip()

    installed = tmp_path / "kernels"
    installed.mkdir()
    (installed / "__init__.py").write_text("ORIGIN = 'installed'\n")
    assert run("import kernels; print(kernels.ORIGIN)", PYTHONPATH=str(tmp_path)) == "installed"

    probe = "import transformers.modeling_utils, workbench.kernels as w, kernels; print(w.__file__, kernels.__file__)"
    ours, top_level = run(probe).split()
    assert ours == str(ROOT / "kernels" / "__init__.py")
    try:
        importlib.metadata.distribution("kernels")
        assert top_level != ours
    except importlib.metadata.PackageNotFoundError:
        assert top_level == ours


def test_the_readmes_main_command_writes_what_the_readme_says(tmp_path, monkeypatch):
    """The README's first command for a fresh machine, its `workbench generate ...` run as written (only `--out` moved
    into a temporary folder): the three files, and the video and sound the paragraph after it describes."""
    import json
    import re
    import shlex

    from workbench.cli import main
    from workbench.media import verify_mp4

    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("python3 -m venv .venv && "))
    command = shlex.split(line.split(" && ")[-1])
    assert command[0] == ".venv/bin/workbench" and command[command.index("--out") + 1] == "out/quickstart"
    command[command.index("--out") + 1] = str(tmp_path / "quickstart")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert main(command[1:]) == 0
    written = sorted(p.name for p in (tmp_path / "quickstart").iterdir())
    assert written == ["result.html", "result.json", "result.mp4"]
    said = re.search(r"2 s of (\d+)x(\d+) video at (\d+) fps \((\d+)\s+frames\) with (\d+) kHz stereo", readme)
    size, fps, frames, khz = int(said[1]), int(said[3]), int(said[4]), int(said[5])
    report = verify_mp4(tmp_path / "quickstart" / "result.mp4", expect_frames=frames, expect_audio_seconds=2.0)
    assert not report.problems and (report.height, report.width) == (size, int(said[2]))
    assert (report.sample_rate, report.audio_channels) == (khz * 1000, 2) and report.black_frames == 0
    record = json.loads((tmp_path / "quickstart" / "result.json").read_text())
    request = record["metadata"]["request"]
    assert (request["fps"], request["frames"], record["metadata"]["model"]) == (fps, frames, "demo-av")
