"""How long a delivery worker's shifts last: the schedule's interval while messages flow, longer while none do."""

from __future__ import annotations

from uuid import uuid4

import pytest

from prefect_webhooks.delivery import Shift
from prefect_webhooks.serving.shifts import RunningShift, shift_seconds


def running_shift(started_at: float, batches_claimed: int = 0, *, offline: bool = False) -> RunningShift:
    # Only the claim count and the start take part in the decision: no sender, cache or task is needed.
    shift = Shift(sender=None, destinations=None, batches_claimed=batches_claimed)  # type: ignore[arg-type]
    return RunningShift(shift, None, None if offline else uuid4(), started_at)  # type: ignore[arg-type]


def test_a_shift_lasts_the_schedules_interval_or_four_fifths_of_a_run() -> None:
    assert shift_seconds({"schedules": [{"interval": 60}, {"interval": 20, "active": False}]}) == 60
    assert shift_seconds({"schedules": [], "parameters": {"run_for_seconds": 20}}) == 16
    with pytest.raises(ValueError, match="needs an interval schedule or run_for_seconds"):
        shift_seconds({"schedules": [{"cron": "* * * * *"}]})


def test_a_run_that_claimed_nothing_goes_on_up_to_the_quiet_run_seconds() -> None:
    started = 1_000.0
    # Quiet: it goes on past its interval, until the quiet span is over.
    assert running_shift(started).goes_on_quietly(3600, now=started + 60)
    assert running_shift(started).goes_on_quietly(3600, now=started + 3599)
    assert not running_shift(started).goes_on_quietly(3600, now=started + 3600)
    # Having claimed one batch, it hands over at the next interval.
    assert not running_shift(started, batches_claimed=1).goes_on_quietly(3600, now=started + 60)
    # Delivery without a flow run hands over as soon as a run can start, quiet or not.
    assert not running_shift(started, offline=True).goes_on_quietly(3600, now=started + 60)
