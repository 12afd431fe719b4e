"""The released model sizes on the meta device, and the README's fits table built from the planner's plans of them."""

from pathlib import Path

import pytest
import torch

from benchmarks.readme import fits_table
from workbench.accelerations.memory.ring import module_bytes
from workbench.cards import CARDS
from workbench.memory_plan import DEVICE_OUTSIDE, MemoryBudget, plan_for
from workbench.model_sizes import RELEASED, card_plans, meta_model, plan, reference_request

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_released_meta_builds_allocate_nothing_and_match_documented_parameter_counts():
    """Every tensor of every release is on the meta device (no storage), and each documented component has its
    documented parameter count within 1 %, in bf16 as `from_pretrained` loads it (2 bytes a parameter, up to the few
    float32 norms and embedders diffusers keeps)."""
    for name, released in RELEASED.items():
        components = {k: m for k, m in meta_model(name).pipeline.components.items() if isinstance(m, torch.nn.Module)}
        on_device = [
            f"{component}.{tensor}"
            for component, module in components.items()
            for tensor, value in [*module.named_parameters(), *module.named_buffers()]
            if not value.is_meta
        ]
        assert on_device == [], f"{name}: tensors with storage {on_device[:5]}"
        for component, documented in released.documented.items():
            module = components[component]
            count = sum(p.numel() for p in module.parameters())
            assert abs(count - documented) <= 0.01 * documented, f"{name} {component}: {count:,} vs {documented:,}"
            assert 2 * count <= module_bytes(module) <= 2.01 * count, f"{name} {component} is not bf16 as loaded"


def test_fits_table_cells_are_the_planners_plans():
    """The README's fits table shows, per card and release, `plan_for`'s plan under that card's memory: "no (needs
    <smallest cap>)" exactly where the card's memory is below the plan's `minimum_cap` (the planner refuses it),
    otherwise the plan's offloaded components, streamed blocks per denoiser, streamed text-encoder layers, offloaded
    denoisers and decode mode. MiniMax-H3 fits a 48 GiB card only by streaming its 62 GiB text encoder's layers; an
    H200 holds Wan2.1-1.3B resident."""
    rows = [line.split(" | ") for line in fits_table(RESULTS) if line.startswith("| `")]
    cells = {row[0].split("`")[1]: dict(zip(RELEASED, [c.strip(" |") for c in row[1:]], strict=True)) for row in rows}
    assert list(cells) == list(CARDS)
    smallest = {model: plan(model, 2**50).minimum_cap for model in RELEASED}
    for card_name, plans in card_plans().items():
        for model, arranged in plans.items():
            cell = cells[card_name][model]
            if arranged is None:
                assert CARDS[card_name].memory < smallest[model] and cell.startswith("no (needs "), (card_name, cell)
                continue
            assert arranged.cap == CARDS[card_name].memory and arranged.minimum_cap == smallest[model]
            assert ("offload " + "+".join(arranged.offloaded) in cell) == bool(arranged.offloaded), cell
            for denoiser, count in arranged.block_counts.items():
                streamed = len(arranged.streamed_blocks[denoiser])
                assert (f"{streamed}/{count}" in cell) == (streamed > 0), (card_name, model, cell)
            text = f"text ring {len(arranged.streamed_text_layers)}/{arranged.text_layer_count}"
            assert (text in cell) == bool(arranged.streamed_text_layers), (card_name, model, cell)
            assert ("denoiser offloaded outside denoise" in cell) == arranged.denoisers_offloaded, cell
            assert ("tiled decode" in cell) == arranged.tiled_decode, cell
            resident = not (arranged.offloaded or arranged.tiled_decode or any(arranged.streamed_blocks.values()))
            resident = resident and not arranged.denoisers_offloaded
            assert (cell == "resident") == resident, cell
    h3, wan = "MiniMax-H3 33.1B", "Wan2.1-T2V-14B"
    with pytest.raises(ValueError, match=rf"the smallest cap that fits is .*\({smallest[h3]} bytes\)"):
        plan_for(meta_model(h3), MemoryBudget(smallest[h3] - 1), reference_request(h3), DEVICE_OUTSIDE)
    wan_4090 = plan_for(meta_model(wan), MemoryBudget("rtx4090"), reference_request(wan), DEVICE_OUTSIDE)
    assert card_plans()["rtx4090"][wan] == wan_4090 and wan_4090.outside == DEVICE_OUTSIDE
    h3_48 = card_plans()["rtx4090-48gb"][h3]
    assert "text_encoder" in h3_48.offloaded and h3_48.streamed_text_layers, str(h3_48)
    assert cells["h200"]["Wan2.1-T2V-1.3B"] == "resident"


def test_released_unknown_name_raises_naming_model():
    with pytest.raises(ValueError, match=r"^model: 'Wan2.1-T2V-7B' is not a released size here; allowed: \["):
        meta_model("Wan2.1-T2V-7B")
