"""Request budget in the store: GCRA slots shared by every process, parking, pauses, ramps (SQLite and PostgreSQL)."""

from __future__ import annotations

import math
import threading

import pytest

from prefect_webhooks.store.endpoints.budget import Limit, Ramp, admit
from prefect_webhooks.store.endpoints.states import pause, read_states
from prefect_webhooks.store.engine.engines import get_engine

NO_RAMP = Ramp(5.0, 0.0)
TEN = Limit("k1", "http://127.0.0.1/hook", 10.0)


def take(count: int, limit: Limit = TEN, *, returning: bool = False, horizon: float = 1.0, ramp: Ramp = NO_RAMP):
    return admit(get_engine(), "d", [limit], [returning] * count, horizon=horizon, ramp=ramp)


def test_slots_are_spaced_at_the_rate_and_the_rest_is_parked_behind_them(backend_url: str) -> None:
    admission = take(25)
    admitted = [delay for ok, delay in zip(admission.admitted, admission.delays, strict=True) if ok]
    parked = [delay for ok, delay in zip(admission.admitted, admission.delays, strict=True) if not ok]
    # Within the 1 s horizon: 0, 0.1, … 1.0 (11 slots), then 14 parked at the same pace after them.
    assert len(admitted) == 11 and len(parked) == 14
    assert all(b - a == pytest.approx(0.1, abs=1e-6) for a, b in zip(admitted, admitted[1:], strict=False))
    assert parked[0] == pytest.approx(admitted[-1] + 0.1, abs=0.01)
    assert all(b - a == pytest.approx(0.1, abs=1e-6) for a, b in zip(parked, parked[1:], strict=False))


def test_a_second_caller_gets_later_slots_and_fresh_messages_queue_behind_parked_ones(backend_url: str) -> None:
    first = take(15)
    parked_end = first.now + max(first.delays)
    second = take(3)
    # A parked backlog exists: fresh messages are placed behind it, not admitted ahead of it. (Delays count from
    # each call's own database time: compared as times, the check does not depend on how long the calls took.)
    assert second.admitted == [False] * 3
    assert second.now + min(second.delays) == pytest.approx(parked_end + 0.1, abs=1e-3)
    # A message coming back from being parked takes the next free slot (within the horizon here).
    back = take(1, returning=True, horizon=10.0)
    assert back.admitted == [True]


def test_burst_lets_that_many_go_at_once(backend_url: str) -> None:
    admission = take(6, Limit("k1", "u", 2.0, burst=3), horizon=0.01)
    assert admission.admitted == [True, True, True, False, False, False]


def test_a_pause_delays_every_slot_and_a_new_limit_resets_the_schedule(backend_url: str) -> None:
    take(30)
    pause(get_engine(), "d", "k1", "u", 5.0, ramp_from=None)
    paused = take(1, returning=True, horizon=100.0)
    assert paused.delays[0] >= 4.9
    changed = take(1, Limit("k1", "u", 50.0), horizon=100.0)
    assert changed.config_changed
    (row,) = read_states(get_engine(), ["d"]).values()
    assert row.rate == 50.0


def test_the_ramp_starts_slow_and_doubles() -> None:
    ramp = Ramp(5.0, 60.0)
    assert ramp.rate(100.0, 100.0) == 5.0
    assert ramp.rate(100.0, 110.0) == pytest.approx(10.0)
    assert ramp.rate(100.0, 159.0) == pytest.approx(5.0 * 2 ** (6 * 59 / 60))
    assert math.isinf(ramp.rate(100.0, 160.0))
    assert math.isinf(Ramp(5.0, 0.0).rate(100.0, 100.0))


def test_concurrent_callers_never_share_a_slot(backend_url: str) -> None:
    """Eight threads (own connections) take slots at once: every slot distinct, all spaced at least 1/rate."""
    get_engine()
    slots: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            admission = take(3, Limit("k1", "u", 100.0), horizon=60.0)
            with lock:
                slots.extend(admission.now + delay
                             for ok, delay in zip(admission.admitted, admission.delays, strict=True) if ok)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(slots) == 120
    slots.sort()
    assert min(b - a for a, b in zip(slots, slots[1:], strict=False)) == pytest.approx(0.01, abs=1e-6)



def test_a_ramp_starts_from_the_rate_kept_with_the_endpoint(backend_url: str) -> None:
    from prefect_webhooks.store.endpoints.states import start_ramps

    unlimited = Limit("k1", "http://127.0.0.1/hook", None)
    start_ramps(get_engine(), [("d", "k1", "http://127.0.0.1/hook")], 1000.0)
    assert read_states(get_engine(), ["d"])[("d", "k1")].ramp_start_rate == 1000.0
    delays = take(200, unlimited, horizon=10.0, ramp=Ramp(5.0, 60.0)).delays
    # 200 requests at about 1,000 a second take about 0.2 s (from the setting's 5 a second: 40 s).
    assert 0.15 < max(delays) < 0.25, max(delays)


def test_a_ramp_from_the_endpoints_own_rate_doubles_every_second_twice_then_ends() -> None:
    ramp = Ramp(5.0, 60.0)
    assert ramp.rate(100.0, 100.0, 1000.0) == 1000.0
    assert ramp.rate(100.0, 101.0, 1000.0) == pytest.approx(2000.0)
    assert ramp.rate(100.0, 101.95, 1000.0) == pytest.approx(1000.0 * 2 ** 1.95)
    assert math.isinf(ramp.rate(100.0, 102.0, 1000.0))
    assert ramp.rate(100.0, 110.0, 5.0) == pytest.approx(10.0)  # from the setting's rate: over the whole minute
