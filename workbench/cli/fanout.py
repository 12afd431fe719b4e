"""`--ray`: `batch` (many requests of one model generated on Ray workers, each request's outputs in its `--out`) and
what every command that fans out shares: the workers and their record store (`_fanout`, `_store_folder`; the store
checked writable before Ray starts), and every case checked against the model here, on the driver, before Ray starts
(`_check_cases_here`, which refuses a model that is none too, when the workers share this machine). The fan-out is
`workbench.evidence.fanout`; the jobs it runs are `workbench.evidence.fanout_jobs`."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from workbench.cli.flags import _accelerations_arg, _flagged, _shapes


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
    `_shapes` for a model whose shapes do not build here: its cases are checked on a worker once it has loaded. With
    a local instance (`--ray` without an address) the workers see this machine's folders, so a model that is no
    folder here is refused here when it is no known name either (`models.preview`'s ValueError)."""
    from workbench.evidence.harness import check_requests
    from workbench.models import preview

    local = args.ray in (None, "local")  # `batch` without --ray fans out on a local instance too
    model = preview(args.model) if local and not os.path.isdir(args.model) else _shapes(args.model)
    if model is None:
        return
    for where, requests in splits.items():
        check_requests(model, requests, where)


@contextlib.contextmanager
def _fanout(args: argparse.Namespace):
    """(Fanout, Store) of a `--ray` run, progress on stderr; the workers end with the block. The store is checked
    writable first (`--store`, else `--out`), before Ray starts."""
    from workbench.evidence.fanout import Fanout, Store, TqdmView
    from workbench.io import check_writable

    store = Store(check_writable(_store_folder(args), "--store" if getattr(args, "store", None) else "--out"))
    address = None if args.ray in (None, "local") else args.ray
    device = args.device
    options = {"address": address, "workers": args.workers, "device": device, "retries": args.retries}
    options["memory"] = args.memory
    flags = {"--ray": "address", "--workers": "workers", "--device": "device", "--retries": "retries"}
    flags["--memory"] = "memory"  # `workers: ...` said as `--workers: ...`, `address: ...` as `--ray: ...`
    with _flagged(flags, Fanout, args.model, dtype=getattr(args, "dtype", None), **options) as fanout:
        fanout.subscribe(TqdmView())
        yield fanout, store


def _store_folder(args: argparse.Namespace) -> Path:
    """The record store of a `--ray` run: `--out` itself for `batch` (its outputs live there), else `--store` or
    `<out>/cells`."""
    return args.out if args.command == "batch" else args.store or args.out / "cells"
