import json
import re
import shutil
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import UMT5Config, UMT5EncoderModel

from workbench import Request, Session
from workbench.models import SHIPPED_MODELS, ltx2, resolve, wan
from workbench.models.family import check_config_sizes, read_workbench_file
from workbench.models.loaded import ALIGNMENT, LoadedModel


@pytest.fixture(scope="module")
def saved_wan(tmp_path_factory):
    path = tmp_path_factory.mktemp("wan")
    wan.tiny(0).save(path)
    return path


def test_load_round_trips_a_saved_pipeline(saved_wan, seed):
    """Tokenizer, weights and scheduler survive the round trip: the output is the in-memory build's, bit for bit. A
    CPU session first gives the checkpoint's weights storage of their own: left as views into the mapped file (8-byte
    aligned), CPU BLAS rounded their products otherwise, and some seeds moved a pixel."""
    loaded = resolve(saved_wan, dtype=torch.float32)
    assert loaded.family is wan.FAMILY

    def unaligned() -> int:
        modules = (loaded.pipeline.transformer, loaded.pipeline.vae)
        return sum(t.data_ptr() % ALIGNMENT > 0 for module in modules for t in module.parameters())

    assert unaligned() > 0  # as diffusers leaves them
    session = Session.open(loaded, device="cpu")
    assert unaligned() == 0
    tiny = Session.open("tiny-wan", device="cpu")
    request = Request("a green triangle", seed=seed)
    got, want = session.generate(request, progress=False), tiny.generate(request, progress=False)
    assert torch.equal(got.latents, want.latents) and np.array_equal(got.frames, want.frames)


def test_load_ltx2_round_trip(tmp_path):
    """Every module of the audio+video pipeline comes back with the weights it was saved with."""
    built = ltx2.tiny(0)
    built.save(tmp_path)
    loaded = resolve(tmp_path, dtype=torch.float32)
    assert loaded.family is ltx2.FAMILY
    modules = {n: c for n, c in built.pipeline.components.items() if isinstance(c, torch.nn.Module)}
    assert set(modules) == {"vae", "audio_vae", "text_encoder", "connectors", "transformer", "vocoder"}
    for name, module in modules.items():
        want, got = module.state_dict(), getattr(loaded.pipeline, name).state_dict()
        assert want.keys() == got.keys(), name
        assert all(torch.equal(want[key], got[key]) for key in want), name


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _tiny_umt5():
    return {"vocab_size": 128, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4}


def test_load_missing_component_folder_names_it(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    shutil.rmtree(broken / "vae")
    with pytest.raises(ValueError, match=r"component folder .*vae is missing"):
        resolve(broken)


def test_load_missing_weights_names_folder(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    for f in (broken / "transformer").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ValueError, match=r"transformer: no safetensors weights found"):
        resolve(broken)


def test_load_mismatched_tensor_names_file_and_key(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    (weights,) = (broken / "transformer").glob("*.safetensors")
    tensors = load_file(weights)
    key = "blocks.0.ffn.net.0.proj.weight"
    tensors[key] = torch.randn(tensors[key].shape[0] + 1, tensors[key].shape[1])
    save_file(tensors, weights)
    with pytest.raises(ValueError, match=r"transformer: .*blocks.0.ffn.net.0.proj.weight expected shape"):
        resolve(broken)


def test_load_missing_tensor_is_refused(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    (weights,) = (broken / "transformer").glob("*.safetensors")
    tensors = load_file(weights)
    del tensors["blocks.1.attn1.to_q.weight"]
    save_file(tensors, weights)
    with pytest.raises(ValueError, match=r"missing_keys.*blocks.1.attn1.to_q.weight"):
        resolve(broken)


def test_load_refuses_pickled_weights(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    torch.save({}, broken / "vae" / "diffusion_pytorch_model.bin")
    with pytest.raises(ValueError, match=r"vae: pickled weights .* refused"):
        resolve(broken)


def test_load_unknown_pipeline_class(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    index = json.loads((broken / "model_index.json").read_text())
    index["_class_name"] = "FluxPipeline"
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"names pipeline 'FluxPipeline'; supported"):
        resolve(broken)


def test_load_not_a_directory_or_not_a_diffusers_folder(tmp_path):
    for absent in (tmp_path / "absent", tmp_path / ("x" * 5000)):  # the second is longer than a file name may be
        with pytest.raises(ValueError, match="neither a known name"):
            resolve(absent)
    with pytest.raises(ValueError, match=r"has no model_index.json .*a diffusers-format directory needs"):
        resolve(tmp_path)  # empty


# Hostile model folders: each is refused with a ValueError naming the folder, component or field, before anything
# it names is imported or allocated.


def _edit_index(folder, **entries):
    index = json.loads((folder / "model_index.json").read_text())
    index.update(entries)
    (folder / "model_index.json").write_text(json.dumps(index))


def test_load_refuses_a_foreign_loader_class_with_pickled_weights(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    # T5EncoderModel would read a pickled pytorch_model.bin (with a tensor missing) and generate
    (broken / "text_encoder" / "model.safetensors").unlink()
    state = UMT5EncoderModel(UMT5Config(**_tiny_umt5())).state_dict()
    state.pop("encoder.final_layer_norm.weight")
    torch.save(state, broken / "text_encoder" / "pytorch_model.bin")
    _edit_index(broken, text_encoder=["transformers", "T5EncoderModel"])
    with pytest.raises(
        ValueError, match=r"component 'text_encoder' names class transformers.T5EncoderModel.*allowed: "
    ):
        resolve(broken)


def test_load_never_imports_a_module_the_index_names(saved_wan, tmp_path, monkeypatch):
    marker = tmp_path / "imported.marker"
    (tmp_path / "wb_hostile_module.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nclass Evil:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = _copy(saved_wan, tmp_path / "m")
    _edit_index(broken, transformer=["wb_hostile_module", "Evil"])
    with pytest.raises(ValueError, match=r"component 'transformer' names class wb_hostile_module.Evil, which is not"):
        resolve(broken)
    assert not marker.exists() and "wb_hostile_module" not in sys.modules
    # the same for a component name the family does not take at all
    _edit_index(broken, transformer=["diffusers", "WanTransformer3DModel"], evil=["wb_hostile_module", "Evil"])
    with pytest.raises(ValueError, match=r"component 'evil' \(wb_hostile_module.Evil\) is not one this family takes"):
        resolve(broken)
    assert not marker.exists()


@pytest.mark.parametrize("key", ["../x", "/abs/vae", "vae/../../x"])
def test_load_refuses_a_component_key_that_is_a_path(saved_wan, tmp_path, key):
    broken = _copy(saved_wan, tmp_path / "m")
    _copy(broken / "vae", tmp_path / "x")  # a loadable folder outside the model directory
    index = json.loads((broken / "model_index.json").read_text())
    index[key] = index.pop("vae")
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=rf"component key {re.escape(repr(key))} is not a plain folder name"):
        resolve(broken)


def test_load_refuses_a_mistyped_deeply_nested_or_looping_index_naming_the_file(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    _edit_index(broken, _class_name=["WanPipeline"])
    with pytest.raises(ValueError, match=r"names pipeline \['WanPipeline'\]; supported"):
        resolve(broken)
    (broken / "model_index.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"model index .*model_index.json: not valid JSON"):
        resolve(broken)
    shutil.copy(saved_wan / "model_index.json", broken / "model_index.json")
    weights = broken / "vae" / "diffusion_pytorch_model.safetensors"
    weights.unlink()
    weights.symlink_to(weights)  # a link to itself
    with pytest.raises(ValueError, match=r"component file .*diffusion_pytorch_model.safetensors does not resolve"):
        resolve(broken)


def test_load_refuses_symlinks_out_of_the_model_folder(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    outside = _copy(broken / "vae", tmp_path / "outside_vae")
    shutil.rmtree(broken / "vae")
    (broken / "vae").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match=r"component folder .*m/vae resolves to .*outside_vae, outside the model"):
        resolve(broken)
    (broken / "vae").unlink()
    (broken / "vae").mkdir()
    (broken / "vae" / "config.json").write_text((outside / "config.json").read_text())
    (broken / "vae" / "diffusion_pytorch_model.safetensors").symlink_to(outside / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ValueError, match=r"component file .*vae/diffusion_pytorch_model.safetensors resolves to"):
        resolve(broken)


def test_load_follows_links_of_a_hugging_face_cache_snapshot_into_its_blobs(saved_wan, tmp_path):
    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    blobs = tmp_path / "models--org--tiny" / "blobs"
    blobs.mkdir(parents=True)
    _copy(saved_wan, snapshot)
    for file in [p for p in snapshot.rglob("*") if p.is_file()]:
        blob = blobs / f"{abs(hash(str(file)))}"
        file.rename(blob)
        file.symlink_to(blob)
    assert resolve(snapshot, dtype=torch.float32).family is wan.FAMILY


def test_load_refuses_a_bin_only_text_encoder(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    (broken / "text_encoder" / "model.safetensors").unlink()
    torch.save({}, broken / "text_encoder" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"text_encoder: pickled weights \['pytorch_model.bin'\] are refused"):
        resolve(broken)


def test_load_refuses_a_shard_index_pointing_outside(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    index = {"metadata": {}, "weight_map": {"blocks.0.attn1.to_q.weight": "../../x.safetensors"}}
    (broken / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"shard '../../x.safetensors' is not a plain .safetensors file name"):
        resolve(broken)


@pytest.mark.parametrize(
    ("component", "file", "field", "value"),
    [
        ("transformer", "config.json", "num_layers", 10**6),
        ("transformer", "config.json", "ffn_dim", 4e9),
        ("scheduler", "scheduler_config.json", "num_train_timesteps", 1e10),
        ("text_encoder", "config.json", "vocab_size", 10**9),
        ("vae", "config.json", "base_dim", -3),
        ("transformer", "config.json", "num_layers", "4"),  # a size field must be an int
    ],
)
def test_load_refuses_an_oversized_or_mistyped_config_field_before_building(
    saved_wan, tmp_path, component, file, field, value
):
    broken = _copy(saved_wan, tmp_path / "m")
    path = broken / component / file
    config = json.loads(path.read_text())
    config[field] = value
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"{component}/{file}: field {field} is {re.escape(repr(value))}; allowed 0"):
        resolve(broken)


def test_load_refuses_nested_oversized_and_non_finite_config_fields(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    path = broken / "scheduler" / "scheduler_config.json"
    path.write_text(path.read_text().replace('"shift": 3.0', '"shift": NaN'))
    with pytest.raises(ValueError, match=r"scheduler_config.json: not valid JSON \(NaN is not a JSON number\)"):
        resolve(broken)
    config = {"text_config": {"layers": [{"num_hidden_layers": 2}, {"num_hidden_layers": 5000}]}}
    with pytest.raises(ValueError, match=r"c.json: field text_config.layers\[1\].num_hidden_layers is 5000"):
        check_config_sizes(config, tmp_path / "c.json")
    with pytest.raises(ValueError, match=r"c.json: field block_out_channels\[1\] is 100000"):
        check_config_sizes({"block_out_channels": [8, 100_000]}, tmp_path / "c.json")


def test_load_names_the_index_file_with_trailing_garbage(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    (broken / "model_index.json").write_text((broken / "model_index.json").read_text() + "}x")
    with pytest.raises(ValueError, match=r"model index .*m/model_index.json: not valid JSON"):
        resolve(broken)


def test_call_overrides_may_not_replace_what_the_request_sets(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    for key, field in (("num_inference_steps", "steps"), ("guidance_scale", "guidance"), ("num_frames", "frames")):
        (broken / "workbench.json").write_text(json.dumps({"call_overrides": {key: 7}}))
        with pytest.raises(ValueError, match=rf"workbench.json: call_overrides.{key} .*\(Request.{field}\)"):
            resolve(broken)
    (broken / "workbench.json").write_text(json.dumps({"call_overrides": {"generator": None}}))
    with pytest.raises(ValueError, match=r"call_overrides.generator is set by the workbench's runner"):
        resolve(broken)
    with pytest.raises(ValueError, match=r"model 'x': call_overrides.guidance_scale"):
        LoadedModel("x", ltx2.FAMILY, None, {}, {"guidance_scale": 1.0})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("banana", 1, r"is not a kwarg .* allowed: \['audio_guidance_rescale', "),
        ("max_sequence_length", 10_000_000, r"is 10000000; allowed: an int in \[1, 10240\]"),
        ("max_sequence_length", "64", r"is '64'; allowed: an int in "),
        ("stg_scale", True, r"is True; allowed: a finite number in \[0.0, 100.0\]"),
        ("spatio_temporal_guidance_blocks", [0, -1], r"is \[0, -1\]; allowed: null or a list .* each an int in \[0, "),
    ],
)
def test_call_overrides_are_checked_against_what_the_pipeline_may_take(tmp_path, key, value, message):
    shipped = json.loads((SHIPPED_MODELS["demo-av-mini"] / "workbench.json").read_text())
    assert read_workbench_file(SHIPPED_MODELS["demo-av-mini"], ltx2.FAMILY)[1] == shipped["call_overrides"]
    shipped["call_overrides"][key] = value
    (tmp_path / "workbench.json").write_text(json.dumps(shipped))
    with pytest.raises(ValueError, match=rf"workbench.json: call_overrides.{key} {message}"):
        read_workbench_file(tmp_path, ltx2.FAMILY)


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ({"frames": -1}, r"defaults.frames: -1 is out of range"),
        ({"frames": 10}, r"defaults.frames: 10 is not accepted by the ltx2 VAE"),
        ({"height": 60}, r"defaults.height: 60 must be a multiple of 32 for ltx2"),
        ({"steps": "16"}, r"defaults.steps: must be an integer"),
        ({"guidance": -1.0}, r"defaults.guidance: -1.0 is out of range"),
    ],
)
def test_stored_defaults_a_request_would_refuse_are_refused_at_load_naming_the_file(tmp_path, defaults, message):
    """Before, such a default passed the load and failed at the first generate as a bare field, naming no file."""
    shipped = json.loads((SHIPPED_MODELS["demo-av-mini"] / "workbench.json").read_text())
    shipped["defaults"] |= defaults
    (tmp_path / "workbench.json").write_text(json.dumps(shipped))
    with pytest.raises(ValueError, match=rf"workbench.json: {message}"):
        read_workbench_file(tmp_path, ltx2.FAMILY)


def test_call_overrides_and_defaults_that_ran_are_in_the_record(saved_wan, tmp_path):
    model = _copy(saved_wan, tmp_path / "m")
    stored = {"defaults": {**wan.TINY_DEFAULTS, "steps": 3}, "call_overrides": {"max_sequence_length": 16}}
    (model / "workbench.json").write_text(json.dumps(stored))
    session = Session.open(resolve(model, dtype=torch.float32), device="cpu")
    result = session.generate(Request("a green triangle", seed=1), progress=False)
    assert result.metadata["call_overrides"] == {"max_sequence_length": 16}
    assert result.metadata["request"]["steps"] == 3 and len(result.step_seconds) == 3


def test_load_refuses_a_config_implying_far_more_than_its_weights(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    path = broken / "transformer" / "config.json"
    config = json.loads(path.read_text())
    config.update(num_layers=200, num_attention_heads=64, attention_head_dim=1024, ffn_dim=200_000)  # each in range
    path.write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"transformer/config.json: the config implies [\d,]+ parameters but the weights"
    ):
        resolve(broken)


def test_load_names_a_corrupt_safetensors_file(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    (weights,) = (broken / "vae").glob("*.safetensors")
    weights.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match=r"vae/diffusion_pytorch_model.safetensors: not a valid safetensors file"):
        resolve(broken)
