"""The released model sizes the families cover, built at full size on the meta device, so the memory planner
(`workbench.memory_plan`) can say which card holds which model without a checkpoint and without memory.

`RELEASED` names each public checkpoint, its family, the reference request it is planned for and the documented
parameter counts of its large components. `meta_model(name)` builds its diffusers pipeline from the configurations
below with every tensor on the meta device (shapes and dtypes, no storage), cast as `from_pretrained(torch_dtype=
torch.bfloat16)` casts (diffusers models keep their `_keep_in_fp32_modules` in float32, transformers models their
`_keep_in_fp32_modules_strict`), inside a `LoadedModel` whose defaults are the reference request: `memory_plan.plan_for`
plans it exactly as it plans the loaded checkpoint. `plan(name, memory)` is that plan, `card_plans()` every release's
plan on every named card; tokenizers and schedulers are left out (they hold no weights). The build runs under
transformers' `no_init_weights` (torch's init functions are no-ops meanwhile, in every thread; the transformers models'
tied weights are tied after it): initialising meta tensors is moot, and it is most of the build's time.
`materialise(build, device, dtype, seed)` makes such a module real with random weights, straight on a device in the
dtype it runs in (`workbench.models.h3.random_full`: the released MiniMax-H3 at full size on a GPU).

Where the numbers come from (the public checkpoints' config.json files and file listings, read as text; diffusers'
class defaults where they equal the published config):
- Wan (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, Wan2.1-T2V-14B-Diffusers, Wan2.2-T2V-A14B-Diffusers): transformer 1.3B
  12 heads x 128, 30 layers, FFN 8960 (as `wan.random_1_3b`); 14B and each A14B expert 40 x 128, 40 layers, FFN 13824
  (`WanTransformer3DModel`'s defaults); the Wan2.1 VAE (`AutoencoderKLWan`'s defaults, also Wan2.2-A14B's); the
  UMT5-XXL encoder (d_model 4096, d_ff 10240, 24 layers, 64 heads x 64, gated-GELU, vocabulary 256,384); Wan2.2 A14B
  switches experts at boundary ratio 0.875. Documented: the 1.3B transformer's safetensors 5.68 GB in float32 (1.42B
  parameters), wan2.1_t2v_14B_bf16.safetensors 28.6 GB (14.3B), the UMT5 encoder 11.4 GB in bf16 (5.68B), the VAE
  508 MB in float32 (127M).
- LTX-2 (Lightricks/LTX-2, the release diffusers' `LTX2Pipeline` loads, "ltx-2-19b"): transformer 48 layers, video 32
  heads x 128, audio 32 x 64, caption width 3840; video VAE, audio VAE (audio_vae/config.json: base 128, ch_mult
  1, 2, 4), vocoder (1024 wide, upsampling 6, 5, 2, 2, 2 to 24 kHz) and text connectors (2 layers of 30 x 128, 128
  registers, projection factor 49): diffusers' class defaults, the published configs and diffusers'
  scripts/convert_ltx2_to_diffusers.py "2.0" configs alike; text encoder Gemma-3 12B (its published
  configuration: hidden 3840, FFN 15360, 48 layers, 16 heads / 8 KV heads of 256, vocabulary 262,208, tied embeddings;
  SigLIP vision tower 27 layers of 1152, FFN 4304, 896 px in patches of 14). Documented: 19B (the transformer, the
  release's ltx-2-19b checkpoint), 12.2B (Gemma-3 12B's model card).
- MiniMax-H3 (MiniMaxAI/MiniMax-H3): vae/config.json equals `AutoencoderKLMiniMaxH3`'s defaults (latent 24, decoder
  36 layers of 32 x 64); the transformer is `MiniMaxH3Transformer3DModel`'s default (hidden 5376, 50 layers, 56 heads
  x 128, FFN 14336), whose 33.1B parameters are the model card's; the audio VAE is `AutoencoderKLMiniMaxH3Audio`'s
  default (not checked against the release); the conditioner is the whole Qwen3-VL-32B (its config.json: hidden 5120,
  FFN 25600, 64 layers, 64 heads / 8 KV heads of 128, vocabulary 151,936, untied head; vision 27 layers of 1152, FFN
  4304, patch 16, output 5120), of which H3 reads hidden state 50 (diffusers' MiniMax-H3 docs: the full checkpoint is
  loaded). Documented: 33.1B (the transformer), 62 GiB in bf16 (the text_encoder folder, as InvokeAI's MiniMax-H3
  loader, lstein/InvokeAI#146, reports it).

Reference requests: Wan at 480x832, 81 frames (the family defaults: 50 steps, CFG 5); LTX-2 at its pipeline's
defaults, 512x768, 121 frames, 40 steps, CFG 4; MiniMax-H3 at the benchmarks' packing (`benchmarks/scenarios/
forward_h3.py`: 10 s at 736x992, 243 frames, 72 x 23 x 31 video rows) with Base16's 17 steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workbench._quiet_imports import defer_torchao
from workbench.request import Request, shown

defer_torchao()  # before any diffusers model import: see workbench/_quiet_imports.py

GIB = 2**30


@dataclass(frozen=True)
class Released:
    """A public checkpoint: `family`, the reference `request` fields it is planned for, the `documented` parameter
    count of its large components (pipeline attribute -> parameters; sources in the module docstring) and `build`,
    which returns its pipeline's weight-holding components (attribute -> meta module) and pipeline keyword arguments."""

    name: str
    family: str
    request: dict[str, Any]
    documented: dict[str, int]
    build: Callable[[], tuple[dict[str, torch.nn.Module], dict[str, Any]]]


def _umt5_xxl_encoder() -> torch.nn.Module:
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=256_384,
        d_model=4096,
        d_kv=64,
        d_ff=10240,
        num_layers=24,
        num_heads=64,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
    )
    return UMT5EncoderModel(config)


def _wan(experts: int, heads: int, layers: int, ffn: int) -> Callable[[], tuple[dict, dict]]:
    def build() -> tuple[dict, dict]:
        from diffusers import AutoencoderKLWan, WanTransformer3DModel

        def transformer() -> torch.nn.Module:
            return WanTransformer3DModel(num_attention_heads=heads, num_layers=layers, ffn_dim=ffn)

        modules = {"text_encoder": _umt5_xxl_encoder(), "vae": AutoencoderKLWan(), "transformer": transformer()}
        if experts == 2:
            modules["transformer_2"] = transformer()
        return modules, {"boundary_ratio": 0.875} if experts == 2 else {}

    return build


def _gemma3_12b() -> torch.nn.Module:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {
        "vocab_size": 262_208,
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
    }
    vision = {
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "image_size": 896,
        "patch_size": 14,
    }
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=256, tie_word_embeddings=True)
    return Gemma3ForConditionalGeneration(config)


def _ltx2() -> tuple[dict, dict]:
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    modules = {
        "text_encoder": _gemma3_12b(),
        "connectors": LTX2TextConnectors(),
        "transformer": LTX2VideoTransformer3DModel(),
        "vae": AutoencoderKLLTX2Video(),
        "audio_vae": AutoencoderKLLTX2Audio(),
        "vocoder": LTX2Vocoder(),
    }
    return modules, {}


# Qwen3-VL-32B's text model (MiniMax-H3's conditioner), as its config.json gives it
QWEN3_VL_32B_TEXT = {
    "vocab_size": 151_936,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20]},
}


# and its vision tower (27 layers of 1152, patch 16, output 5120)
QWEN3_VL_32B_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 5120,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}


def qwen3_vl(
    text: dict[str, Any] = QWEN3_VL_32B_TEXT, vision: dict[str, Any] = QWEN3_VL_32B_VISION, **token_ids: int
) -> torch.nn.Module:
    """A `Qwen3VLForConditionalGeneration` of these text and vision configs (Qwen3-VL-32B by default), untied head;
    `token_ids` (`image_token_id`, `vision_start_token_id`, ...) name its tokenizer's vision tokens."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **token_ids)
    return Qwen3VLForConditionalGeneration(config)


def _h3() -> tuple[dict, dict]:
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel

    from workbench.models.h3 import quiet_weight_norm

    with quiet_weight_norm():
        audio_vae = AutoencoderKLMiniMaxH3Audio()
    modules = {
        "text_encoder": qwen3_vl(),
        "transformer": MiniMaxH3Transformer3DModel(),
        "vae": AutoencoderKLMiniMaxH3(),
        "audio_vae": audio_vae,
    }
    return modules, {}


_WAN_REQUEST = {"frames": 81, "height": 480, "width": 832, "steps": 50, "guidance": 5.0, "fps": 16}
_UMT5, _WAN_VAE = 5_680_000_000, 127_000_000
RELEASED = {
    model.name: model
    for model in (
        Released(
            "Wan2.1-T2V-1.3B",
            "wan",
            _WAN_REQUEST,
            {"transformer": 1_420_000_000, "text_encoder": _UMT5, "vae": _WAN_VAE},
            _wan(1, 12, 30, 8960),
        ),
        Released(
            "Wan2.1-T2V-14B",
            "wan",
            _WAN_REQUEST,
            {"transformer": 14_300_000_000, "text_encoder": _UMT5, "vae": _WAN_VAE},
            _wan(1, 40, 40, 13824),
        ),
        Released(
            "Wan2.2-T2V-A14B",
            "wan",
            _WAN_REQUEST,
            {"transformer": 14_300_000_000, "transformer_2": 14_300_000_000, "text_encoder": _UMT5},
            _wan(2, 40, 40, 13824),
        ),
        Released(
            "LTX-2 19B",
            "ltx2",
            {"frames": 121, "height": 512, "width": 768, "steps": 40, "guidance": 4.0, "fps": 24},
            {"transformer": 19_000_000_000, "text_encoder": 12_200_000_000},
            _ltx2,
        ),
        Released(
            "MiniMax-H3 33.1B",
            "h3",
            {"frames": 243, "height": 736, "width": 992, "steps": 17, "fps": 24},
            {"transformer": 33_100_000_000, "text_encoder": 62 * GIB // 2},
            _h3,
        ),
    )
}


def cast_like_from_pretrained(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """`module`'s floating tensors to `dtype`, except those `from_pretrained(torch_dtype=dtype)` keeps in float32."""
    from transformers import PreTrainedModel

    attribute = "_keep_in_fp32_modules_strict" if isinstance(module, PreTrainedModel) else "_keep_in_fp32_modules"
    keep = set(getattr(module, attribute, None) or [])
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(torch.float32 if keep & set(name.split(".")) else dtype)


def materialise(
    build: Callable[[], torch.nn.Module], device: str | torch.device, dtype: torch.dtype, seed: int
) -> torch.nn.Module:
    """`build()`'s module with random weights made straight on `device` in `dtype`: no float32 copy of a large model
    ever exists (a 33B transformer is 132 GB in float32), and nothing is left as `to_empty`'s garbage.

    `build()` runs with every parameter on the meta device and every buffer computed on the CPU by its constructor
    (accelerate's `init_empty_weights(include_buffers=False)`, inside transformers' `no_init_weights`). The parameters
    are cast as `cast_like_from_pretrained` casts them, allocated on `device` (`to_empty`) and initialised there,
    seeded with `seed`, by their module's own `reset_parameters()` (`nn.Linear`, `nn.Embedding`, convolutions,
    `nn.LayerNorm`, `nn.RMSNorm`); an RMS norm without one (transformers' `*RMSNorm`) gets its initial ones. The
    buffers (rotary tables) are put back on `device` as their constructor computed them, dtype included, as
    `from_pretrained` leaves them. RuntimeError naming the parameters no module initialises, or the buffers `build`
    left on the meta device. Returned in eval mode without gradients. Peak on `device`: the module in `dtype`."""
    from accelerate import init_empty_weights
    from transformers.initialization import no_init_weights

    with init_empty_weights(include_buffers=False), no_init_weights():
        module = build()
    buffers = {name: buffer.clone() for name, buffer in module.named_buffers()}
    if meta := [name for name, buffer in buffers.items() if buffer.is_meta]:
        raise RuntimeError(f"materialise: buffers {meta[:5]} ({len(meta)} in all) were built on the meta device")
    cast_like_from_pretrained(module, dtype)
    module.to_empty(device=device)
    torch.manual_seed(seed)
    initialised: set[int] = set()
    with torch.no_grad():
        for sub in module.modules():
            own = list(sub.parameters(recurse=False))
            if not own:
                continue
            if hasattr(sub, "reset_parameters"):
                sub.reset_parameters()
            elif type(sub).__name__.endswith("RMSNorm") and [p is sub.weight for p in own] == [True]:
                sub.weight.fill_(1.0)
            else:
                continue
            initialised.update(id(p) for p in own)
        missed = [name for name, p in module.named_parameters() if id(p) not in initialised]
        if missed:
            raise RuntimeError(f"materialise: no initialiser for parameters {missed[:5]} ({len(missed)} in all)")
        for name, buffer in buffers.items():
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner), leaf, buffer.to(device))
    return module.eval().requires_grad_(False)


@functools.cache
def meta_model(name: str) -> Any:
    """The released model `name` (a key of `RELEASED`) as a `LoadedModel` whose every tensor is on the meta device,
    bf16 as loaded, with the reference request as its defaults. Built once per process (a few seconds for all)."""
    from transformers import PreTrainedModel
    from transformers.initialization import no_init_weights

    from workbench.models import families
    from workbench.models.loaded import LoadedModel

    released = _released(name)
    family = families()[released.family]
    with torch.device("meta"), no_init_weights():  # initialising meta tensors is moot, and slow on the CPU
        modules, kwargs = released.build()
    for module in modules.values():
        if isinstance(module, PreTrainedModel):
            module.tie_weights()  # `init_weights` ties them, and `no_init_weights` skipped it
        cast_like_from_pretrained(module, torch.bfloat16)
        module.eval().requires_grad_(False)
    if released.family == "h3":
        from workbench.models.h3 import assemble

        pipeline = assemble(modules)
    else:
        from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline, WanPipeline

        cls = {"wan": WanPipeline, "ltx2": LTX2Pipeline}[released.family]
        pipeline = cls(tokenizer=None, scheduler=FlowMatchEulerDiscreteScheduler(), **modules, **kwargs)
    return LoadedModel(name, family, pipeline, dict(released.request), {})


def reference_request(name: str) -> Request:
    """The resolved request the released model `name` is planned for."""
    model = meta_model(name)
    return Request("reference").resolved(model.family, model.defaults)


def plan(name: str, memory: Any) -> Any:
    """`memory_plan.plan_for` of the released model `name` under `memory` (bytes, "24GiB", a card's name, or a
    MemoryBudget) for its reference request: a `MemoryPlan`, or ValueError naming the smallest cap that fits."""
    from workbench.memory_plan import DEVICE_OUTSIDE, MemoryBudget, plan_for

    return plan_for(meta_model(name), MemoryBudget.of(memory), reference_request(name), DEVICE_OUTSIDE)


@functools.cache
def card_plans() -> dict[str, dict[str, Any]]:
    """card name (`workbench.cards.CARDS`) -> released model -> its `plan` under that card's memory, or None where
    the planner refuses the card (its memory below the plan's `minimum_cap`). Computed once per process."""
    from workbench.cards import CARDS

    plans: dict[str, dict[str, Any]] = {}
    for card in CARDS:
        plans[card] = {}
        for name in RELEASED:
            try:
                plans[card][name] = plan(name, card)
            except ValueError:  # "memory: a cap of ... cannot hold this model and request"
                plans[card][name] = None
    return plans


def _released(name: str) -> Released:
    if name not in RELEASED:
        raise ValueError(f"model: {shown(name)} is not a released size here; allowed: {list(RELEASED)}")
    return RELEASED[name]
