"""The multi-process launcher: argument errors, and `workbench generate --gpus 2` on two gloo CPU processes."""

import json

import pytest
import torch

from workbench import Request
from workbench.cli import main
from workbench.distributed import WORKER_ENV, check_gpus, cli_accelerations, is_worker, run_arms, torchrun_command

REQUEST = Request("a red circle", frames=9, height=64, width=64, steps=2)


@pytest.mark.parametrize(
    "gpus, device, message",
    [
        (0, "cpu", r"gpus: expected a positive int \(the number of processes\), got 0"),
        (True, "cpu", r"gpus: expected a positive int"),
        (2, "tpu", r"device: 'tpu' with gpus=2; allowed: \['auto', 'cuda', 'cpu'\]"),
    ],
)
def test_check_gpus_bad_input_raises(gpus, device, message):
    with pytest.raises(ValueError, match=message):
        check_gpus(gpus, device)


@pytest.mark.skipif(torch.cuda.device_count() >= 64, reason="checks the refusal for more GPUs than present")
def test_check_gpus_more_than_present_is_runtime_error():
    with pytest.raises(RuntimeError, match=r"gpus=64: this machine has \d+ CUDA device\(s\)"):
        check_gpus(64, "cuda")


@pytest.mark.parametrize(
    "model, request_, arms, message",
    [
        (object(), REQUEST, {"a": {}}, r"model: expected a name or a local directory"),
        ("tiny-wan", "a red circle", {"a": {}}, r"request: expected a workbench.Request"),
        ("tiny-wan", REQUEST, {}, r"arms: expected a non-empty dict"),
        ("tiny-wan", REQUEST, {"a": "context_parallel"}, r"arms: expected a non-empty dict"),
    ],
)
def test_run_arms_bad_input_raises(model, request_, arms, message):
    with pytest.raises(ValueError, match=message):
        run_arms(model, request_, arms, gpus=2, device="cpu")


def test_torchrun_command_runs_the_module_in_n_processes():
    command = torchrun_command(3, "workbench.cli", ["generate", "--gpus", "3"])
    assert command[1:] == [
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3", "-m", "workbench.cli",
        "generate", "--gpus", "3",
    ]  # fmt: skip


def test_cli_bad_gpus_writes_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["generate", "--model", "tiny-wan", "--prompt", "p", "--gpus", "0", "--out", str(out)]) == 2
    assert "gpus: expected a positive int" in capsys.readouterr().err
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the direct relayouts cannot run on this CPU
    argv = ["generate", "--model", "tiny-wan", "--prompt", "p", "--gpus", "2", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 2  # refused before torchrun starts any process
    err = capsys.readouterr().err
    assert "gpus=2 on cpu: the context-parallel relayout kernels need the Triton interpreter there; set " in err
    assert "TRITON_INTERPRET=1, or run on GPUs; from Python, `distributed.run_arms` with context_parallel's " in err
    assert "relayout='reference' runs the torch references instead" in err
    assert not out.exists()


def test_cli_generate_two_gloo_processes_rank_zero_writes(tmp_path, monkeypatch):
    """`--gpus 2 --device cpu` re-executes under torchrun; the workers run the direct relayouts in the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "out"
    argv = ["generate", "--model", "tiny-wan", "--prompt", "a red circle", "--frames", "9", "--height", "64"]
    argv += ["--width", "64", "--steps", "2", "--seed", "1", "--gpus", "2", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["result.html", "result.json", "result.mp4"]
    record = json.loads((out / "result.json").read_text())
    receipt = record["receipts"]["context_parallel"]
    assert receipt["executed"] and receipt["options"]["ulysses_degree"] == 2
    assert receipt["direct_relayout_calls"] == 3 * receipt["cp_attention_calls"] > 0
    assert "reference_relayout_calls" not in receipt and receipt["notes"]["relayout"] == "direct"


def test_run_arms_restore_check_sees_a_replaced_vae_decode(sessions):
    """check_restore fingerprints the VAE too: an instance-level `_decode` left behind (what
    context_parallel's parallel_decode installs) or a changed tiling setting counts as not restored."""
    from workbench.accelerations import fingerprint
    from workbench.distributed import _restorable

    model = sessions("tiny-wan").model
    vae = model.pipeline.vae
    before = _restorable(model, fingerprint)
    vae.__dict__["_decode"] = lambda z, return_dict=True: None
    try:
        assert _restorable(model, fingerprint) != before
    finally:
        del vae.__dict__["_decode"]
    assert _restorable(model, fingerprint) == before
    vae.use_tiling = True
    try:
        assert _restorable(model, fingerprint) != before
    finally:
        vae.use_tiling = False
    assert _restorable(model, fingerprint) == before


def test_cli_accelerations_parallel_decode_installs_bands():
    assert cli_accelerations(2) == {"context_parallel": {"ulysses_degree": 2}}
    assert cli_accelerations(4, parallel_decode=True) == {
        "context_parallel": {"ulysses_degree": 4, "parallel_decode": "bands"}
    }
    with pytest.raises(ValueError, match=r"--parallel-decode: .* needs --gpus N with N >= 2, got --gpus 1"):
        cli_accelerations(1, parallel_decode=True)


def test_cli_parallel_decode_with_one_gpu_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["generate", "--model", "tiny-wan", "--prompt", "p", "--parallel-decode", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "workbench generate: error: --parallel-decode:" in err and "got --gpus 1" in err
    assert not out.exists()


def test_cli_parallel_decode_reaches_the_workers_accelerations(tmp_path, monkeypatch):
    """In a worker, `--gpus 2 --parallel-decode` opens the session with context_parallel parallel_decode='bands'
    (the session is stubbed: this checks the wiring; the decode itself is tested in the plugin's tests)."""
    import workbench
    from workbench import distributed

    seen = {}

    class Opened(Exception):
        pass

    def fake_open(model, **kwargs):
        seen.update(kwargs)
        raise Opened

    monkeypatch.setattr(distributed, "is_worker", lambda: True)
    monkeypatch.setattr(distributed, "init_worker", lambda device: torch.device("cpu"))
    monkeypatch.setattr(workbench.Session, "open", staticmethod(fake_open))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what the direct relayouts need on a CPU (else refused before)
    argv = ["generate", "--model", "tiny-wan", "--prompt", "p", "--gpus", "2", "--device", "cpu"]
    with pytest.raises(Opened):
        main([*argv, "--parallel-decode", "--out", str(tmp_path / "a")])
    assert seen["accelerations"] == {"context_parallel": {"ulysses_degree": 2, "parallel_decode": "bands"}}
    with pytest.raises(Opened):
        main([*argv, "--out", str(tmp_path / "b")])
    assert seen["accelerations"] == {"context_parallel": {"ulysses_degree": 2}}


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {WORKER_ENV: "1"},
            rf"^{WORKER_ENV}: '1' is set outside a torchrun worker \(RANK, LOCAL_RANK, WORLD_SIZE: not set",
        ),
        ({WORKER_ENV: "1", "RANK": "0", "LOCAL_RANK": "0"}, r"WORLD_SIZE: not set"),
        ({WORKER_ENV: "1", "RANK": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, r"RANK: 'x'; allowed: a non-negative"),
        ({WORKER_ENV: "1", "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, r"RANK: 2; allowed: 0 to 1"),
        ({WORKER_ENV: "yes"}, rf"^{WORKER_ENV}: 'yes'; allowed: unset, '0', or '1'"),
    ],
)
def test_stray_worker_switch_is_a_clear_error(monkeypatch, env, message):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        is_worker()


def test_stray_worker_switch_stops_the_cli_before_loading(monkeypatch, tmp_path, capsys):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(WORKER_ENV, "1")
    out = tmp_path / "out"
    assert main(["generate", "--model", "tiny-wan", "--prompt", "p", "--out", str(out)]) == 2
    assert f"{WORKER_ENV}: '1' is set outside a torchrun worker" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("value", [None, "", "0"])
def test_worker_switch_unset_or_off_is_not_a_worker(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(WORKER_ENV, raising=False)
    else:
        monkeypatch.setenv(WORKER_ENV, value)
    assert is_worker() is False
