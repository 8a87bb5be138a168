"""Deletion runs on demand: a run of ``deletions/interval`` only when a request waits, one at a time."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect_webhooks.blocks.api_status import PrefectApi
from prefect_webhooks.deletions import has_pending_requests, request_deletion
from prefect_webhooks.deployments.serve import (
    DELETIONS_DEPLOYMENT,
    DELETIONS_ON_DEMAND,
    build_deployments,
)
from prefect_webhooks.serving.deletion_runs import start_deletion_run_if_requested


def served_deletions(**options: bool) -> Any:
    """``deletions/interval`` as serve's runner builds it."""
    return next(d for d in build_deployments(**options) if d.name == DELETIONS_DEPLOYMENT)


def test_a_run_starts_only_while_a_request_waits_and_none_is_unfinished(prefect_harness: None,
                                                                         store_url: str) -> None:
    from prefect.client.orchestration import get_client

    deployment_id = served_deletions(deletions_on_demand=True).apply()

    async def check() -> Any:
        async with get_client() as client:
            return await start_deletion_run_if_requested(client, PrefectApi())

    async def runs() -> list[Any]:
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        async with get_client() as client:
            return await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[
                deployment_id])))

    async def deployment() -> Any:
        async with get_client() as client:
            return await client.read_deployment(deployment_id)

    # Registered as serve registers it: no schedule, and the UI says who starts the runs.
    registered = asyncio.run(deployment())
    assert registered.schedules == [] and DELETIONS_ON_DEMAND in (registered.description or "")
    # Quiet: no request, no run.
    assert not has_pending_requests()
    assert asyncio.run(check()) is None
    assert asyncio.run(runs()) == []
    # A request waits: one run, for serve's runner to execute; a second check leaves it at one.
    request_deletion("user-to-forget")
    started = asyncio.run(check())
    assert started is not None
    assert asyncio.run(check()) is None
    (run,) = asyncio.run(runs())
    assert run.id == started and run.state.is_scheduled()
    assert "prefect-webhooks" in run.tags


def test_serve_serves_deletions_without_their_schedule_only_when_its_workers_start_the_runs(
        store_url: str) -> None:
    assert served_deletions(deletions_on_demand=True).schedules in (None, [])
    assert served_deletions().schedules[0].schedule.interval.total_seconds() == 60
