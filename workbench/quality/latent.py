"""Latent-space distance: the gate that decoded-pixel metrics cannot override (a VAE can hide latent drift)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def latent_rel_l2(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """||candidate - reference|| / ||reference||, computed in float64 on the CPU.

    float64 so that bf16/fp16 latents of video size do not lose the difference in the accumulation.
    A zero reference gives 0.0 for a zero candidate and inf otherwise; non-finite inputs give nan or inf,
    which every budget treats as a failure. Shapes must match exactly (a ValueError names both).
    """
    if tuple(reference.shape) != tuple(candidate.shape):
        raise ValueError(
            f"latents: shapes differ, reference {tuple(reference.shape)} vs candidate {tuple(candidate.shape)}"
        )
    ref = reference.detach().to(device="cpu", dtype=torch.float64)
    cand = candidate.detach().to(device="cpu", dtype=torch.float64)
    denominator = torch.linalg.vector_norm(ref).item()
    numerator = torch.linalg.vector_norm(cand - ref).item()
    if denominator == 0.0 and numerator == 0.0:
        return 0.0
    if denominator == 0.0:
        return math.nan if math.isnan(numerator) else math.inf
    return numerator / denominator


def rel_l2(got: torch.Tensor | Sequence[torch.Tensor], want: torch.Tensor | Sequence[torch.Tensor]) -> float:
    """||got - want|| / ||want|| over one tensor or matching sequences of tensors (all outputs together), on their
    device with fp32 accumulation: the measure of a kernel's or a forward's error. nan when `want` is all zeros."""
    got, want = (
        (got if isinstance(got, tuple | list) else (got,)),
        (want if isinstance(want, tuple | list) else (want,)),
    )
    num = sum(float((g.float() - w.float()).pow(2).sum()) for g, w in zip(got, want, strict=True))
    den = sum(float(w.float().pow(2).sum()) for w in want)
    return (num / den) ** 0.5 if den else float("nan")
