"""Pacing: a pause after each step, as long as the step took and never shorter than the floor."""

from __future__ import annotations

import time

import pytest

from prefect_webhooks.store.log.pacing import Pacer, paced


def test_a_step_is_followed_by_a_pause_as_long_as_it_took_times_the_ratio() -> None:
    pauses: list[float] = []
    pacer = Pacer(ratio=2.0, floor=0.001, sleep=pauses.append)
    with pacer.step():
        time.sleep(0.05)
    assert len(pauses) == 1 and 0.1 <= pauses[0] < 0.5
    with pacer.step():
        pass
    assert pauses[1] == pytest.approx(0.001, abs=0.001)
    assert pacer.steps == 2 and pacer.paused == pytest.approx(sum(pauses))


def test_a_failed_step_is_not_paused_after_and_no_pacer_never_pauses() -> None:
    pauses: list[float] = []
    pacer = Pacer(sleep=pauses.append)
    with pytest.raises(ZeroDivisionError), pacer.step():
        1 / 0  # noqa: B018
    with paced(None):
        pass
    assert pauses == [] and pacer.steps == 0
