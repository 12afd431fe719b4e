"""Wan's random real-shape builds: what the GPU benchmarks time must have the released shapes."""

import torch

from workbench.model_sizes import meta_model
from workbench.models import experts, wan


def test_random_a14b_has_the_released_expert_shapes_dtypes_and_boundary():
    """Built on the meta device (no memory): both experts have the parameters of model_sizes' Wan2.2-T2V-A14B
    (shape for shape), cast as from_pretrained casts (the fp32-kept modules float32, the rest bf16); the 40-step T2V
    schedule switches experts where Wan2.2's shift-12 schedule and 0.875 boundary put it."""
    model = wan.random_a14b(0, "meta", torch.bfloat16)
    released = meta_model("Wan2.2-T2V-A14B").pipeline
    for name in ("transformer", "transformer_2"):
        built, want = getattr(model.pipeline, name), getattr(released, name)
        shapes = {key: (tuple(p.shape), p.dtype) for key, p in built.named_parameters()}
        assert shapes == {key: (tuple(p.shape), p.dtype) for key, p in want.named_parameters()}, name
        assert {dtype for _, dtype in shapes.values()} == {torch.bfloat16, torch.float32}
        assert built.config.qk_norm == "rms_norm_across_heads" and built.config.num_layers == 40
    assert model.pipeline.config.boundary_ratio == 0.875 and model.defaults["steps"] == 40
    schedule = experts.schedule(model, 40).experts
    assert (schedule.count("transformer"), schedule.count("transformer_2")) == (26, 14)
    assert schedule == ("transformer",) * 26 + ("transformer_2",) * 14


def test_random_14b_has_the_released_transformer_shapes_and_dtypes():
    """Built on the meta device: the transformer has the parameters of model_sizes' Wan2.1-T2V-14B (shape for shape,
    dtype for dtype), and nothing but the one denoiser."""
    model = wan.random_14b(0, "meta", torch.bfloat16)
    built, want = model.pipeline.transformer, meta_model("Wan2.1-T2V-14B").pipeline.transformer
    shapes = {key: (tuple(p.shape), p.dtype) for key, p in built.named_parameters()}
    assert shapes == {key: (tuple(p.shape), p.dtype) for key, p in want.named_parameters()}
    assert model.pipeline.transformer_2 is None and model.pipeline.config.boundary_ratio is None
    assert sum(p.numel() for p in built.parameters()) > 14e9 and built.config.qk_norm == "rms_norm_across_heads"
