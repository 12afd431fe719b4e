"""The GPUs people run these models on, by name (the small-card presets): memory and compute capability.

`Session.open(model, memory="rtx4090-48gb")` plans under that card's memory (`workbench.memory_plan`), and
`profiles.card_plan("exact-fast", family, "rtx4090-48gb")` says what the profile installs on its compute capability.
The seeds' deployment cards are the RTX 4090 48 GB (sm_89) and the RTX 3080 20 GB (sm_86); the stock 24 GB RTX 4090 and
RTX 3090 are the cards most users have; the data-centre cards are for comparison.

Memory: for the H100 and the H200, the total `torch.cuda.get_device_properties` reported on the cards this project
measured on (`device.memory_bytes` in benchmarks/results/fp8-attention-h100.json and fp8-attention.json: 79.2 and
139.8 GiB, under their marketed 80 and 141 GB). For the other cards, which no record here measured, the marketed size
read as GiB; such a card reports somewhat less (the H100's total is 1 % under its marketed size), so a plan for it may
count on up to about that much memory the card does not have: plan with `headroom` or a cap of your own when it is tight.
The planner keeps its headroom below the memory for the CUDA context, allocator fragmentation and library workspaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.request import shown

GIB = 2**30


@dataclass(frozen=True)
class Card:
    """A GPU by name: `memory` bytes, `target` its compute capability's name in `workbench.kernels.targets.TARGETS`."""

    name: str
    memory: int
    target: str
    label: str


CARDS = {
    card.name: card
    for card in (
        Card("rtx3080-20gb", 20 * GIB, "sm_86", "RTX 3080 20 GB (a seeds' deployment card)"),
        Card("rtx3090", 24 * GIB, "sm_86", "RTX 3090 24 GB"),
        Card("rtx4090", 24 * GIB, "sm_89", "RTX 4090 24 GB"),
        Card("rtx4090-48gb", 48 * GIB, "sm_89", "RTX 4090 48 GB (a seeds' deployment card)"),
        Card("l40s", 48 * GIB, "sm_89", "L40S 48 GB"),
        Card("a100-80gb", 80 * GIB, "sm_80", "A100 80 GB"),
        Card("h100", 85_017_493_504, "sm_90", "H100 80 GB"),
        Card("h200", 150_109_880_320, "sm_90", "H200 141 GB"),
    )
}


def card(name: str) -> Card:
    """The card called `name` (case-insensitive); ValueError listing the known names otherwise."""
    found = CARDS.get(name.strip().lower()) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"card: {shown(name)} is not a known card; allowed: {list(CARDS)}")
    return found


def is_card(name: object) -> bool:
    return isinstance(name, str) and name.strip().lower() in CARDS
