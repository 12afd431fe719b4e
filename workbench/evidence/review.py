"""Two or more qualification records side by side, as one static HTML page (the review notebook's report).

A record whose candidate did not execute (`not_executed`) shows no speed-up anywhere, in no table:
its timings measured the baseline twice, whatever the numbers say.
"""

from __future__ import annotations

import html
import json
from typing import Any

from workbench.environment import device_label
from workbench.evidence.report import Table, budget_text, page, receipts_text, speedup_text, video
from workbench.request import shown
from workbench.result import Result

# The quality columns, record key -> heading (worded as in the qualification and sweep reports); the audio ones when
# a case measured sound.
QUALITY = {
    "within_budget": "in budget",
    "exact": "exact",
    "latent_rel_l2": "latent rel-L2",
    "psnr_db": "PSNR dB",
    "psnr_min_db": "min-frame PSNR dB",
    "ssim_mean": "mean SSIM",
    "min_ssim": "min-frame SSIM",
}
QUALITY_AUDIO = {"audio_snr_db": "audio SNR dB", "lsd_db": "log-spectral distance dB"}
# The keys of a qualification record the page reads (`harness.qualify` writes them, with kind "qualification").
REVIEWED = ("verdict", "cases", "baseline", "candidate", "rounds", "budget", "device")
CASE = ("verdict", "reason", "speedup", "quality", "receipts")  # the keys of each case the page reads


def review_page(
    records: dict[str, dict[str, Any]], pilots: dict[str, list[tuple[Result, Result]]] | None = None
) -> str:
    """The page comparing `records` (label -> record as `qualify` made it): a summary (each record's budget in
    words), the speed-ups with their CI95 and pairs, the quality metrics per case with the budget's failures, and,
    for labels in `pilots`, each case's baseline and candidate pilot videos (>= 256 px, captioned). Static: data
    URIs, no script. A record of another kind (a calibrate `stack.json`, a sweep, a `result.json`) is a ValueError
    naming its label."""
    if not records:
        raise ValueError("records: at least one record is required")
    for label, record in records.items():
        _check_qualification(label, record)
    labels = list(records)
    summary = {
        "verdict": [r["verdict"] for r in records.values()],
        "model": [r.get("model") for r in records.values()],
        "device": [device_label(r["device"]) for r in records.values()],
        "baseline": [json.dumps(r["baseline"]) for r in records.values()],
        "candidate": [json.dumps(r["candidate"]) for r in records.values()],
        "rounds": [r["rounds"] for r in records.values()],
        "cases": [len(r["cases"]) for r in records.values()],
        "budget": [budget_text(r["budget"]) for r in records.values()],
    }
    speed, quality, receipts = {}, {}, {}
    audio = any(case["quality"].get("audio_snr_db") is not None for r in records.values() for case in r["cases"])
    metrics = QUALITY | (QUALITY_AUDIO if audio else {})
    for label, record in records.items():
        for index, case in enumerate(record["cases"]):
            row = f"{label} case {index}"
            speed[row] = [case["verdict"], speedup_text(case), case["speedup"].get("n_pairs"), case["reason"]]
            failures = "; ".join(case["quality"].get("failures", [])) or "none"
            quality[row] = [*(case["quality"].get(m) for m in metrics), failures]
            receipts[row] = [receipts_text(case["receipts"])]
    title = "Review: " + " vs ".join(f"{label} {json.dumps(records[label]['candidate'])}" for label in labels)
    body = [
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Records</h2>",
        Table(summary, ["", *labels]).html(),
        "<h2>Speed (baseline time / candidate time, median and CI95 of paired rounds)</h2>",
        Table(speed, ["", "verdict", "speed-up", "pairs", "reason"]).html(),
        "<h2>Quality of each candidate against its baseline</h2>",
        Table(quality, ["", *metrics.values(), "budget failures"]).html(),
        "<h2>What ran (receipts of the candidate's pilot)</h2>",
        Table(receipts, ["", "receipts"]).html(),
    ]
    for label, pairs in (pilots or {}).items():
        for index, (a, b) in enumerate(pairs):
            candidate = json.dumps(records[label]["candidate"])
            body += [f"<h2>{html.escape(label)} case {index}</h2>", video(a, "baseline"), video(b, candidate)]
    return page(title, body)


def _check_qualification(label: str, record: Any) -> None:
    """ValueError naming `label` unless `record` is a qualification record (a dict of kind "qualification", or of no
    kind, holding every key in REVIEWED)."""
    allowed = "allowed: a qualification record (what qualify returns; `workbench qualify` writes qualification.json)"
    if not isinstance(record, dict):
        raise ValueError(f"records[{label!r}]: a {type(record).__name__}; {allowed}")
    kind = record.get("kind", "qualification")
    if kind != "qualification":
        raise ValueError(f"records[{label!r}]: a {kind!r} record; {allowed}")
    missing = [key for key in REVIEWED if key not in record]
    if missing:
        raise ValueError(f"records[{label!r}]: a record without {', '.join(map(repr, missing))}; {allowed}")
    cases = record["cases"]
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"records[{label!r}]: 'cases' is {shown(cases)}; allowed: a non-empty list of case objects")
    for index, case in enumerate(cases):  # what the page reads of each (a hand-edited or cut record: named here)
        lacking = [key for key in CASE if not isinstance(case, dict) or key not in case]
        speed = case.get("speedup") if isinstance(case, dict) else None
        lacking += [f"speedup.{k}" for k in ("median", "low", "high") if isinstance(speed, dict) and k not in speed]
        if lacking or not isinstance(speed, dict) or not isinstance(case["quality"], dict):
            raise ValueError(
                f"records[{label!r}]: cases[{index}] is {shown(case)}; allowed: an object with {list(CASE)}, "
                "'speedup' and 'quality' objects, 'speedup' holding median, low and high"
                + (f" (missing: {', '.join(lacking)})" if lacking else "")
            )
