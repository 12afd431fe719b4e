"""Where a result says it came from: the commit must be the code's own, never a surrounding checkout's."""

import subprocess

from workbench import environment


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_git_revision_of_a_checkout_names_its_commit_unless_the_sender_names_one(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_COMMIT", raising=False)
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("x")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "m")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert environment.git_revision(tmp_path) == {"commit": head, "dirty": False}
    monkeypatch.setenv("WORKBENCH_COMMIT", "feedface")  # a copy sent to another machine may carry a stale .git
    assert environment.git_revision(tmp_path) == {"commit": "feedface", "dirty": None}


def test_git_revision_of_a_snapshot_inside_another_checkout_is_not_that_checkouts(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    monkeypatch.delenv("WORKBENCH_COMMIT", raising=False)
    assert environment.git_revision(snapshot) == {"commit": None, "dirty": None}
    monkeypatch.setenv("WORKBENCH_COMMIT", "feedface")  # the launcher names it
    assert environment.git_revision(snapshot) == {"commit": "feedface", "dirty": None}


def test_device_past_the_last_cuda_device_is_refused_naming_the_ones_there(monkeypatch):
    import pytest
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert environment.device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(RuntimeError, match=r"^device: 'cuda:2' requested but this machine has 2 CUDA device\(s\)"):
        environment.device("cuda:2")


def test_device_label_names_the_gpu_or_the_cpu_model_and_threads():
    import torch

    cpu = environment.device_info(torch.device("cpu"))
    assert cpu["cpu"] == environment.cpu_model_name() and cpu["cpu"]
    threads = torch.get_num_threads()
    assert environment.device_label(cpu) == f"{cpu['cpu']}, {threads} thread{'s' * (threads != 1)}"
    gpu = {"type": "cuda", "name": "NVIDIA H200", "memory_bytes": 150_000_000_000}
    assert environment.device_label(gpu) == "NVIDIA H200 (140 GiB)"
    assert environment.device_label({"type": "cpu", "name": "x86_64", "threads": 2}) == "x86_64, 2 threads"
    assert environment.device_label({"type": "cpu", "cpu": "AMD EPYC", "threads": 1}) == "AMD EPYC, 1 thread"
