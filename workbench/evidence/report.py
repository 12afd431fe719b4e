"""A static HTML report of a qualification record: tables, and both arms' pilot MP4s as data URIs,
so the report opens offline and survives being mailed or exported."""

from __future__ import annotations

import base64
import html
import json
from typing import Any

from workbench.result import Result


def render(record: dict[str, Any], pilots: list[tuple[Result, Result]] | None) -> str:
    """The report page; with `pilots=None` (a record read back without its outputs) the videos are
    replaced by a note saying so."""
    parts = [
        "<!doctype html><meta charset='utf-8'><title>qualification</title>",
        "<style>body{font-family:sans-serif;margin:1.5em}td,th{border:1px solid #ccc;padding:2px 6px}"
        "table{border-collapse:collapse;margin:0.5em 0}video{max-width:45%;margin-right:1%}</style>",
        f"<h1>Qualification: {html.escape(record['verdict'])}</h1>",
        _table(
            {
                "model": record["model"],
                "baseline": json.dumps(record["baseline"]),
                "candidate": json.dumps(record["candidate"]),
                "rounds": record["rounds"],
                "device": record["device"].get("name"),
                "commit": f"{record['git'].get('commit')} (dirty={record['git'].get('dirty')})",
                "budget": json.dumps(record["budget"]),
            }
        ),
    ]
    pairs = pilots if pilots is not None else [None] * len(record["cases"])
    for index, (case, pair) in enumerate(zip(record["cases"], pairs, strict=True)):
        quality = case["quality"]
        speed = case["speedup"]
        parts += [
            f"<h2>Case {index}: {html.escape(case['request']['prompt'])} (seed {case['request']['seed']})</h2>",
            f"<p><b>{html.escape(case['verdict'])}</b>: {html.escape(case['reason'])}</p>",
            _table(
                {
                    "speed-up (median, CI95)": f"{speed['median']:.4f} [{speed['low']:.4f}, {speed['high']:.4f}]",
                    "baseline seconds": _numbers(case["baseline_seconds"]),
                    "candidate seconds": _numbers(case["candidate_seconds"]),
                    "warm-up seconds": json.dumps(case["warmup_seconds"]),
                    "timed outputs match pilot": json.dumps(case["timed_outputs_match_pilot"]),
                    "latent rel-L2": quality.get("latent_rel_l2"),
                    "PSNR dB (clip / min frame)": f"{quality.get('psnr_db')} / {quality.get('psnr_min_db')}",
                    "min-frame SSIM": quality.get("min_ssim"),
                    "budget failures": "; ".join(quality.get("failures", [])) or "none",
                    "receipts": json.dumps(case["receipts"]),
                }
            ),
            _video(pair[0], "baseline") + _video(pair[1], "candidate")
            if pair is not None
            else "<p><i>Videos not embedded: this report was rendered from the record alone.</i></p>",
        ]
    return "".join(parts)


def _table(rows: dict[str, Any]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows.items())
    return f"<table>{cells}</table>"


def _numbers(values: list[float]) -> str:
    return ", ".join(f"{v:.4f}" for v in values)


def _video(result: Result, label: str) -> str:
    data = base64.b64encode(result.mp4_bytes()).decode()
    return f'<video controls title="{label}" src="data:video/mp4;base64,{data}"></video>'
