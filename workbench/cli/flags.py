"""The command line's values read and checked before any model loads. The JSON flags (`--accelerate`, `--baseline`,
`--candidate`, `--budget`, `--base`, `--options`), `--values`, `--candidates`, `--adapter` and the `--out` folders are
parsed into what the library takes, each refusal a ValueError under its flag (`_flagged` puts the library's own
words under the flag that gave the value); `_shapes` gives a model's request defaults without reading its weights,
so a request the model refuses is named before it loads; `_note_a_a` and `_note_replaced` say on stderr, before a
run, what a person may not have meant (an arm that is the baseline, an `--out` holding an earlier run's files). As
everywhere in `workbench.cli`, the library is imported inside the functions, on first use."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


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


def _flagged(flag: str | tuple[str, ...] | dict[str, str], check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`check(*args, **kwargs)`, its ValueError said under the command line's `flag`: `--rounds: 0; ...` where the
    library says `rounds: 0; ...`, `--accelerate: easycache.threshold: ...` where it names no flag's field. Given
    several flags, the error goes under the one whose field it names (`max_evals: ...` under `--max-evals`), and
    stays as it is when it names none of them. A flag whose field the library names otherwise comes as {flag: field}
    (`{"--ray": "address"}`)."""
    try:
        return check(*args, **kwargs)
    except ValueError as error:
        text, names = str(error), (flag,) if isinstance(flag, str) else flag
        flags = names if isinstance(names, dict) else {n: n.removeprefix("--").replace("-", "_") for n in names}
        for name, field in flags.items():
            if len(flags) == 1 or text.startswith(f"{field}: "):
                raise ValueError(f"{name}: {text.removeprefix(f'{field}: ')}") from None
        raise


def _shapes(model: str) -> Any:
    """`models.preview(model)`: its family and request defaults with no weight read, to check requests before it
    loads. None when its shapes do not build here (a folder only the Ray workers hold, a config the meta device
    cannot build, a name that is no model): the model's own load then reports what is wrong, or checks the requests
    once loaded, as `Session.open`'s memory planning leaves such a model to the load (a `--ray` run on this machine
    refuses a name that is no model at once: `fanout._check_cases_here`)."""
    from workbench.models import preview

    try:
        return preview(model)
    except (ValueError, RuntimeError):
        return None
