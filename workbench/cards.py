"""The GPUs people run these models on, by name (the small-card presets): memory and compute capability.

`Session.open(model, memory="rtx4090-48gb")` plans under that card's memory (`workbench.memory_plan`), and
`profiles.card_plan("exact-fast", family, "rtx4090-48gb")` says what the profile installs on its compute capability.
The seeds' deployment cards are the RTX 4090 48 GB (sm_89) and the RTX 3080 20 GB (sm_86); the stock 24 GB RTX 4090 and
RTX 3090 are the cards most users have; the data-centre cards are for comparison.

Memory is the card's total as `torch.cuda.get_device_properties` reports it (marketed "GB" on these cards are GiB);
the planner keeps its headroom below it for the CUDA context, allocator fragmentation and library workspaces.
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
        Card("h100", 80 * GIB, "sm_90", "H100 80 GB"),
        Card("h200", 141 * GIB, "sm_90", "H200 141 GB"),
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
