"""Issue-6 first GPU look: are the block kernels bitwise on the H200, how fast are they against the
roofline, and what do the exact plugins do to a Wan2.1-1.3B-shaped request (A/B/A harness)."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.common import envelope, wan_1_3b_request, write
from workbench import Session
from workbench.evidence.harness import qualify
from workbench.evidence.records import write_record
from workbench.kernel_bench import WAN_1_3B, micro_benchmarks


def main() -> None:
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    results = {"kernels": {row["kernel"]: row for row in micro_benchmarks(**WAN_1_3B)}}
    write(envelope("exact-fast-kernels", WAN_1_3B, results, {}, "first GPU look"), "exact-fast-kernels")
    session = Session.open("random-wan-1.3b", device="cuda", dtype="bfloat16")
    request = wan_1_3b_request(4)
    for name, candidate in [
        ("fused-block-ops", {"fused_block_ops": {}}),
        ("exact-plugins", {"fused_block_ops": {}, "adaln_precompute": {}, "cross_kv_cache": {}}),
    ]:
        try:
            record, _ = qualify(session, [request], {}, candidate, rounds=3, progress=False)
        except Exception as error:
            write_record(out / f"exact-fast-{name}.json", {"error": repr(error)})
            print(name, "error", repr(error))
            continue
        write_record(out / f"exact-fast-{name}.json", record)
        case = record["cases"][0]
        print(name, record["verdict"], case["reason"], "exact:", case["quality"]["exact"], case["receipts"])


if __name__ == "__main__":
    main()
