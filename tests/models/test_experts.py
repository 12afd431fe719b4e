"""Wan2.2's two experts: the schedule plugins read, and caches / sparse routing counting per expert (issue 24)."""

import pytest

from workbench import Request, Session
from workbench.accelerations.attention.sparse_routing import Router, Settings
from workbench.accelerations.base import Receipt
from workbench.models import experts

STEPS = 8
SIZE = {"frames": 5, "height": 32, "width": 32}


@pytest.fixture(scope="module")
def session():
    return Session.open("tiny-wan22", device="cpu")


def _generate(session, seed):
    return session.generate(Request("a red circle moves left", seed=seed, steps=STEPS, **SIZE), progress=False)


def test_expert_schedule_matches_the_experts_the_pipeline_runs(session, seed):
    ran = []
    hooks = [
        denoiser.register_forward_pre_hook(lambda *_, name=name: ran.append(name))
        for name, denoiser in experts.named_denoisers(session.model)
    ]
    try:
        _generate(session, seed)
    finally:
        for hook in hooks:
            hook.remove()
    schedule = experts.schedule(session.model, STEPS)
    assert tuple(ran[::2]) == tuple(ran[1::2]) == schedule.experts  # cond and uncond call the same expert
    high, low = schedule.span("transformer"), schedule.span("transformer_2")
    assert high.start == 0 and high.stop == low.start and low.stop == STEPS and len(high) >= 2 and len(low) >= 3


def _shares_sum_to_totals(receipt):
    for key in ("computed", "reused"):
        assert sum(share.get(key, 0) for share in receipt["experts"].values()) == receipt.get(key, 0), receipt


# Decisions per (expert, CFG branch), given the high-noise expert's `hi` and the low-noise expert's `lo` steps, per
# expert and boundary-unaware, with the same threshold (reuse whenever allowed), warm-up 2 and final step 1. TeaCache:
# the boundary-unaware count lets the low-noise expert reuse on its second step and the high-noise expert on its last;
# per expert both stay dense. EasyCache keeps its transformation per denoiser either way (the low-noise expert starts
# with none cached), so only the high-noise expert's last step before the switch differs.
DECISIONS = {
    "teacache": ("rel_l1_thresh", {
        True: lambda hi, lo: ("C" * hi, "CC" + "R" * (lo - 3) + "C"),
        False: lambda hi, lo: ("CC" + "R" * (hi - 2), "C" + "R" * (lo - 2) + "C"),
    }),
    "easycache": ("threshold", {
        True: lambda hi, lo: ("C" * hi, "CC" + "R" * (lo - 3) + "C"),
        False: lambda hi, lo: ("CC" + "R" * (hi - 2), "CC" + "R" * (lo - 3) + "C"),
    }),
}  # fmt: skip


@pytest.mark.parametrize("plugin", sorted(DECISIONS))
def test_cache_per_expert_changes_decisions_at_the_switch(session, plugin, seed):
    knob, expected = DECISIONS[plugin]
    schedule = experts.schedule(session.model, STEPS)
    high, low = len(schedule.span("transformer")), len(schedule.span("transformer_2"))
    for per_expert in (False, True):
        session.accelerate({plugin: {knob: 1e6, "warmup": 2, "final_dense": 1, "per_expert": per_expert}})
        try:
            receipt = _generate(session, seed).receipts[plugin]
        finally:
            session.accelerate({})
        _shares_sum_to_totals(receipt)
        decisions = receipt["notes"]["decisions"]
        for branch in ("cond", "uncond"):
            got = (decisions[f"transformer/{branch}"], decisions[f"transformer_2/{branch}"])
            assert got == expected[per_expert](high, low), (per_expert, decisions)


def test_sparse_dense_steps_count_per_expert(session, seed):
    """dense_steps=2: per expert, each expert's first two steps run dense; boundary-unaware, only the request's."""
    shares = {}
    settings = Settings(tau=0.0, dense_steps=2, sink_tokens=0, protect_prefix=0)
    for per_expert in (False, True):
        receipt = Receipt(("sparse_calls",))
        router = Router("test", session.model, receipt, lambda c: (c.backend_fn(**c.kwargs), None), lambda r: settings)
        router.per_expert = per_expert
        router.install()
        try:
            router.reset(STEPS)
            _generate(session, seed)
        finally:
            router.remove()
        shares[per_expert] = receipt.by_expert()
        for key in ("dense_step_calls", "sparse_calls"):
            assert sum(s.get(key, 0) for s in shares[per_expert].values()) == receipt.counters[key]
    blocks = 2 * 2  # two self-attentions per expert, two CFG branches per step
    assert shares[True]["transformer"]["dense_step_calls"] == shares[True]["transformer_2"]["dense_step_calls"]
    assert shares[True]["transformer_2"]["dense_step_calls"] == 2 * blocks
    assert shares[False]["transformer"]["dense_step_calls"] == 2 * blocks
    assert "dense_step_calls" not in shares[False]["transformer_2"]


def test_per_expert_counting_refuses_a_step_the_schedule_gives_another_expert(session):
    schedule = experts.schedule(session.model, STEPS)
    with pytest.raises(RuntimeError, match=r"expert 'transformer_2' ran request step 0, where the schedule has"):
        schedule.counted("transformer_2", 0, 0, STEPS, per_expert=True)
    assert schedule.counted("transformer_2", 0, 0, STEPS, per_expert=False) == (0, STEPS)


def test_mag_cache_gives_each_expert_its_own_ratios_and_step_count(session, seed):
    """calibrate=True records the ratios per expert (the lengths of their spans); given the request's list (the
    experts' concatenated in request order), each expert's diffusers config holds its own span's ratios and step count
    per expert, the whole list and request boundary-unaware, and the experts then skip other blocks."""
    request = Request("a red circle moves left", seed=seed, steps=STEPS, **SIZE)
    schedule = experts.schedule(session.model, STEPS)
    high, low = schedule.span("transformer"), schedule.span("transformer_2")
    session.accelerate({"mag_cache": {"calibrate": True}})
    try:
        recorded = session.generate(request, progress=False).receipts["mag_cache"]["notes"]["mag_ratios"]
    finally:
        session.accelerate({})
    assert {key: len(ratios) for key, ratios in recorded.items()} == {
        f"{branch}/{name}": len(span) for branch in ("cond", "uncond") for name, span in (("transformer", high), ("transformer_2", low))
    }  # fmt: skip
    ratios = recorded["cond/transformer"] + recorded["cond/transformer_2"]
    skipped = {}
    for per_expert in (True, False):
        session.accelerate({"mag_cache": {"mag_ratios": ratios, "threshold": 1.0, "per_expert": per_expert}})
        try:
            config = session._handles[0]._config("transformer_2")
            receipt = session.generate(request, progress=False).receipts["mag_cache"]
        finally:
            session.accelerate({})
        given = ratios[low.start : low.stop] if per_expert else ratios
        assert config.num_inference_steps == (len(low) if per_expert else STEPS)
        assert [float(r) for r in config.mag_ratios] == pytest.approx(given)
        skipped[per_expert] = {name: share.get("blocks_skipped", 0) for name, share in receipt["experts"].items()}
    assert skipped[True] != skipped[False], skipped
