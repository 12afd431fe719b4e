"""`python -m benchmarks run SCENARIO [SCENARIO ...] [--out DIR] [--smoke] [--rounds N] [--max-seconds S]`, `list`,
`docs`.

`run` measures each scenario in this process and writes `<out>/<scenario>.json` (benchmarks/envelope.py) as soon as
it is done; `<out>` is `--out`, else $BENCHMARKS_OUT when set (benchmarks/device/setup.sh sets it to the device
call's $OUT, the folder that comes back), else out/benchmarks-smoke for a `--smoke` run (git-ignored: a CPU smoke
never replaces a committed record), else benchmarks/results. Bad options are usage errors (exit status 2, one line
naming the flag, or BENCHMARKS_OUT when the folder came from it) before anything runs: `--rounds` < 1, a
`--max-seconds` that is not a finite number >= 0 or that none of the scenarios reads, an empty `--out` or one that
cannot be made or written, a full run (no `--smoke`) on a machine without CUDA. `--rounds` 1 or 2 runs (a capped
scenario's long requests may afford no more) but gives no ratios, a CI95 needs `MIN_PAIRS` paired rounds: `run`
says so, and so does each record. A scenario that declares `ALLOCATOR` (the capped ones:
`expandable_segments:True`, which torch reads once, when CUDA starts) needs it in PYTORCH_CUDA_ALLOC_CONF: on a GPU
`run` starts itself again with it added when it is missing (`allocator_env`), and refuses to mix such scenarios
with others in one process. A scenario that fails is reported and the next one still runs (exit status 1
if any failed). A scenario that declares `STOPS_AT_MAX_SECONDS` reads `--max-seconds`: those run in parts
(calibrate-wan, request-capped, request-wan22) stop cleanly with their partial state under `<out>`, say so, and
write no envelope: the same command continues them (exit status 0); those that repeat rounds (fanout, ring) end
their rounds early and their envelope says how many ran. Ctrl-C ends `run` with one line saying what was written
(and a partial state kept), exit status 130.
`docs` regenerates docs/measurements.md and the README's generated blocks (plugin table, headline figures): both
are rendered first, and a `--results` that is no folder, holds no records or a bad one, a `--readme` that cannot be
read or lacks a block's markers, or an `--out` or `--readme` that cannot be written is a usage error naming the
flag, with nothing written.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

import torch

from workbench.evidence.stats import MIN_PAIRS

RESULTS = Path(__file__).parent / "results"
SMOKE_OUT = Path(__file__).parent.parent / "out" / "benchmarks-smoke"  # git-ignored (out/)
DOCS = Path(__file__).parent.parent / "docs" / "measurements.md"
README = Path(__file__).parent.parent / "README.md"


def default_out(smoke: bool, environ: Mapping[str, str] | None = None) -> Path:
    """Where `run` writes without `--out`: $BENCHMARKS_OUT when set and not empty (`environ`, default os.environ),
    else SMOKE_OUT for a smoke run (a CPU smoke record must never replace a committed one), else RESULTS."""
    given = (os.environ if environ is None else environ).get("BENCHMARKS_OUT")
    if given:
        return Path(given)
    return SMOKE_OUT if smoke else RESULTS


def check_options(rounds: int, max_seconds: float | None) -> None:
    """ValueError naming the flag unless `rounds` is an integer >= 1 and `max_seconds` is None or a finite number
    >= 0 (NaN compares false with every time, so a NaN limit would stop at once; no limit is None, not inf)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"--rounds: must be an integer >= 1 (>= 3 for a CI95), got {rounds!r}")
    if max_seconds is not None and (
        isinstance(max_seconds, bool)
        or not isinstance(max_seconds, int | float)
        or not math.isfinite(max_seconds)
        or max_seconds < 0
    ):
        raise ValueError(
            f"--max-seconds: must be a finite number of seconds >= 0 (leave it out for no limit), got {max_seconds!r}"
        )


def few_rounds(rounds: int) -> str:
    """Why a run of `rounds` (< `MIN_PAIRS`) gives no ratios, for the command's note and the record's."""
    return f"--rounds {rounds}: fewer than the {MIN_PAIRS} paired rounds a CI95 needs, so times but no ratios"


def run_scenario(name: str, out: Path, smoke: bool, rounds: int, max_seconds: float | None = None) -> Path:
    """Run scenario `name` and write its envelope into `out`; returns the file (with fewer than `MIN_PAIRS` rounds,
    its notes say why it holds no ratios: `few_rounds`). ValueError, before the scenario
    starts, for an unknown name, bad `rounds` or `max_seconds` (`check_options`) or an `out` that cannot be made or
    written (`workbench.io.check_writable`, which leaves nothing behind); RuntimeError when a full run has no CUDA
    device (or fewer than the scenario's GPUs); `Unfinished` when a scenario run in chunks stopped at `max_seconds`
    (its partial state is under `out`).

    A smoke run sets TRITON_INTERPRET=1 for the scenario only (the kernels are decorated at first launch, so this is
    early enough; worker processes it starts inherit it) and puts back the caller's value, or its absence, when the
    scenario returns or raises."""
    from benchmarks.envelope import Context, envelope, write
    from benchmarks.scenarios import SCENARIOS
    from workbench.io import check_writable

    if name not in SCENARIOS:
        raise ValueError(f"scenario: unknown {name!r}; allowed: {sorted(SCENARIOS)}")
    check_options(rounds, max_seconds)
    check_writable(out, "--out")
    if smoke:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise RuntimeError(f"{name}: needs a CUDA device (run with --smoke for the CPU check of the scenario)")
    else:
        device = torch.device("cuda")
    module = SCENARIOS[name]
    setting = getattr(module, "ALLOCATOR", None)
    if device.type == "cuda" and setting and setting not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(","):
        raise RuntimeError(f"{name}: run with PYTORCH_CUDA_ALLOC_CONF={setting} (set before CUDA starts; `run` does)")
    before = os.environ.get("TRITON_INTERPRET")
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        measurement = module.run(Context(smoke, rounds, device, out, max_seconds))
        if rounds < MIN_PAIRS:
            measurement.notes.append(f"Run with {few_rounds(rounds)}.")
        return write(envelope(name, measurement, device, smoke, getattr(module, "SETTINGS", ())), out)
    finally:
        if smoke:
            if before is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = before


def allocator_env(names: list[str], environ: dict[str, str]) -> dict[str, str] | None:
    """The environment to restart `run` with so that the scenarios' `ALLOCATOR` settings hold from CUDA's start, or
    None when nothing is missing. ValueError when scenarios that declare one run with others, or declare different
    ones (each setting holds for the whole process)."""
    from benchmarks.scenarios import SCENARIOS

    wanted = {name: getattr(SCENARIOS[name], "ALLOCATOR", None) for name in names}
    settings = set(wanted.values())
    if len(settings) > 1:
        raise ValueError(
            "scenarios with an allocator setting run in their own process (torch reads it once): "
            + "; ".join(f"{name}: {setting or 'none'}" for name, setting in wanted.items())
        )
    (setting,) = settings
    current = environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if setting is None or setting in current.split(","):
        return None
    return environ | {"PYTORCH_CUDA_ALLOC_CONF": ",".join(filter(None, [current, setting]))}


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); returns the exit status. A usage error exits 2 (SystemExit)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="the Vflash Workbench benchmark harness")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="measure scenarios, one results file each")
    run.add_argument("scenarios", nargs="+", metavar="SCENARIO")
    results, smoke_out = (os.path.relpath(path, Path(__file__).parent.parent) for path in (RESULTS, SMOKE_OUT))
    run.add_argument(
        "--out",
        help=f"results folder (default: $BENCHMARKS_OUT when set, else {results}, or {smoke_out} with --smoke: a "
        "smoke never replaces a committed record)",
    )
    run.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny shapes on the CPU: checks the code, not the speed (writes to {smoke_out} unless --out or "
        "$BENCHMARKS_OUT says otherwise)",
    )
    run.add_argument("--rounds", type=int, default=3, help="A/B/A rounds (default 3, the least for a CI95)")
    run.add_argument(
        "--max-seconds",
        type=float,
        help="a scenario run in parts or rounds (one whose module sets STOPS_AT_MAX_SECONDS) stops cleanly after "
        "about this long (finite, >= 0; default: no limit; refused when no scenario given reads it)",
    )
    commands.add_parser("list", help="the scenarios")
    docs = commands.add_parser("docs", help="regenerate docs/measurements.md and the README's generated blocks")
    docs.add_argument("--results", default=RESULTS)
    docs.add_argument("--out", default=DOCS)
    docs.add_argument("--readme", default=README)
    args = parser.parse_args(argv)
    for flag in ("out", "results", "readme"):  # as text: Path("") would be the current folder
        if getattr(args, flag, None) == "":
            parser.error(f"--{flag}: must name a path, got ''")
        if isinstance(getattr(args, flag, None), str):
            setattr(args, flag, Path(getattr(args, flag)))
    if args.command == "list":
        from benchmarks.scenarios import SCENARIOS

        for name, module in SCENARIOS.items():
            print(f"{name:18s} {module.GPUS} GPU{'s' if module.GPUS > 1 else ' '}  {module.SUMMARY}")
        return 0
    if args.command == "docs":
        return _docs(parser, args.results, args.out, args.readme)
    from benchmarks.scenarios import SCENARIOS

    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; allowed: {sorted(SCENARIOS)}")
    from workbench.io import check_writable

    try:  # every option refused here, before anything runs (run_scenario checks the same again)
        check_options(args.rounds, args.max_seconds)
        if args.out is None:
            field = "BENCHMARKS_OUT" if os.environ.get("BENCHMARKS_OUT") else "--out"
            args.out = check_writable(default_out(args.smoke), field)
        else:
            args.out = check_writable(args.out, "--out")
    except ValueError as error:
        parser.error(str(error))
    if args.max_seconds is not None:
        ignoring = [name for name in args.scenarios if not getattr(SCENARIOS[name], "STOPS_AT_MAX_SECONDS", False)]
        reading = sorted(name for name, module in SCENARIOS.items() if getattr(module, "STOPS_AT_MAX_SECONDS", False))
        if len(ignoring) == len(args.scenarios):
            parser.error(f"--max-seconds: none of {ignoring} reads it; allowed only with one of {reading}")
        if ignoring:
            print(f"note: --max-seconds does not limit {ignoring}", file=sys.stderr)
    cuda = [name for name in args.scenarios if SCENARIOS[name].GPUS >= 1]
    if not args.smoke and cuda and not torch.cuda.is_available():
        parser.error(f"{', '.join(cuda)}: needs a CUDA device, this machine has none; run with --smoke on a CPU")
    if not args.smoke and torch.cuda.is_available():  # is_available does not start CUDA's allocator
        try:
            environ = allocator_env(args.scenarios, dict(os.environ))
        except ValueError as error:
            parser.error(str(error))
        if environ is not None:
            print(f"restarting with PYTORCH_CUDA_ALLOC_CONF={environ['PYTORCH_CUDA_ALLOC_CONF']}", flush=True)
            os.execvpe(sys.executable, [sys.executable, "-m", "benchmarks", *(argv or sys.argv[1:])], environ)
    if args.rounds < MIN_PAIRS:
        print(f"note: {few_rounds(args.rounds)}", file=sys.stderr)
    from benchmarks.envelope import Unfinished
    from workbench.evidence.resume import partial_path

    failed, written = [], []
    for name in args.scenarios:
        print(f"== {name}", flush=True)
        try:
            written.append(run_scenario(name, args.out, args.smoke, args.rounds, args.max_seconds))
            print(f"wrote {written[-1]}", flush=True)
        except Unfinished as unfinished:
            print(f"unfinished {name}: {unfinished}", flush=True)
        except KeyboardInterrupt:  # Ctrl-C: what was kept, not a traceback from wherever it hit
            partial = partial_path(args.out / name)
            kept = f"; its partial state {partial} is kept: the same command continues it" if partial.exists() else ""
            shown = ", ".join(map(str, written)) or "nothing"
            print(f"\npython -m benchmarks run: interrupted during {name}{kept}; wrote {shown}", file=sys.stderr)
            return 130
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


def _docs(parser: argparse.ArgumentParser, results: Path, out: Path, readme: Path) -> int:
    """`docs`: the page and the README rendered in memory, then both written; a bad `--results` (`docs.page`),
    `--readme` or `--out` is a usage error naming the flag, with nothing written."""
    from benchmarks.docs import page
    from benchmarks.readme import render
    from workbench.io import check_targets, check_writable, write_atomic

    try:
        text = page(results)
    except (OSError, ValueError) as error:  # an OSError names its file
        parser.error(f"--results: {error}")
    try:
        rendered = render(readme.read_text(), results)
    except (OSError, ValueError) as error:
        parser.error(f"--readme: {readme}: {getattr(error, 'strerror', None) or error}")
    for flag, path in (("--out", out), ("--readme", readme)):
        try:
            check_targets(path.parent, [path.name], flag)
            check_writable(path.parent, flag)
        except ValueError as error:
            parser.error(str(error))
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, data in ((out, text), (readme, rendered)):
        print(f"wrote {write_atomic(path, data.encode())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
