"""The evidence commands `qualify`, `sweep`, `search` and `calibrate`. Each checks its whole command line before a
model loads, runs in one session here or on Ray workers (`--ray`: `workbench.cli.fanout`), writes its record and
report into `--out` and prints where they are. Without `--ray` each keeps a partial record in `--out` while it runs:
`_check_resume` checks `--resume` (and an `--out` holding one) against the command line, `_remove_partial` removes it
once the final record is written, `_resume_command` is the command that continues it and `_interrupted` says what a
Ctrl-C kept (for `batch` too: its store)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.cli.fanout import _check_cases_here, _fanout, _store_folder
from workbench.cli.flags import (
    _accelerations_arg,
    _candidates_arg,
    _check_sweep,
    _flagged,
    _json_arg,
    _note_a_a,
    _note_replaced,
    _values_arg,
)

if TYPE_CHECKING:
    from workbench.evidence.resume import Partial
    from workbench.quality import Budget


def _qualify(args: argparse.Namespace) -> int:
    from workbench import Session
    from workbench.evidence.harness import check_requests, check_rounds, default_budget, qualify
    from workbench.evidence.manifest import load_manifest
    from workbench.evidence.records import record_bytes
    from workbench.evidence.report import render
    from workbench.evidence.resume import Partial
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
        record, pilots = qualify(
            session, requests, configs["baseline"], configs["candidate"], args.rounds, budget,
            **_resume_options(args, identity),
        )  # fmt: skip
        if isinstance(record, Partial):
            return _print_partial(args, record)
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
    from workbench.evidence.harness import check_requests, check_rounds, default_budget
    from workbench.evidence.manifest import load_manifest
    from workbench.evidence.report import NO_SPEED_CLAIM
    from workbench.evidence.resume import Partial
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
        budget = _budget(default_budget(session), configs["budget"])
        run = sweeps.sweep if args.command == "sweep" else sweeps.search
        arguments = _sweep_arguments(args, configs, values, candidates)
        result = run(session, requests, *arguments, budget, **_resume_options(args, identity))
        if isinstance(result, Partial):
            return _print_partial(args, result)
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
    from workbench.evidence.harness import check_requests, check_rounds, default_budget
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
    budget = _budget(default_budget(session), overrides)
    base = profile(args.base_profile, session.model.family.name, session.device, session.model)
    options |= _resume_options(args)
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
        return _print_partial(args, result)
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


def _budget(default: Budget, overrides: dict[str, Any]) -> Budget:
    """The model's default budget with the command line's `--budget` overrides (`null` drops a limit)."""
    from workbench.quality import Budget

    return Budget.from_dict({**default.to_dict(), **overrides})


def _sweep_arguments(args: argparse.Namespace, configs: dict, values: list | None, candidates: list | None) -> tuple:
    """The positional arguments of `sweep` (or `search`) after the requests, up to the budget."""
    if args.command == "sweep":
        return args.plugin, args.option, values, configs["base"], configs["baseline"], args.rounds
    return candidates, configs["baseline"], args.rounds


def _show(value: object) -> str:
    return "none" if value is None else json.dumps(value, sort_keys=True)


_NOUNS = {"calibrate": "calibration", "qualify": "qualification", "sweep": "sweep", "search": "search"}
_UNITS = {"qualify": "case", "sweep": "(value, case) pair", "search": "(candidate, case) pair"}  # a record's step


def _check_resume(args: argparse.Namespace, known: dict[str, Any]) -> None:
    """The partial-record flags of an evidence command (`calibrate`, `qualify`, `sweep`, `search`), before any
    model loads: `--resume` and `--max-seconds` refused with `--ray` (its store resumes by cell), `--max-seconds`
    below 0 or NaN, `--resume` naming a folder with no partial record of this command (the path named); an `--out`
    holding one refused without `--resume` (continue it, or choose another `--out`); the partial record's form
    (`read_partial`) and the fields of its run that the command line alone decides (`known`: `resume.check_run`,
    each differing field with its recorded and given value). The rest (budget, model, dtype, device) is checked once
    the model is loaded."""
    from workbench.evidence.resume import check_run, partial_path, read_partial

    noun = _NOUNS[args.command]
    if args.resume is not None and args.ray is not None:
        raise ValueError("--resume: not with --ray (its --store resumes a Ray run cell by cell: run the same command)")
    if args.max_seconds is not None and args.ray is not None:
        raise ValueError("--max-seconds: not with --ray (stop it with Ctrl-C: its --store keeps every finished cell)")
    if args.max_seconds is not None and not args.max_seconds >= 0:
        raise ValueError(f"--max-seconds: {args.max_seconds!r}; allowed: seconds >= 0")
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


def _resume_options(args: argparse.Namespace, identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keywords of a run kept in a partial record: its folder (`--resume`, else `--out`), and with
    `--max-seconds` the limit counted from the call's start (loading included; a stop's reason quotes the flag);
    `identity` where the run takes one (qualify, sweep, search: the suite)."""
    options = {"resume": args.resume or args.out} | ({} if identity is None else {"identity": identity})
    if args.max_seconds is not None:
        options |= {"max_seconds": args.max_seconds, "started": args.started}
    return options


def _print_partial(args: argparse.Namespace, partial: Partial) -> int:
    """A run stopped at `--max-seconds`: why, where its partial record is, and the command that continues it."""
    print(f"partial: {partial.reason}")
    print(f"record: {partial.path}")
    print(f"resume: {_resume_command(args, partial.path.parent)}")
    return 0


def _remove_partial(args: argparse.Namespace, command: str) -> None:
    """Once the final record of `command` is published (without `--ray`): remove its partial record, which the final
    record holds whole, and the outputs kept beside it."""
    from workbench.evidence.resume import partial_path, remove_partial

    if args.ray is None:
        remove_partial(partial_path(args.resume or args.out, command))


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
