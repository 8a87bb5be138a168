"""Deletion runs on demand: under ``prefect-webhooks serve``, ``deletions/interval`` runs when a request waits.

A run of the deletions flow every minute mostly finds nothing to do, and each one is a flow run in the Prefect UI
and a process started by the runner. So ``serve`` has its runner serve ``deletions/interval`` without its schedule
(``build_deployments(deletions_on_demand=True)``), and its first delivery worker starts the runs: every interval of
that deployment's schedule in the deployments file (60 s) it asks the store whether a request waits (one probe of
the requests' state index, whatever the history) and, when one does and no run of the deployment is already
scheduled, pending or running, creates a run, which the runner executes. A quiet minute costs one query and no
flow run; a request waits at most an interval plus the run's start, as it did with the schedule.

While the Prefect API cannot be reached no run can start; the first check after its return starts one run for
everything that waited. ``prefect deployment run deletions/interval`` still runs it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from uuid import UUID

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType

from prefect_webhooks.blocks.api_status import PrefectApi
from prefect_webhooks.deletions import has_pending_requests
from prefect_webhooks.deployments.serve import DELETIONS_DEPLOYMENT

logger = logging.getLogger("prefect_webhooks.serving.delivery_worker")

# The first check comes this soon after the start (a request may have waited while serve was stopped).
FIRST_CHECK_AFTER_AT_MOST = 10.0
_UNFINISHED = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]


async def start_deletion_run_if_requested(client: PrefectClient, api: PrefectApi) -> UUID | None:
    """Start a run of ``deletions/interval`` when a deletion request waits and no run of it is unfinished.

    Returns:
        The started run's id, or None when none was needed or the Prefect API cannot be reached.
    """
    if not api.reachable or not await asyncio.to_thread(has_pending_requests):
        return None
    deployment = await api.call(lambda: client.read_deployment_by_name(f"deletions/{DELETIONS_DEPLOYMENT}"))
    unfinished = await api.call(lambda: client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=_UNFINISHED))),
        limit=1))
    if unfinished:
        return None
    run = await api.call(lambda: client.create_flow_run_from_deployment(deployment.id))
    logger.info("a deletion request waits: started deletions run %s", run.name)
    return run.id


async def start_deletion_runs(client: PrefectClient, api: PrefectApi, interval: float, stop: asyncio.Event) -> None:
    """Check every ``interval`` seconds until ``stop`` is set; a failed check is logged and the next one tries."""
    wait = min(interval, FIRST_CHECK_AFTER_AT_MOST)
    while True:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
        if stop.is_set():
            return
        wait = interval
        try:
            await start_deletion_run_if_requested(client, api)
        except Exception as exc:
            logger.warning("checking for deletion requests failed (%s: %s); the next check tries again",
                           type(exc).__name__, exc)
