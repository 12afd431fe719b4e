"""attention_policy: dense attention unless a qualified sparse setting exists for exactly this case.

`policy="auto"` (the default) resolves per family, device and size: dense (the stock dispatcher backend,
`native`: PyTorch SDPA, which picks flash/cuDNN on a GPU) unless the registry of qualified settings holds an
entry for exactly this family, this device (its name as records store it, e.g. "NVIDIA H200"), this model (the denoiser
class and a digest of its config, `model_key`) and this size (the number of target-video rows a self-attention
call carries, `video_tokens`: 32,760 for Wan at 480x832x81). Only such a call runs the entry's sparse plugin
with the entry's options; every other call, and every call on another device / model / size, runs dense.
`policy="dense"` is the explicit dense choice (installs nothing).

Where the qualified settings come from: `qualified_attention.json` beside this module (or the file named by
the `registry` option). An entry is accepted only if its `evidence` is a qualification record (the A/B/A
harness, `workbench.evidence.harness.qualify`) whose verdict is `qualified`, whose candidate is exactly
`{plugin: options}` and whose device name matches: a setting that lost its evidence, or never had a speed
claim, cannot be auto-selected. An entry whose plugin cannot run here (sol-attn missing) is a RuntimeError at
install, never a silent dense run.

Receipt: `policy` (what actually ran: "dense", or the sparse plugin that served the qualified calls; its dense
steps/blocks still show under `dense_calls`), `contract` ("bitwise"
while only dense ran, "approximate" once a sparse call ran, so `Result.exact` is False exactly then), the
routing counters (`sparse_calls`, `dense_calls`, `unqualified_calls`, ...) and the entry used.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench import environment
from workbench.accelerations.attention import sol_package
from workbench.accelerations.attention.sparse_kernels import LOW_PRECISION, block_sparse_attend
from workbench.accelerations.attention.sparse_routing import ROUTED, Call, Router, Settings
from workbench.accelerations.base import Handle, Spec, option

REGISTRY_FILE = Path(__file__).with_name("qualified_attention.json")
ROOT = Path(__file__).resolve().parents[3]  # evidence paths in an entry are relative to the repository root
ENTRY_FIELDS = ("family", "device", "model_key", "video_tokens", "plugin", "options", "evidence")
# the registered sparse plugins whose settings this policy can serve, each with the options its attend reads from
# Settings.extra
EXTRA = {"block_sparse": LOW_PRECISION, "sol_attn": sol_package.OPTIONS}
ROUTABLE = tuple(EXTRA)


def _spec(plugin: str) -> Spec:
    """The registered Spec of a routable plugin (looked up at use: the registry imports this module)."""
    from workbench.accelerations import REGISTRY

    return REGISTRY[plugin]


def device_name(device: torch.device) -> str:
    """The device's name as qualification records store it (`environment.device_info`): "NVIDIA H200", "x86_64"."""
    return environment.device_info(device)["name"]


def model_key(model: Any) -> str:
    """The denoiser class(es) and a digest of their configs: two models with one key have the same shapes."""
    parts = []
    for denoiser in model.denoisers():
        config = {k: v for k, v in dict(denoiser.config).items() if not k.startswith("_")}
        digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]
        parts.append(f"{type(denoiser).__name__}:{digest}")
    return "+".join(parts)


def load_registry(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a registry file, each checked against its evidence; ValueError naming what is wrong."""
    path = Path(path)
    try:
        if not path.is_file():  # a device such as /dev/zero would be read without end
            raise OSError("not a regular file")
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as error:  # ValueError: a NUL in the path, or not JSON
        raise ValueError(f"attention_policy.registry: {str(path)!r} is not a readable JSON file: {error}") from error
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"attention_policy.registry: {path} must be an object with a list 'entries'")
    for number, entry in enumerate(entries):
        _check_entry(path, number, entry)
    return entries


def register(entry: dict[str, Any], registry: str | Path = REGISTRY_FILE) -> Path:
    """Add `entry` (what `workbench.evidence.calibrate.registry_entry` earns) to `registry`, replacing an entry for the
    same family, device, model and video_tokens; checked against its evidence first, written atomically. The
    committed registry only takes evidence inside the repository (stored relative to its root, so the entry holds on
    another checkout). ValueError, with nothing written, otherwise. Returns the registry's path."""
    from workbench.io import json_bytes, write_atomic

    registry, entry = Path(registry), dict(entry)
    evidence = Path(entry.get("evidence", "")).resolve()
    if registry.resolve() == REGISTRY_FILE.resolve():
        if not evidence.is_relative_to(ROOT):
            raise ValueError(f"register: evidence {str(evidence)!r} is outside the repository {str(ROOT)!r}")
        entry["evidence"] = str(evidence.relative_to(ROOT))
    entries = load_registry(registry) if registry.exists() else []
    _check_entry(registry, len(entries), entry)
    same = ("family", "device", "model_key", "video_tokens")
    kept = [e for e in entries if any(e[key] != entry[key] for key in same)]
    data = json.loads(registry.read_text()) if registry.exists() else {"version": 1}
    write_atomic(registry, json_bytes({**data, "entries": [*kept, entry]}))
    return registry


def _check_entry(path: Path, number: int, entry: Any) -> None:
    where = f"attention_policy.registry: {path} entry {number}"
    if not isinstance(entry, dict) or set(ENTRY_FIELDS) - set(entry):
        raise ValueError(f"{where}: needs the fields {list(ENTRY_FIELDS)}, got {entry!r}")
    if entry["plugin"] not in ROUTABLE:
        raise ValueError(f"{where}: plugin {entry['plugin']!r}; allowed: {sorted(ROUTABLE)}")
    options = _spec(entry["plugin"]).validate(entry["options"])
    if isinstance(entry["video_tokens"], bool) or not isinstance(entry["video_tokens"], int):
        raise ValueError(f"{where}: video_tokens must be an int, got {entry['video_tokens']!r}")
    evidence = Path(entry["evidence"])
    evidence = evidence if evidence.is_absolute() else ROOT / evidence
    try:
        record = json.loads(evidence.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{where}: evidence {str(evidence)!r} is not a readable record: {error}") from error
    candidate = record.get("candidate") or {}
    problems = []
    if record.get("kind") != "qualification" or record.get("verdict") != "qualified":
        problems.append(f"verdict {record.get('verdict')!r} (a {record.get('kind')!r} record), not 'qualified'")
    if set(candidate) != {entry["plugin"]} or _spec(entry["plugin"]).validate(candidate[entry["plugin"]]) != options:
        problems.append(f"candidate {candidate!r} is not {{{entry['plugin']!r}: {entry['options']!r}}}")
    if (record.get("device") or {}).get("name") != entry["device"]:
        problems.append(f"device {(record.get('device') or {}).get('name')!r} is not {entry['device']!r}")
    if record.get("model_key") not in (None, entry["model_key"]):
        problems.append(f"model_key {record['model_key']!r} is not {entry['model_key']!r}")
    if problems:
        raise ValueError(f"{where}: evidence {evidence} does not back it: {'; '.join(problems)}")


class _Installed(Handle):
    def __init__(self, spec: Spec, options: dict[str, Any], router: Router | None, entries: dict[int, dict]):
        super().__init__(spec, options, proof=("sparse_calls", "dense_calls", "dense_requests"))
        self.router, self.entries = router, entries
        if router is not None:
            router.receipt = self.receipt
            router.install()

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        if self.router is None:
            self.receipt.counters["dense_requests"] += 1  # nothing installed: every call is the stock backend
        else:
            self.router.reset(steps)

    def report(self) -> dict[str, Any]:
        report = super().report()
        counters = self.receipt.counters
        sparse_sizes = self.receipt.notes.get("sparse_video_tokens", [])
        if self.router is not None:
            report.setdefault("notes", {}).update(self.router.notes())
        used = sorted({self.entries[rows]["plugin"] for rows in sparse_sizes})
        report["policy"] = "+".join(used) if used else "dense"
        report["contract"] = "approximate" if counters["sparse_calls"] > 0 else "bitwise"
        report["dense_backend"] = "native (the stock dispatcher backend)"
        report["entries"] = [self.entries[rows] for rows in sparse_sizes]
        return report

    def _remove(self) -> None:
        if self.router is not None:
            self.router.remove()


@dataclass(frozen=True)
class AttentionPolicyConfig:
    """attention_policy's options."""

    policy: str = option("auto", allowed=("auto", "dense"), help="auto: qualified sparse or dense; dense")
    registry: str = option("", help="qualified-settings file; empty: the committed qualified_attention.json")


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    if options["policy"] == "dense":
        return lambda: _Installed(SPEC, options, None, {})
    entries = load_registry(options["registry"] or REGISTRY_FILE)
    key = (model.family.name, device_name(device), model_key(model))
    matching = {e["video_tokens"]: e for e in entries if (e["family"], e["device"], e["model_key"]) == key}
    if not matching:
        return lambda: _Installed(SPEC, options, None, {})
    settings = {
        rows: Settings.from_options(
            {**_spec(e["plugin"]).validate(e["options"]), "plugin": e["plugin"]},
            extra=("plugin", *EXTRA[e["plugin"]]),
        )
        for rows, e in matching.items()
    }
    attends = {}
    for plugin in sorted({e["plugin"] for e in matching.values()}):  # every check of that plugin, here
        spec = _spec(plugin)
        example = next(spec.validate(e["options"]) for e in matching.values() if e["plugin"] == plugin)
        if plugin == "sol_attn":
            attends[plugin] = sol_package.router_for(model, device, example, None).attend
        else:
            attends[plugin] = block_sparse_attend

    def attend(call: Call) -> tuple[torch.Tensor, torch.Tensor | None]:
        notes = call.router.receipt.notes
        rows = call.kwargs["query"].shape[1] - call.prefix
        notes["sparse_video_tokens"] = sorted({*notes.get("sparse_video_tokens", []), rows})
        return attends[call.settings.extra["plugin"]](call)

    router = Router("attention_policy", model, None, attend, settings.get)
    if "block_sparse" in attends:
        from workbench.kernels.block_sparse_attention import DTYPES, MAX_HEAD_DIM

        router.check_modules(MAX_HEAD_DIM, DTYPES)
    return lambda: _Installed(SPEC, options, router, matching)


SPEC = Spec(
    name="attention_policy",
    contract="approximate",  # may run a qualified sparse setting; its receipt says which contract actually ran
    summary="auto: dense attention unless a qualified sparse setting exists for this family, device and size",
    prepare_fn=_prepare,
    config=AttentionPolicyConfig,
    # it routes like the sparse plugins and chooses the dense backend itself: it stacks with neither
    touches=("attention_processor.backend", ROUTED, "blocks.compiled_call"),
    order=20,
)
SPECS = (SPEC,)
