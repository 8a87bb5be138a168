"""Scheduled runs missed while Prefect was down run once afterwards, not once per missed slot.

The missed runs are made by Prefect's own scheduling code (``schedule_runs``, what its scheduler service calls) on
the session's test server, with times in the past, then executed oldest first as a runner does after an outage.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.schedules import IntervalSchedule
from prefect.client.schemas.sorting import FlowRunSort
from prefect.flow_engine import run_flow

from prefect_webhooks.flows.deletions import deletions


async def written_beside_the_server(write: Any) -> None:
    """Run ``write(session)`` in a transaction on the test server's database, tried again while the server holds its
    SQLite write lock a moment ("database is locked", seen under two busy workers)."""
    from prefect.server.database import provide_database_interface
    from sqlalchemy.exc import OperationalError

    for attempt in range(20):
        try:
            async with provide_database_interface().session_context(begin_transaction=True) as session:
                await write(session)
            return
        except OperationalError:
            if attempt == 19:
                raise
            await asyncio.sleep(0.5)


async def missed_runs(deployment_id: UUID, slots: int, every: float) -> None:
    """Prefect's scheduler, as it would have run before an outage: ``slots`` runs whose time has passed."""
    from prefect.server.models.deployments import schedule_runs

    now = datetime.now(timezone.utc)

    async def schedule(session: Any) -> None:
        await schedule_runs(session=session, deployment_id=deployment_id,
                            start_time=now - timedelta(seconds=slots * every), end_time=now,
                            min_time=timedelta(seconds=slots * every - 1), min_runs=slots, max_runs=slots)

    await written_beside_the_server(schedule)


async def taken_long_ago(flow_run_id: UUID) -> None:
    """Set the run ``Pending`` five minutes ago (the API stamps states with the server's time; the model does not)."""
    from prefect.server.models.flow_runs import set_flow_run_state
    from prefect.server.schemas.states import State, StateType

    taken_at = datetime.now(timezone.utc) - timedelta(minutes=5)
    state = State(type=StateType.PENDING, name="Submitting", timestamp=taken_at)

    async def take(session: Any) -> None:
        await set_flow_run_state(session=session, flow_run_id=flow_run_id, state=state, force=True)

    await written_beside_the_server(take)


def runs_of(deployment_id: UUID) -> list[Any]:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                                     sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=50)


def every_ten_seconds(name: str) -> UUID:
    """A deployment of ``deletions`` scheduled every 10 s since an hour ago."""
    anchor = datetime.now(timezone.utc) - timedelta(hours=1)
    schedule = DeploymentScheduleCreate(schedule=IntervalSchedule(interval=timedelta(seconds=10), anchor_date=anchor))
    return deletions.to_deployment(name=name, schedules=[schedule]).apply()


@pytest.mark.timeout(180)
def test_the_newest_missed_run_goes_ahead_and_the_others_end_cancelled(prefect_harness: None, store_url: str) -> None:
    deployment_id = every_ten_seconds("catch-up")
    asyncio.run(missed_runs(deployment_id, slots=4, every=10))
    missed = runs_of(deployment_id)
    assert len(missed) == 4 and all(run.auto_scheduled for run in missed)
    # One of them was taken by a runner as the outage began and left Pending (it never started).
    asyncio.run(taken_long_ago(missed[1].id))
    for run in (missed[0], missed[2], missed[3]):  # oldest first, as a runner submits them
        run_flow(deletions, flow_run=run, return_type="state")
    states = {run.id: run.state for run in runs_of(deployment_id)}
    assert [states[run.id].type.value for run in missed] == ["CANCELLED", "CANCELLED", "CANCELLED", "COMPLETED"]
    assert all("Superseded" in (states[run.id].message or "") for run in missed[:3])


def test_a_run_started_by_hand_always_goes_ahead(prefect_harness: None, store_url: str) -> None:
    deployment_id = every_ten_seconds("catch-up-manual")
    asyncio.run(missed_runs(deployment_id, slots=2, every=10))
    with get_client(sync_client=True) as client:
        manual = client.create_flow_run_from_deployment(deployment_id)
    state = run_flow(deletions, flow_run=manual, return_type="state")
    assert state.is_completed()
    # It touched no scheduled run either.
    assert sorted(run.state.type.value for run in runs_of(deployment_id) if run.auto_scheduled) == ["SCHEDULED"] * 2


def test_a_run_taken_before_the_next_slot_fell_due_goes_ahead(prefect_harness: None, store_url: str) -> None:
    # A schedule shorter than a run's start: the next slot falls due while this run starts. It still runs (else
    # every run would give way to the next and none would run).
    deployment_id = every_ten_seconds("catch-up-slow-start")
    asyncio.run(missed_runs(deployment_id, slots=2, every=10))
    earlier, _later = runs_of(deployment_id)
    asyncio.run(taken_long_ago(earlier.id))
    state = run_flow(deletions, flow_run=earlier, return_type="state")
    assert state.is_completed()
    assert runs_of(deployment_id)[1].state.is_scheduled()
