"""Rounding to bfloat16 / float16 inside the Triton kernels, as torch rounds (device functions, not kernels).

BF16_ROUNDING: fp32 -> bf16 is written out in integers: round to nearest, ties to even, as c10::BFloat16 does; a NaN
stays a NaN (stored as 0x7FC0; NaN bit patterns are outside the kernels' contracts). The CPU interpreter's
`.to(tl.bfloat16)` truncates, so the tests there could not prove the kernels' rounding with it; on a GPU the
written-out form equals `cvt.rn.bf16.f32`, costs a few integer ops and keeps one code path.

A kernel names the functions it calls in `LazyKernel(kernel, helpers=(...))`, with those they call in turn.
"""

import triton.language as tl


def bf16_round(x):
    """fp32 `x` rounded to the nearest bfloat16 (BF16_ROUNDING), kept as an fp32 value."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16) << 16
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


def round_to(x, ROUND: tl.constexpr):
    """fp32 `x` rounded as an op on tensors of the kernel's dtype rounds it (`_runtime.ROUNDING`: 0 fp32, unchanged;
    1 bfloat16 (BF16_ROUNDING); 2 float16), kept as an fp32 value."""
    if ROUND == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16) << 16
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif ROUND == 2:
        x = x.to(tl.float16).to(tl.float32)
    return x


def store_bf16(at, x, mask):
    """Store fp32 `x` at the bfloat16 pointers `at` (BF16_ROUNDING; a NaN is stored as 0x7FC0)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    bits = tl.where(x != x, 0x7FC0, bits)
    tl.store(at, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
