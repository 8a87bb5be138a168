"""Endpoint health across processes (``store.endpoints.states.record_health``): one run of failures disables an
endpoint once, however many processes report failures of it."""

from __future__ import annotations

from datetime import timedelta

from prefect_webhooks.store.endpoints.states import DISABLED, FAILING, HealthReport, record_health, url_key
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.tables import store_now

URL = "https://hooks.example.com/in"


def failures(count: int, since_seconds_ago: float) -> HealthReport:
    return HealthReport(url_key(URL), URL, False, count, store_now() - timedelta(seconds=since_seconds_ago),
                        "HTTP 500")


def test_failures_another_process_reports_after_the_disable_start_no_new_run(backend_url: str) -> None:
    engine = get_engine()
    settings = {"failing_threshold": 5, "disable_after": timedelta(seconds=2)}
    # Process A: failing for 3 s, past disable_after: failing, then disabled.
    first = record_health(engine, "d", [failures(5, 3.0)], **settings)
    assert [transition.kind for transition in first] == [FAILING, DISABLED]
    # Process B's batch sent its requests before the disable (2.5 s ago) and reports them now: the same run.
    second = record_health(engine, "d", [failures(3, 2.5)], **settings)
    assert [transition.kind for transition in second] == []
    # Failures of requests made after the disable (the endpoint enabled again, or a batch already claimed) start a
    # run of their own, disabled only a full disable_after later.
    assert record_health(engine, "d", [failures(2, 0.0)], **settings) == []
