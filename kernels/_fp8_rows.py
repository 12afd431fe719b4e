"""Row-wise dynamic FP8 (e4m3) quantization in torch: `reference`, the recipe `fp8_rowwise`'s kernel computes and the
project's one torch row quantizer (the FP8 block ring's, `workbench.accelerations.memory.ring`). Torch only, no
triton: the ring runs where triton is not installed (it is a dependency on Linux only). Its constants are the FP8
kernels' (`attention_quantize` takes them from here too).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value
EPS = 1e-12  # the smallest amax a scale is made from (an all-zero row's, an all-zero block's)


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) of any float dtype and strides, in fp32 maths: (q (M, K) float8_e4m3fn, scale (M, 1) float32) with
    scale = max(amax(|row|), EPS) / FP8_MAX and q = clamp(row / scale, -FP8_MAX, FP8_MAX) rounded to nearest e4m3.

    An all-zero row gets scale EPS / FP8_MAX (about 2.2e-15): what the kernel's branch-free `max(amax, EPS)` gives
    (torchao's row-wise recipe clamps the same way), positive and finite, so the row's bytes are zeros and it
    dequantizes (`q.float() * scale`) to exactly zero. A row with 0 < amax < EPS takes that scale too: its round
    trip is off by at most EPS / 28 (half an e4m3 step at 448, times the scale) rather than amax / 28."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=EPS) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
