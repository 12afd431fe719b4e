from collections import Counter

from workbench.data.synthetic import COLOURS, DIRECTIONS, parse_caption
from workbench.training.dataset import HELD_OUT_PAIRS, TRAIN_PAIRS, build, captions, eval_cases, train_scene


def test_held_out_pairs_never_reach_training_and_cover_every_colour_and_direction(rng):
    assert not set(HELD_OUT_PAIRS) & set(TRAIN_PAIRS) and len(TRAIN_PAIRS) + len(HELD_OUT_PAIRS) == 16
    assert {c for c, _ in HELD_OUT_PAIRS} == set(COLOURS) and {d for _, d in HELD_OUT_PAIRS} == set(DIRECTIONS)
    for seed in rng.integers(0, 10_000, size=12):
        labels = train_scene(int(seed)).labels
        assert (labels["colour"], labels["direction"]) in TRAIN_PAIRS


def test_eval_cases_are_balanced_unseen_seeds_with_the_held_out_block_marked():
    cases = eval_cases(16)
    first8 = [parse_caption(caption) for _, caption, _ in cases[:8]]
    assert Counter(c["colour"] for c in first8) == dict.fromkeys(COLOURS, 2)
    assert Counter(c["direction"] for c in first8) == dict.fromkeys(DIRECTIONS, 2)
    assert [held for _, _, held in cases] == [False] * 8 + [True] * 4 + [False] * 4
    assert min(seed for seed, _, _ in cases) >= 1_000_000 and len({seed for seed, _, _ in cases}) == 16


def test_build_renders_clips_with_caption_ids_from_the_table():
    clips = build(5, workers=1)
    table = captions()
    assert clips.video.shape == (5, 9, 64, 64, 3) and clips.audio.shape == (5, 2, 6000) and len(clips) == 5
    assert [table[int(i)] for i in clips.caption_ids] == [train_scene(s).caption for s in range(5)]
    assert len(set(table)) == len(table) and table[-1] == ""


def test_rich_training_captions_never_name_a_held_out_pair_and_eval_cases_balance_every_attribute(rng):
    from workbench.training.model import preset

    toy = preset("av2", {"frames": 9, "height": 32, "width": 32, "vae_channels": [8, 16, 32]})
    for seed in rng.integers(0, 10_000, size=12):
        labels = parse_caption(train_scene(int(seed), toy).caption)
        assert (labels["colour"], labels["direction"]) in TRAIN_PAIRS and "speed" in labels
    rich = [parse_caption(c) for c in captions(rich=True)[:-1]]
    assert len(rich) == 16 * 3 * 2 * 2 and len({str(c) for c in rich}) == len(rich) and captions(rich=True)[-1] == ""
    pairs = [(c["colour"], c["direction"]) for c in rich]
    assert set(pairs[: 12 * 12]) == set(TRAIN_PAIRS) and set(pairs[12 * 12 :]) == set(HELD_OUT_PAIRS)
    cases = [parse_caption(caption) for _, caption, _ in eval_cases(16, rich=True)]
    for field in ("speed", "background"):
        assert len({c[field] for c in cases[:4]}) == 2 and Counter(c[field] for c in cases)[cases[0][field]] == 8
    assert {(c["colour"], c["speed"]) for c in cases[:8]} == {(c, s) for c in COLOURS for s in ("slow", "fast")}
