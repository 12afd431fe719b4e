import math

import numpy as np
import pytest
import torch

from workbench.quality import latent_rel_l2


def test_latent_rel_l2_matches_hand_computed():
    reference = torch.tensor([3.0, 4.0])  # norm 5
    candidate = torch.tensor([3.0, 4.5])  # difference norm 0.5
    assert latent_rel_l2(reference, candidate) == pytest.approx(0.1, abs=1e-15)


def test_latent_rel_l2_matches_float64_numpy_on_noncontiguous_bf16(rng):
    base = rng.standard_normal((5, 3, 7, 9))
    reference = torch.from_numpy(base).to(torch.bfloat16).transpose(1, 3)  # non-contiguous view, odd sizes
    candidate = (torch.from_numpy(base) + 0.05 * torch.from_numpy(rng.standard_normal(base.shape))).to(torch.bfloat16)
    candidate = candidate.transpose(1, 3)
    ref64 = reference.to(torch.float64).numpy()
    cand64 = candidate.to(torch.float64).numpy()
    expected = np.linalg.norm(cand64 - ref64) / np.linalg.norm(ref64)
    assert latent_rel_l2(reference, candidate) == pytest.approx(expected, rel=1e-12)


def test_latent_rel_l2_shape_mismatch_raises_naming_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        latent_rel_l2(torch.ones(2, 3), torch.ones(3, 2))


def test_latent_rel_l2_zero_and_nonfinite_references():
    zero = torch.zeros(4)
    assert latent_rel_l2(zero, zero) == 0.0
    assert latent_rel_l2(zero, torch.ones(4)) == math.inf
    assert math.isnan(latent_rel_l2(zero, torch.tensor([math.nan, 0.0, 0.0, 0.0])))
    assert math.isnan(latent_rel_l2(torch.ones(4), torch.tensor([math.nan, 1.0, 1.0, 1.0])))
