"""The README's generated blocks (`python -m benchmarks docs` rewrites them; never typed by hand).

A block sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`:
- `plugins`: every registered acceleration (`workbench.accelerations.available()`, the registry's order): name,
  kind, contract, one-line summary, options with their defaults (`*`: required, no default);
- `cards`: the named cards of `workbench.cards` (memory, compute capability, FP8) and what the exact-fast profile
  leaves out on each per family (`profiles.card_plan`, from the plugins' declared capabilities);
- `headline`: the headline ratios of `HEADLINE` from `benchmarks/results/<scenario>.json` (current envelope only),
  each with its CI95, device and date; a result that is missing is left out, never filled in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from benchmarks.envelope import FORMAT

# (scenario, ratio key, what it is): the figures a reader of the README looks for first.
HEADLINE = (
    ("forward-wan", "stock/exact-fast", "Wan2.1-1.3B forward (32,760 tokens): exact-fast profile"),
    ("forward-wan", "stock/bit-equal", "Wan2.1-1.3B forward: the bit-equal set"),
    ("request-wan", "stock/exact-fast", "Wan2.1-1.3B request (480x832x81, 6 steps, CFG): exact-fast"),
    ("forward-h3", "stock/exact-fast", "MiniMax-H3 33.1B forward (52,648 rows): exact-fast"),
    ("forward-h3", "stock/block_sparse", "MiniMax-H3 forward: block_sparse at 20 % density"),
    ("forward-h3", "stock/block_sparse+norms+fp8", "MiniMax-H3 forward: block_sparse + fused_block_norms + FP8"),
    ("sparse-attention", "cudnn/block_sparse@0.20 (queued)", "block-sparse attention call at 20 % vs cuDNN dense"),
    ("memory", "stock/group_offload", "Wan2.1-1.3B request: group_offload under a memory cap (< 1: slower)"),
)


def plugins_table() -> list[str]:
    """One row per registered acceleration."""
    from workbench.accelerations import available

    lines = ["| plugin | kind | contract | what it does | options (default; `*` required) |", "|---|---|---|---|---|"]
    for name, spec in available().items():
        options = ", ".join(
            f"`{o.name}`*" if o.required else f"`{o.name}={o.default!r}`".replace("|", "\\|") for o in spec.options
        )
        lines.append(f"| `{name}` | {spec.kind} | {spec.contract} | {spec.summary.replace('|', '/')} | {options} |")
    return lines


def cards_table() -> list[str]:
    """One row per named card: what it has and what exact-fast leaves out there, per family."""
    from workbench.cards import CARDS
    from workbench.kernels.targets import TARGETS
    from workbench.profiles import card_plan

    families = ("wan", "ltx2", "h3")
    lines = ["| card (`memory=`) | memory | compute | FP8 tensor cores | exact-fast leaves out (" + ", ".join(families)
             + ") |", "|---|---|---|---|---|"]  # fmt: skip
    for name, card in CARDS.items():
        left = {}
        for family in families:
            for plugin, why in card_plan("exact-fast", family, name)[1].items():
                left.setdefault(f"`{plugin}` ({why})", []).append(family)
        said = "; ".join(f"{what}: {', '.join(fams)}" for what, fams in left.items()) or "nothing"
        fp8 = "yes" if TARGETS[card.target].fp8 else "no"
        lines.append(f"| {card.label} (`{name}`) | {card.memory // 2**30} GiB | {card.target} | {fp8} | {said} |")
    return lines


def headline_table(results: Path) -> list[str]:
    """The `HEADLINE` ratios found in `results` (current envelope), in `HEADLINE`'s order."""
    lines = ["| measurement | speed-up | CI95 | device, date |", "|---|---|---|---|"]
    for scenario, key, label in HEADLINE:
        path = results / f"{scenario}.json"
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        ratio = (record.get("ratios") or {}).get(key)
        if record.get("format") != FORMAT or record.get("smoke") or not isinstance(ratio, dict):
            continue
        device = (record.get("device") or {}).get("name", "?")
        lines.append(f"| {label} | {ratio['median']:.3f}x | [{ratio['low']:.3f}, {ratio['high']:.3f}] | "
                     f"{device}, {str(record.get('date', '?'))[:10]} |")  # fmt: skip
    return lines


def render(text: str, results: Path) -> str:
    """`text` (the README) with its generated blocks rewritten. ValueError if a block's markers are missing."""
    blocks = (("plugins", plugins_table()), ("cards", cards_table()), ("headline", headline_table(results)))
    for name, lines in blocks:
        pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"README: the markers of the generated block {name!r} are missing")
        body = "\n".join(lines)
        text = pattern.sub(lambda m, body=body: f"{m.group(1)}{body}\n{m.group(2)}", text)
    return text


def update(readme: Path, results: Path) -> Path:
    """Rewrite `readme`'s generated blocks in place (atomically); returns `readme`."""
    from workbench.io import write_atomic

    return write_atomic(readme, render(readme.read_text(), results).encode())


def blocks(text: str) -> dict[str, Any]:
    """name -> body of each generated block in `text` (for tests)."""
    return dict(re.findall(r"<!-- generated:(\w+) -->\n(.*?)<!-- /generated:\1 -->", text, re.DOTALL))
