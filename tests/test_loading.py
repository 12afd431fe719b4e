import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from workbench import Request, Session
from workbench.models import ltx2, resolve, wan


@pytest.fixture(scope="module")
def saved_wan(tmp_path_factory):
    path = tmp_path_factory.mktemp("wan")
    wan.tiny(0).save(path)
    return path


def test_load_round_trips_a_saved_pipeline(saved_wan):
    loaded = resolve(saved_wan, dtype=torch.float32)
    assert loaded.family is wan.FAMILY
    session = Session.open(loaded, device="cpu")
    tiny = Session.open("tiny-wan", device="cpu")
    request = Request("a green triangle", seed=4)
    # tokenizer, weights and scheduler survive the round trip: output identical to the in-memory build
    assert np.array_equal(
        session.generate(request, progress=False).frames, tiny.generate(request, progress=False).frames
    )


def test_load_ltx2_round_trip(tmp_path):
    ltx2.tiny(0).save(tmp_path)
    loaded = resolve(tmp_path, dtype=torch.float32)
    assert loaded.family is ltx2.FAMILY and loaded.pipeline.vocoder is not None


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_load_missing_component_folder_names_it(saved_wan, tmp_path):
    broken = _copy(saved_wan, tmp_path / "m")
    import shutil

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


def test_load_not_a_directory(tmp_path):
    with pytest.raises(ValueError, match="neither a known name"):
        resolve(tmp_path / "absent")
