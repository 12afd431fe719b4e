"""Where the time of one block-sparse call at 20 % density goes, for q/k/v in two layouts: (B, H, T, D)
contiguous (the sparse benchmark's structured set) and the same values as a transposed view of (B, T, H, D) (the
layout diffusers' attention hands over, as in the captured set). Per layout: the call, `plan` and `attend` on the
stream clock (benchmarks/sparse_attention_h200.timed_ms), and the device time of each kernel in 5 profiled calls.

Run: `python -m benchmarks.sparse_call_profile` (one H200, under a minute); writes
`$OUT/<date>-sparse-call-profile.json`. Question it answers: run 5-6 found the structured call ~0.25 ms slower than
its two parts timed alone, the captured one not.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.common import envelope, kernel_split, write
from benchmarks.sparse_attention_h200 import DIM, HEADS, TOKENS, dense, structured_qkv, tau_for, timed_ms
from workbench.kernels.block_sparse_attention import attend, block_sparse_attention, plan


def layouts() -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    q, k, v = structured_qkv(11)
    # the same values stored token-major: (B, T, H, D) contiguous, seen as (B, H, T, D)
    views = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    return {"bhtd_contiguous": (q, k, v), "bthd_view": views}


def measure(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Any]:
    tau, density = tau_for(q, k, 0.20)
    route = plan(q, k, v, tau, 0)
    row: dict[str, Any] = {"tau": tau, "density": density}
    row["cudnn"] = timed_ms(lambda: dense(q, k, v, "cudnn"))
    row["call"] = timed_ms(lambda: block_sparse_attention(q, k, v, tau, 0))
    row["plan"] = timed_ms(lambda: plan(q, k, v, tau, 0))
    row["attend"] = timed_ms(lambda: attend(q, k, v, route))

    def five() -> None:
        for _ in range(5):
            block_sparse_attention(q, k, v, tau, 0)
        torch.cuda.synchronize()

    _, per_kernel, _ = kernel_split(five, True)
    row["kernels_us_per_call"] = {
        name[:120]: us / 5 for name, (us, _) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])
    }
    return row


def main() -> None:
    arms = {name: measure(*qkv) for name, qkv in layouts().items()}
    for name, row in arms.items():
        print(name, {p: round(row[p]["stream_ms"], 3) for p in ("cudnn", "call", "plan", "attend")}, flush=True)
        print("  ", {k: round(v, 1) for k, v in list(row["kernels_us_per_call"].items())[:10]}, flush=True)
    shape = {"batch": 1, "heads": HEADS, "tokens": TOKENS, "head_dim": DIM, "dtype": "bfloat16"}
    write(envelope("sparse-call-profile", shape, arms, {}, __doc__.split("\n\n")[0]), "sparse-call-profile")


if __name__ == "__main__":
    main()
