"""The commands besides the evidence: `generate` (one request into an MP4, its JSON record and HTML report; with
`--gpus N` the command runs again under torchrun, one rank a GPU: `workbench.distributed`), `train-tiny` (a demo-av
preset trained on synthetic scenes, resumable) and `info` (versions, the device and the registered model
families)."""

from __future__ import annotations

import argparse
import json
import sys

from workbench.cli.flags import _accelerations_arg, _adapter_arg, _flagged, _shapes


def _generate(args: argparse.Namespace) -> int:
    from workbench import Request, Result, Session, distributed, environment
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
    names = Result.saved_names(args.name, "--name", args.out, trace=args.trace)
    check_targets(args.out, names, "--out")  # against --out's file system
    if args.profile == "within-budget" and args.calibration is None:
        raise ValueError(
            "--profile within-budget: needs --calibration RECORD, the calibration.json of a `workbench calibrate` "
            "run (e.g. benchmarks/results/calibrate-demo-av/easycache-cpu.json for demo-av on a CPU)"
        )
    if args.calibration is not None and args.profile != "within-budget":
        raise ValueError(f"--calibration: goes with --profile within-budget only, not --profile {args.profile}")
    if args.calibration is not None:
        calibration_record(args.calibration, "--calibration")  # its form; where it holds below
    if args.parallel_decode:  # a bad combination is refused before any process starts
        distributed.cli_accelerations(args.gpus, parallel_decode=True)
    shapes = None if distributed.is_worker() else _shapes(args.model)  # the launcher checks it for every rank
    if shapes is not None:
        resolved = _flagged(flags, shapes.resolve, request)  # a request the model refuses, before its weights load
        if args.calibration is not None:  # where the record holds, as far as the shapes tell (the rest once loaded)
            here = environment.device(args.device)
            _flagged("--calibration", within_budget, args.calibration, shapes.name, here, resolved.to_dict())
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
            chosen = _flagged(
                "--calibration", within_budget, args.calibration, session.model.name, session.device, resolved, **held
            )
            left_out = {}
        else:
            chosen, left_out = profile_plan(args.profile, session.model.family.name, session.device, session.model)
        for plugin, reason in left_out.items():
            print(f"profile {args.profile}: {plugin} left out ({reason})", file=sys.stderr)
        installed = session.accelerate({**accelerations, **chosen, **extra})
        print(f"accelerations: {', '.join(installed) or 'none'}", file=sys.stderr)
    result = session.generate(request, progress=distributed.rank() == 0, trace=args.trace)
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
    if args.trace:
        print(f"trace:  {mp4.parent / names[-1]} (open in ui.perfetto.dev; the timings include the profiler's cost)")
    if not report.ok:
        print(f"media check: {'; '.join(report.problems)}", file=sys.stderr)
    return 0


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
