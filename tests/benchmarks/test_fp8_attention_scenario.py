"""fp8-attention's error decomposition (`error_parts`): its all-steps part is the kernel reference's own error, so the
single-step parts decompose what the kernel's contract says it computes."""

import torch
import torch.nn.functional as F

from benchmarks.scenarios import fp8_attention as scenario
from workbench.kernels import fp8_attention as fa
from workbench.quality.latent import rel_l2


def test_error_parts_all_steps_equal_the_kernel_references_error():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 128, generator=g) for _ in range(3))
    parts = scenario.error_parts(q, k, v)
    assert set(parts) == {"qk_int8", "qk_e4m3", "p_e4m3", "v_e4m3", "p_and_v_e4m3", "all_int8_fp8", "p_int8",
                          "v_int8", "all_int8_int8"}  # fmt: skip
    head = (slice(None), slice(0, 1))  # error_parts looks at head 0
    exact = F.scaled_dot_product_attention(*(x[head].double() for x in (q, k, v)))
    for pv in ("fp8", "int8"):
        want = rel_l2(fa.reference(q, k, v, pv=pv, qk="int8")[head], exact)
        assert abs(parts[f"all_int8_{pv}"] - want) < 1e-5 * want, (pv, parts)
    assert all(0 < value < 0.1 for value in parts.values()), parts
