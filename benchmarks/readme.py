"""The README's generated blocks (`python -m benchmarks docs` rewrites them; never typed by hand).

A block sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`:
- `plugins`: every registered acceleration (`workbench.accelerations.available()`, the registry's order): name,
  kind, contract, one-line summary, options with their defaults (`*`: required, no default);
- `cards`: the named cards of `workbench.cards` (memory, compute capability, FP8) and what the exact-fast profile
  leaves out on each per family (`profiles.card_plan`, from the plugins' declared capabilities);
- `fits`: per named card and released model size (`workbench.model_sizes`), the memory planner's arrangement for one
  whole request at the model's reference size (bf16 weights, estimated activations), or "no" with the smallest cap
  that fits; then what `ring.json` measured under a cap, the ring beside diffusers' group offloading under the same
  cap (`ring-group-offload-*.json`) and the whole H3 request under a cap, when present;
- `headline`: the headline ratios of `HEADLINE` from `benchmarks/results/<stem>.json` (current envelope only),
  each with its CI95, device and date; a result that is missing, or whose candidate the record does not confirm
  (`docs.unconfirmed`), is left out, never filled in. A label says what its record ran: `{plugins}` and `{base}` are
  filled from the record's `shape`, and "exact-fast" reads "exact-fast (without FA4)" where the candidate arm's
  config has no flash4_attention.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from benchmarks.docs import candidate_arm, read_json, unconfirmed
from benchmarks.envelope import FORMAT

# (results file stem, ratio key, what it is): the figures a reader of the README looks for first.
HEADLINE = (
    ("forward-wan", "stock/exact-fast", "Wan2.1-1.3B forward (32,760 tokens): exact-fast profile"),
    ("forward-wan", "stock/bit-equal", "Wan2.1-1.3B forward: the bit-equal set"),
    ("forward-wan", "stock/exact-fast+fp8_attention", "Wan2.1-1.3B forward: exact-fast + fp8_attention (approximate)"),
    ("request-wan", "stock/exact-fast", "Wan2.1-1.3B request (480x832x81, 6 steps, CFG): exact-fast"),
    (
        "request-lora",
        "stock+unfused/exact-fast+fused",
        "Wan2.1-1.3B 4-step request with a LoRA: exact-fast + fused "
        "adapter + fused decode vs stock + diffusers' LoRA layers",
    ),
    ("request-wan22", "stock/exact-fast", "Wan2.2-A14B request (2 x 14B experts, reduced steps): exact-fast"),
    ("forward-h3", "stock/exact-fast", "MiniMax-H3 33.1B forward (52,648 rows): exact-fast"),
    ("forward-h3", "stock/block_sparse", "MiniMax-H3 forward: block_sparse at 20 % density"),
    ("forward-h3", "stock/block_sparse+norms+fp8", "MiniMax-H3 forward: block_sparse + fused_block_norms + FP8"),
    (
        "forward-h3-fp8",
        "stock/exact-fast+fp8_attention",
        "MiniMax-H3 forward: exact-fast + fp8_attention (approximate)",
    ),
    (
        "forward-h3-lowbit",
        "stock/block_sparse(int8)+norms+fp8",
        "MiniMax-H3 forward: block_sparse with INT8/FP8 exact blocks + fused_block_norms + FP8",
    ),
    ("sparse-attention", "cudnn/block_sparse@0.20 (queued)", "block-sparse attention call at 20 % vs cuDNN dense"),
    (
        "fp8-attention",
        "flash4/fp8_attention[qk=int8,pv=fp8]",
        "FP8 attention call (INT8 Q.K^T, FP8 P.V: fp8_attention's default) vs FlashAttention-4",
    ),
    (
        "fp8-attention",
        "flash4/fp8_attention[qk=int8,pv=int8]",
        "FP8 attention call with INT8 P.V (`pv='int8'`, the lower-error P.V) vs FlashAttention-4",
    ),
    (
        "calibrate-wan",
        "stock/within-budget seed 42",
        "Wan2.1-1.3B 16-step request within the default quality budget, held-out seed 42: {plugins} calibrated over "
        "{base}",
    ),
    ("memory", "stock/group_offload", "Wan2.1-1.3B request: group_offload under a memory cap (< 1: slower)"),
    (
        "ring-exact-fast-48GiB",
        "resident/ring+exact-fast-48GiB",
        "MiniMax-H3 forward under a 48 GiB cap: block ring + exact-fast vs resident stock",
    ),
    ("request-capped", "resident/plan", "Wan2.1-14B request under a 24 GiB cap: the session's memory plan"),
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
        lines.append(f"| {card.label} (`{name}`) | {_card_gib(card.memory)} | {card.target} | {fp8} | {said} |")
    return lines


def fits_table(results: Path) -> list[str]:
    """One row per named card, one column per released model size (`workbench.model_sizes.card_plans`: the planner's
    plan, "no" with the smallest cap that fits where it refuses the card), the requests, weights and smallest caps
    above, a legend, and the capped forwards `results/ring.json` measured (left out when missing or a smoke run)."""
    from workbench.cards import CARDS
    from workbench.memory_plan import DEVICE_OUTSIDE, footprint
    from workbench.model_sizes import RELEASED, card_plans, meta_model, plan, reference_request

    requests, weights, smallest = [], [], {}
    for name in RELEASED:
        request = reference_request(name)
        cfg = f", CFG {request.guidance:g}" if request.guidance is not None and request.guidance > 1 else ""
        requests.append(f"{request.height}x{request.width}, {request.frames} frames, {request.steps} steps{cfg}")
        fp = footprint(meta_model(name), request)
        weights.append(sum(fp.components.values()) + sum(map(sum, fp.blocks.values())) + sum(fp.denoiser_rest.values()))
        smallest[name] = plan(name, 2**50).minimum_cap
    lines = [
        "| card (`memory=`) | " + " | ".join(RELEASED) + " |",
        "|---" * (len(RELEASED) + 1) + "|",
        "| request | " + " | ".join(requests) + " |",
        "| bf16 weights | " + " | ".join(map(_gib_up, weights)) + " |",
        "| smallest cap that fits | " + " | ".join(map(_gib_up, smallest.values())) + " |",
    ]
    for card, plans in card_plans().items():
        cells = [_cell(p) if p else f"no (needs {_gib_up(smallest[name])})" for name, p in plans.items()]
        lines.append(f"| `{card}` ({_card_gib(CARDS[card].memory)}) | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Planner estimates, not measurements: `workbench.memory_plan.plan_for` on each release built from its published "
        "configuration on the meta device (`workbench.model_sizes`, which names the reference requests), activation "
        f"peaks from the planner's formulas; of each card, {DEVICE_OUTSIDE / 2**30:.2f} GiB kept for the CUDA context "
        "and the libraries' kernels (`memory_plan.DEVICE_OUTSIDE`) and 10 % of the rest as headroom. `resident`: "
        "everything stays on the card; `offload X`: X waits in host memory between its stages; `ring S/N`: S of the "
        "denoiser's N blocks stream from pinned host memory each forward (`block_ring`, one per expert on Wan2.2); "
        "`text ring S/N`: S of the (offloaded) text encoder's N layers stream through the same ring during text "
        "encoding, the rest of it comes on whole for that stage; `denoiser offloaded outside denoise`: the "
        "denoiser's resident weights wait in host memory during the other stages and come back once a request; "
        "`tiled decode`: the VAE decodes in tiles.",
    ]
    return lines + _measured_under_cap(results) + _beside_group_offload(results) + _measured_h3_request(results)


def _gib_up(value: int) -> str:
    return f"{math.ceil(value / 2**30 * 10) / 10:.1f} GiB"


def _card_gib(memory: int) -> str:
    """A card's memory in GiB, rounded down to a tenth: "20 GiB", "79.1 GiB"."""
    return f"{math.floor(memory / 2**30 * 10) / 10:g} GiB"


def _cell(plan: Any) -> str:
    parts = [f"offload {'+'.join(plan.offloaded)}"] if plan.offloaded else []
    rings = [f"{len(plan.streamed_blocks[d])}/{n}" for d, n in plan.block_counts.items() if plan.streamed_blocks[d]]
    parts += [f"ring {' + '.join(rings)}"] if rings else []
    parts += (
        [f"text ring {len(plan.streamed_text_layers)}/{plan.text_layer_count}"] if plan.streamed_text_layers else []
    )
    parts += ["denoiser offloaded outside denoise"] if plan.denoisers_offloaded else []
    parts += ["tiled decode"] if plan.tiled_decode else []
    return ", ".join(parts) or "resident"


def _measured_under_cap(results: Path) -> list[str]:
    """A line on the block-ring arms of `results/ring.json` (current envelope, not a smoke run) that ran under their
    cap with output equal to resident, or nothing."""
    from workbench.model_sizes import RELEASED, plan

    path = results / "ring.json"
    record = read_json(path) if path.exists() else {}
    arms = [
        arm
        for arm in (record.get("arms") or {}).values()
        if "block_ring" in (arm.get("config") or {}) and arm.get("under_cap") and arm.get("equal_to_resident")
    ]
    if record.get("format") != FORMAT or record.get("smoke") or not arms:
        return []
    shape, device = record.get("shape") or {}, (record.get("device") or {}).get("name", "?")
    h3 = next(name for name, released in RELEASED.items() if released.family == "h3")
    return [
        "",
        f"Measured (`benchmarks/results/ring.json`, {device}, {str(record.get('date', '?'))[:10]}): the MiniMax-H3 "
        f"transformer forward alone ({shape.get('rows', '?'):,} rows; no text encoder, no decode) ran with the block "
        f"ring under caps of {' and '.join(_gib_up(arm['cap_bytes']) for arm in arms)} (peaks "
        f"{' and '.join(_gib_up(arm['peak_bytes']) for arm in arms)}, output equal to resident); activation peak "
        f"{_gib_up(shape.get('activation_bytes', 0))} ({shape.get('activation_source', '?')}; the planner's estimate "
        f"for the {h3} column: {_gib_up(plan(h3, 2**50).activation['denoise'])}).",
    ]


def _beside_group_offload(results: Path) -> list[str]:
    """A line per `results/ring-group-offload-*.json` (current envelope, not a smoke run) whose block ring and group
    offloading arms both ran under their cap with output equal to resident: their median forward seconds against
    resident's, from the same process; or nothing."""
    lines = []
    for path in sorted(results.glob("ring-group-offload-*.json")):
        record = read_json(path)
        arms = record.get("arms") or {}
        ring = [a for a in arms.values() if "block_ring" in (a.get("config") or {})]
        offload = [a for a in arms.values() if "group_offload" in (a.get("config") or {})]
        ran = [a for a in ring[:1] + offload[:1] if a.get("under_cap") and a.get("equal_to_resident")]
        if record.get("format") != FORMAT or record.get("smoke") or len(ran) != 2 or "resident" not in arms:
            continue
        device = (record.get("device") or {}).get("name", "?")
        pairs = min(len(a.get("seconds") or []) for a in ran)
        lines += [
            "",
            f"Measured (`benchmarks/results/{path.name}`, {device}, {str(record.get('date', '?'))[:10]}; one process, "
            f"{pairs} A/B/A pair{'s' * (pairs != 1)}): the same H3 forward under a {_gib_up(ran[0]['cap_bytes'])} cap "
            f"took {ran[0]['median_s']:.2f} s with the block ring (peak {_gib_up(ran[0]['peak_bytes'])}) and "
            f"{ran[1]['median_s']:.2f} s with diffusers' group offloading (one block per group, streams; peak "
            f"{_gib_up(ran[1]['peak_bytes'])}), against {arms['resident']['median_s']:.2f} s resident (uncapped); both "
            "outputs equal to resident.",
        ]
    return lines


def _measured_h3_request(results: Path) -> list[str]:
    """A line on `results/request-h3-capped.json` (current envelope, not a smoke run) when its request completed:
    the cap, the time, the allocated peak per stage against the plan's, and the NVML device peak; or nothing."""
    path = results / "request-h3-capped.json"
    record = read_json(path) if path.exists() else {}
    row = (record.get("arms") or {}).get("plan") or {}
    if record.get("format") != FORMAT or record.get("smoke") or not row.get("completed"):
        return []
    shape, device = record.get("shape") or {}, (record.get("device") or {}).get("name", "?")
    request, planned = shape.get("request") or {}, row.get("planned_peak_bytes") or {}
    peaks = ", ".join(
        f"{stage} {_gib_up(peak)} (planned {_gib_up(planned[stage])})"
        if stage in planned
        else f"{stage} {_gib_up(peak)}"
        for stage, peak in (row.get("peak_bytes") or {}).items()
    )
    nvml, cap = row.get("nvml_peak_used_bytes"), shape.get("cap", 0)
    device_peak = "."
    if nvml:
        over = f", {_gib_up(nvml - cap)} over the cap, which bounds the allocator" if nvml > cap else ", under the cap"
        device_peak = (
            f"; the device's own peak (NVML: the CUDA context, the libraries' memory and the allocator's cached "
            f"blocks included) {_gib_up(nvml)}{over}."
        )
    return [
        "",
        f"Measured (`benchmarks/results/request-h3-capped.json`, {device}, {str(record.get('date', '?'))[:10]}): a "
        f"whole MiniMax-H3 request ({request.get('frames')} frames of {request.get('height')}x{request.get('width')}, "
        f"{request.get('steps')} steps; text encode, denoise, video and audio decode) completed under a "
        f"{_gib_up(cap)} memory cap in {row.get('seconds', 0):.1f} s; allocated peaks per stage "
        f"{peaks} (a stage's measured peak includes its start, while the stage before still holds its components; "
        f"the plan counts each stage's own){device_peak}",
    ]


def headline_table(results: Path) -> list[str]:
    """The `HEADLINE` ratios found in `results` (current envelope, candidate confirmed), in `HEADLINE`'s order, each
    labelled as `headline_label` says."""
    lines = ["| measurement | speed-up | CI95 | device, date |", "|---|---|---|---|"]
    for stem, key, label in HEADLINE:
        path = results / f"{stem}.json"
        if not path.exists():
            continue
        record = read_json(path)
        ratio = (record.get("ratios") or {}).get(key)
        if record.get("format") != FORMAT or record.get("smoke") or not isinstance(ratio, dict):
            continue
        if unconfirmed(record, key) is not None:  # no speed-up in any table (workbench.evidence.review)
            continue
        device, date = (record.get("device") or {}).get("name", "?"), str(record.get("date", "?"))[:10]
        lines.append(f"| {headline_label(label, record, key)} | {ratio['median']:.3f}x | "
                     f"[{ratio['low']:.3f}, {ratio['high']:.3f}] | {device}, {date} |")  # fmt: skip
    return lines


def headline_label(label: str, record: dict[str, Any], key: str) -> str:
    """`label` as what `record` ran for ratio `key`: `{plugins}` (joined by " + ") and `{base}` (its plugins' names)
    from the record's `shape`, and the first "exact-fast" as "exact-fast (without FA4)" when the candidate arm's
    config has no flash4_attention (the profile leaves it out where flash_attn.cute is not installed)."""
    shape = record.get("shape") or {}
    label = label.format(plugins=" + ".join(shape.get("plugins") or []), base=", ".join(shape.get("base") or {}))
    found = candidate_arm(record, key)
    config = found[1].get("config") if found is not None else None
    if "exact-fast" in label and isinstance(config, dict) and "flash4_attention" not in config:
        label = label.replace("exact-fast", "exact-fast (without FA4)", 1)
    return label


def render(text: str, results: Path) -> str:
    """`text` (the README) with its generated blocks rewritten. ValueError if a block's markers are missing."""
    blocks = (
        ("plugins", plugins_table()),
        ("cards", cards_table()),
        ("fits", fits_table(results)),
        ("headline", headline_table(results)),
    )
    for name, lines in blocks:
        pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"README: the markers of the generated block {name!r} are missing")
        body = "\n".join(lines)
        text = pattern.sub(lambda m, body=body: f"{m.group(1)}{body}\n{m.group(2)}", text)
    return text


def blocks(text: str) -> dict[str, Any]:
    """name -> body of each generated block in `text` (for tests)."""
    return dict(re.findall(r"<!-- generated:(\w+) -->\n(.*?)<!-- /generated:\1 -->", text, re.DOTALL))
