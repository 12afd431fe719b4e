"""selective_fp8: glob selection, refusal without an FP8-capable GPU, counted fallbacks, exact restore."""

import os

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")

from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from workbench import Request, Session  # noqa: E402
from workbench.accelerations import fingerprint  # noqa: E402
from workbench.accelerations.quantization import selective_fp8 as fp8  # noqa: E402

pytest.importorskip("torchao", reason="selective_fp8 needs the fp8 extra (torchao)")

SIZE = {"frames": 9, "height": 32, "width": 32}
FFN = ["blocks.*.ffn.net.0.proj", "blocks.*.ffn.net.2"]


@pytest.fixture(scope="module")
def session():
    return Session.open("tiny-wan", device="cpu")


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, r"selective_fp8.include: give at least one .* or groups >= 1"),
        ({"groups": -1}, r"selective_fp8.groups"),
        ({"include": "blocks.*"}, r"selective_fp8.include: expected list/NoneType, got str"),
        ({"include": []}, r"selective_fp8.include: give at least one"),
        ({"include": [3]}, r"selective_fp8.include\[0\]: expected str, got int"),
        ({"include": [""]}, r"selective_fp8.include: an empty glob"),
        ({"include": ["decoder.*"]}, r"selective_fp8.include: \['decoder.\*'\] .* matches no nn.Linear"),
        ({"include": FFN, "exclude": ["blocks.*"]}, r"selective_fp8.include: .* matches no nn.Linear"),
        ({"include": FFN, "allow_fallback": "yes"}, r"selective_fp8.allow_fallback: expected bool"),
        ({"include": FFN, "path": "triton"}, r"selective_fp8.path: .*'torchao', 'fused'"),
        ({"groups": 1, "order": "speed"}, r"selective_fp8.order: .*'size', 'measured'"),
    ],
)
def test_selective_fp8_bad_option_raises(session, options, message):
    before = fingerprint(session.model.pipeline.transformer)
    with pytest.raises(ValueError, match=message):
        session.accelerate({"selective_fp8": options})
    assert fingerprint(session.model.pipeline.transformer) == before


def test_layer_groups_rank_block_linears_by_size_and_groups_select_exactly_theirs(session):
    """Every Linear inside a numbered block falls in exactly one group (its path with indices as "*"), ranked by
    the weights it holds; `groups=N` selects the layers of the N largest and no other (the FFN's two groups differ
    though fnmatch's "*" would join them); the calibration knob searches N."""
    denoisers = session.model.denoisers()
    groups = fp8.layer_groups(denoisers)
    sizes = [size for _, size in groups]
    assert sizes == sorted(sizes, reverse=True) and {g for g, _ in groups[:2]} == {
        "blocks.*.ffn.net.*.proj",
        "blocks.*.ffn.net.*",
    }
    block_linears = {(path, m.weight.numel()) for path, m in denoisers[0].named_modules()
                     if isinstance(m, torch.nn.Linear) and path.startswith("blocks.")}  # fmt: skip
    assert sum(sizes) == sum(n for _, n in block_linears)
    assert all(fp8.group_of(path) in dict(groups) for path, _ in block_linears)
    largest = groups[0][0]
    chosen = fp8._select(denoisers, [], [], {largest})
    assert chosen and all(fp8.group_of(path) == largest for _, path in chosen)
    assert len(chosen) == sum(fp8.group_of(path) == largest for path, _ in block_linears)
    assert fp8.SPEC.knob.option == "groups" and fp8.SPEC.knob.integer and fp8.SPEC.knob.low == 1


def test_rank_by_gain_orders_groups_by_seconds_saved_and_puts_slower_fp8_last(session):
    """A fake timing where FP8 saves time in proportion to the weights less a fixed cost: the ranking follows the
    seconds saved per forward (summed over each group's layers), groups that lose time come last, and the shapes
    cover exactly the layers `layer_groups` counts."""
    shapes = fp8.group_shapes(session.model.denoisers())
    assert {g: sum(k * n for k, n in s) for g, s in shapes.items()} == dict(fp8.layer_groups(session.model.denoisers()))
    sizes = [k * n for layers in shapes.values() for k, n in layers]
    cost = (min(sizes) + max(sizes)) / 2 * 1e-9
    ranking = fp8.rank_by_gain(shapes, lambda k, n: k * n * 1e-9 - cost)
    gains = [gain for _, gain in ranking]
    assert gains == sorted(gains, reverse=True) and {g for g, _ in ranking} == set(shapes)
    assert gains[0] > 0 > gains[-1]  # something gains, something loses: the order is not vacuous


def test_measured_order_refuses_without_an_fp8_gpu(session):
    if fp8.machine_problem(session.device) is None:
        pytest.skip("this machine has an FP8 GPU")
    with pytest.raises(RuntimeError, match=r"selective_fp8.order='measured': times FP8 GEMMs .* no CUDA device"):
        session.accelerate({"selective_fp8": {"groups": 1, "order": "measured", "allow_fallback": True}})


def test_machine_problem_below_sm_89_is_the_kernels_fp8_refusal(monkeypatch):
    """A CUDA device below sm_89 is refused for the reason the FP8 kernels give (`_runtime.fp8_problem`)."""
    from workbench.kernels import _runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_runtime, "capability", lambda device: 86)
    assert fp8.machine_problem(torch.device("cuda")) == (
        "FP8 (e4m3) needs compute capability 8.9 or newer (Ada, Hopper); this GPU is sm_86"
    )
    monkeypatch.setattr(_runtime, "capability", lambda device: 89)
    assert fp8.machine_problem(torch.device("cuda")) is None


def test_measured_order_times_each_shape_once_and_quantizes_the_top_group(monkeypatch):
    """order="measured" end to end on the CPU (fused path: the quantization kernel under the interpreter, torch's
    CPU _scaled_mm; hardware check lifted; 64 rows): every group timed and ranked in the receipt, most saved first;
    the FP8 GEMMs counted are exactly the top group's layers; a re-install times nothing again."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(fp8, "machine_problem", lambda device: None)
    monkeypatch.setattr(fp8, "MEASURED_ROWS", 64)
    monkeypatch.setattr(fp8, "_SAVED", {})
    session = Session.open("tiny-wan", device="cpu", dtype="bfloat16")
    shapes = fp8.group_shapes(session.model.denoisers())
    request = Request("a red circle moves left", seed=3, steps=1, **SIZE)
    options = {"selective_fp8": {"groups": 1, "order": "measured", "path": "fused"}}
    session.accelerate(options)
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    order = result.receipts["selective_fp8"]["notes"]["group_order"]
    assert [g for g, _ in order] and {g for g, _ in order} == set(shapes)
    assert [ms for _, ms in order] == sorted((ms for _, ms in order), reverse=True)
    timed = set(fp8._SAVED)
    assert {(k, n) for *_, k, n in timed} == {shape for layers in shapes.values() for shape in layers}
    forwards = 2  # one step, two CFG branches
    assert result.receipts["selective_fp8"]["fp8_gemms"] == len(shapes[order[0][0]]) * forwards
    import workbench.evidence.timing as timing

    monkeypatch.setattr(timing, "time_call", None)  # a second install must not time again
    session.accelerate(options)
    session.accelerate({})
    assert set(fp8._SAVED) == timed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_selective_fp8_refuses_cpu_without_fallback(session):
    with pytest.raises(RuntimeError, match=r"selective_fp8: row-wise FP8 cannot run here: .*no CUDA device"):
        session.accelerate({"selective_fp8": {"include": FFN}})
    with pytest.raises(RuntimeError, match=r"selective_fp8: .*blocks\.0\.ffn\.net\.(0\.proj|2): no CUDA device"):
        session.accelerate({"selective_fp8": {"groups": 1}})
    assert session.accelerations == {}


def test_selective_fp8_missing_torchao_is_runtime_error(session, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torchao.quantization", None)
    with pytest.raises(RuntimeError, match=r"vflash-workbench\[fp8\]"):
        session.accelerate({"selective_fp8": {"include": FFN, "allow_fallback": True}})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_selective_fp8_fallback_counts_and_equals_dense(session, seed):
    request = Request("a red circle moves left", seed=seed, steps=2, **SIZE)
    dense = session.generate(request, progress=False)
    before = fingerprint(session.model.pipeline.transformer)
    session.accelerate({"selective_fp8": {"include": FFN, "allow_fallback": True}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(session.model.pipeline.transformer) == before
    receipt = result.receipts["selective_fp8"]
    assert receipt["executed"] is False and receipt.get("fp8_gemms", 0) == 0
    # 2 blocks x 2 FFN Linears x 2 steps x 2 CFG branches, all dense
    assert sum(receipt["fallbacks"].values()) == 16 and any("no CUDA device" in r for r in receipt["fallbacks"])
    assert torch.equal(result.latents, dense.latents) and np.array_equal(result.frames, dense.frames)
    assert result.exact


def test_selective_fp8_quantizes_and_restores_exactly(monkeypatch):
    """The install/uninstall path on CPU, with the hardware checks lifted (no forward is run)."""
    import torchao.quantization.quant_api as quant_api

    monkeypatch.setattr(fp8, "machine_problem", lambda device: None)
    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    session = Session.open("tiny-wan", device="cpu")
    transformer = session.model.pipeline.transformer
    with pytest.raises(RuntimeError, match=r"weight dtype torch.float32 is not torch.bfloat16"):
        session.accelerate({"selective_fp8": {"include": FFN}})
    transformer.to(torch.bfloat16)
    before = fingerprint(transformer)
    weights = {name: module.weight for name, module in transformer.named_modules() if hasattr(module, "weight")}
    session.accelerate({"selective_fp8": {"include": FFN, "exclude": ["blocks.1.*"]}})
    quantized = {n for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear) and fp8._is_quantized(m)}
    assert quantized == {"blocks.0.ffn.net.0.proj", "blocks.0.ffn.net.2"}
    session.accelerate({})
    assert fingerprint(transformer) == before
    assert all(module.weight is weights[name] for name, module in transformer.named_modules() if name in weights)
    assert all("extra_repr" not in module.__dict__ for module in transformer.modules())


def test_selective_fp8_fused_path_runs_fp8_gemms_and_restores(monkeypatch, seed):
    """path="fused" end to end on the CPU (the quantization kernel under the interpreter, torch's CPU _scaled_mm),
    with the hardware check lifted: FP8 GEMMs counted, latents near the bf16 request, the model untouched after."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(fp8, "machine_problem", lambda device: None)
    session = Session.open("tiny-wan", device="cpu", dtype="bfloat16")
    transformer = session.model.pipeline.transformer
    request = Request("a red circle moves left", seed=seed, steps=2, **SIZE)
    dense = session.generate(request, progress=False)
    before = fingerprint(transformer)
    session.accelerate({"selective_fp8": {"include": FFN, "path": "fused"}})
    try:
        result = session.generate(request, progress=False)
    finally:
        session.accelerate({})
    assert fingerprint(transformer) == before
    assert all("forward" not in module.__dict__ for module in transformer.modules())
    receipt = result.receipts["selective_fp8"]
    assert receipt["executed"] and receipt["fp8_gemms"] == 16 and receipt["fallbacks"] == {}, receipt
    assert not result.exact
    rel = float((result.latents.float() - dense.latents.float()).norm() / dense.latents.float().norm())
    assert 0 < rel < 0.1, f"seed {seed}: latents rel L2 {rel:.3e}"


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs CUDA sm >= 8.9"
)
@pytest.mark.parametrize("path", ["torchao", "fused"])
def test_selective_fp8_runs_fp8_gemms_on_gpu(path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    net = net.to("cuda", torch.bfloat16)
    model = SimpleNamespace(
        denoisers=lambda: [net], family=SimpleNamespace(name="wan"), pipeline=SimpleNamespace(net=net)
    )
    x = torch.randn(4, 77, 256, device="cuda", dtype=torch.bfloat16)
    dense = net(x)
    before = fingerprint(net)
    options = fp8.SPEC.validate({"include": ["0", "2"], "path": path})
    handle = fp8.SPEC.prepare(model, options, torch.device("cuda")).activate()
    try:
        out = net(x)
    finally:
        handle.uninstall()
    assert handle.receipt.counters["fp8_gemms"] == 2 and not handle.receipt.fallbacks
    assert float((out - dense).float().norm() / dense.float().norm()) < 0.1
    assert fingerprint(net) == before


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs CUDA sm >= 8.9"
)
@pytest.mark.parametrize("path", ["torchao", "fused"])
def test_measured_order_on_gpu_ranks_by_timed_gemms(path, monkeypatch):
    """Two block groups of different widths: both timed on this GPU, ranked by ms saved, the top one quantized."""
    monkeypatch.setattr(fp8, "_SAVED", {})
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(
        torch.nn.ModuleDict({"wide": torch.nn.Linear(2048, 8192), "narrow": torch.nn.Linear(256, 256)})
        for _ in range(2)
    )
    root = torch.nn.Module()
    root.blocks = blocks.to("cuda", torch.bfloat16)
    model = SimpleNamespace(
        denoisers=lambda: [root], family=SimpleNamespace(name="wan"), pipeline=SimpleNamespace(net=root)
    )
    options = fp8.SPEC.validate({"groups": 1, "order": "measured", "path": path})
    handle = fp8.SPEC.prepare(model, options, torch.device("cuda")).activate()
    try:
        handle.begin_request(0, 1)
        order = handle.receipt.notes["group_order"]
        top = order[0][0]
        x = torch.randn(64, 2048 if top.endswith("wide") else 256, device="cuda", dtype=torch.bfloat16)
        for block in root.blocks:
            block[top.rsplit(".", 1)[1]](x)
    finally:
        handle.uninstall()
    assert {g for g, _ in order} == {"blocks.*.wide", "blocks.*.narrow"} and order[0][1] >= order[1][1]
    assert handle.receipt.counters["fp8_gemms"] == 2


@pytest.mark.parametrize("ring", ["block_ring", "fp8_ring"])
def test_selective_fp8_fused_path_and_a_block_ring_refuse_together(monkeypatch, ring):
    """The fused path computes from FP8 copies it keeps on the device, so a ring installed with it would stream
    weights no layer reads: the ring refuses, naming itself, selective_fp8 and a Linear, and the whole set rolls back.
    A layer whose weight a ring or the session's memory plan holds on the host is a layer problem for selective_fp8
    (refused, or dense)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(fp8, "machine_problem", lambda device: None)
    session = Session.open("tiny-wan", device="cpu", dtype="bfloat16")
    transformer = session.model.pipeline.transformer
    before = fingerprint(transformer)
    refusal = rf"{ring}: selective_fp8's forwards on layers it moves \(streamed block 0: ffn\.net\.0\.proj, .*\) "
    with pytest.raises(RuntimeError, match=refusal + rf".*; install {ring} without selective_fp8$"):
        session.accelerate({"selective_fp8": {"include": FFN, "path": "fused"}, ring: {"resident_blocks": 0}})
    assert fingerprint(transformer) == before and not session._handles
    host = torch.nn.Linear(32, 32).to(torch.bfloat16)
    assert fp8._layer_problem(host, torch.device("cuda")) == "weight on cpu, not cuda (streamed or offloaded)"
    assert fp8._layer_problem(host, torch.device("cpu")) is None
