"""fp8_attention: the kernel equals its torch reference (the same quantization, the same tiled online softmax) under
the Triton CPU interpreter, its low-bit error against dense attention is bounded, key smoothing leaves the softmax
alone, and bad inputs are refused."""

import math

import pytest
import torch

from workbench.kernels import _runtime
from workbench.kernels.fp8_attention import (
    ADA,
    BF16_PV,
    DEFAULT,
    FP8,
    PV_MODES,
    QK_MODES,
    Launch,
    cost,
    fp8_attention,
    launch_for,
    online_softmax,
    quantize,
    quantize_reference,
    reference,
    reference_logits,
)

D = 128


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("pv", PV_MODES)
def test_fp8_attention_matches_reference(rng, fp8_p_equal, pv):
    """fp32 in and out (no output rounding to hide behind): odd Tq != Tk, q a (B, T, H, D) dispatcher view, k a
    strided slice, v offset by a large mean; the default launch and one with 32-key tiles (reference told so)."""
    seed = rng.initial_seed()
    q = torch.randn(1, 203, 2, D, generator=rng).transpose(1, 2)  # (1, 2, 203, D), token stride 2 * D
    k = torch.randn(1, 2, 2 * 171, D, generator=rng)[:, :, ::2]  # (1, 2, 171, D), every other token
    v = torch.randn(1, 2, 171, D, generator=rng) + 3.0
    for launch in (DEFAULT, Launch(block_m=32, block_n=32, num_warps=2, num_stages=1)):
        out = fp8_attention(q, k, v, scale=0.1, pv=pv, launch=launch, kernel="triton")
        want = reference(q, k, v, scale=0.1, pv=pv, block_n=launch.block_n)
        assert out.shape == (1, 2, 203, D) and out.dtype == torch.float32
        assert out.transpose(1, 2).is_contiguous(), "the output keeps q's (B, T, H, D) memory order"
        if pv != "bf16":
            fp8_p_equal(out, want, f"seed {seed}, {launch}")
        else:  # bf16 P: an exp2 ulp crosses its finer rounding grid more often, by less
            assert _rel(out, want) < 5e-4, f"seed {seed}, {launch}: {_rel(out, want)}"


@pytest.mark.parametrize("d", [16, 48, 64])
def test_fp8_attention_other_head_dims_match_reference(rng, fp8_p_equal, d):
    """64 runs as it is, 16 and 48 zero-padded to 32 and 64: the output is the reference's of the unpadded inputs
    (the default scale is 1/sqrt(d), the padded channels add nothing), (B, H, T, d) in q's memory order. One-byte P
    is held to `fp8_p_equal` (a P an exp2 ulp from a rounding boundary may move its row), bf16 P to 5e-4."""
    q = torch.randn(1, 150, 2, d, generator=rng).transpose(1, 2)
    k, v = (torch.randn(1, 2, 131, d, generator=rng) for _ in range(2))
    for pv, qk in (("fp8", "int8"), ("bf16", "e4m3")):
        out = fp8_attention(q, k, v, pv=pv, qk=qk)
        assert out.shape == q.shape and out.transpose(1, 2).is_contiguous()
        want, message = reference(q, k, v, pv=pv, qk=qk), f"seed {rng.initial_seed()}, d={d}, {pv}/{qk}"
        if pv == "fp8":
            fp8_p_equal(out, want, message)
        else:
            assert _rel(out, want) < 5e-4, message
        dense = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v
        assert _rel(out, dense) < 8e-2


def test_fp8_attention_bf16_error_against_dense_is_bounded(rng):
    """bf16 q, k, v, iid normal, against cuDNN-equivalent bf16 dense attention (torch SDPA), at the kernel's default
    e4m3 Q.K^T: the error is the quantization's. With bf16 P.V it lies between 1e-2, several times bf16 dense's own
    rounding (2^-9 an element), so the quantized kernel really ran, and 4.5e-2; FP8 P.V, which also rounds P and v to
    e4m3, errs more, and below 6e-2, under e4m3's unit roundoff 2^-4 (the most one rounding moves a value)."""
    seed = rng.initial_seed()
    q, k, v = (torch.randn(1, 3, 257, D, generator=rng).bfloat16() for _ in range(3))
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    errors = {pv: _rel(fp8_attention(q, k, v, pv=pv), dense) for pv in ("fp8", "bf16")}
    assert 1e-2 < errors["bf16"] < 4.5e-2 and errors["bf16"] < errors["fp8"] < 6e-2, f"seed {seed}: {errors}"
    out = fp8_attention(q, k, v)
    assert out.dtype == torch.bfloat16 and _rel(out, reference(q, k, v)) < 1e-2, f"seed {seed}"  # bf16 rounding


@pytest.mark.parametrize("pv", PV_MODES)
def test_fp8_attention_int8_qk_matches_reference(rng, fp8_p_equal, pv):
    """qk="int8": the kernel's int8 dot (int32 accumulation) against the reference's exact fp32 product of the same
    int8 values, on the same odd, strided, offset inputs as the e4m3 test, with 32-row / 32-key tiles."""
    seed = rng.initial_seed()
    q = torch.randn(1, 203, 2, D, generator=rng).transpose(1, 2)
    k = torch.randn(1, 2, 2 * 171, D, generator=rng)[:, :, ::2]
    v = torch.randn(1, 2, 171, D, generator=rng) + 3.0
    launch = Launch(block_m=32, block_n=32, num_warps=2, num_stages=1)
    out = fp8_attention(q, k, v, scale=0.1, pv=pv, launch=launch, qk="int8", kernel="triton")
    want = reference(q, k, v, scale=0.1, pv=pv, block_n=32, qk="int8")
    if pv != "bf16":
        fp8_p_equal(out, want, f"seed {seed}")
    else:
        assert _rel(out, want) < 5e-4, f"seed {seed}: {_rel(out, want)}"
    z = quantize(q, k, v, pv, qk="int8")
    steps = z.k_scale.repeat_interleave(128, 2)[:, :, :171, None]  # (1, 2, 171, 1): one int8 step per block
    smoothed = k - k.mean(2, keepdim=True)
    assert z.q8.dtype == z.k8.dtype == torch.int8 and z.k8.abs().max() == 127, f"seed {seed}"
    assert ((z.k8[:, :, :171].float() * steps - smoothed).abs() <= 0.5 * steps + 1e-6).all(), f"seed {seed}"


def _structured(rng: torch.Generator, heads: int, tokens: int) -> tuple[torch.Tensor, ...]:
    """bf16 (1, heads, tokens, 128) q/k shaped like a DiT's normed activations: a per-channel offset shared by q and
    k, 4 outlier channels with 6x gain, then RMS-normalised per token (the models' q/k norm); v iid normal."""
    q, k, v = (torch.randn(1, heads, tokens, D, generator=rng) for _ in range(3))
    offset = torch.randn(1, heads, 1, D, generator=rng)
    gain = torch.ones(D)
    gain[torch.randperm(D, generator=rng)[:4]] = 6.0

    def normed(x: torch.Tensor) -> torch.Tensor:
        x = (x + offset) * gain
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))).bfloat16()

    return normed(q), normed(k), v.bfloat16()


def test_fp8_attention_int8_qk_error_is_lower_than_e4m3_and_bounded(rng):
    """Against bf16 dense attention (torch SDPA) on iid and on structured q/k (`_structured`), all six precision
    pairs. int8 Q.K^T's error lies above 5e-3 (more than bf16 rounding: the quantized kernel ran) and below `bounds`,
    one per inputs and P.V precision: looser for structured q/k, whose outlier channels widen each block's range and
    so coarsen its 127 levels, and looser the coarser the P.V (bf16, then int8, then FP8, whose e4m3 P and v keep 3
    mantissa bits). It is below e4m3 Q.K^T's at every P.V precision, which is why the plugin's default Q.K^T is int8;
    int8 P.V (P scaled to each tile's row max) errs less than FP8 P.V, which makes it the lower-error one-byte P.V."""
    seed = rng.initial_seed()
    inputs = {"iid": tuple(torch.randn(1, 3, 257, D, generator=rng).bfloat16() for _ in range(3)),
              "structured": _structured(rng, 3, 257)}  # fmt: skip
    bounds = {("iid", "fp8"): 4.5e-2, ("iid", "int8"): 2.6e-2, ("iid", "bf16"): 1.8e-2, ("structured", "fp8"): 5.3e-2,
              ("structured", "int8"): 3.3e-2, ("structured", "bf16"): 3.0e-2}  # fmt: skip
    for kind, (q, k, v) in inputs.items():
        dense = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        errors = {(qk, pv): _rel(fp8_attention(q, k, v, pv=pv, qk=qk), dense) for qk in QK_MODES for pv in PV_MODES}
        for pv in PV_MODES:
            assert 5e-3 < errors["int8", pv] < bounds[kind, pv], f"seed {seed}, {kind}: {errors}"
            assert errors["int8", pv] < errors["e4m3", pv], f"seed {seed}, {kind}: {errors}"
        assert errors["int8", "int8"] < errors["int8", "fp8"], f"seed {seed}, {kind}: {errors}"


def test_fp8_attention_key_smoothing_leaves_softmax_unchanged_and_helps(rng):
    """Exact maths: subtracting the keys' mean over tokens leaves every softmax row equal. Quantized: keys with a
    common offset (as trained keys carry) lose most of their per-token part to e4m3 unless smoothed first."""
    seed = rng.initial_seed()
    q, k, v = (torch.randn(1, 2, 130, D, generator=rng, dtype=torch.float64) for _ in range(3))
    k = k + 6.0 * torch.randn(1, 2, 1, D, generator=rng, dtype=torch.float64)
    plain = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1)
    smoothed = torch.softmax(q @ (k - k.mean(2, keepdim=True)).transpose(-1, -2) / math.sqrt(D), -1)
    assert (plain - smoothed).abs().max() < 1e-12, f"seed {seed}"
    q, k, v = q.float(), k.float(), v.float()
    dense = plain.float() @ v

    def attention(k_mean):  # `reference`'s maths (bf16 P.V: only Q.K^T quantized) with this smoothing vector
        z = quantize_reference(q, k, v, "bf16", k_mean=k_mean)
        acc, l = online_softmax(*reference_logits(z, 130, 130, D**-0.5), "bf16", DEFAULT.block_n)  # noqa: E741
        return acc / l[..., None]

    assert torch.equal(attention(None), reference(q, k, v, pv="bf16")), f"seed {seed}"
    with_smoothing, without = _rel(attention(None), dense), _rel(attention(torch.zeros(1, 2, 1, D)), dense)
    assert with_smoothing < 0.5 * without, f"seed {seed}: {with_smoothing} vs {without}"
    z = quantize(q, k, v)
    k8 = z.k8[:, :, :130].float() * z.k_scale.repeat_interleave(128, 2)[:, :, :130, None]
    assert z.k8.dtype == FP8 and (k8 - (k - k.mean(2, keepdim=True))).abs().max() < 0.2, f"seed {seed}"


def test_fp8_attention_bad_inputs_raise():
    q = torch.randn(1, 2, 40, D)
    for args, kwargs, message in (
        ((torch.randn(1, 2, 40, 160), q, q), {}, r"q has head dim 160; supported: 1..128"),
        ((q.half(), q, q), {}, "q has dtype torch.float16"),
        ((q, q.bfloat16(), q), {}, "q, k, v dtypes differ"),
        ((q, q[:, :1], q[:, :1]), {}, r"shapes q \(1, 2, 40, 128\), k \(1, 1, 40, 128\).* do not match"),
        ((q, q, q), {"pv": "int4"}, r"pv: 'int4'; allowed: \['fp8', 'bf16', 'int8'\]"),
        ((q, q, q), {"qk": "int4"}, r"qk: 'int4'; allowed: \['e4m3', 'int8'\]"),
        ((q, q, q), {"scale": 0.0}, "scale: 0.0; allowed: a number > 0"),
        ((q, q, q), {"launch": 64, "kernel": "triton"}, "launch: 64; allowed: None or a Launch"),
        ((q, q, q), {"launch": DEFAULT}, "launch: given with kernel='auto'; allowed: None, or a launch with kernel="),
        ((q, q, q), {"kernel": "cute"}, r"kernel: 'cute'; allowed: \['auto', 'triton'\]"),
    ):
        with pytest.raises(ValueError, match=f"fp8_attention: {message}"):
            fp8_attention(*args, **kwargs)
    for bad, message in (({"block_m": 256}, "block_m: 256"), ({"block_n": 48}, "block_n: 48"),
                         ({"num_warps": 3}, "num_warps: 3"), ({"num_stages": 0}, "num_stages: 0")):  # fmt: skip
        with pytest.raises(ValueError, match=f"fp8_attention: Launch.{message}"):
            Launch(**bad)
    with pytest.raises(ValueError, match="fp8_attention: block_n: 100"):
        reference(q, q, q, block_n=100)


def _non_finite_cases(q: torch.Tensor) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
    """(name, (q, k, v)): one NaN or inf placed in q, k or v of head 0."""
    cases = []
    for name, which, value in (("nan q", 0, float("nan")), ("nan k", 1, float("nan")), ("inf k", 1, float("inf")),
                               ("nan v", 2, float("nan"))):  # fmt: skip
        qkv = [q.clone(), q.clone(), q.clone()]
        qkv[which][0, 0, 3, 5] = value
        cases.append((name, tuple(qkv)))
    return cases


@pytest.mark.parametrize("pv", PV_MODES)
@pytest.mark.parametrize("qk", QK_MODES)
def test_fp8_attention_non_finite_inputs_give_nan_where_dense_does(rng, qk, pv):
    """A NaN or inf input is never hidden: the output is NaN wherever dense attention's is (the quantizer's scales
    carry it), the other head stays finite. Before, the block amax skipped NaN and the output came out finite."""
    q = torch.randn(1, 2, 40, D, generator=rng)
    for name, (a, b, c) in _non_finite_cases(q):
        out = fp8_attention(a, b, c, pv=pv, qk=qk)
        dense = torch.nn.functional.scaled_dot_product_attention(a, b, c)
        assert dense.isnan().any(), name
        assert out.isnan()[dense.isnan()].all(), f"{qk}/{pv}, {name}: finite output where dense attention is NaN"
        assert out[:, 1].isfinite().all(), f"{qk}/{pv}, {name}: the untouched head"


def test_fp8_attention_refuses_without_interpreter_or_fp8(monkeypatch):
    q = torch.randn(1, 1, 16, D)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="fp8_attention: CPU tensors need the Triton interpreter"):
        fp8_attention(q, q, q)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(_runtime, "capability", lambda device: 86)
    with pytest.raises(RuntimeError, match=r"fp8_attention: FP8 \(e4m3\) needs compute capability 8.9.*sm_86"):
        fp8_attention(q, q, q)


def test_fp8_attention_launch_and_cost():
    assert launch_for(torch.device("cpu")) == DEFAULT and launch_for(torch.device("cpu"), "bf16") == BF16_PV
    assert launch_for(torch.device("cpu"), "int8") == DEFAULT
    assert ADA.block_n == BF16_PV.block_n == DEFAULT.block_n  # same maths on every launch
    b, h, t = 1, 12, 32760
    nbytes, flops = cost((b, h, t, D))
    assert flops == 4 * b * h * t * t * D
    assert nbytes == b * h * t * D * (3 * 2 + 3 + 3 + 2)  # q, k, v read in bf16; q8, k8, v8 written and read
    assert cost((b, h, t, D), pv="bf16")[0] == nbytes + 2 * b * h * t * D
    assert cost((b, h, t, D), pv="int8") == (nbytes, flops)


@pytest.mark.parametrize(("qk", "pv"), [("e4m3", "fp8"), ("int8", "fp8"), ("int8", "int8")])
def test_fp8_attention_p_reaches_its_dot_without_lane_shuffles_on_sm90(monkeypatch, qk, pv):
    """Compiled for sm_90 (no GPU), one-byte P.V: P goes from the logits' accumulator to the P.V dot's register
    operand by renaming registers (v stored in v_slot order, P relabelled to match): the PTX has the row reductions'
    butterfly shuffles and no indexed shuffle, which is what a cross-lane layout conversion of P takes. pv="int8"
    runs its P.V as an s8 x s8 -> s32 wgmma."""
    from tests.kernels._targets import compiled_for, record
    from workbench.kernels.targets import TARGETS, built_for

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    heads = torch.zeros(1, 2, 256, D, dtype=torch.bfloat16)
    with built_for(TARGETS["sm_90"]):
        launched = record(lambda: fp8_attention(heads, heads, heads, pv=pv, qk=qk), TARGETS["sm_90"])
        found = next(x for x in launched if x.name == "_fp8_attention_fwd")
        ptx = compiled_for(found, TARGETS["sm_90"]).asm["ptx"]
    assert "wgmma.mma_async" in ptx and "shfl.sync.bfly" in ptx
    assert "shfl.sync.idx" not in ptx
    assert ("s32.s8.s8" in ptx) == (qk == "int8" or pv == "int8")


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs CUDA sm >= 8.9"
)
@pytest.mark.parametrize("qk", QK_MODES)
@pytest.mark.parametrize("pv", PV_MODES)
@pytest.mark.parametrize("d", [D, 48])
def test_fp8_attention_compiled_matches_reference_on_gpu(monkeypatch, pv, qk, d):
    """The compiled path (hardware e4m3 / bf16 conversions, TMA, tensor-core dots) against the same reference, on
    bf16 inputs of an odd length in the dispatcher's layout, and its error against cuDNN-class dense attention; at
    the production head dim and at demo-av's 48 (zero-padded to 64)."""
    monkeypatch.delenv("TRITON_INTERPRET")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 1000, 4, d, generator=g, device="cuda").bfloat16().transpose(1, 2) for _ in range(3))
    out = fp8_attention(q, k, v, pv=pv, qk=qk)
    assert _rel(out, reference(q, k, v, pv=pv, block_n=launch_for(q.device).block_n, qk=qk)) < 1e-2
    bound = {("e4m3", "fp8"): 6e-2, ("e4m3", "int8"): 5e-2, ("e4m3", "bf16"): 4.5e-2, ("int8", "fp8"): 4.5e-2,
             ("int8", "int8"): 2.6e-2, ("int8", "bf16"): 2e-2}[qk, pv]  # fmt: skip
    assert _rel(out, torch.nn.functional.scaled_dot_product_attention(q, k, v)) < bound
    for name, (a, b, c) in _non_finite_cases(q.contiguous()):  # hardware max and min skip NaN: still NaN out
        nan = fp8_attention(a, b, c, pv=pv, qk=qk).isnan()
        assert nan[torch.nn.functional.scaled_dot_product_attention(a, b, c).isnan()].all(), name
