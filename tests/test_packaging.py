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
