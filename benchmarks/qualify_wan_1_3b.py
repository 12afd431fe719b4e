"""Issue-4 measurement: qualification records (A/B/A harness) on a Wan2.1-1.3B-shaped request.

Pairs: cuDNN vs FA2 (torch's flash SDPA) attention; stock vs PAB; stock vs EasyCache at more steps;
stock vs regional compile. Each pair writes its record (JSON) and, when it fits the transfer limit,
its HTML report with both arms' videos; pairs run in order and each is written as soon as it is done.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks.common import wan_1_3b_request
from workbench import Session
from workbench.evidence.harness import qualify
from workbench.evidence.records import write_record
from workbench.evidence.report import render
from workbench.media import write_atomic

MAX_REPORT_BYTES = 15 * 2**20
PAIRS = [
    (
        "cudnn-vs-flash",
        4,
        {"attention_backend": {"backend": "cudnn"}},
        {"attention_backend": {"backend": "_native_flash"}},
    ),
    ("stock-vs-pab", 4, {}, {"pyramid_attention_broadcast": {}}),
    ("stock-vs-easycache", 10, {}, {"easycache": {"threshold": 0.3, "warmup": 2, "final_dense": 1}}),
    ("stock-vs-regional-compile", 4, {}, {"regional_compile": {}}),
]


def main() -> None:
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    session = Session.open("random-wan-1.3b", device="cuda", dtype="bfloat16")
    for name, steps, baseline, candidate in PAIRS:
        start = time.perf_counter()
        request = wan_1_3b_request(steps)
        try:
            record, pilots = qualify(session, [request], baseline, candidate, rounds=3, progress=False)
        except Exception as error:  # one failed pair must not lose the others; the failure is recorded
            write_record(out / f"qualify-{name}.json", {"pair": name, "error": repr(error)})
            print(f"{name}: error {error!r}")
            continue
        record["pair"] = name
        record["wall_seconds"] = time.perf_counter() - start
        record["commit_env"] = os.environ.get("WORKBENCH_COMMIT")
        write_record(out / f"qualify-{name}.json", record)
        page = render(record, pilots).encode()
        if len(page) <= MAX_REPORT_BYTES:
            write_atomic(out / f"qualify-{name}.html", page)
        case = record["cases"][0]
        print(
            name,
            record["verdict"],
            case["reason"],
            case["speedup"]["median"],
            case["speedup"]["low"],
            case["speedup"]["high"],
            case["quality"].get("latent_rel_l2"),
            f"{len(page) / 2**20:.1f} MiB",
        )


if __name__ == "__main__":
    main()
