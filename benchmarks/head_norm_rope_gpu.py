"""`head_norm_rope` (MiniMax-H3's q/k RMSNorm + rotary) on the GPU at the full-size model's q: what each launch
candidate costs per call against the copy bandwidth, next to the torch steps it replaces.

x (1, 52,648, 56, 128) bf16 (randn * 2 + 0.1, fresh seed recorded), weight (128,) bf16, float32 (T, 96) tables.
Per candidate: microseconds per call (benchmarks/norm_kernels_gpu.py's timer: each call alone after an L2 flush,
rounds with the arm order rotating), GB/s of `cost()` bytes and its fraction of COPY_BANDWIDTH, and the contract
check on the first CHECK_ROWS tokens: max-abs and relative-L2 error vs a float64 run of the chain at most 2x
torch's own (+1e-7 of the output scale). `torch` is diffusers' steps (RMSNorm, then `_apply_rotary_emb`).

Run: `python -m benchmarks.head_norm_rope_gpu` (one H200, under a minute); writes
`$OUT/<date>-head-norm-rope-gpu.json`. `--smoke`: tiny shapes on the CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import secrets
import statistics

import torch
from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

from benchmarks.common import envelope, write
from benchmarks.norm_kernels_gpu import _time
from workbench.kernel_bench import COPY_BANDWIDTH
from workbench.kernels import head_norm_rope as hnr

SHAPE, SMOKE_SHAPE, ROT = (1, 52648, 56, 128), (1, 37, 3, 128), 96
CHECK_ROWS = 2048
EPS = 1e-5


def _errors(got: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - truth
    return diff.abs().max().item(), (diff.norm() / truth.norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    seed = secrets.randbits(31)
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(shape, device=device, generator=g) * 2 + 0.1).to(torch.bfloat16)
    weight = (1 + 0.2 * torch.randn(shape[-1], device=device, generator=g)).to(torch.bfloat16)
    angles = torch.rand(shape[1], ROT // 2, device=device, generator=g).repeat(1, 2) * 40
    cos, sin = angles.cos(), angles.sin()
    norm = torch.nn.RMSNorm(shape[-1], eps=EPS, device=device, dtype=torch.bfloat16)
    norm.weight.data.copy_(weight)

    def stock() -> torch.Tensor:
        return _apply_rotary_emb(norm(x), cos, sin)

    fns = {"torch": stock, "copy": lambda: x.clone()}
    fns.update({name: (lambda launch=launch: hnr.head_norm_rope(x, weight, EPS, cos, sin, launch))
                for name, launch in hnr.CANDIDATES.items()})  # fmt: skip
    rows = slice(0, CHECK_ROWS)
    truth = hnr.reference(x[:, rows].double(), weight.double(), EPS, cos[rows].double(), sin[rows].double())
    t_max, t_rel = _errors(stock()[:, rows], truth)
    floor = 1e-7 * truth.abs().max().item()
    checks = {}
    for name in hnr.CANDIDATES:
        k_max, k_rel = _errors(fns[name]()[:, rows], truth)
        checks[name] = {
            "max_abs": k_max,
            "rel_l2": k_rel,
            "ok": k_max <= 2 * t_max + floor and k_rel <= 2 * t_rel + 1e-7,
        }
    times = _time(fns, args.rounds, args.repeats, device)
    bytes_moved = hnr.cost(shape)
    arms = {}
    for name, values in times.items():
        us = statistics.median(values)
        arms[name] = {
            "median_us": us,
            "gb_s": bytes_moved / us / 1e3,
            "of_copy": bytes_moved / (us * 1e-6) / COPY_BANDWIDTH,
        }
        arms[name].update(checks.get(name, {}))
        print(f"{name:8s} {us:9.1f} us  {arms[name]['of_copy']:.0%} of copy  {checks.get(name, '')}", flush=True)
    shape_record = {"x": list(shape), "rotated": ROT, "dtype": "bfloat16", "seed": seed, "smoke": args.smoke,
                    "torch_check": {"max_abs": t_max, "rel_l2": t_rel}}  # fmt: skip
    ratios = {"torch_over_default": arms["torch"]["median_us"] / arms["r16_w4"]["median_us"]}
    write(envelope("head-norm-rope-gpu", shape_record, arms, ratios, __doc__.split("\n\n")[0]), "head-norm-rope-gpu")


if __name__ == "__main__":
    main()
