"""Qualification, sweeps, searches, calibration and batch generation as cells of a `Fanout` (the CLI's `--ray`).

What one cell is, so that every speed ratio comes from one process:
- qualify: one request's A/B/A of the candidate against the baseline (`harness.qualify` on that request). The
  qualification of a whole suite is its cells' records merged (`merge`): cases in request order, each naming the
  worker it ran on, the suite verdict the weakest case's; the same record `harness.qualify` writes otherwise.
- sweep / search: one qualification per value / candidate, so one cell per (value, request); the result is built
  by `sweep.sweep_result` / `search_result` from those records, as the single-process sweep builds it.
- calibrate: the knob search (one plugin, or a greedy stack) is one cell, because its points' speed-ups are
  against the dense references run in its own process; its confirmation on the test requests is one qualify cell
  per request. (Without Ray, `calibrate.calibrate(resume=...)` resumes a search point by point.)
- generate (`batch`): one request, generated with the run's accelerations; its MP4, JSON and HTML come back.

Each function checks the configuration on the first worker before any cell runs (`Fanout.validate`), runs its
cells, then raises RuntimeError naming every cell that failed (the others all ran; the store keeps them, so a re-run
runs only the failed ones).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from workbench.evidence import calibrate as calibration
from workbench.evidence import sweep as sweeps
from workbench.evidence.fanout import Cell, Fanout, Store
from workbench.evidence.harness import MIN_ROUNDS, SUITE_ORDER, check_budget, default_budget
from workbench.evidence.harness import qualify as qualify_here
from workbench.quality import Budget
from workbench.request import Request


def qualify(
    fanout: Fanout,
    store: Store,
    requests: list[Request],
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    rounds: int = MIN_ROUNDS,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """The qualification record of `candidate` against `baseline` on `requests` (see `harness.qualify`)."""
    budget = check_budget(budget, fanout.default_budget)
    return _qualifications(fanout, store, requests, baseline, [candidate], rounds, budget)[0]


def sweep(
    fanout: Fanout,
    store: Store,
    requests: list[Request],
    plugin: str,
    option: str,
    values: list[Any],
    base_options: dict[str, Any] | None = None,
    baseline: dict[str, Any] | None = None,
    rounds: int = MIN_ROUNDS,
    budget: Budget | None = None,
) -> sweeps.SweepResult:
    """`sweep.sweep` with its cells on the fanout's workers (same arguments, same result)."""
    values, base_options, baseline = sweeps.check_values(values), dict(base_options or {}), dict(baseline or {})
    configs = sweeps.sweep_configs(plugin, option, values, base_options)
    budget = check_budget(budget, fanout.default_budget)
    records = _qualifications(fanout, store, requests, baseline, configs, rounds, budget)
    return sweeps.sweep_result(plugin, option, values, base_options, baseline, budget, records)


def search(
    fanout: Fanout,
    store: Store,
    requests: list[Request],
    candidates: list[dict[str, Any]],
    baseline: dict[str, Any] | None = None,
    rounds: int = MIN_ROUNDS,
    budget: Budget | None = None,
) -> sweeps.SearchResult:
    """`sweep.search` with its cells on the fanout's workers."""
    sweeps.check_candidates(candidates)
    baseline = dict(baseline or {})
    budget = check_budget(budget, fanout.default_budget)
    records = _qualifications(fanout, store, requests, baseline, candidates, rounds, budget)
    return sweeps.search_result(candidates, baseline, budget, records)


def calibrate(
    fanout: Fanout,
    store: Store,
    calibration_requests: list[Request],
    test: list[Request],
    plugins: list[str],
    budget: dict[str, Any] | None = None,
    *,
    knob: str | None = None,
    fixed: dict[str, dict[str, Any]] | None = None,
    base_profile: str = "exact-fast",
    margin: float = calibration.MARGIN,
    max_evals: int = calibration.MAX_EVALS,
    rounds: int = MIN_ROUNDS,
) -> calibration.Calibration | calibration.Stack:
    """`calibrate.calibrate` (one plugin) or `calibrate.stack` (several) over the profile `base_profile`, with
    `budget` overriding the model's default budget (both resolved on the worker, which knows the model and
    device) and `fixed` giving each plugin's options besides its knob; the search runs in one cell, the
    confirmation on `test` in one cell per request."""
    calibration.check_arguments(plugins, knob, margin, max_evals)
    fixed = calibration.check_options(plugins, fixed or {})
    Budget.from_dict(budget or {})  # a bad field is refused before any worker starts
    if not calibration_requests or not test:
        raise ValueError("requests: calibration and test need at least one request each")
    args = {"calibration_requests": calibration_requests, "test": test, "plugins": plugins, "knob": knob}
    args |= {"fixed": fixed} if fixed else {}  # absent when empty: the cells' keys stay as they were
    args |= {"budget": budget or {}, "base_profile": base_profile, "margin": margin, "max_evals": max_evals}
    cell = Cell("calibrate", args | {"rounds": rounds}, f"calibrate {', '.join(plugins)}")
    record = _records(fanout.run([cell], store), store)[0]
    kind = calibration.Calibration if record["kind"] == "calibration" else calibration.Stack
    result = kind.from_record(record)
    if result.status == "searched":
        confirmation = _qualifications(fanout, store, test, {}, [result.config], rounds, result.budget)[0]
        calibration.apply_confirmation(result, confirmation)
    return result


def batch(
    fanout: Fanout, store: Store, requests: list[tuple[str, Request]], accelerations: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Generate each (name, request) with `accelerations` installed; the outputs go to the store's
    `outputs/<name>/` (`<name>.mp4`, `.json`, `.html`). Returns name -> store entry. `accelerations` the model or
    device cannot take is refused on a worker before any cell runs; a request it refuses fails its own cell only."""
    names = [name for name, _ in requests]
    if not requests or len(set(names)) != len(names):
        raise ValueError(f"requests: need at least one, each name once; got {names}")
    cells = [
        Cell("generate", {"request": r, "accelerations": accelerations, "name": n}, f"{n}: {r.prompt[:40]}", n)
        for n, r in requests
    ]
    if fanout.pending(cells, store):
        fanout.validate([accelerations])
    entries = fanout.run(cells, store)
    _records(entries, store)
    return dict(zip(names, entries.values(), strict=True))


def read_requests(path: str | Path) -> list[tuple[str, Request]]:
    """A batch file: a JSON list of requests ({"name": optional file stem, "prompt": ..., other `Request`
    fields}), or a suite manifest (`data_manifests/*.json`: its test cases). Names default to `request-0000`...
    ValueError naming the entry for anything else."""
    from workbench.evidence.manifest import load_manifest
    from workbench.io import RepeatedKey, check_stem, unique_keys

    path = Path(path)
    try:
        data = json.loads(path.read_text(), object_pairs_hook=unique_keys)
    except json.JSONDecodeError as error:
        raise ValueError(f"requests: {path} is not valid JSON ({error})") from error
    except UnicodeDecodeError as error:  # its own words name no file
        raise ValueError(f"requests: {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except RecursionError:  # its own words name no file
        raise ValueError(f"requests: {path} is not valid JSON (nested too deeply)") from None
    except RepeatedKey as error:
        raise ValueError(f"requests: {path}: {error}") from None
    except OSError as error:
        raise ValueError(f"requests: {path} is not readable ({error.strerror or error})") from error
    if isinstance(data, dict) and "test" in data:
        suite = load_manifest(path, allow_other_model=True)
        return [(f"request-{i:04d}", case.to_request()) for i, case in enumerate(suite.test)]
    if not isinstance(data, list) or not data:
        raise ValueError(f"requests: {path} must hold a non-empty JSON list of requests or a suite manifest")
    out: dict[str, Request] = {}
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"requests[{i}]: expected an object, got {type(item).__name__}")
        fields = dict(item)
        allowed = ["name", *(f.name for f in dataclasses.fields(Request))]
        unknown = sorted(set(fields) - set(allowed))
        if unknown:
            raise ValueError(f"requests[{i}]: unknown field(s) {unknown}; allowed: {allowed}")
        if "prompt" not in fields:
            raise ValueError(f"requests[{i}].prompt: missing (required: ['prompt']; allowed: {allowed})")
        name = check_stem(fields.pop("name", f"request-{i:04d}"), f"requests[{i}].name")
        if name in out:
            raise ValueError(f"requests[{i}].name: {name!r} is taken by an earlier request; names must be unique")
        try:
            out[name] = Request(**fields)
        except (TypeError, ValueError) as error:
            raise ValueError(f"requests[{i}]: {error}") from error
    return list(out.items())


def merge(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One qualification record from per-request cell records of one configuration (in request order): the cases
    in order, each with its `worker`; verdict the weakest case's; `workers` lists each worker once; `init_seconds`
    is the longest load. The rest (configs, rounds, budget, model, environment) is the first record's: records of
    other code than the first's are refused (`check_one_code`)."""
    check_one_code(records)
    cases = [{**case, "worker": record["worker"]} for record in records for case in record["cases"]]
    workers = []
    for record in records:
        if record["worker"] not in workers:
            workers.append(record["worker"])
    merged = {key: value for key, value in records[0].items() if key != "worker"}
    merged |= {"verdict": min((c["verdict"] for c in cases), key=SUITE_ORDER.index), "cases": cases}
    return merged | {"init_seconds": max(r["init_seconds"] for r in records), "workers": workers}


def check_one_code(records: list[dict[str, Any]]) -> None:
    """RuntimeError naming the first of `records` whose `git` revision or package `versions` differ from the first
    record's: their cells ran on other code (workers of one cluster on different checkouts), and one record names
    one commit. (Cells of the store from other code are other cells: `Fanout.session_key`.)"""
    for index, record in enumerate(records):
        for field in ("git", "versions"):
            if record.get(field) != records[0].get(field):
                hosts = [(r.get("worker") or {}).get("host") for r in (records[0], record)]
                raise RuntimeError(
                    f"records: cell {index} (on {hosts[1]}) ran other code than cell 0 (on {hosts[0]}): {field} "
                    f"{record.get(field)} vs {records[0].get(field)}; run every worker on one checkout and one set "
                    "of packages, into another store (this one keeps these cells)"
                )


def execute(session: Any, cell: Cell) -> tuple[dict[str, Any], dict[str, bytes] | None]:
    """Run `cell` on a worker's `session`: (its record, its output files or None)."""
    args = cell.args
    if cell.kind == "qualify":
        request, baseline, candidate = args["request"], args["baseline"], args["candidate"]
        return qualify_here(session, [request], baseline, candidate, args["rounds"], args["budget"], False)[0], None
    if cell.kind == "calibrate":
        return _search(session, **args).to_record(), None
    if cell.kind == "generate":
        session.accelerate(args["accelerations"])
        result = session.generate(args["request"], progress=False)
        with tempfile.TemporaryDirectory() as folder:
            result.save(folder, cell.name)
            files = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file() and p.name[0] != "."}
        return result.summary(), files
    raise ValueError(f"cell.kind: {cell.kind!r}; allowed: qualify, calibrate, generate")


def _search(
    session: Any, calibration_requests: list[Request], test: list[Request], plugins: list[str], **options: Any
) -> calibration.Calibration | calibration.Stack:
    """The search of `calibrate` (the CLI's budget and base resolved here, on the worker), not confirmed."""
    from workbench.profiles import profile

    requests, knob, fixed = calibration_requests, options.pop("knob"), options.pop("fixed", {})
    budget = Budget.from_dict({**default_budget(session).to_dict(), **options.pop("budget")})
    options["base"] = profile(options.pop("base_profile"), session.model.family.name, session.device, session.model)
    if len(plugins) == 1:
        result = calibration.calibrate(
            session, requests, None, plugins[0], budget, knob=knob, options=fixed.get(plugins[0]), progress=False,
            **options,
        )  # fmt: skip
    else:
        result = calibration.stack(session, requests, None, plugins, budget, options=fixed, progress=False, **options)
    result.scope = calibration.scope_of(session, requests, test)  # what the setting holds for, test seeds included
    return result


def _qualifications(fanout, store, requests, baseline, candidates, rounds, budget) -> list[dict[str, Any]]:
    """One merged qualification record per candidate; the configurations are validated on a worker first, unless
    the store already holds every cell."""
    groups = [
        [
            Cell(
                "qualify",
                {"request": r, "baseline": baseline, "candidate": c, "rounds": rounds, "budget": budget},
                f"{json.dumps(c, sort_keys=True, separators=(',', ':'))} seed {r.seed}: {r.prompt[:24]}",
            )
            for r in requests
        ]
        for c in candidates
    ]
    cells = [cell for group in groups for cell in group]
    if fanout.pending(cells, store):
        fanout.validate([baseline, *candidates], rounds, requests)
    records = _records(fanout.run(cells, store), store)
    check_one_code(records)  # across configurations too: a sweep's rows are compared with each other
    size = len(requests)
    return [merge(records[i * size : (i + 1) * size]) for i in range(len(candidates))]


def _records(entries: dict[str, dict[str, Any]], store: Store) -> list[dict[str, Any]]:
    failed = [entry for entry in entries.values() if entry["status"] != "finished"]
    if failed:
        shown = "; ".join(f"{entry['label']}: {entry['error']}" for entry in failed[:5])
        raise RuntimeError(
            f"{len(failed)} of {len(entries)} cells failed ({shown}); the store {store.root} keeps the "
            f"{len(entries) - len(failed)} finished, and a re-run runs only the failed ones"
        )
    return [entry["record"] for entry in entries.values()]
