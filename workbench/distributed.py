"""Several processes, one request: the torchrun launcher behind `workbench generate --gpus N` and the notebook way.

A context-parallel request needs one process per GPU, all running the same request with the same seed
(see `workbench.accelerations.parallel.context_parallel`). Three ways in:

- `workbench generate --gpus 2 ...`: the CLI re-executes itself under torchrun
  (`python -m torch.distributed.run --standalone --nproc-per-node 2 -m workbench.cli generate ...`). Each worker
  initialises the process group (NCCL on CUDA; gloo on CPU, which is for tests), opens the session on its own
  GPU, installs `context_parallel` with `ulysses_degree = N` and runs the request; rank 0 alone writes outputs.
- From a notebook: `generate(model, request, gpus=2)` or `run_arms(model, request, {name: accelerations})`
  starts the same workers as a subprocess and returns rank 0's `Result`s. A Jupyter kernel is one process and
  does not join the group; each call loads the model anew in the workers (`result.metadata["init_seconds"]`).
- A script of your own under torchrun: `device = init_worker("cuda")`, then `Session.open(..., device=device)`.
"""

from __future__ import annotations

import atexit
import datetime
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench.request import Request
from workbench.result import Result

WORKER_ENV = "WORKBENCH_PARALLEL_WORKER"
DEVICES = ("auto", "cuda", "cpu")


TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def is_worker() -> bool:
    """True inside a worker this module started: `launch` sets WORKBENCH_PARALLEL_WORKER=1 and torchrun sets RANK,
    LOCAL_RANK and WORLD_SIZE. The switch unset, "" or "0": not a worker. ValueError for any other value, and for
    "1" without a valid torchrun environment (the switch set stray by hand)."""
    value = os.environ.get(WORKER_ENV)
    if value in (None, "", "0"):
        return False
    if value != "1":
        raise ValueError(f"{WORKER_ENV}: {value!r}; allowed: unset, '0', or '1' (set by launch for its workers only)")
    try:
        torchrun_ranks()
    except ValueError as error:
        raise ValueError(
            f"{WORKER_ENV}: '1' is set outside a torchrun worker ({error}); it is set by workbench.distributed.launch "
            "for the workers it starts: unset it, and use --gpus N to run on several GPUs"
        ) from None
    return True


def torchrun_ranks() -> tuple[int, int, int]:
    """(RANK, LOCAL_RANK, WORLD_SIZE) from the environment torchrun gives a worker; ValueError naming a variable that
    is missing or not an integer in range (WORLD_SIZE >= 1, 0 <= RANK and LOCAL_RANK < WORLD_SIZE)."""
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise ValueError(f"{', '.join(missing)}: not set; a torchrun worker has all of {list(TORCHRUN_ENV)}")
    values = {}
    for name in TORCHRUN_ENV:
        try:
            values[name] = int(os.environ[name])
        except ValueError:
            raise ValueError(f"{name}: {os.environ[name][:40]!r}; allowed: a non-negative integer") from None
    world = values["WORLD_SIZE"]
    if world < 1:
        raise ValueError(f"WORLD_SIZE: {world}; allowed: an integer >= 1")
    for name in ("RANK", "LOCAL_RANK"):
        if not 0 <= values[name] < world:
            raise ValueError(f"{name}: {values[name]}; allowed: 0 to {world - 1} (WORLD_SIZE={world})")
    return values["RANK"], values["LOCAL_RANK"], world


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def check_gpus(gpus: int, device: str) -> str:
    """`gpus` processes on `device` ("auto", "cuda" or "cpu"); returns the device type the workers will use."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus: expected a positive int (the number of processes), got {gpus!r}")
    if device not in DEVICES:
        raise ValueError(
            f"device: {device!r} with gpus={gpus}; allowed: {list(DEVICES)} (each worker takes its own GPU)"
        )
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if kind == "cuda" and torch.cuda.device_count() < gpus:
        raise RuntimeError(
            f"gpus={gpus}: this machine has {torch.cuda.device_count()} CUDA device(s); use --device cpu for a gloo "
            "test run, or a machine with enough GPUs"
        )
    return kind


def check_cli_relayout(gpus: int, kind: str) -> None:
    """Refuse, before any process starts, a `workbench generate --gpus N` on the CPU whose workers (this process's
    environment) could not run `cli_accelerations`' direct relayouts: they need the Triton interpreter there."""
    from workbench.kernels._runtime import cpu_without_interpreter

    if gpus > 1 and cpu_without_interpreter(kind):
        raise ValueError(
            f"gpus={gpus} on cpu: the context-parallel relayout kernels need the Triton interpreter there; set "
            "TRITON_INTERPRET=1, or run on GPUs; from Python, `distributed.run_arms` with context_parallel's "
            "relayout='reference' runs the torch references instead"
        )


def torchrun_command(nproc: int, module: str, args: list[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m module args...` (a free port each time)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        *args,
    ]


def launch(
    nproc: int,
    module: str,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess:
    """Run `module` in `nproc` torchrun workers and wait. On timeout the whole process group it started is killed."""
    command = torchrun_command(nproc, module, args)
    environment = {**os.environ, **(env or {}), WORKER_ENV: "1"}
    pipe = subprocess.PIPE if capture else None
    process = subprocess.Popen(command, env=environment, stdout=pipe, stderr=pipe, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RuntimeError(f"{module}: {nproc} workers did not finish within {timeout} s; they were stopped") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def init_worker(device: str = "auto", timeout_s: float | None = None) -> torch.device:
    """In a torchrun worker: pick this rank's device, start the process group (NCCL on CUDA, gloo on CPU).

    `timeout_s` bounds how long a collective may wait for the other ranks (torch's default otherwise)."""
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        raise RuntimeError("init_worker: not in a torchrun worker (RANK/LOCAL_RANK unset); start it with torchrun")
    _, local, world = torchrun_ranks()
    kind = check_gpus(world, device)
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    if kind == "cuda":
        torch_device = torch.device("cuda", local)
        torch.cuda.set_device(torch_device)
        if not dist.is_initialized():
            dist.init_process_group("nccl", device_id=torch_device, timeout=timeout)
    else:
        torch_device = torch.device("cpu")
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=timeout)
    atexit.register(finish_worker)
    return torch_device


def finish_worker() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_worker(code: int = 0) -> None:
    """End a torchrun worker whose work is done and whose group is destroyed: flush stdio and leave with `code`
    without the interpreter's teardown, where gloo's threads can still abort the process (SIGABRT, "terminate called
    without an active exception") after every rank has finished."""
    finish_worker()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cli_accelerations(gpus: int, parallel_decode: bool = False) -> dict[str, dict[str, Any]]:
    """What `workbench generate --gpus N [--parallel-decode]` installs: Ulysses over N processes with the direct
    relayouts; with `parallel_decode`, also the Wan VAE decode split into one band per rank
    (`context_parallel.parallel_decode="bands"`: approximate against the untiled decode)."""
    if parallel_decode and gpus < 2:
        raise ValueError(
            f"--parallel-decode: splits the VAE decode over the ranks of a context-parallel request; it needs "
            f"--gpus N with N >= 2, got --gpus {gpus}"
        )
    options: dict[str, Any] = {"ulysses_degree": gpus}
    if parallel_decode:
        options["parallel_decode"] = "bands"
    return {"context_parallel": options}


def generate(
    model: str | Path,
    request: Request,
    gpus: int = 2,
    device: str = "auto",
    dtype: str | None = None,
    seed: int = 0,
    accelerations: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> Result:
    """One request on `gpus` worker processes (default: `context_parallel` Ulysses over all of them)."""
    config = cli_accelerations(gpus) if accelerations is None else accelerations
    return run_arms(model, request, {"request": config}, gpus, device, dtype, seed, env, timeout)["request"]


def run_arms(
    model: str | Path,
    request: Request,
    arms: dict[str, dict[str, Any]],
    gpus: int = 2,
    device: str = "auto",
    dtype: str | None = None,
    seed: int = 0,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    check_restore: bool = False,
) -> dict[str, Result]:
    """Load `model` once in `gpus` workers and run `request` under each arm's accelerations, in order.

    An arm `{}` runs the whole model in every process (what one process computes: the single-GPU reference);
    `{"context_parallel": {...}}` splits it over the group. Returns rank 0's Result per arm. `check_restore`
    adds `metadata["uninstall_restored"]`: the denoisers' and the VAE's fingerprints (state-dict hash, module
    types, hooks; for the VAE also its instance-level method overrides and tiling settings) after the arm was
    uninstalled equal the ones before (hashing copies every weight to the CPU: slow on big
    models). `env` is added to the workers' environment (e.g. TRITON_INTERPRET=1 for direct relayouts on CPU).
    """
    if not isinstance(model, str | Path):
        raise ValueError(f"model: expected a name or a local directory, got {type(model).__name__}")
    if not isinstance(request, Request):
        raise ValueError(f"request: expected a workbench.Request, got {type(request).__name__}")
    if not isinstance(arms, dict) or not arms or not all(isinstance(c, dict) for c in arms.values()):
        raise ValueError("arms: expected a non-empty dict of name -> accelerations config (a dict)")
    check_gpus(gpus, device)
    with tempfile.TemporaryDirectory(prefix="workbench-parallel-") as folder:
        spec = {
            "model": str(model),
            "request": request,
            "arms": arms,
            "device": device,
            "dtype": dtype,
            "seed": seed,
            "check_restore": check_restore,
            "out": str(Path(folder) / "results.pkl"),
        }
        spec_path = Path(folder) / "spec.pkl"
        spec_path.write_bytes(pickle.dumps(spec))
        done = launch(gpus, "workbench.distributed", [str(spec_path)], env=env, timeout=timeout, capture=True)
        if done.returncode != 0 or not Path(spec["out"]).is_file():
            raise RuntimeError(f"run_arms: workers exited with {done.returncode}:\n{_failure(done.stderr or '')}")
        return pickle.loads(Path(spec["out"]).read_bytes())  # written by our own worker into our own temp folder


def _failure(stderr: str) -> str:
    """What a failed group of workers said: each rank's exception line (torchrun prefixes a worker's output with
    `[rankN]:`), else the last 25 lines of their output."""
    lines = stderr.strip().splitlines()
    raised = [line for line in lines if re.match(r"\[rank\d+\]: [\w.]*(Error|Exception|Interrupt)\b", line)]
    return "\n".join(raised) if raised else "\n".join(lines[-25:])


def _restorable(model: Any, fingerprint: Any) -> list[Any]:
    """What uninstall must give back: each denoiser's fingerprint, and the VAE's with its instance-level method
    overrides and tiling settings (context_parallel's parallel_decode replaces `vae._decode`)."""
    state: list[Any] = [fingerprint(d) for d in model.denoisers()]
    vae = getattr(model.pipeline, "vae", None)
    if isinstance(vae, torch.nn.Module):
        overrides = sorted(k for k, v in vae.__dict__.items() if callable(v) and not isinstance(v, torch.nn.Module))
        tiling = {k: v for k, v in vae.__dict__.items() if k == "use_tiling" or k.startswith("tile_sample_")}
        state += [fingerprint(vae), overrides, tiling]
    return state


def _worker(spec_path: Path) -> None:
    from workbench import Session
    from workbench.accelerations import fingerprint

    spec = pickle.loads(spec_path.read_bytes())
    device = init_worker(spec["device"])
    try:
        session = Session.open(spec["model"], device=str(device), dtype=spec["dtype"], seed=spec["seed"])
        results: dict[str, Result] = {}
        for name, config in spec["arms"].items():
            before = _restorable(session.model, fingerprint) if spec["check_restore"] else None
            session.accelerate(config)
            try:
                result = session.generate(spec["request"], progress=False)
            finally:
                session.accelerate({})
            if before is not None:
                result.metadata["uninstall_restored"] = before == _restorable(session.model, fingerprint)
            results[name] = result
        if rank() == 0:
            temporary = Path(spec["out"] + ".tmp")
            temporary.write_bytes(pickle.dumps(results))
            temporary.rename(spec["out"])
        dist.barrier()  # no rank tears its connections down while another still uses them
    finally:
        finish_worker()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
    exit_worker(0)
