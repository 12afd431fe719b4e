"""What several scenarios share: the Wan2.1-1.3B workload, arm visits through the public Session API, attention captures.

Arms are `Session.accelerate` configs; a visit installs its arm (untimed), runs its calls, and removes it again
(`session.accelerate({})`), so A/B/A rounds see each arm fresh and the model stock between visits.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from workbench import Request, Session
from workbench.accelerations.attention.sparse_routing import Call, Router, Settings
from workbench.accelerations.base import Receipt
from workbench.evidence.timing import Timing, aba_rounds, kernel_times, time_call
from workbench.profiles import profile_plan
from workbench.quality.latent import rel_l2

WAN_TOKENS_GRID = (21, 30, 52)  # latent frames x height x width tokens of 81 x 480 x 832 after the (1, 2, 2) patch


def calls(smoke: bool, repeats: int, warmup: int) -> dict[str, Any]:
    """`time_call` keyword arguments: as given on a full run; one call, no warm-up, no queued clock in a smoke run
    (its numbers are not read, and the Triton interpreter makes every call slow)."""
    return {"repeats": 1, "warmup": 0, "queued": False} if smoke else {"repeats": repeats, "warmup": warmup}


def wan_request(steps: int, smoke: bool) -> Request:
    """480x832, 81 frames (32,760 tokens), CFG 5; `smoke`: 5 frames at 16x16, 1 step."""
    request = Request("a red circle moves left over a blue floor", seed=42, frames=81, height=480, width=832,
                      steps=steps, guidance=5.0)  # fmt: skip
    return dataclasses.replace(request, frames=5, height=16, width=16, steps=1) if smoke else request


def open_wan(smoke: bool, device: torch.device) -> Session:
    """random-wan-1.3b in bf16 on `device` (tiny-wan for `smoke`)."""
    return Session.open("tiny-wan" if smoke else "random-wan-1.3b", device=str(device), dtype="bfloat16")


def exact_fast(family: str, device: torch.device, notes: list[str], model: Any = None) -> dict[str, Any]:
    """The `exact-fast` profile's config here (for the loaded `model`, when given); what it leaves out on this machine
    or model goes into `notes`."""
    config, left_out = profile_plan("exact-fast", family, device, model)
    for plugin, reason in left_out.items():
        notes.append(f"exact-fast ({family}) runs without {plugin} here: {reason}.")
    return config


def split_arms(family: str, device: torch.device, world: int, notes: list[str]) -> dict[str, dict[str, Any]]:
    """The context-parallel scenarios' arms: one GPU and Ulysses over `world` ranks (the direct relayouts), each alone
    and with the exact-fast profile."""
    fast = exact_fast(family, device, notes)
    split = {"context_parallel": {"ulysses_degree": world, "relayout": "direct"}}
    return {"1-gpu": {}, "ulysses": split, "1-gpu+exact-fast": fast, "ulysses+exact-fast": {**fast, **split}}


def launch_ranks(module: str, ranks: int, rounds: int, smoke: bool, timeout: float) -> dict[str, Any]:
    """Run scenario `module`'s worker (`worker_main`) in `ranks` torchrun processes and return what rank 0 wrote
    ({shape, arms, ratios, notes}); RuntimeError when the workers fail."""
    from workbench import distributed

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "measurement.json"
        args = ["--worker", str(out), "--rounds", str(rounds), *(["--smoke"] if smoke else [])]
        done = distributed.launch(ranks, module, args, timeout=timeout)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"{module}: the {ranks} torchrun workers failed (exit code {done.returncode})")
        return json.loads(out.read_text())


def worker_main(description: str, worker: Callable[[Path, int, bool], None]) -> None:
    """A scenario module's `__main__` under torchrun: `worker(out, rounds, smoke)` from `launch_ranks`' arguments."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--worker", type=Path, required=True, help="where rank 0 writes its measurement (JSON)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny model, gloo on the CPU")
    arguments = parser.parse_args()
    worker(arguments.worker, arguments.rounds, arguments.smoke)


def rank_visit(session: Session, config: dict[str, Any], here: bool, work: Callable[[], Any]) -> float:
    """One visit of a torchrun rank: `config` installed, `work()` run on this rank when `here` (the others wait),
    between two barriers, the device synchronised; returns this rank's wall-clock seconds between the barriers (rank
    0's is the visit's time) and removes `config` again. A failing `work()` still meets the second barrier before its
    error is raised, so the ranks' barriers stay paired for the next visit."""
    import torch.distributed as dist

    session.accelerate(config)
    try:
        dist.barrier()
        start = time.perf_counter()
        failure: Exception | None = None
        if here:
            try:
                work()
                if session.device.type == "cuda":
                    torch.cuda.synchronize(session.device)
            except Exception as error:
                failure = error
        dist.barrier()
        if failure is not None:
            raise failure
        return time.perf_counter() - start
    finally:
        session.accelerate({})


def with_fp8_attention(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with fp8_attention (its defaults: int8 Q.K^T, FP8 P.V) as its self-attention; a dense backend in
    `config` (exact-fast's flash4_attention) keeps every other call (sparse_routing: ROUTED_ORDER)."""
    return config | {"fp8_attention": {}}


def wan_forward_inputs(session: Session, request: Request) -> tuple[dict[str, Any], dict[str, Any]]:
    """One transformer call's keyword arguments at `request`'s shape (random latents, timestep 500, the pipeline's
    own text encoding of the prompt) and their description."""
    pipe, device = session.model.pipeline, session.device
    request = session.resolve(request)
    frames = (request.frames - 1) // 4 + 1
    shape = (1, pipe.transformer.config.in_channels, frames, request.height // 8, request.width // 8)
    generator = torch.Generator(device).manual_seed(0)
    latents = torch.randn(shape, device=device, generator=generator).to(session.dtype)
    max_len = session.model.call_overrides.get("max_sequence_length", 512)
    with torch.inference_mode():
        text, _ = pipe.encode_prompt(
            request.prompt, do_classifier_free_guidance=False, max_sequence_length=max_len, device=device
        )
    kwargs = {"hidden_states": latents, "timestep": torch.tensor([500.0], device=device),
              "encoder_hidden_states": text.to(session.dtype), "return_dict": False}  # fmt: skip
    tokens = frames * (request.height // 16) * (request.width // 16)
    return kwargs, {"latents": list(shape), "text": list(text.shape), "tokens": tokens, "dtype": str(session.dtype)}


@dataclasses.dataclass
class ForwardArm:
    """One arm of a forward benchmark: its config, its checked output and its times."""

    name: str
    config: dict[str, Any]
    output: Any = None
    error: str | None = None
    timings: list[Timing] = dataclasses.field(default_factory=list)
    mismatches: int = 0  # timed visits whose last output differed from the checked one


class Forwards:
    """Visits of forward arms on one session: `visit(arm)` installs the arm, runs `warmup` untimed forwards (plugin
    caches fill: the steady state of step 2 on of a request), times `per_visit` forwards (`time_call`, synchronised
    clock), counts a visit whose last output differs from the arm's checked one (`mismatches`), and uninstalls."""

    def __init__(self, session: Session, forward: Callable[[], Any], per_visit: int, warmup: int):
        self.session, self.forward, self.per_visit, self.warmup = session, forward, per_visit, warmup

    def check(self, arm: ForwardArm) -> None:
        """Install and run `arm` once (compiles included), keeping its output; an arm that cannot run records why."""
        try:
            self.session.accelerate(arm.config)
            with torch.inference_mode():
                arm.output = self.forward()
        except Exception as error:  # reported in the envelope, the other arms go on
            arm.error = f"{type(error).__name__}: {error}"
        finally:
            self.session.accelerate({})

    def visit(self, arm: ForwardArm) -> float:
        last: list[Any] = [None]

        def run() -> None:
            last[0] = self.forward()

        self.session.accelerate(arm.config)
        try:
            with torch.inference_mode():
                timing = time_call(run, self.session.device, self.per_visit, self.warmup, queued=False)
        finally:
            self.session.accelerate({})
        arm.mismatches += not equal(last[0], arm.output)
        arm.timings.append(timing)
        return timing.median_s

    def kernels(self, arm: ForwardArm) -> dict[str, Any]:
        """Where one forward of `arm` spends device time (`kernel_times`), after the visit's untimed forwards; a
        profiler failure is recorded as {"error": ...} (a diagnostic must not lose the arms' measured rounds)."""
        self.session.accelerate(arm.config)
        try:
            with torch.inference_mode():
                for _ in range(self.warmup):
                    self.forward()
                return kernel_times(self.forward, self.session.device)
        except Exception as error:  # recorded in the row
            return {"error": f"{type(error).__name__}: {error}"}
        finally:
            self.session.accelerate({})

    def rows(self, arms: list[ForwardArm], stock: ForwardArm) -> dict[str, Any]:
        """Per arm: config, error, median and per-visit seconds, rel-L2 and equality against stock."""
        rows: dict[str, Any] = {}
        for arm in arms:
            row: dict[str, Any] = {"config": arm.config}
            if arm.error is not None:
                row["error"] = arm.error
            if arm.timings:
                seconds = [t.median_s for t in arm.timings]
                row.update(median_s=statistics.median(seconds), seconds=seconds, outputs_match_check=not arm.mismatches)
            if arm.output is not None and stock.output is not None:
                row.update(
                    rel_l2_vs_stock=rel_l2(arm.output, stock.output), equal_to_stock=equal(arm.output, stock.output)
                )
            rows[arm.name] = row
        return rows


def equal(a: Any, b: Any) -> bool:
    """torch.equal of two outputs (tensors or tuples of tensors)."""
    a, b = (a if isinstance(a, tuple | list) else (a,)), (b if isinstance(b, tuple | list) else (b,))
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@contextlib.contextmanager
def captured_attention(block: torch.nn.Module, tokens: int) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Record (q, k) (B, H, T, D) of the torch SDPA calls over `tokens` keys made inside `block`'s forward.

    Works while attention runs through `torch.nn.functional.scaled_dot_product_attention` (diffusers' native
    backend, the stock arm); the call itself runs unchanged."""
    records: list[tuple[torch.Tensor, torch.Tensor]] = []
    inside = [False]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query: torch.Tensor, key: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if inside[0] and key.shape[-2] == tokens:
            records.append((query.detach().clone(), key.detach().clone()))
        return sdpa(query, key, *args, **kwargs)

    hooks = [
        block.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
        block.register_forward_hook(lambda *_: inside.__setitem__(0, False)),
    ]
    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        yield records
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
        for hook in hooks:
            hook.remove()


def captured_qkv(
    session: Session, request: Request, keep: Callable[[int, int], bool] = lambda step, block: True
) -> list[dict[str, Any]]:
    """Run `request` on `session` as it is and record the q, k, v (B, T, H, D) of the family's routed self-attention
    calls (`sparse_routing`: the router takes each call and hands it to the backend unchanged).

    For quality measurements on real activations: `keep(step, block)` chooses which calls to hold (each holds three
    full tensors on the model's device); `step` counts over the whole request (the cache context's step index, else
    the denoiser's calls). Records: {"step", "block", "prefix", "q", "k", "v"}."""
    records: list[dict[str, Any]] = []

    def attend(call: Call) -> tuple[torch.Tensor, None]:
        if keep(call.router.step, call.block):
            q, k, v = (x.detach() for x in call.qkv)
            records.append(
                {"step": call.router.step, "block": call.block, "prefix": call.prefix, "q": q, "k": k, "v": v}
            )
        return call.backend_fn(**call.kwargs), None

    settings = Settings(tau=0.0, sink_tokens=0, protect_prefix=0)
    router = Router(
        "capture", session.model, Receipt(("sparse_calls",)), attend, lambda rows: settings, per_expert=False
    )
    router.reset(request.steps)
    router.install()
    try:
        session.generate(request, progress=False)
    finally:
        router.remove()
    return records


def tau_for(q: torch.Tensor, k: torch.Tensor, sink: int, target: float) -> dict[str, Any]:
    """Bisection on block_sparse's `tau` for a routing density near `target` (density falls as tau rises), with
    the kernel's own public `routing`; q, k (B, H, T, D)."""
    from workbench.kernels.block_sparse_attention import routing

    low, high = -4.0, 8.0
    floor = routing(q, k, high, sink)[1]
    if floor > target:  # the diagonal band and the sink rows alone exceed the target
        return {"tau": high, "density": floor, "target": target, "reachable": False}
    for _ in range(24):
        mid = (low + high) / 2
        if routing(q, k, mid, sink)[1] > target:
            low = mid
        else:
            high = mid
    tau = (low + high) / 2
    return {"tau": tau, "density": routing(q, k, tau, sink)[1], "target": target, "reachable": True}


def compare_forwards(
    forwards: Forwards, arms: list[ForwardArm], rounds: int, notes: list[str], kernels: bool = False
) -> tuple[dict, dict]:
    """Check every arm, then A/B/A rounds of the runnable ones against the first (stock): (arm rows, ratios).
    `kernels`: after the rounds, each arm that ran gets `kernels`, one forward's device time by kernel name."""
    for arm in arms:
        forwards.check(arm)
    stock, runnable = arms[0], [a for a in arms[1:] if a.error is None]
    if stock.error is not None:
        raise RuntimeError(f"the stock arm cannot run: {stock.error}")
    for arm in arms[1:]:
        if arm.error is not None:
            notes.append(f"arm {arm.name} could not run and is not timed: {arm.error}")
    result = aba_rounds(
        ("stock", lambda: forwards.visit(stock)), {a.name: (lambda a=a: forwards.visit(a)) for a in runnable}, rounds
    )
    for name, error in result.errors.items():
        notes.append(f"arm {name} failed during the rounds and was dropped: {error}")
    rows = forwards.rows(arms, stock)
    if kernels:
        for arm in [stock, *(a for a in runnable if a.name not in result.errors)]:
            rows[arm.name]["kernels"] = forwards.kernels(arm)
    return rows, {name: ci.to_dict() for name, ci in result.ratios().items()}
