"""`workbench generate ...`, `qualify`, `sweep`, `search`, `calibrate`, `batch`, `train-tiny` and `info`.

`qualify`, `sweep`, `search` and `calibrate` take `--ray [ADDRESS]`: their cells run on Ray workers, one resident
session each (`--memory`: planned under a cap, or for each worker's own GPU), into a resumable record store
(`--store`, default `<out>/cells`); see `workbench.evidence.fanout`. Every case is checked against the model on the
driver before Ray starts, as without Ray (`fanout._check_cases_here`).
Without Ray, `calibrate`, `qualify`, `sweep` and `search` keep a partial record in `--out` while they run
(`<command>.partial.json`, rewritten after every tried value or finished case; removed once the final record is
written): `--resume DIR` continues it, running only what it does not hold (a partial record of other arguments is
refused, naming each field that differs); an `--out` holding one is refused without `--resume`. `--max-seconds S`
stops such a run cleanly at a step (or case) boundary and prints the command that continues it.

A bad input (a bad value, a missing or unreadable file, JSON that does not parse, an `--out` that cannot be
written) exits with status 2 and one line on stderr naming the flag or file and what is wrong. Ctrl-C exits with
status 130 and one line saying what was kept and the command that goes on from there (`evidence._interrupted`).
Every `--out` is created and probed for writing before a model loads, so no run loses its work to an unwritable
folder.

The commands live in modules named for what they hold: `flags` (the command line's values read and checked),
`generate` (`generate`, `train-tiny`, `info`), `evidence` (`qualify`, `sweep`, `search`, `calibrate` and their partial
records) and `fanout` (`batch` and what every `--ray` run shares).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from workbench.cli.evidence import _calibrate, _interrupted, _qualify, _sweep_or_search
from workbench.cli.fanout import _batch
from workbench.cli.flags import _directory
from workbench.cli.generate import _generate, _info, _train_tiny


def _under_flag(message: str, flags: set[str]) -> str:
    """A library's error said under the command line's flag when it names one of the command's `flags` by its field:
    `gpus: ...` as `--gpus: ...`, `requests[1]: ...` as `--requests[1]: ...`, `adapter.path: ...` as
    `--adapter: path: ...`; any other message as it is."""
    match = re.match(r"([a-z][a-z_]*)(?=[:.\[])", message)
    flag = None if match is None else "--" + match[1].replace("_", "-")
    if flag not in flags:
        return message
    rest = message[match.end() :]
    return f"{flag}: {rest[1:]}" if rest.startswith(".") else flag + rest


def _partial_record_flags(command: argparse.ArgumentParser, record: str, unit: str) -> None:
    """`command`'s `--resume DIR` (continue the run whose partial record, `record` in words, is in DIR) and
    `--max-seconds`: a clean stop at a `unit` boundary (`workbench.evidence.resume.Journal`)."""
    command.add_argument(
        "--resume", type=Path, metavar="DIR", help=f"continue the run whose partial record ({record}) is in DIR"
    )
    command.add_argument(
        "--max-seconds",
        type=float,
        help=f"stop cleanly at a {unit} boundary: a new {unit} starts only while it is expected to end within this "
        f"many seconds, and every call runs at least one new {unit}, so a call can end past them; prints how to resume",
    )


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
        """argparse's usage error as one line on stderr, status 2, like every other refusal (`workbench generate:
        error: argument --seed: invalid int value: 'abc' (see workbench generate --help)`, no usage block); where a
        flag's value starts with a dash (`--prompt -dog`, which argparse reads as a flag, leaving --prompt without a
        value), how to write it."""
        names = re.fullmatch(r"argument ([\w/-]+): expected one argument", message)
        words = getattr(self, "_words", [])
        for flag in names[1].split("/") if names else []:
            if flag in words[:-1] and (value := words[words.index(flag) + 1]).startswith("-"):
                message += f"; a value that starts with '-' goes after '=': {flag}={value}"
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


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
        "--trace",
        action="store_true",
        help="run the request under torch.profiler; writes <name>.trace.json.gz (for ui.perfetto.dev) with the rest",
    )
    gen.add_argument(
        "--parallel-decode",
        action="store_true",
        help="with --gpus N >= 2: split the Wan VAE decode into one band per GPU (approximate vs untiled decode)",
    )

    qual = commands.add_parser("qualify", help="A/B/A qualification of a candidate against a baseline")
    qual.add_argument("--candidate", required=True, help="accelerations JSON of the candidate arm")
    swp = commands.add_parser("sweep", help="qualify one plugin at each value of one option; knee, cliff, Pareto")
    swp.add_argument("--plugin", required=True, help="the acceleration plugin, e.g. easycache")
    swp.add_argument("--option", required=True, help="the option swept, e.g. threshold")
    swp.add_argument("--values", required=True, help="comma-separated JSON values (or a JSON list), e.g. 0,0.05,0.1")
    swp.add_argument("--base", default="{}", help="JSON options of the plugin kept fixed at every value")
    search_cmd = commands.add_parser("search", help="qualify fixed configurations; pick the fastest qualified")
    search_cmd.add_argument("--candidates", required=True, help="JSON list of accelerations configurations")
    for sub in (qual, swp, search_cmd):
        sub.add_argument("--model", required=True)
        sub.add_argument("--suite", required=True, type=Path, help="a data_manifests/*.json suite")
        sub.add_argument("--cases", default="test", choices=("test", "calibration"))
        sub.add_argument("--baseline", default="{}", help="accelerations JSON of the baseline arm")
        sub.add_argument("--rounds", type=int, default=3)
        sub.add_argument("--budget", default="{}", help="JSON overrides of the quality budget")
        sub.add_argument("--device", default="auto")
        sub.add_argument("--out", required=True, type=_directory)
        sub.add_argument("--allow-other-model", action="store_true", help="run a suite pinned to another model")
        record = "one case a step" if sub is qual else "one configuration's case a step"
        _partial_record_flags(sub, record, "case")

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
    _partial_record_flags(cal, "written after every step", "step")

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
    tiny.add_argument("--device", default="auto", help="auto (CUDA when present, else the CPU), cpu, cuda or cuda:N")
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
    args.started = time.perf_counter()  # what `--max-seconds` counts from
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
        flags = {o for action in commands.choices[args.command]._actions for o in action.option_strings}
        print(f"workbench {args.command}: error: {_under_flag(message, flags)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was kept and how to go on, not a traceback from wherever it hit
        print(f"\nworkbench {args.command}: interrupted; {_interrupted(args)}", file=sys.stderr)
        return 130
