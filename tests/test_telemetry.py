"""Telemetry's clock: what a request's timings and step seconds measure."""

import time
from types import SimpleNamespace

from workbench import Request
from workbench import telemetry as telemetry_module


def test_subscriber_time_is_excluded_from_stage_step_and_total_timings(sessions, monkeypatch):
    """A subscriber runs inside the intervals being timed (each stage and each step after the first holds at least
    one call); its time is excluded from all of them and from the total, and the request_end event says how much.
    The subscriber stalls for an hour on telemetry's clock (a real clock shifted forward), far past any real
    interval of the tiny request, without waiting for it."""
    stall, shift = 3600.0, [0.0]
    monkeypatch.setattr(telemetry_module, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + shift[0]))
    session = sessions("tiny-wan")
    unsubscribe = session.subscribe(lambda event: shift.__setitem__(0, shift[0] + stall))
    try:
        result = session.generate(Request("p", steps=3), progress=False)
    finally:
        unsubscribe()
    *before, end = result.events  # request_end's subscribers run after the total is read
    assert end.kind == "request_end" and end.data["subscriber_seconds"] >= stall * len(before)
    assert result.metadata["subscriber_seconds"] >= stall * len(before)  # read after request_end's own calls
    assert len(result.step_seconds) == 3 and all(0 < seconds < stall for seconds in result.step_seconds)
    stages = {k: v for k, v in result.timings.items() if k not in ("other", "total")}
    assert stages and all(0 < seconds < stall for seconds in stages.values()), stages
    assert 0 < result.timings["total"] <= end.t - end.data["subscriber_seconds"] < stall
    assert abs(sum(stages.values()) + result.timings["other"] - result.timings["total"]) < 1e-6
