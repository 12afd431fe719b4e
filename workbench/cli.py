"""`workbench generate ...`, `qualify`, `sweep`, `search`, `calibrate`, `batch`, `train-tiny` and `info`.

`qualify`, `sweep`, `search` and `calibrate` take `--ray [ADDRESS]`: their cells run on Ray workers, one resident
session each (`--memory`: planned under a cap, or for each worker's own GPU), into a resumable record store
(`--store`, default `<out>/cells`); see `workbench.evidence.fanout`. Every case is checked against the model on the
driver before Ray starts, as without Ray (`_check_cases_here`).
Without Ray, `calibrate`, `qualify`, `sweep` and `search` keep a partial record in `--out` while they run
(`<command>.partial.json`, rewritten after every tried value or finished case; removed once the final record is
written): `--resume DIR` continues it, running only what it does not hold (a partial record of other arguments is
refused, naming each field that differs); an `--out` holding one is refused without `--resume`. `calibrate
--max-seconds S` stops cleanly and prints the command that continues it.

A bad input (a bad value, a missing or unreadable file, JSON that does not parse, an `--out` that cannot be
written) exits with status 2 and one line on stderr naming the flag or file and what is wrong. Ctrl-C exits with
status 130 and one line saying what was kept and the command that goes on from there (`_interrupted`). Every `--out`
is created and probed for writing before a model loads, so no run loses its work to an unwritable folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

T = TypeVar("T")

if TYPE_CHECKING:
    from workbench.quality import Budget


class _Parser(argparse.ArgumentParser):
    """argparse, taking every word that reads as a negative number (`-5GiB`, `-1e3`, `-.5x`, `-inf`, `-nan`) as a
    flag's value: `--memory -5GiB` reaches the flag's own check (`--memory: '-5GiB' is not an amount of memory;
    allowed: ...`), where argparse takes only `-5` and `-.5` so and says `argument --memory: expected one argument`,
    nothing of what is allowed. No option of this command line starts with a dash and a digit, `inf` or `nan`, so no
    option reads as such a word. Every subcommand's parser is one of these (`add_parser` makes its parent's class).

    Flags are matched whole, never by prefix: `--mode i2v` is refused as an unrecognized argument, where argparse's
    abbreviations would read it as `--model i2v` (and a later `--model` would silently drop it)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"-(\.?\d|inf|nan)", re.IGNORECASE)  # argparse reads .match

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._words = list(sys.argv[1:] if args is None else args)  # for `error`; a subcommand's parser gets its own
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """argparse's usage error; where a flag's value starts with a dash (`--prompt -dog`, which argparse reads as
        a flag, leaving --prompt without a value), how to write it."""
        names = re.fullmatch(r"argument ([\w/-]+): expected one argument", message)
        words = getattr(self, "_words", [])
        for flag in names[1].split("/") if names else []:
            if flag in words[:-1] and (value := words[words.index(flag) + 1]).startswith("-"):
                message += f"; a value that starts with '-' goes after '=': {flag}={value}"
        super().error(message)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="workbench", description="Vflash Workbench")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="run one request and write MP4 + JSON + HTML report")
    gen.add_argument(
        "--model",
        default="demo-av",
        help="demo-av (the shipped trained model, default), demo-av-mini, tiny-wan, tiny-wan22, tiny-ltx2, tiny-h3, "
        "or a local diffusers directory",
    )
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--negative-prompt", default="")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--frames", type=int)
    gen.add_argument("--height", type=int)
    gen.add_argument("--width", type=int)
    gen.add_argument("--steps", type=int)
    gen.add_argument("--guidance", type=float)
    gen.add_argument("--fps", type=int)
    gen.add_argument("--device", default="auto")
    gen.add_argument("--dtype", default=None)
    gen.add_argument("--name", default="result", help="file stem of the outputs")
    gen.add_argument(
        "--out",
        required=True,
        type=_directory,
        help="directory for the outputs (created and probed before the model loads)",
    )
    gen.add_argument("--gpus", type=int, default=1, help="processes (one per GPU) running one context-parallel request")
    gen.add_argument(
        "--profile",
        default="stock",
        choices=("stock", "exact-fast", "within-budget"),
        help="a named acceleration set for the model's family and device (workbench.profiles)",
    )
    gen.add_argument("--calibration", type=Path, help="with --profile within-budget: the calibrate record it reads")
    gen.add_argument("--accelerate", default="{}", help="accelerations JSON, installed over --profile's set")
    gen.add_argument(
        "--adapter",
        action="append",
        default=[],
        help='a LoRA .safetensors fused into the denoiser: a path, or JSON {"path", "scale", "target", "name"}; repeat',
    )
    gen.add_argument(
        "--memory",
        help="device memory cap, e.g. 48GiB, 24GB or a card's name (rtx4090): planned before loading, refused if it "
        "cannot fit",
    )
    gen.add_argument(
        "--fp8-ring",
        action="store_true",
        help="with --memory: streamed denoiser blocks move as row-wise FP8 (half the bytes; approximate, exact=False)",
    )
    gen.add_argument(
        "--parallel-decode",
        action="store_true",
        help="with --gpus N >= 2: split the Wan VAE decode into one band per GPU (approximate vs untiled decode)",
    )

    qual = commands.add_parser("qualify", help="A/B/A qualification of a candidate against a baseline")
    qual.add_argument("--model", required=True)
    qual.add_argument("--suite", required=True, type=Path, help="a data_manifests/*.json suite")
    qual.add_argument("--cases", default="test", choices=("test", "calibration"))
    qual.add_argument("--baseline", default="{}", help="accelerations JSON of the baseline arm")
    qual.add_argument("--candidate", required=True, help="accelerations JSON of the candidate arm")
    qual.add_argument("--rounds", type=int, default=3)
    qual.add_argument("--budget", default="{}", help="JSON overrides of the quality budget")
    qual.add_argument("--device", default="auto")
    qual.add_argument("--out", required=True, type=_directory)
    qual.add_argument("--allow-other-model", action="store_true", help="run a suite pinned to another model")
    qual.add_argument(
        "--resume", type=Path, metavar="DIR", help="continue the run whose partial record (one case a step) is in DIR"
    )

    swp = commands.add_parser("sweep", help="qualify one plugin at each value of one option; knee, cliff, Pareto")
    swp.add_argument("--plugin", required=True, help="the acceleration plugin, e.g. easycache")
    swp.add_argument("--option", required=True, help="the option swept, e.g. threshold")
    swp.add_argument("--values", required=True, help="comma-separated JSON values (or a JSON list), e.g. 0,0.05,0.1")
    swp.add_argument("--base", default="{}", help="JSON options of the plugin kept fixed at every value")
    search_cmd = commands.add_parser("search", help="qualify fixed configurations; pick the fastest qualified")
    search_cmd.add_argument("--candidates", required=True, help="JSON list of accelerations configurations")
    for sub in (swp, search_cmd):
        sub.add_argument("--model", required=True)
        sub.add_argument("--suite", required=True, type=Path, help="a data_manifests/*.json suite")
        sub.add_argument("--cases", default="test", choices=("test", "calibration"))
        sub.add_argument("--baseline", default="{}", help="accelerations JSON of the baseline arm")
        sub.add_argument("--rounds", type=int, default=3)
        sub.add_argument("--budget", default="{}", help="JSON overrides of the quality budget")
        sub.add_argument("--device", default="auto")
        sub.add_argument("--out", required=True, type=_directory)
        sub.add_argument("--allow-other-model", action="store_true", help="run a suite pinned to another model")
        sub.add_argument(
            "--resume",
            type=Path,
            metavar="DIR",
            help="continue the run whose partial record (one configuration's case a step) is in DIR",
        )

    cal = commands.add_parser(
        "calibrate", help="the most aggressive setting inside a quality budget; several --plugin: a greedy stack"
    )
    cal.add_argument("--model", required=True)
    cal.add_argument("--suite", required=True, type=Path, help="a data_manifests/*.json suite (calibration + test)")
    cal.add_argument("--plugin", required=True, action="append", help="a plugin with a knob; repeat to stack")
    cal.add_argument("--knob", help="the option searched: the plugin's declared knob, checked when given")
    cal.add_argument("--budget", default="{}", help="JSON overrides of the default budget (audio limits included)")
    cal.add_argument(
        "--options", default="{}", help="JSON plugin -> fixed options besides the knob, e.g. mag_cache's mag_ratios"
    )
    cal.add_argument("--margin", type=float, default=0.8, help="share of the budget a setting may use when searched")
    cal.add_argument("--max-evals", type=int, default=7, help="knob values tried per search")
    cal.add_argument("--base-profile", default="exact-fast", choices=("exact-fast", "stock"), help="installed under")
    cal.add_argument("--rounds", type=int, default=3, help="A/B/A rounds of the confirmation")
    cal.add_argument("--device", default="auto")
    cal.add_argument("--out", required=True, type=_directory)
    cal.add_argument("--allow-other-model", action="store_true", help="run a suite pinned to another model")
    cal.add_argument(
        "--register",
        action="store_true",
        help="add the attention_policy entry the run earns (if any) to the committed qualified_attention.json",
    )
    cal.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="continue the run whose partial record (written after every step) is in DIR",
    )
    cal.add_argument(
        "--max-seconds",
        type=float,
        help="stop cleanly at a step boundary: a new step starts only while it is expected to end within this many "
        "seconds, and every call runs at least one new step, so a call can end past them; prints how to resume",
    )

    tiny = commands.add_parser("train-tiny", help="train a demo-av preset on synthetic scenes (resumable)")
    tiny.add_argument(
        "--out", required=True, type=_directory, help="run folder: checkpoint/, <preset>/, train.json, loss.png"
    )
    tiny.add_argument(
        "--preset",
        default="demo-av",
        help="architecture: av2 (the shipped demo-av: 49x128x128, stereo) or demo-av (the shipped demo-av-mini: 9x64x64)",
    )
    tiny.add_argument("--minutes", type=float, default=6.0, help="training time of this call")
    tiny.add_argument(
        "--wall-minutes",
        type=float,
        help="limit on the whole call from set-up to record (Python's start-up not counted): training stops early "
        "enough for export and evaluation",
    )
    tiny.add_argument("--device", default="cuda")
    tiny.add_argument("--resume", action="store_true", help="continue from --out/checkpoint")
    tiny.add_argument("--train-clips", type=int, default=4096)
    tiny.add_argument("--ae-minutes", type=float, help="the autoencoder stage's planned total (default: 0.4 x minutes)")
    tiny.add_argument("--ae-train", default="all", help="autoencoders trained this call: video, audio or all")
    tiny.add_argument("--denoise-minutes", type=float, help="the denoiser stage's planned total (LR anneal)")
    tiny.add_argument(
        "--ae-batch", type=int, help="video clips per autoencoder step (audio: twice); default: the checkpoint's, or 24"
    )
    tiny.add_argument("--denoise-batch", type=int, default=256)
    tiny.add_argument("--vocoder-lr", type=float, default=1e-4, help="peak learning rate of --stage vocoder")
    tiny.add_argument(
        "--vocoder-reset", action="store_true", help="with --stage vocoder: start from a freshly initialised vocoder"
    )
    tiny.add_argument("--eval-requests", type=int, default=32, help="held-out requests generated at the end")
    tiny.add_argument(
        "--stage", choices=("vocoder", "denoiser"), help="with --resume: train only this stage for --minutes"
    )
    tiny.add_argument(
        "--pack", type=Path, help="also write the run as <=15 MiB tar parts (+ train.json, loss.png) here"
    )
    tiny.add_argument(
        "--profile-steps", type=int, default=0, help="profile this many steps of each stage: OUT/profile-STAGE.txt"
    )
    tiny.add_argument(
        "--compile", action="store_true", help="the denoiser's transformer blocks through torch.compile (regional)"
    )

    bat = commands.add_parser("batch", help="generate many requests of one model on Ray workers; outputs per request")
    bat.add_argument("--model", required=True)
    bat.add_argument("--requests", required=True, type=Path, help="JSON list of requests (with 'name'), or a suite")
    bat.add_argument("--accelerate", default="{}", help="accelerations JSON installed on every worker")
    bat.add_argument("--dtype", default=None)
    bat.add_argument("--out", required=True, type=_directory, help="the store: entries/<key>.json, outputs/<name>/")
    for sub in (qual, swp, search_cmd, cal, bat):
        sub.add_argument(
            "--ray",
            nargs="?",
            const="local",
            metavar="ADDRESS",
            help="run the cells on Ray workers: a cluster's ADDRESS ('auto': the running one), none: start a local one",
        )
        sub.add_argument("--workers", type=int, help="with --ray: workers (default: one per GPU, 1 on CPU)")
        sub.add_argument("--retries", type=int, default=2, help="with --ray: re-runs of a cell whose worker died")
        sub.add_argument(
            "--memory",
            help="with --ray: each worker's device memory cap (48GiB, a card's name) or 'device' (its own GPU's)",
        )
        if sub is not bat:
            sub.add_argument("--store", type=Path, help="with --ray: the record store (default: <out>/cells)")
    bat.add_argument("--device", default="auto", help="auto, cuda or cpu (one GPU per worker)")

    commands.add_parser("info", help="versions, device and registered model families")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `--gpus N` re-executes under torchrun
    args.started = time.perf_counter()  # what `calibrate --max-seconds` counts from
    try:
        if args.command not in ("batch", "generate", "info", "train-tiny") and args.ray is None:
            if args.workers is not None or args.store is not None or args.retries != 2:
                raise ValueError("--workers, --retries, --store: go with --ray")
            if args.memory is not None:
                raise ValueError("--memory: goes with --ray here (generate takes it for its own session)")
        if args.command == "qualify":
            return _qualify(args)
        if args.command in ("sweep", "search"):
            return _sweep_or_search(args)
        if args.command == "calibrate":
            return _calibrate(args)
        if args.command == "train-tiny":
            return _train_tiny(args)
        if args.command == "batch":
            return _batch(args)
        return _generate(args) if args.command == "generate" else _info()
    except (ValueError, RuntimeError, OSError) as error:
        message = " ".join(str(error).split())  # one line, whatever the message holds
        print(f"workbench {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was kept and how to go on, not a traceback from wherever it hit
        print(f"\nworkbench {args.command}: interrupted; {_interrupted(args)}", file=sys.stderr)
        return 130


def _generate(args: argparse.Namespace) -> int:
    from workbench import Request, Result, Session, distributed
    from workbench.accelerations.attention.attention_policy import model_key
    from workbench.accelerations.memory.ring import AS_STORED, FP8
    from workbench.io import check_targets, check_writable
    from workbench.media import verify_mp4
    from workbench.memory_plan import MemoryBudget, parse_cap
    from workbench.profiles import calibration_record, profile_plan, within_budget

    fields = ("frames", "height", "width", "steps", "guidance", "fps")
    flags = ("--prompt", "--negative-prompt", "--seed", *(f"--{name}" for name in fields))  # `seed: ...` as `--seed: `
    request = _flagged(
        flags,
        Request,
        args.prompt,
        negative_prompt=args.negative_prompt,
        seed=args.seed,
        **{name: getattr(args, name) for name in fields},
    )
    device, accelerations = args.device, {}
    extra = _accelerations_arg("accelerate", args.accelerate)  # refused before the model loads
    adapters = [_adapter_arg(text) for text in args.adapter]
    if args.fp8_ring and args.memory is None:
        raise ValueError("--fp8-ring: FP8 transfers are how a memory cap's ring moves blocks; give --memory too")
    transfer = FP8 if args.fp8_ring else AS_STORED
    memory = None if args.memory is None else MemoryBudget(args.memory, request=request, ring_transfer=transfer)
    if args.memory is not None:
        parse_cap(args.memory, "--memory")  # refused here, before loading, under the flag's name
    if not distributed.is_worker():  # probed once by the launcher: ranks probing one folder at once race each other
        check_writable(args.out, "--out")
    check_targets(args.out, Result.saved_names(args.name, "--name", args.out), "--out")  # against --out's file system
    if (args.profile == "within-budget") != (args.calibration is not None):
        raise ValueError("--calibration: a calibrate record goes with --profile within-budget, and only with it")
    if args.calibration is not None:
        calibration_record(args.calibration, "--calibration")  # its form; where it holds is checked once loaded
    if args.parallel_decode:  # a bad combination is refused before any process starts
        distributed.cli_accelerations(args.gpus, parallel_decode=True)
    shapes = None if distributed.is_worker() else _shapes(args.model)  # the launcher checks it for every rank
    if shapes is not None:
        _flagged(flags, shapes.resolve, request)  # a request the model refuses, before its weights load
    if args.gpus != 1 or distributed.is_worker():  # see workbench.distributed
        distributed.check_cli_relayout(args.gpus, distributed.check_gpus(args.gpus, args.device))
        if not distributed.is_worker():
            return distributed.launch(args.gpus, "workbench.cli", args.argv).returncode
        device = str(distributed.init_worker(args.device))
        accelerations = distributed.cli_accelerations(args.gpus, parallel_decode=args.parallel_decode)
    session = Session.open(
        args.model,
        device=device,
        dtype=args.dtype,
        seed=args.seed,
        accelerations=accelerations,
        memory=memory,
        adapters=adapters,
    )
    _flagged(flags, session.resolve, request)  # refuse a bad request before any work
    print(f"loaded {session} in {session.init_seconds:.2f} s", file=sys.stderr)
    if session.memory_plan is not None:
        print(session.memory_plan, file=sys.stderr)
    if args.profile != "stock" or extra:
        if args.profile == "within-budget":
            resolved = session.resolve(request).to_dict()
            held = {"key": model_key(session.model), "dtype": str(session.dtype).removeprefix("torch.")}
            chosen = within_budget(args.calibration, session.model.name, session.device, resolved, **held)
            left_out = {}
        else:
            chosen, left_out = profile_plan(args.profile, session.model.family.name, session.device, session.model)
        for plugin, reason in left_out.items():
            print(f"profile {args.profile}: {plugin} left out ({reason})", file=sys.stderr)
        installed = session.accelerate({**accelerations, **chosen, **extra})
        print(f"accelerations: {', '.join(installed) or 'none'}", file=sys.stderr)
    result = session.generate(request, progress=distributed.rank() == 0)
    if distributed.rank() != 0:  # one request over the group: rank 0 writes it
        return 0
    for plugin in extra:  # asked for by name: say so when it did nothing at this request (its receipt shows why)
        if not result.receipts.get(plugin, {}).get("executed", True):
            print(f"warning: {plugin} did no work at this request (receipt executed=false)", file=sys.stderr)
    mp4 = result.save(args.out, args.name)
    report = verify_mp4(mp4, result.frames.shape[0], result.audio_seconds)
    timings = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in result.timings.items())
    print(f"timings: {timings}", file=sys.stderr)
    print(f"video:  {mp4}")
    print(f"report: {mp4.with_suffix('.html')}")
    print(f"record: {mp4.with_suffix('.json')}")
    if not report.ok:
        print(f"media check: {'; '.join(report.problems)}", file=sys.stderr)
    return 0


def _qualify(args: argparse.Namespace) -> int:
    from workbench import Session
    from workbench.evidence.harness import check_requests, check_rounds, default_budget, qualify
    from workbench.evidence.manifest import load_manifest
    from workbench.evidence.records import record_bytes
    from workbench.evidence.report import render
    from workbench.io import check_writable, write_set
    from workbench.quality import Budget

    configs = {name: _accelerations_arg(name, getattr(args, name)) for name in ("baseline", "candidate")}
    _note_a_a(configs["baseline"], {"--candidate": configs["candidate"]})
    configs["budget"] = _json_arg("budget", args.budget)
    _flagged("--budget", Budget.from_dict, configs["budget"])  # bad overrides: refused before anything loads
    _flagged("--rounds", check_rounds, args.rounds)
    suite = load_manifest(args.suite, model=args.model, allow_other_model=args.allow_other_model)
    requests = [case.to_request() for case in getattr(suite, args.cases)]
    identity = {"suite": {"name": suite.name, "sha256": suite.sha256, "cases": args.cases}}
    arms = {"baseline": configs["baseline"], "candidate": configs["candidate"], "rounds": args.rounds}
    _check_resume(args, arms | {"requests": [r.to_dict() for r in requests]} | identity)
    check_writable(args.out, "--out")
    _note_replaced(args.out, ["qualification.json", "qualification.html"])
    if args.ray is not None:
        from workbench.evidence import fanout_jobs

        _check_cases_here(args, {args.cases: requests})
        with _fanout(args) as (fanout, store):
            budget = _budget(fanout.default_budget(), configs["budget"])
            record = fanout_jobs.qualify(
                fanout, store, requests, configs["baseline"], configs["candidate"], args.rounds, budget
            )
        pilots = None  # the pilots stayed on the workers: the report says the videos are not embedded
    else:
        session = Session.open(args.model, device=args.device)
        check_requests(session, requests, args.cases)  # a case the model refuses, named before any case runs
        budget = _budget(default_budget(session), configs["budget"])
        resume = {"resume": args.resume or args.out, "identity": identity}  # the partial record lives there
        record, pilots = qualify(
            session, requests, configs["baseline"], configs["candidate"], args.rounds, budget, **resume
        )
    record["suite"] = {"name": suite.name, "path": str(args.suite), "sha256": suite.sha256, "cases": args.cases}
    files = {"qualification.json": record_bytes(record), "qualification.html": render(record, pilots).encode()}
    paths = write_set(args.out, files)
    _remove_partial(args, "qualify")
    print(f"verdict: {record['verdict']}")
    print(f"record: {paths['qualification.json']}")
    print(f"report: {paths['qualification.html']}")
    return 0


def _sweep_or_search(args: argparse.Namespace) -> int:
    from workbench import Session
    from workbench.evidence import sweep as sweeps
    from workbench.evidence.harness import check_requests, check_rounds
    from workbench.evidence.manifest import load_manifest
    from workbench.evidence.report import NO_SPEED_CLAIM
    from workbench.io import check_writable
    from workbench.quality import Budget

    configs = {"baseline": _accelerations_arg("baseline", args.baseline), "budget": _json_arg("budget", args.budget)}
    values = None
    if args.command == "sweep":
        configs["base"] = _json_arg("base", args.base)
        values = _values_arg(args.values)
        _check_sweep(args.plugin, args.option, values, configs["base"])
    candidates = _candidates_arg(args.candidates) if args.command == "search" else None
    _note_a_a(configs["baseline"], {f"--candidates[{i}]": c for i, c in enumerate(candidates or [])})
    _flagged("--budget", Budget.from_dict, configs["budget"])  # bad overrides: refused before anything loads
    _flagged("--rounds", check_rounds, args.rounds)
    suite = load_manifest(args.suite, model=args.model, allow_other_model=args.allow_other_model)
    requests = [case.to_request() for case in getattr(suite, args.cases)]
    identity = {"suite": {"name": suite.name, "sha256": suite.sha256, "cases": args.cases}}
    if args.command == "sweep":
        known = {"plugin": args.plugin, "option": args.option, "values": values, "base_options": configs["base"]}
    else:
        known = {"candidates": candidates}
    known |= {"baseline": configs["baseline"], "rounds": args.rounds, "requests": [r.to_dict() for r in requests]}
    _check_resume(args, known | identity)
    check_writable(args.out, "--out")
    _note_replaced(args.out, [f"{args.command}.json", f"{args.command}.html"])
    if args.ray is not None:
        from workbench.evidence import fanout_jobs

        _check_cases_here(args, {args.cases: requests})
        with _fanout(args) as (fanout, store):
            budget = _budget(fanout.default_budget(), configs["budget"])
            run = fanout_jobs.sweep if args.command == "sweep" else fanout_jobs.search
            result = run(fanout, store, requests, *_sweep_arguments(args, configs, values, candidates), budget)
    else:
        session = Session.open(args.model, device=args.device)
        check_requests(session, requests, args.cases)  # a case the model refuses, named before any case runs
        budget = _budget(sweeps.default_budget(session), configs["budget"])
        run = sweeps.sweep if args.command == "sweep" else sweeps.search
        resume = {"resume": args.resume or args.out, "identity": identity}  # the partial record lives there
        result = run(session, requests, *_sweep_arguments(args, configs, values, candidates), budget, **resume)
    if args.command == "sweep":
        print(f"knee: {_show(result.knee)}; cliff: {_show(result.cliff)}")
        print(f"recommended: {_show(result.recommended)} ({result.reason})")
    else:
        print(f"best: {_show(result.best)} ({result.reason})")
    for row in result.rows:
        # A verdict that makes no speed claim (`report.NO_SPEED_CLAIM`) shows no speed-up.
        speed = "" if row.verdict in NO_SPEED_CLAIM else f", speed-up {row.speedup:.4f}"
        print(f"  {row.label}: {row.verdict}{speed}, within budget {row.within_budget}")
    record, page = sweeps.write(result, args.out)
    _remove_partial(args, args.command)
    print(f"record: {record}")
    print(f"report: {page}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from workbench import Session
    from workbench.evidence import calibrate as calibration
    from workbench.evidence.harness import check_requests, check_rounds
    from workbench.evidence.manifest import load_manifest
    from workbench.io import check_writable
    from workbench.profiles import profile
    from workbench.quality import Budget

    overrides = _json_arg("budget", args.budget)
    _flagged("--budget", Budget.from_dict, overrides)  # an unknown field or a bad limit: refused before loading
    if args.knob is not None and len(args.plugin) > 1:
        raise ValueError("--knob: names one plugin's option; give it with a single --plugin")
    if args.register:
        from workbench.accelerations.attention.attention_policy import ROOT

        if not args.out.resolve().is_relative_to(ROOT):
            raise ValueError(
                f"--register: --out {args.out} must be inside the repository {ROOT} (the committed registry points "
                "at the evidence by a path relative to it)"
            )
    flags = ("--plugin", "--knob", "--margin", "--max-evals")
    _flagged(flags, calibration.check_arguments, args.plugin, args.knob, args.margin, args.max_evals)
    _flagged("--rounds", check_rounds, args.rounds)
    fixed = calibration.check_options(args.plugin, _json_arg("options", args.options))
    suite = load_manifest(args.suite, model=args.model, allow_other_model=args.allow_other_model)
    if not suite.calibration or not suite.test:
        raise ValueError(f"--suite: {args.suite} needs both calibration and test cases")
    if args.ray is not None and (args.resume is not None or args.max_seconds is not None):
        raise ValueError("--resume, --max-seconds: not with --ray (its --store resumes a Ray run cell by cell)")
    if args.max_seconds is not None and not args.max_seconds >= 0:
        raise ValueError(f"--max-seconds: {args.max_seconds!r}; allowed: seconds >= 0")
    _check_resume(args, {})  # its form, before loading; which run made it is checked once loaded
    check_writable(args.out, "--out")
    kind = "calibration" if len(args.plugin) == 1 else "stack"
    _note_replaced(args.out, [f"{kind}.json", f"{kind}.html"])
    calibration_requests = [case.to_request() for case in suite.calibration]
    test = [case.to_request() for case in suite.test]
    options = {"margin": args.margin, "max_evals": args.max_evals, "rounds": args.rounds}
    if args.ray is not None:
        from workbench.evidence import fanout_jobs

        _check_cases_here(args, {"calibration": calibration_requests, "test": test})
        with _fanout(args) as (fanout, store):
            result = fanout_jobs.calibrate(
                fanout, store, calibration_requests, test, args.plugin, overrides, knob=args.knob,
                base_profile=args.base_profile, fixed=fixed, **options,
            )  # fmt: skip
        return _calibrate_report(args, result)
    session = Session.open(args.model, device=args.device)
    for split, requests in (("calibration", calibration_requests), ("test", test)):
        check_requests(session, requests, split)  # a case the model refuses, named before any case runs
    budget = _budget(calibration.default_budget(session), overrides)
    base = profile(args.base_profile, session.model.family.name, session.device, session.model)
    options["resume"] = args.resume or args.out  # the partial record, rewritten after every step, lives there
    if args.max_seconds is not None:  # counted from the call's start, loading included; its reason quotes the flag
        options["max_seconds"], options["started"] = args.max_seconds, args.started
    if len(args.plugin) == 1:
        result = calibration.calibrate(
            session, calibration_requests, test, args.plugin[0], budget, knob=args.knob, base=base,
            options=fixed.get(args.plugin[0]), **options,
        )  # fmt: skip
    else:
        result = calibration.stack(
            session, calibration_requests, test, args.plugin, budget, base=base, options=fixed, **options
        )
    return _calibrate_report(args, result)


def _calibrate_report(args: argparse.Namespace, result) -> int:
    from workbench.evidence import calibrate as calibration
    from workbench.evidence.resume import Partial

    if isinstance(result, Partial):
        print(f"partial: {result.reason}")
        print(f"record: {result.path}")
        print(f"resume: {_resume_command(args, result.path.parent)}")
        return 0
    if isinstance(result, calibration.Calibration):
        print(f"knee: {_show(result.knee)}; cliff: {_show(result.cliff)}")
    else:
        for plugin, why in result.left_out.items():
            print(f"left out {plugin}: {why}")
    print(f"{result.status}: {result.reason}")
    print(f"setting: {_show(None if result.status == 'no_setting' else result.config)}")
    record, page = calibration.write(result, args.out)
    _remove_partial(args, "calibrate")
    print(f"record: {record}")
    print(f"report: {page}")
    if args.register:
        from workbench.accelerations.attention import attention_policy

        earned = Path(args.out) / "attention_registry.json"
        if calibration.registry_entry(result, str(earned)) is not None:  # this run's: not one left by an earlier run
            for entry in attention_policy.load_registry(earned):
                print(f"registered: {entry['plugin']} at {entry['video_tokens']} video rows in "
                      f"{attention_policy.register(entry)}")  # fmt: skip
        else:
            print("not registered: the run earned no attention_policy entry (registry_entry: a calibrated "
                  "sparse-attention setting, qualified alone)")  # fmt: skip
    return 0


_NOUNS = {"calibrate": "calibration", "qualify": "qualification", "sweep": "sweep", "search": "search"}
_UNITS = {"qualify": "case", "sweep": "(value, case) pair", "search": "(candidate, case) pair"}  # a record's step


def _check_resume(args: argparse.Namespace, known: dict[str, Any]) -> None:
    """The partial-record flags of an evidence command (`calibrate`, `qualify`, `sweep`, `search`), before any
    model loads: `--resume` refused with `--ray` (its store resumes by cell) or naming a folder with no partial
    record of this command (the path named); an `--out` holding one refused without `--resume` (continue it, or
    choose another `--out`); the partial record's form (`read_partial`) and the fields of its run that the command
    line alone decides (`known`: `resume.check_run`, each differing field with its recorded and given value). The
    rest (budget, model, dtype, device) is checked once the model is loaded."""
    from workbench.evidence.resume import check_run, partial_path, read_partial

    noun = _NOUNS[args.command]
    if args.resume is not None and args.ray is not None:
        raise ValueError("--resume: not with --ray (its --store resumes a Ray run cell by cell: run the same command)")
    if args.resume is not None:
        path = partial_path(args.resume, args.command)
        if not path.exists():
            raise ValueError(f"--resume: {args.resume} holds no partial {noun} record ({path})")
        check_run(path, read_partial(path), known, fields=True)
    elif args.ray is None and (path := partial_path(args.out, args.command)).exists():
        raise ValueError(
            f"--out: {args.out} holds a partial {noun} record ({path.name}); continue it with --resume "
            f"{args.out}, or choose another --out"
        )


def _remove_partial(args: argparse.Namespace, command: str) -> None:
    """Once the final record of `command` is published (without `--ray`): remove its partial record, which the final
    record holds whole."""
    from workbench.evidence.resume import partial_path

    if args.ray is None:
        partial_path(args.resume or args.out, command).unlink(missing_ok=True)


def _resume_command(args: argparse.Namespace, folder: Path) -> str:
    """The command line of this evidence command (`calibrate`, `qualify`, `sweep`, `search`) continuing the partial
    record in `folder` (`--resume` replaced)."""
    argv, skip = [], False
    for item in args.argv:
        if not skip and item != "--resume" and not item.startswith("--resume="):
            argv.append(item)
        skip = item == "--resume"
    return shlex.join(["workbench", *argv, "--resume", str(folder)])


def _interrupted(args: argparse.Namespace) -> str:
    """What an interrupted (Ctrl-C) evidence command kept, and the command that goes on from there: without `--ray`
    its partial record (the steps, cases or (configuration, case) pairs finished, and the `--resume` command), with
    `--ray` its store (the same command runs only the cells not finished there). Nothing is half-written
    (`workbench.io`): what was not published is gone, whole."""
    from workbench.evidence.resume import partial_path, read_partial
    from workbench.evidence.store import Store

    again = shlex.join(["workbench", *args.argv])
    if args.command not in ("qualify", "sweep", "search", "calibrate", "batch"):
        return "nothing was written"
    if args.ray is not None or args.command == "batch":  # batch always fans out, into its --out
        store = Store(_store_folder(args))
        try:
            done = sum(entry["status"] == "finished" for entry in store.entries().values())
        except (ValueError, OSError):
            done = "its"
        return f"the store {store.root} keeps {done} finished cell(s); the same command runs only the rest: {again}"
    path = partial_path(args.resume or args.out, args.command)
    unit = _UNITS.get(args.command, "step")
    try:
        record = read_partial(path) if path.exists() else None
    except (ValueError, OSError):
        record = None
    if record is None:
        return f"no {unit} was recorded yet; nothing to continue, the same command starts again: {again}"
    done = len(record["steps"])
    if args.command == "calibrate":
        shown = f"{done} step(s) recorded"
    else:
        total = done + (record.get("remaining") or {}).get("at_most", 0)
        shown = f"{done} of {total} {unit}(s) finished and recorded"
    return f"{shown} in {path}; continue: {_resume_command(args, path.parent)}"


def _batch(args: argparse.Namespace) -> int:
    from workbench.evidence import fanout_jobs
    from workbench.io import check_writable

    accelerations = _accelerations_arg("accelerate", args.accelerate)
    requests = fanout_jobs.read_requests(args.requests)
    check_writable(args.out, "--out")
    _check_cases_here(args, {"requests": [request for _, request in requests]})
    with _fanout(args) as (fanout, store):
        entries = fanout_jobs.batch(fanout, store, requests, accelerations)
    for name, entry in entries.items():
        print(
            f"{name}: {args.out / entry['outputs'] / name}.mp4 ({entry['worker']['host']}, {entry['worker']['label']})"
        )
    return 0


def _check_cases_here(args: argparse.Namespace, splits: dict[str, list]) -> None:
    """`--ray`: every case resolved against the model's family and defaults here, on the driver, before Ray starts,
    as the run without Ray does once its session loads: `test[1]: frames: 10 is not accepted by the wan VAE`. See
    `_shapes` for a model whose shapes do not build here: its cases are checked on a worker once it has loaded."""
    from workbench.evidence.harness import check_requests

    model = _shapes(args.model)
    if model is None:
        return
    for where, requests in splits.items():
        check_requests(model, requests, where)


def _shapes(model: str) -> Any:
    """`models.preview(model)`: its family and request defaults with no weight read, to check requests before it
    loads. None when its shapes do not build here (a folder only the Ray workers hold, a config the meta device
    cannot build, a name that is no model): the model's own load then reports what is wrong, or checks the requests
    once loaded, as `Session.open`'s memory planning leaves such a model to the load."""
    from workbench.models import preview

    try:
        return preview(model)
    except (ValueError, RuntimeError):
        return None


@contextlib.contextmanager
def _fanout(args: argparse.Namespace):
    """(Fanout, Store) of a `--ray` run, progress on stderr; the workers end with the block."""
    from workbench.evidence.fanout import Fanout, Store, TqdmView

    address = None if args.ray in (None, "local") else args.ray
    device = args.device
    options = {"address": address, "workers": args.workers, "device": device, "retries": args.retries}
    options["memory"] = args.memory
    flags = ("--workers", "--device", "--retries", "--memory")  # `workers: ...` said as `--workers: ...`
    with _flagged(flags, Fanout, args.model, dtype=getattr(args, "dtype", None), **options) as fanout:
        fanout.subscribe(TqdmView())
        yield fanout, Store(_store_folder(args))


def _store_folder(args: argparse.Namespace) -> Path:
    """The record store of a `--ray` run: `--out` itself for `batch` (its outputs live there), else `--store` or
    `<out>/cells`."""
    return args.out if args.command == "batch" else args.store or args.out / "cells"


def _budget(default: Budget, overrides: dict[str, Any]) -> Budget:
    """The model's default budget with the command line's `--budget` overrides (`null` drops a limit)."""
    from workbench.quality import Budget

    return Budget.from_dict({**default.to_dict(), **overrides})


def _sweep_arguments(args: argparse.Namespace, configs: dict, values: list | None, candidates: list | None) -> tuple:
    """The positional arguments of `sweep` (or `search`) after the requests, up to the budget."""
    if args.command == "sweep":
        return args.plugin, args.option, values, configs["base"], configs["baseline"], args.rounds
    return candidates, configs["baseline"], args.rounds


def _train_tiny(args: argparse.Namespace) -> int:
    from workbench.io import check_writable
    from workbench.training.config import TrainConfig
    from workbench.training.train_tiny import train

    fields = (
        "out",
        "preset",
        "minutes",
        "wall_minutes",
        "device",
        "resume",
        "train_clips",
        "ae_minutes",
        "ae_train",
        "denoise_minutes",
        "ae_batch",
        "denoise_batch",
        "vocoder_lr",
        "vocoder_reset",
        "eval_requests",
        "pack",
        "profile_steps",
        "compile",
        "stage",
    )
    config = TrainConfig(**{name: getattr(args, name) for name in fields})
    flags = tuple(f"--{name.replace('_', '-')}" for name in fields)
    _flagged(flags, config.validate)  # a bad option is refused before --out is made, under its flag
    check_writable(args.out, "--out")
    if args.pack is not None:
        check_writable(args.pack, "--pack")
    record = train(config)
    print(f"model:  {args.out / args.preset}")
    print(f"record: {args.out / 'train.json'}")
    if "eval" in record:
        print(f"caption match (held-out seeds): {json.dumps(record['eval']['all'])}")
    return 0


def _values_arg(text: str) -> list:
    """`--values`: a JSON list, or comma-separated JSON values (strings quoted: '"a","b"')."""
    stripped = text.strip()
    try:
        values = json.loads(stripped) if stripped.startswith("[") else [json.loads(item) for item in text.split(",")]
    except json.JSONDecodeError as error:
        raise ValueError(
            f"--values: {text!r} is not a comma-separated list of JSON values, e.g. 0,0.05,0.1 ({error})"
        ) from error
    except RecursionError:
        raise ValueError("--values: not valid JSON (nested too deeply)") from None
    if not isinstance(values, list) or not values:
        raise ValueError(f"--values: {text!r}: expected at least one value")
    return values


def _check_sweep(plugin: str, option: str, values: list, base: dict[str, Any]) -> None:
    """`sweep`'s `--plugin`, `--option`, each `--base` option, then each configuration `{plugin: {**base, option:
    value}}` checked as installing it would check it (no model needed): ValueError naming the flag at fault."""
    from workbench.accelerations import REGISTRY, install
    from workbench.evidence.sweep import sweep_configs

    spec = REGISTRY.get(plugin)
    if spec is None:
        raise ValueError(f"--plugin: unknown {plugin!r}; available: {sorted(REGISTRY)}")
    options = {o.name: o for o in spec.options}
    if option not in options:
        raise ValueError(f"--option: {plugin} has no option {option!r}; allowed: {sorted(options)}")
    for name, value in base.items():
        if name == option or name not in options:
            allowed = sorted(set(options) - {option})
            raise ValueError(f"--base: {plugin} option {name!r}; allowed: {allowed} (--option {option} is swept)")
        _flagged("--base", options[name].check, plugin, value)
    for config in _flagged("--values", sweep_configs, plugin, option, values, base):
        _flagged("--values", install.check_options, REGISTRY, config)


def _candidates_arg(text: str) -> list:
    """`--candidates`: a non-empty JSON list of accelerations configurations, each checked as installing it would
    check it (no model needed)."""
    from workbench.accelerations import REGISTRY, install
    from workbench.evidence.sweep import check_candidates

    value = _parse_json("--candidates", text)
    if not isinstance(value, list) or not value or not all(isinstance(item, dict) for item in value):
        raise ValueError("--candidates: expected a non-empty JSON list of objects ({plugin: options})")
    for i, candidate in enumerate(value):
        _flagged(f"--candidates[{i}]", install.check_options, REGISTRY, candidate)
    _flagged("--candidates", check_candidates, value)  # a repeated configuration
    return value


def _show(value: object) -> str:
    return "none" if value is None else json.dumps(value, sort_keys=True)


def _adapter_arg(text: str) -> Any:
    """One `--adapter`: a path, or a JSON object of `workbench.Adapter`'s fields; checked before the model loads."""
    from workbench import Adapter

    fields = _json_arg("adapter", text) if text.lstrip().startswith("{") else {"path": text}
    unknown = sorted(set(fields) - {"path", "scale", "target", "name"})
    if unknown or "path" not in fields:
        raise ValueError(f"--adapter: fields {sorted(fields)}; allowed: path (required), scale, target, name")
    return Adapter(**fields)


def _directory(text: str) -> Path:
    """An output folder argument: refused when empty (Path("") would be the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path; give a directory")
    return Path(text)


def _parse_json(flag: str, text: str) -> Any:
    """`text` parsed as JSON; text that does not parse, nests deeper than the parser goes, or gives a key twice in
    one object is a ValueError naming `flag`."""
    from workbench.io import RepeatedKey, unique_keys

    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag}: not valid JSON ({error})") from error
    except RepeatedKey as error:
        raise ValueError(f"{flag}: {error}") from None
    except RecursionError:  # its own words name no input
        raise ValueError(f"{flag}: not valid JSON (nested too deeply)") from None


def _json_arg(name: str, text: str) -> dict:
    """`--<name>`'s JSON object (ValueError naming the flag otherwise)."""
    value = _parse_json(f"--{name}", text)
    if not isinstance(value, dict):
        raise ValueError(f"--{name}: expected a JSON object, got {type(value).__name__}")
    return value


def _accelerations_arg(name: str, text: str) -> dict:
    """`--<name>`'s accelerations JSON with its plugins' names, options and conflicts checked (no model needed)."""
    from workbench.accelerations import REGISTRY, install

    value = _json_arg(name, text)
    _flagged(f"--{name}", install.check_options, REGISTRY, value)
    return value


def _note_replaced(out: Path, names: list[str]) -> None:
    """Say so on stderr, before any run, where `out` already holds files this run writes (an earlier run's): they
    are replaced, whole, when it ends (`workbench.io.write_set`); until then they stay as they were."""
    found = [name for name in names if (out / name).exists()]
    if found:
        print(
            f"note: --out {out} holds {', '.join(found)} of an earlier run; this run replaces them when it ends "
            "(another --out keeps them)",
            file=sys.stderr,
        )


def _note_a_a(baseline: dict, arms: dict[str, dict]) -> None:
    """Say so on stderr where an arm is the baseline itself: an A/A comparison, whose spread measures the noise (a
    way to see it, or a slip in the JSON), before minutes of runs. Compared as installed (`sweep.setting_key`): an
    option spelled at its default is the same arm."""
    from workbench.evidence.sweep import setting_key

    for flag, arm in arms.items():
        if setting_key(arm) == setting_key(baseline):
            print(
                f"note: {flag} is the baseline ({json.dumps(arm)}): an A/A run, it measures the noise", file=sys.stderr
            )


def _flagged(flag: str | tuple[str, ...], check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`check(*args, **kwargs)`, its ValueError said under the command line's `flag`: `--rounds: 0; ...` where the
    library says `rounds: 0; ...`, `--accelerate: easycache.threshold: ...` where it names no flag's field. Given
    several flags, the error goes under the one whose field it names (`max_evals: ...` under `--max-evals`), and
    stays as it is when it names none of them."""
    try:
        return check(*args, **kwargs)
    except ValueError as error:
        text, flags = str(error), (flag,) if isinstance(flag, str) else flag
        for name in flags:
            field = name.removeprefix("--").replace("-", "_")
            if len(flags) == 1 or text.startswith(f"{field}: "):
                raise ValueError(f"{name}: {text.removeprefix(f'{field}: ')}") from None
        raise


def _info() -> int:
    import torch

    from workbench import environment
    from workbench.io import json_bytes
    from workbench.models import TINY_MODELS, families

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = {
        **environment.describe(device),
        "families": {
            name: {"pipeline": f.pipeline_class, "modes": f.modes, "audio": f.has_audio}
            for name, f in families().items()
        },
        "tiny_models": list(TINY_MODELS),
    }
    print(json_bytes(info).decode(), end="")
    return 0


if __name__ == "__main__":
    from workbench import distributed

    code = main()
    if distributed.is_worker():  # a torchrun rank: leave without the interpreter's teardown
        distributed.exit_worker(code or 0)
    sys.exit(code)
