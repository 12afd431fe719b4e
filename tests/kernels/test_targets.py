"""Every kernel compiles for every supported card (sm_80, sm_86, sm_89, sm_90) with the launch its public function
ships, fits the card's shared memory, and spills nothing where the H200's launch spills nothing (issue 28). No GPU: Triton's own
compiler and ptxas, on launches recorded from the public functions at production shapes (bf16, Wan-1.3B widths)."""

import contextlib
import functools
import os
from unittest import mock

import pytest
import torch
import triton

from tests.kernels._targets import compile_for, compiled_for, record
from workbench.kernels import (
    _runtime,
    adaln_modulate,
    block_sparse_attention,
    fp8_attention,
    fp8_rowwise,
    gated_residual,
    head_norm_rope,
    layernorm_modulate,
    qk_norm_rope,
    relayout,
    rms_norm_silu,
)
from workbench.kernels.targets import TARGETS, built_for

B, T, H, D = 1, 1024, 12, 128
C = H * D
BF16, F32 = torch.bfloat16, torch.float32


def _rows(dtype=BF16):
    return torch.zeros(B, T, C, dtype=dtype)


def _heads(dtype=BF16):
    return torch.zeros(B, T, H, D, dtype=dtype)


def _tables():  # (T, D) rotary tables, head_norm_rope's form
    return torch.zeros(T, D), torch.zeros(T, D)


def _freqs():  # (1, T, 1, D): the form qk_norm_rope and rope_only take
    return torch.zeros(1, T, 1, D), torch.zeros(1, T, 1, D)


EXAMPLES = {
    "adaln_modulate": lambda: adaln_modulate.adaln_modulate(
        _rows(F32), torch.zeros(B, 1, C), torch.zeros(B, 1, C), BF16
    ),
    "adaln_modulate_in_dtype": lambda: adaln_modulate.adaln_modulate_in_dtype(
        _rows(), torch.zeros(B, 1, C, dtype=BF16), torch.zeros(B, 1, C, dtype=BF16)
    ),
    "gated_residual": lambda: gated_residual.gated_residual(_rows(), _rows(), torch.zeros(B, 1, C)),
    "gated_residual_in_dtype": lambda: gated_residual.gated_residual_in_dtype(
        _rows(), _rows(), torch.zeros(B, 1, C, dtype=BF16)
    ),
    "head_norm_rope": lambda: head_norm_rope.head_norm_rope(_heads(), torch.ones(D, dtype=BF16), 1e-6, *_tables()),
    "layernorm_modulate": lambda: layernorm_modulate.layernorm_modulate(
        _rows(), 1e-6, scale=torch.zeros(B, 1, C), shift=torch.zeros(B, 1, C), out_dtype=BF16
    ),
    "add_layernorm_modulate": lambda: layernorm_modulate.add_layernorm_modulate(
        _rows(), _rows(), 1e-6, weight=torch.ones(C), bias=torch.zeros(C)
    ),
    "qk_norm_rope": lambda: qk_norm_rope.qk_norm_rope(_rows(), torch.ones(C, dtype=BF16), 1e-6, *_freqs(), H),
    "rope_only": lambda: qk_norm_rope.rope_only(_heads(), *_freqs()),
    "pack_qkv": lambda: relayout.pack_qkv(_heads(), _heads(), _heads(), 2),
    "rms_norm_silu": lambda: rms_norm_silu.rms_norm_silu(  # the Wan VAE's widest norm, into a padded conv buffer
        torch.zeros(1, 384, 2, 60, 104, dtype=BF16),
        torch.ones(384, dtype=BF16),
        out=torch.zeros(1, 384, 4, 62, 106, dtype=BF16)[:, :, 2:, 1:-1, 1:-1],
    ),
    "pixel_norm_silu": lambda: rms_norm_silu.pixel_norm_silu(  # LTX-2's widest norm, channels-last into a buffer
        torch.zeros(1, 1024, 2, 16, 24, dtype=BF16).contiguous(memory_format=torch.channels_last_3d),
        out=torch.zeros(1, 1024, 4, 18, 26, dtype=BF16).contiguous(memory_format=torch.channels_last_3d)[
            :, :, 1:-1, 1:-1, 1:-1
        ],
    ),
    "merge_heads": lambda: relayout.merge_heads(torch.zeros(2, B, T // 2, H // 2, D, dtype=BF16), 2),
    "split_result": lambda: relayout.split_result(  # attention's (B, H/W, T, D) output seen as (B, T, H/W, D)
        torch.zeros(B, H // 2, T, D, dtype=BF16).transpose(1, 2), 2
    ),
    "quantize_rows": lambda: fp8_rowwise.quantize_rows(torch.zeros(T, C, dtype=BF16)),
    "block_sparse_attention": lambda: block_sparse_attention.block_sparse_attention(
        *(torch.zeros(B, H, T, D, dtype=BF16) for _ in range(3)), 0.0, 64
    ),
    "block_sparse_attention_int8": lambda: block_sparse_attention.block_sparse_attention(
        *(torch.zeros(B, H, T, D, dtype=BF16) for _ in range(3)), 0.0, 64, precision="int8"
    ),
    "fp8_attention": lambda: fp8_attention.fp8_attention(*(torch.zeros(B, H, T, D, dtype=BF16) for _ in range(3))),
    "fp8_attention_bf16_pv": lambda: fp8_attention.fp8_attention(
        *(torch.zeros(B, H, T, D, dtype=BF16) for _ in range(3)), pv="bf16"
    ),
    "fp8_attention_int8_qk": lambda: fp8_attention.fp8_attention(
        *(torch.zeros(B, H, T, D, dtype=BF16) for _ in range(3)), qk="int8"
    ),
    "fp8_attention_int8_pv": lambda: fp8_attention.fp8_attention(
        *(torch.zeros(B, H, T, D, dtype=BF16) for _ in range(3)), qk="int8", pv="int8"
    ),
}
FP8_KERNELS = ("_quantize_rows", "_fp8_attention_fwd", "_quantize_fwd")  # refused before any launch below sm_89
FP8_EXAMPLES = ("block_sparse_attention_int8",)  # a kernel that also runs without FP8, in its FP8 mode: refused too


def _record(target: str) -> dict[str, list]:
    """name -> the launches its example makes on a `target` card (one call may launch several kernels)."""
    return {name: record(call, TARGETS[target]) for name, call in EXAMPLES.items()}


@pytest.fixture(scope="module")
def hopper():
    """The H200's launches and what they need there: the reference for spills."""
    launches = _record("sm_90")
    return launches, {
        (name, i): compile_for(launch, TARGETS["sm_90"])
        for name, found in launches.items()
        for i, launch in enumerate(found)
    }


def test_every_kernel_has_an_example_and_records_its_shipped_launch(hopper):
    launches, _ = hopper
    recorded = {launch.name for found in launches.values() for launch in found}
    assert {
        "_modulate", "_gated_residual", "_head_norm_rope", "_layernorm_modulate", "_tiled_rope",
        "_row_qk_norm_rope", "_tiled_copy", "_quantize_rows", "_block_means_qkv", "_compact", "_block_sparse_fwd",
        "_fp8_attention_fwd", "_quantize_fwd", "_rms_norm_silu",
    } <= recorded  # fmt: skip
    attention = next(x for x in launches["block_sparse_attention"] if x.name == "_block_sparse_fwd")
    assert attention.options == {"num_warps": 4, "num_stages": 3} and attention.constexprs["D"] == D


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_90"])
def test_every_kernel_compiles_for_the_card_within_its_shared_memory_and_spills_no_more(hopper, target):
    card = TARGETS[target]
    _, reference = hopper
    for name, found in _record(target).items():
        for i, launch in enumerate(found):
            if (launch.name in FP8_KERNELS or name in FP8_EXAMPLES) and not card.fp8:
                continue  # refused before any launch below sm_89 (test_fp8_is_refused_below_sm_89)
            report = compile_for(launch, card) if target != "sm_90" else reference[(name, i)]
            assert report.shared_bytes <= card.shared_bytes, (name, report)
            assert reference[(name, i)].spill_bytes > 0 or report.spill_bytes == 0, (name, report)


def test_relayout_and_block_sparse_take_their_ampere_ada_launch_below_sm_90():
    q = torch.zeros(B, T, H, D, dtype=BF16)
    heads = torch.zeros(B, H, T, D, dtype=BF16)
    for target, warps, rows in (("sm_80", 8, 32), ("sm_86", 8, 32), ("sm_89", 8, 32), ("sm_90", 4, 64)):
        (launch,) = record(lambda: relayout.pack_qkv(q, q, q, 2), TARGETS[target])
        assert launch.options["num_warps"] == warps, target
        launches = record(
            lambda: block_sparse_attention.block_sparse_attention(heads, heads, heads, 0.0, 64), TARGETS[target]
        )
        attention = next(x for x in launches if x.name == "_block_sparse_fwd")
        assert (attention.options["num_warps"], attention.constexprs["ROWS"]) == (warps, rows), target


def test_fp8_is_refused_below_sm_89(monkeypatch):
    from workbench.kernels import _runtime

    for number, refused in ((80, True), (86, True), (89, False), (90, False)):
        monkeypatch.setattr(_runtime, "capability", lambda device, n=number: n)
        if refused:
            with pytest.raises(RuntimeError, match=f"quantize_rows: FP8 .* needs compute capability 8.9.*sm_{number}"):
                _runtime.check_fp8("quantize_rows", torch.device("cuda"))
        else:
            _runtime.check_fp8("quantize_rows", torch.device("cuda"))


def test_fp8_attention_takes_one_launch_per_card_and_is_refused_below_sm_89():
    """sm_89 and sm_90 take their own (spill-free) launches; below sm_89 the public function refuses before any
    launch."""
    heads = torch.zeros(B, H, T, D, dtype=BF16)
    cases = (("sm_89", "fp8", fp8_attention.ADA), ("sm_89", "bf16", fp8_attention.ADA),
             ("sm_90", "fp8", fp8_attention.DEFAULT), ("sm_90", "bf16", fp8_attention.BF16_PV))  # fmt: skip
    for target, pv, launch in cases:
        launches = record(functools.partial(fp8_attention.fp8_attention, heads, heads, heads, pv=pv), TARGETS[target])
        found = next(x for x in launches if x.name == "_fp8_attention_fwd")
        assert found.options == {"num_warps": launch.num_warps, "num_stages": launch.num_stages}, (target, pv)
        assert (found.constexprs["BLOCK_M"], found.constexprs["BLOCK_N"]) == (launch.block_m, launch.block_n)
    for target in ("sm_80", "sm_86"):
        with (
            mock.patch.object(_runtime, "capability", lambda device, n=TARGETS[target].capability: n),
            pytest.raises(RuntimeError, match=f"fp8_attention: FP8 .* needs compute capability 8.9.*{target}"),
        ):
            fp8_attention.fp8_attention(heads[:, :1, :64], heads[:, :1, :64], heads[:, :1, :64])


def _ptx(launch) -> str:
    """`launch` compiled by Triton for the H200 (sm_90), as the JIT would on that GPU: its PTX."""
    return compiled_for(launch, TARGETS["sm_90"]).asm["ptx"]


def test_built_for_runs_the_cards_code_on_this_gpu_and_keeps_it_apart(monkeypatch):
    """Inside built_for(sm_86) Triton generates the card's code for the GPU at hand: block-sparse attention's Ampere
    launch, built for the H200, loads K/V through TMA descriptors; built for the 3090 it does not, and is still
    sm_90 code. LazyKernel decorates such builds apart (Triton's cache key has no architecture, and would hand back
    the GPU's own build); the knob and TRITON_OVERRIDE_ARCH are restored after."""
    monkeypatch.delenv("TRITON_OVERRIDE_ARCH", raising=False)
    heads = torch.zeros(B, H, T, D, dtype=BF16)
    launches = record(lambda: block_sparse_attention.block_sparse_attention(heads, heads, heads, 0.0, 64),
                      TARGETS["sm_86"])  # fmt: skip
    attention = next(x for x in launches if x.name == "_block_sparse_fwd")
    native = _ptx(attention)
    with built_for(TARGETS["sm_86"]):
        assert triton.knobs.runtime.override_arch == "sm86"
        card = _ptx(attention)
    assert "tensormap" in native and "tensormap" not in card and ".target sm_90a" in card
    assert triton.knobs.runtime.override_arch is None and "TRITON_OVERRIDE_ARCH" not in os.environ

    monkeypatch.setattr(_runtime, "interpreting", lambda: False)
    decorated = []
    monkeypatch.setattr(triton, "jit", lambda fn: decorated.append(fn) or mock.MagicMock())
    kernel = _runtime.LazyKernel(lambda x: None)
    for target in (None, "sm_89", "sm_89", None, "sm_86"):
        with built_for(TARGETS[target]) if target else contextlib.nullcontext():
            kernel[(1,)]
    assert len(decorated) == 3  # this GPU's build, the 4090's, the 3090's
