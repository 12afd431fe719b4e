"""LoRA adapters fused through diffusers' loader (issue 24): per expert, exact unfuse, metadata defaults, plugins on
the fused weights. The LoRA files are random, made here with peft in diffusers' Wan LoRA key format."""

import numpy as np
import pytest
import torch
from diffusers import WanTransformer3DModel
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from workbench import Adapter, Request, Session
from workbench.accelerations import available, fingerprint
from workbench.accelerations.quantization import selective_fp8 as fp8
from workbench.models import wan

SIZE = {"frames": 5, "height": 32, "width": 32}
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]


def lora_file(path, denoiser, seed, metadata=None):
    """A random rank-4 LoRA for a denoiser shaped like `denoiser`, saved as diffusers' `transformer.<module>.lora_A/B`
    keys (what `WanPipeline.save_lora_weights` writes), with `metadata` in the safetensors header."""
    torch.manual_seed(seed)
    shaped = WanTransformer3DModel.from_config(denoiser.config)
    shaped.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=TARGETS, init_lora_weights=False))
    state = {f"transformer.{key}": value.contiguous() for key, value in get_peft_model_state_dict(shaped).items()}
    save_file(state, str(path), metadata=metadata or {})
    return path


def _state(module):
    return {key: tensor.clone() for key, tensor in module.state_dict().items()}


def _generate(session, seed, **fields):
    return session.generate(
        Request("a red circle moves left", seed=seed, **{"steps": 2, **SIZE, **fields}), progress=False
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"path": "missing.safetensors"}, r"adapter.path: 'missing.safetensors' is not an existing .safetensors file"),
        ({"scale": float("nan")}, r"adapter.scale: nan; allowed: a finite number"),
        ({"scale": True}, r"adapter.scale: True; allowed: a finite number"),
        ({"scale": 1e3}, r"adapter.scale: 1000.0; allowed: a finite number in \[-100.0, 100.0\]"),
        ({"target": "transformer_3"}, r"adapter.target: 'transformer_3'; allowed: \['transformer', 'transformer_2'"),
        ({"name": "a b"}, r"adapter.name: 'a b'; allowed: 1-64 letters"),
    ],
)
def test_adapter_bad_field_raises(tmp_path, fields, message):
    path = tmp_path / "lora.safetensors"
    save_file({"transformer.x.lora_A.weight": torch.ones(1)}, str(path))
    with pytest.raises(ValueError, match=message):
        Adapter(**{"path": path, **fields})


def test_a_failed_adapter_load_raises_and_changes_nothing(tmp_path, seed):
    """A target the model lacks, a file that is no LoRA, or a LoRA none of whose keys reach the targeted denoiser
    (a text encoder's keys, peft's own unprefixed keys: diffusers only warns and loads nothing) is refused with the
    adapter, the target and the keys named, leaving the weights as they were: the model's own, or the adapters fused
    before with their metadata's request defaults and metadata records."""
    session = Session.open("tiny-wan", device="cpu")
    transformer = session.model.pipeline.transformer
    path = lora_file(tmp_path / "a.safetensors", transformer, seed, {"steps": "3"})
    before = fingerprint(transformer)
    with pytest.raises(ValueError, match=r"adapter.target: 'transformer_2' needs \['transformer_2'\]"):
        session.load_adapters([Adapter(path, target="transformer_2")])
    assert fingerprint(transformer) == before
    lora = load_file(str(path))
    refused = {  # file name -> its tensors, the words of the refusal
        "other": ({"some.weight": torch.ones(2)}, ""),  # diffusers' own words follow
        "encoder": (
            {f"text_encoder.model.layers.0.self_attn.q_proj.lora_{ab}.weight": torch.ones(4, 4) for ab in "AB"},
            r"no layer of transformer took its weights; its keys start with \['text_encoder'\]",
        ),
        "unprefixed": (
            {key.removeprefix("transformer."): value for key, value in lora.items()},
            r"no layer of transformer took its weights; its keys start with \['blocks'\]",
        ),
    }
    for name, (tensors, _) in refused.items():
        save_file(tensors, str(tmp_path / f"{name}.safetensors"))
    for previous in ([], [Adapter(path)]):  # nothing fused before, then the adapter `a`
        session.load_adapters(previous)
        expected = fingerprint(transformer)
        for name, (_, words) in refused.items():
            with pytest.raises(
                ValueError, match=rf"adapters: '{name}' \(.*{name}.safetensors\) into transformer: {words}"
            ):
                session.load_adapters([Adapter(tmp_path / f"{name}.safetensors", scale=5.0)])
            assert fingerprint(transformer) == expected, (previous, name)
    assert expected != before
    assert session.resolve(Request("x", **SIZE)).steps == 3  # the metadata's default, as after the first fusion
    assert [record["name"] for record in _generate(session, 0).metadata["adapters"]] == ["a"]


def test_adapters_fuse_per_expert_match_diffusers_lora_and_unfuse_bitwise(tmp_path, seed):
    """One adapter on each Wan2.2 expert: only its expert's weights change; the fused request is diffusers' own
    (unfused, peft-layer) LoRA request up to float rounding; unloading restores every tensor bit for bit."""
    session = Session.open("tiny-wan22", device="cpu")
    pipe = session.model.pipeline
    high = lora_file(tmp_path / "high.safetensors", pipe.transformer, seed)
    low = lora_file(tmp_path / "low.safetensors", pipe.transformer_2, seed + 1)
    dense = _generate(session, seed)
    states = [_state(pipe.transformer), _state(pipe.transformer_2)]
    prints = [fingerprint(pipe.transformer), fingerprint(pipe.transformer_2)]

    session.load_adapters([Adapter(high, scale=0.7)])
    assert fingerprint(pipe.transformer) != prints[0] and fingerprint(pipe.transformer_2) == prints[1]
    assert fingerprint(pipe.transformer)["leftovers"] == () and not hasattr(pipe.transformer, "peft_config")
    records = session.load_adapters([Adapter(high, scale=0.7), Adapter(low, scale=-0.5, target="transformer_2")])
    assert [(r["name"], r["target"], r["scale"]) for r in records] == [
        ("high", "transformer", 0.7),
        ("low", "transformer_2", -0.5),
    ]
    fused = _generate(session, seed)
    assert fused.metadata["adapters"] == records and not torch.equal(fused.latents, dense.latents)

    session.load_adapters([])
    for module, state, before in zip((pipe.transformer, pipe.transformer_2), states, prints, strict=True):
        assert fingerprint(module) == before
        assert all(torch.equal(tensor, state[key]) for key, tensor in module.state_dict().items())
    assert torch.equal(_generate(session, seed).latents, dense.latents)

    pipe.load_lora_weights(str(tmp_path), weight_name=high.name, adapter_name="high")  # diffusers' unfused path
    pipe.load_lora_weights(str(tmp_path), weight_name=low.name, adapter_name="low", load_into_transformer_2=True)
    pipe.transformer.set_adapters(["high"], weights=[0.7])
    pipe.transformer_2.set_adapters(["low"], weights=[-0.5])
    reference = _generate(session, seed)
    rel = float((fused.latents - reference.latents).norm() / reference.latents.norm())
    assert rel < 1e-5, f"seed {seed}: fused vs diffusers' LoRA layers rel L2 {rel:.2e}"


def test_one_adapter_on_both_wan22_experts_is_diffusers_request_and_unloads_exactly(tmp_path, seed):
    """target="both": the one file fused into each expert at the same scale (both change), the request diffusers'
    own LoRA layers give with the file loaded into both; unloading restores both bit for bit."""
    session = Session.open("tiny-wan22", device="cpu")
    pipe = session.model.pipeline
    both = lora_file(tmp_path / "both.safetensors", pipe.transformer, seed)
    dense = _generate(session, seed)
    prints = [fingerprint(pipe.transformer), fingerprint(pipe.transformer_2)]
    (record,) = session.load_adapters([Adapter(both, scale=0.6, target="both")])
    assert (record["target"], record["scale"]) == ("both", 0.6)
    assert fingerprint(pipe.transformer) != prints[0] and fingerprint(pipe.transformer_2) != prints[1]
    fused = _generate(session, seed)
    session.load_adapters([])
    assert [fingerprint(pipe.transformer), fingerprint(pipe.transformer_2)] == prints
    assert torch.equal(_generate(session, seed).latents, dense.latents)
    pipe.load_lora_weights(str(tmp_path), weight_name=both.name, adapter_name="both")  # diffusers' unfused path
    pipe.load_lora_weights(str(tmp_path), weight_name=both.name, adapter_name="both", load_into_transformer_2=True)
    pipe.transformer.set_adapters(["both"], weights=[0.6])
    pipe.transformer_2.set_adapters(["both"], weights=[0.6])
    reference = _generate(session, seed)
    rel = float((fused.latents - reference.latents).norm() / reference.latents.norm())
    assert rel < 1e-5 and not torch.equal(fused.latents, dense.latents), f"seed {seed}: rel L2 {rel:.2e}"


def test_adapter_metadata_sets_request_defaults_and_shift(tmp_path, seed):
    metadata = {"num_inference_steps": "3", "guidance": "1.5", "shift": "5.0"}
    path = lora_file(tmp_path / "fast.safetensors", wan.tiny().pipeline.transformer, seed, metadata)
    session = Session.open("tiny-wan", device="cpu", adapters=[{"path": path, "scale": 0.5}])
    pipe = session.model.pipeline
    shift = wan.tiny().pipeline.scheduler.config.shift
    assert pipe.scheduler.config.shift == 5.0
    request = session.resolve(Request("x", **SIZE))
    assert (request.steps, request.guidance) == (3, 1.5)
    assert session.resolve(Request("x", steps=2, guidance=4.0, **SIZE)).steps == 2  # the request's own win
    session.load_adapters([])
    assert pipe.scheduler.config.shift == shift and session.resolve(Request("x", **SIZE)).steps != 3


def test_a_dropped_session_leaves_its_adapters_named_and_close_takes_them_out(tmp_path, seed):
    """A session dropped without close() leaves its adapters fused and its metadata's scheduler in place: opening its
    model again is refused, naming both. close() takes them out: the model opens again on its own weights."""
    path = lora_file(tmp_path / "fast.safetensors", wan.tiny().pipeline.transformer, seed, {"shift": "5.0"})
    first = Session.open("tiny-wan", device="cpu", adapters=[{"path": path}])
    model = first.model
    del first
    with pytest.raises(
        ValueError,
        match=r"^model: 'tiny-wan' carries what was installed on it and never removed \(transformer: LoRA adapters "
        r"\['fast'\] fused into its weights; scheduler: replaced by an adapter's metadata \(shift=5.0\)\)",
    ):
        Session.open(model, device="cpu")

    second = Session.open("tiny-wan", device="cpu")
    model = second.model
    own, scheduler = _state(model.pipeline.transformer), model.pipeline.scheduler
    second.load_adapters([Adapter(path)])
    second.close()
    again = Session.open(model, device="cpu")
    assert all(torch.equal(tensor, own[key]) for key, tensor in model.pipeline.transformer.state_dict().items())
    assert again.model.pipeline.scheduler is scheduler


def test_every_exact_plugin_composes_with_a_fused_adapter_or_refuses_with_its_reason(tmp_path, monkeypatch, seed):
    """With an adapter fused, each registered exact plugin either installs, runs (a bitwise one equal to the fused
    request, the others within a reduction-order bound) and comes off leaving the fused weights as they were, or
    refuses before changing anything with a message that names it (on this CPU: the CUDA-only ones, and
    context_parallel without its process group)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    session = Session.open("tiny-wan", device="cpu", dtype="bfloat16")
    transformer = session.model.pipeline.transformer
    session.load_adapters([Adapter(lora_file(tmp_path / "a.safetensors", transformer, seed), scale=0.8)])
    fused_print, fused = fingerprint(transformer), _generate(session, seed)
    ran, refused = set(), set()
    for name, spec in available().items():
        if spec.contract == "approximate":
            continue
        try:
            session.accelerate({name: {}})
        except (RuntimeError, ValueError) as error:
            assert str(error).startswith(f"{name}: ") and fingerprint(transformer) == fused_print, (name, error)
            refused.add(name)
            continue
        try:
            result = _generate(session, seed)
        finally:
            session.accelerate({})
        assert fingerprint(transformer) == fused_print, name
        rel = float((result.latents.float() - fused.latents.float()).norm() / fused.latents.float().norm())
        assert torch.equal(result.latents, fused.latents) if spec.contract == "bitwise" else rel < 0.05, (name, rel)
        ran.add(name)
    cpu_exact = {"cross_kv_cache", "block_ring", "adaln_precompute", "fused_block_ops", "fused_qkv", "fused_vae_decode"}
    assert cpu_exact <= ran and {"group_offload", "flash4_attention"} <= refused, (ran, refused)


def test_plugins_compose_with_a_fused_adapter(tmp_path, monkeypatch, seed):
    """With an adapter fused: a bitwise cache and a rounding fused-op plugin equal the fused request bit for bit;
    selective_fp8 quantizes the fused weights (FP8 GEMMs run, near the fused request); all come off exactly."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(fp8, "machine_problem", lambda device: None)
    session = Session.open("tiny-wan", device="cpu", dtype="bfloat16")
    transformer = session.model.pipeline.transformer
    original = fingerprint(transformer)
    session.accelerate({"cross_kv_cache": {}})  # installed before: comes off for the fusion, goes back on after
    session.load_adapters([Adapter(lora_file(tmp_path / "a.safetensors", transformer, seed), scale=0.8)])
    assert session.accelerations == {"cross_kv_cache": {}}
    session.accelerate({})
    fused_print = fingerprint(transformer)
    fused = _generate(session, seed)
    for config in ({"cross_kv_cache": {}}, {"fused_block_ops": {}}):
        session.accelerate(config)
        result = _generate(session, seed)
        session.accelerate({})
        assert torch.equal(result.latents, fused.latents) and np.array_equal(result.frames, fused.frames), config
        assert all(r["executed"] for r in result.receipts.values()) and fingerprint(transformer) == fused_print
    session.accelerate({"selective_fp8": {"include": ["blocks.*.ffn.net.*"], "path": "fused"}})
    result = _generate(session, seed)
    session.accelerate({})
    assert result.receipts["selective_fp8"]["fp8_gemms"] > 0 and fingerprint(transformer) == fused_print
    rel = float((result.latents.float() - fused.latents.float()).norm() / fused.latents.float().norm())
    assert 0 < rel < 0.1, f"seed {seed}: latents rel L2 {rel:.3e}"
    session.load_adapters([])
    assert fingerprint(transformer) == original
