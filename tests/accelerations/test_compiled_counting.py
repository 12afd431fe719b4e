"""Receipt counts made inside compiled code: a tensor add, no recompiles, the true count (CPU inductor)."""

import pytest
import torch
from diffusers.models.attention import AttentionModuleMixin

from workbench import Request, Session
from workbench.accelerations.base import Receipt

SIZE = {"frames": 5, "height": 32, "width": 32}  # not test_regional_compile's: its first request must compile


def test_count_in_fullgraph_compile_is_a_tensor_add_without_recompiles():
    receipt = Receipt(("calls",))
    receipt.traceable(torch.device("cpu"), counters=("calls",), fallbacks=("slow path",))

    @torch.compile(fullgraph=True)
    def step(x: torch.Tensor) -> torch.Tensor:
        receipt.count("calls")
        receipt.count("calls", 2)
        receipt.count_fallback("slow path")
        return x * 2

    with torch._dynamo.config.patch(error_on_recompile=True):  # a Python int counter would recompile on call 2
        for _ in range(4):
            step(torch.ones(3))
    assert not receipt.counters and not receipt.fallbacks, "compiled counts went to the Python counters"
    assert receipt.to_dict() == {"executed": True, "calls": 12, "fallbacks": {"slow path": 4}}
    receipt.count("calls")  # eager: the Python counter, added to what was folded
    assert receipt.to_dict()["calls"] == 13
    receipt.reset()
    assert receipt.to_dict() == {"executed": False, "fallbacks": {}}
    assert int(receipt.traced_counters["calls"]) == 0


def test_count_in_compiled_code_without_a_tensor_fails_fullgraph_naming_it():
    receipt = Receipt(("calls",))

    @torch.compile(fullgraph=True)
    def step(x: torch.Tensor) -> torch.Tensor:
        receipt.count("calls")
        return x * 2

    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"'calls' ran in compiled code without a tensor"):
        step(torch.ones(3))


def test_attention_backend_under_regional_compile_counts_every_call_without_recompiling():
    """The H200 failure (cuDNN + regional_compile, FailOnRecompileLimitHit) with the CPU's native backend."""
    session = Session.open("tiny-wan", device="cpu")
    denoisers = session.model.denoisers()
    blocks = [block for denoiser in denoisers for block in denoiser.blocks]
    attentions = sum(isinstance(m, AttentionModuleMixin) for block in blocks for m in block.modules())
    forwards = []
    hooks = [d.register_forward_pre_hook(lambda *_: forwards.append(1)) for d in denoisers]  # outside the blocks

    def run(steps: int) -> tuple[object, int]:
        forwards.clear()
        result = session.generate(Request("a red circle moves left", seed=3, steps=steps, **SIZE), progress=False)
        return result, len(forwards)

    try:
        session.accelerate({"regional_compile": {}})
        plain, _ = run(2)
        session.accelerate({"attention_backend": {"backend": "native"}, "regional_compile": {}})
        first, second = run(2), run(3)
    finally:
        session.accelerate({})
        for hook in hooks:
            hook.remove()
    for (result, calls), graphs in ((first, 1), (second, 0)):  # one graph for every block and step, then reused
        compiled = result.receipts["regional_compile"]
        assert compiled["graphs_compiled"] == graphs and compiled["compiled_calls"] == calls * len(blocks)
        assert result.receipts["attention_backend"]["attention_calls"] == calls * attentions > 0
    assert torch.equal(first[0].latents, plain.latents), "counting changed the compiled block's output"
