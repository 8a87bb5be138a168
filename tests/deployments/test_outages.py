"""The runner of ``serve`` starts after an outage with one due run per deployment and none left Pending."""

from __future__ import annotations

import asyncio
import time

from prefect.settings import PREFECT_API_URL, temporary_settings

from prefect_webhooks.deployments.outages import api_answers, settle_missed_runs
from prefect_webhooks.flows.deletions import deletions
from tests.flows.test_catch_up import every_ten_seconds, missed_runs, runs_of, taken_long_ago
from tests.servers import free_port


def test_before_serving_the_newest_due_run_stays_and_the_rest_are_settled(prefect_harness: None) -> None:
    deployment_id = every_ten_seconds("settle-before-serving")
    asyncio.run(missed_runs(deployment_id, slots=5, every=10))
    missed = runs_of(deployment_id)
    asyncio.run(taken_long_ago(missed[0].id))  # a runner that is gone took it
    deployment = deletions.to_deployment(name="settle-before-serving")
    assert settle_missed_runs([deployment]) == (3, 1)
    states = [run.state.name for run in runs_of(deployment_id)]
    assert states == ["Crashed", "Cancelled", "Cancelled", "Cancelled", "Scheduled"]
    # A deployment not saved yet has nothing to settle.
    assert settle_missed_runs([deletions.to_deployment(name="never-saved")]) == (0, 0)


def test_an_unreachable_api_is_told_within_the_probe_timeout(prefect_harness: None) -> None:
    assert api_answers()
    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        started = time.monotonic()
        assert not api_answers(timeout=2)
        assert time.monotonic() - started < 2.5
