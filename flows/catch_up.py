"""Scheduled runs missed while Prefect (or every worker) was down run once afterwards, not once per missed slot.

Prefect's scheduler creates a deployment's runs ahead of time; those whose time passed during an outage are all due
at once when it ends, and Prefect runs each of them (3.8; on 3.4 the runner of ``prefect.serve`` exits instead, and
``prefect-webhooks serve`` restarts it). Every flow of this package is idempotent over its inputs (the deletions
process what is pending, an audience sync diffs the newest snapshot), so one run covers every missed slot:

- a scheduled run of ``deletions`` or ``audience-sync`` first asks ``later_due_run``: if a later scheduled run of
  the same deployment is already due and not finished, this one ends ``Cancelled`` as superseded by it, and the
  newest runs (``superseded``); that one cancels the earlier runs that never started (a runner may have taken one
  during the outage and left it ``Pending``);
- the delivery worker takes only the newest of the ``deliver/continuous`` runs due at once (``run_newest_only``)
  and cancels the others.

Runs started by hand (not auto-scheduled) always run.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.context import FlowRunContext
from prefect.states import Cancelled, State

from prefect_webhooks.utilities.missed_runs import STUCK_PENDING_SECONDS, superseded_message

logger = logging.getLogger("prefect_webhooks.catch_up")

_NOT_FINISHED = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]


def _scheduled_run() -> FlowRun | None:
    """The current flow run when it is an auto-scheduled run of a deployment."""
    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    if flow_run is None or flow_run.deployment_id is None or not flow_run.auto_scheduled:
        return None
    return flow_run


def _slot(run: FlowRun) -> datetime:
    return run.expected_start_time or run.created


def _runs_of_deployment(flow_run: FlowRun, states: list[StateType], after: datetime | None,
                        before: datetime) -> list[FlowRun]:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[flow_run.deployment_id])),
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(not_any_=[flow_run.id]),
                expected_start_time=FlowRunFilterExpectedStartTime(after_=after, before_=before),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states))),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=200)


def _taken_at(client: Any, flow_run: FlowRun) -> datetime:
    """When a runner or worker took the run (its last ``Pending`` state); now when that cannot be told."""
    pending = [state.timestamp for state in client.read_flow_run_states(flow_run.id) if state.is_pending()]
    return max(pending) if pending else datetime.now(timezone.utc)


def later_due_run() -> FlowRun | None:
    """In an auto-scheduled deployment run: a later scheduled run of the same deployment, not finished, that was
    already due when this run was taken (taken together after an outage: it covers this run's slot); None otherwise,
    also when Prefect cannot be asked.

    A later run that fell due only after this one was taken (a schedule shorter than a run's start) does not count:
    each run would otherwise give way to the next one and none would run.
    """
    flow_run = _scheduled_run()
    if flow_run is None:
        return None
    try:
        with get_client(sync_client=True) as client:
            taken_at = _taken_at(client, flow_run)
        later = _runs_of_deployment(flow_run, _NOT_FINISHED, _slot(flow_run), taken_at)
    except Exception as exc:
        logger.warning("could not check for a later due run (%s): this run goes ahead", type(exc).__name__)
        return None
    later = [run for run in later if _slot(run) > _slot(flow_run)]
    return later[0] if later else None


def cancel_earlier_runs() -> int:
    """In the auto-scheduled run that goes ahead: cancel the earlier runs of its deployment that never started —
    still scheduled, or taken (``Pending``) during an outage and left there for ``STUCK_PENDING_SECONDS`` — as
    superseded by it. Returns how many."""
    flow_run = _scheduled_run()
    if flow_run is None:
        return 0
    now = datetime.now(timezone.utc)
    cancelled = 0
    try:
        earlier = _runs_of_deployment(flow_run, [StateType.SCHEDULED, StateType.PENDING], None, _slot(flow_run))
        with get_client(sync_client=True) as client:
            for run in earlier:
                if _slot(run) >= _slot(flow_run) or run.state is None:
                    continue
                if run.state.is_pending() and (now - run.state.timestamp).total_seconds() < STUCK_PENDING_SECONDS:
                    continue  # being started right now
                client.set_flow_run_state(run.id, Cancelled(message=superseded_message(flow_run)),
                                          force=run.state.is_pending())
                cancelled += 1
    except Exception as exc:
        logger.warning("could not cancel the earlier runs this one covers (%s)", type(exc).__name__)
    return cancelled


def superseded() -> State[Any] | None:
    """``Cancelled`` (to return from the flow) when a later due run covers this one; None when it goes ahead, after
    cancelling the earlier runs it covers."""
    newer = later_due_run()
    if newer is None:
        cancel_earlier_runs()
        return None
    return Cancelled(message=superseded_message(newer))


async def run_newest_only(client: PrefectClient, due: list[FlowRun]) -> list[FlowRun]:
    """Of scheduled runs of one deployment due at once, the newest (in a list); the others are cancelled."""
    if len(due) <= 1:
        return due
    ordered = sorted(due, key=lambda run: run.expected_start_time or run.created)
    newest = ordered[-1]
    for run in ordered[:-1]:
        # Not forced: a run another worker took meanwhile is left to it.
        await client.set_flow_run_state(run.id, Cancelled(message=superseded_message(newest)))
    logger.info("%d scheduled run(s) missed meanwhile cancelled as superseded by %s", len(ordered) - 1, newest.name)
    return [newest]
