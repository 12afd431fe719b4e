"""request-h3-capped runs one whole H3 request under the session's memory plan; `h3.random_full` builds its model
through `model_sizes.materialise`, checked here on tiny configurations (the released one is 124 GiB)."""

import json

import pytest
import torch

from benchmarks.__main__ import main
from benchmarks.scenarios import request_h3_capped
from workbench import Request, Session
from workbench.model_sizes import cast_like_from_pretrained, materialise, meta_model, plan, qwen3_vl
from workbench.models import h3
from workbench.models.loaded import LoadedModel
from workbench.models.tokenizer import build_tokenizer

TINY = {"transformer": h3.TINY_TRANSFORMER, "vae": h3.TINY_VAE, "audio_vae": h3.TINY_AUDIO_VAE,
        "text": h3.TINY_TEXT, "vision": h3.TINY_VISION}  # fmt: skip


def test_request_h3_capped_smoke_records_the_plan_and_each_stage(tmp_path):
    assert main(["run", "request-h3-capped", "--smoke", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "request-h3-capped.json").read_text())
    row = record["arms"]["plan"]
    assert row["completed"] and row["exact"] and row["finite"], row
    assert set(row["stages_s"]) >= {"text_encode", "denoise", "video_decode", "audio_decode"}
    assert row["plan"]["offloaded"] and row["receipt"]["component_onloads"] > 0 and row["moved_bytes"] > 0
    assert record["shape"]["cap"] == row["plan"]["cap"] == row["plan"]["minimum_cap"]
    assert record["shape"]["request"]["mode"] == "t2va" and record["shape"]["host"]["plan_pinned_exact_bytes"] > 0
    assert any(note.startswith("The memory plan under") for note in record["notes"]), record["notes"]


@pytest.mark.parametrize("value", ["lots", "0GiB", "-4GiB"])
def test_request_h3_capped_bad_cap_raises_naming_the_variable_before_building(monkeypatch, tmp_path, value):
    monkeypatch.setenv("REQUEST_H3_CAP", value)
    monkeypatch.setattr(request_h3_capped, "resolve", lambda *a, **k: pytest.fail("built before the cap was checked"))
    with pytest.raises(ValueError, match=rf"REQUEST_H3_CAP: '{value}'; allowed: a size such as 48GiB"):
        request_h3_capped.settings()
    assert main(["run", "request-h3-capped", "--smoke", "--out", str(tmp_path)]) == 1
    assert not (tmp_path / "request-h3-capped.json").exists()


def test_request_h3_capped_host_pinned_at_48gib_is_the_plans_offloaded_and_streamed_weights():
    """At 48 GiB the released H3's plan pins 101.6 GiB of weights; in power-of-two chunks (what torch's pinned allocator
    takes at their size) that costs under 1 % more, where one buffer for the streamed weights alone would be rounded
    up to 128 GiB, the GPU machine's whole host."""
    model, planned = meta_model(request_h3_capped.RELEASE), plan(request_h3_capped.RELEASE, "48GiB")
    exact, chunked = request_h3_capped.host_pinned(model, planned)
    assert 100 * 2**30 < exact < 103 * 2**30
    assert exact <= chunked < 1.01 * exact


def test_request_h3_capped_prompt_is_the_reference_text_rows():
    tokenizer = build_tokenizer(2048, model_max_length=512, extra_special_tokens=h3.VISION_TOKENS)
    text = request_h3_capped.prompt(tokenizer)
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == request_h3_capped.TEXT_ROWS


def test_materialise_initialises_every_parameter_and_buffer_as_a_fresh_module():
    """The text encoder through `materialise` (meta, `to_empty`, reset) against the same config built normally:
    same names, dtypes and buffers (the rotary tables as constructed), every parameter finite and reset."""
    torch.manual_seed(7)
    ids = h3.vision_token_ids(build_tokenizer(128, extra_special_tokens=h3.VISION_TOKENS))
    built = materialise(lambda: qwen3_vl(h3.TINY_TEXT, h3.TINY_VISION, **ids), "cpu", torch.bfloat16, 3)
    fresh = qwen3_vl(h3.TINY_TEXT, h3.TINY_VISION, **ids)
    cast_like_from_pretrained(fresh, torch.bfloat16)
    params = dict(built.named_parameters())
    assert {n: p.dtype for n, p in params.items()} == {n: p.dtype for n, p in fresh.named_parameters()}
    assert all(torch.isfinite(p).all() for p in params.values())
    constructed = dict(qwen3_vl(h3.TINY_TEXT, h3.TINY_VISION, **ids).named_buffers())  # rotary tables, float32
    buffers = dict(built.named_buffers())
    assert buffers.keys() == constructed.keys() and len(buffers) == 4
    for name, buffer in constructed.items():
        assert buffers[name].dtype == buffer.dtype == torch.float32 and torch.equal(buffers[name], buffer), name
    for name, module in built.named_modules():
        if isinstance(module, torch.nn.Linear):  # kaiming-uniform: inside +-1/sqrt(fan_in), not constant
            bound = module.in_features**-0.5
            assert module.weight.abs().max() <= bound * 1.01 and module.weight.float().std() > 0, name
        elif type(module).__name__.endswith("RMSNorm"):
            assert torch.equal(module.weight, torch.ones_like(module.weight)), name
    again = materialise(lambda: qwen3_vl(h3.TINY_TEXT, h3.TINY_VISION, **ids), "cpu", torch.bfloat16, 3)
    assert all(torch.equal(p, params[n]) for n, p in again.named_parameters())  # seeded


def test_materialise_parameter_without_initialiser_raises_naming_it():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.gain = torch.nn.Parameter(torch.ones(4))

    with pytest.raises(RuntimeError, match=r"no initialiser for parameters \['gain'\]"):
        materialise(Scaled, "cpu", torch.bfloat16, 0)


def test_random_components_tiny_configs_run_a_request():
    """`random_full`'s path (random_components, assemble) at tiny configs: a whole t2va request, finite."""
    components = h3.random_components(TINY, seed=0, device="cpu", dtype=torch.bfloat16)
    for name in ("transformer", "text_encoder"):
        assert all(torch.isfinite(t).all() for t in [*components[name].parameters(), *components[name].buffers()])
    rope = components["transformer"].rope
    assert rope.inv_freq.dtype == torch.float32 and rope.inv_freq.abs().max() == 1.0
    model = LoadedModel("tiny-random", h3.FAMILY, h3.assemble(components, **h3.TINY_CANVAS), h3.TINY_DEFAULTS, {})
    result = Session.open(model, device="cpu", dtype="bfloat16").generate(Request("a fox"), progress=False)
    assert result.finite and result.frames.shape == (124, 32, 64, 3)
