"""Issue-7 CPU evidence for block-sparse attention on the tiny Wan of head dim 128 (`wan.tiny_d128`), under the
Triton interpreter (`python -m benchmarks.sparse_cpu`, about two minutes on two cores):

1. quality on real activations: q/k/v captured from the model's own attn1 calls (both blocks, both steps) and
   the relative L2 of the kernel's output against dense attention at a few tau, with the routing density;
2. the A/B/A harness (`qualify`) on stock vs block_sparse: quality of the whole request, receipts, verdict.

Both are statements about a random-weight tiny model on a CPU: they prove the paths and show how far the method
moves this model, not quality on a trained model nor any speed (the verdict can be at best `no_speed_claim`).
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from benchmarks.common import envelope, write  # noqa: E402
from workbench import Request, Session  # noqa: E402
from workbench.accelerations.attention.sparse_routing import captured_qkv  # noqa: E402
from workbench.evidence.harness import qualify  # noqa: E402
from workbench.kernels.block_sparse_attention import block_sparse_attention  # noqa: E402
from workbench.models import wan  # noqa: E402

SIZE = {"frames": 9, "height": 128, "width": 192, "steps": 2, "guidance": 1.0}  # 288 tokens, 5 blocks
TAUS = (float("-inf"), -0.5, 0.0, 0.5, 1.0, float("inf"))
CANDIDATE = {"block_sparse": {"tau": 0.0}}


def quality(session: Session) -> dict:
    with captured_qkv(session.model) as records:
        session.generate(Request("a red circle moves left", seed=42, **SIZE), progress=False)
    rows = []
    for record in records:
        q, k, v = (record[x].transpose(1, 2).float() for x in "qkv")
        dense = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v
        for tau in TAUS:
            out, density = block_sparse_attention(q, k, v, tau, 0, return_density=True)
            rel = ((out - dense).norm() / dense.norm()).item()
            rows.append({"step": record["step"], "block": record["block"], "tau": tau, "density": float(density),
                         "rel_l2": rel})  # fmt: skip
            print(
                f"step {record['step']} block {record['block']} tau {tau:5} density {float(density):.3f} rel-L2 {rel:.3e}"
            )
    return {"captured_calls": len(records), "tokens": int(records[0]["q"].shape[1]), "rows": rows}


def main() -> None:
    session = Session(wan.tiny_d128(), torch.device("cpu"), torch.float32, 0.0)
    table = quality(session)
    shape = {"model": "tiny-wan-d128", "heads": 1, "head_dim": 128, "tokens": table["tokens"], **SIZE}
    notes = (
        "q/k/v captured from the random-weight tiny Wan's attn1 (fp32, CPU, Triton interpreter); rel-L2 of the "
        "block-sparse kernel vs dense softmax attention per captured call and tau (sink 0, no protected rows). "
        "Random weights: near-uniform attention with small outputs, so the mean pseudo-keys move the output more "
        "than on a trained model is likely to; not a quality claim for trained models."
    )
    write(
        envelope("sparse-quality-tiny-wan-cpu", shape, {"block_sparse": table}, {}, notes),
        "sparse-quality-tiny-wan-cpu",
    )

    request = Request("a red circle moves left", seed=42, **SIZE)
    record, _ = qualify(session, [request], {}, CANDIDATE, rounds=3, progress=False)
    case = record["cases"][0]
    arms = {"stock": {"seconds": case["baseline_seconds"]}, "block_sparse": {"seconds": case["candidate_seconds"],
            "receipts": case["receipts"], "exact": case["exact"]}}  # fmt: skip
    ratios = {"speedup": case["speedup"], "quality": case["quality"]}
    notes = (
        f"A/B/A harness, stock vs {CANDIDATE} on a CPU under the Triton interpreter: verdict {record['verdict']} "
        f"({case['reason']}). CPU times say nothing about the GPU product; the interpreter makes the kernel far "
        "slower than torch's dense attention here."
    )
    result = envelope("sparse-qualify-tiny-wan-cpu", shape, arms, ratios, notes)
    result["qualification"] = record
    write(result, "sparse-qualify-tiny-wan-cpu")
    print(record["verdict"], case["reason"], case["quality"].get("latent_rel_l2"))


if __name__ == "__main__":
    main()
