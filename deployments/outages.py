"""The runner of the served deployments across Prefect outages.

Prefect's runner meets an outage of its API badly: on 3.4 it exits at the first refused connection; on 3.8 it
survives, then submits every scheduled run missed meanwhile at once, one process each (a 30 s outage with a 3 s
schedule: 24 processes starting together), and leaves runs it took during the outage ``Pending`` for good. So the
runner process of ``serve`` (``deployments.serve``):

- starts serving only once the Prefect API answers (``wait_for_api``), after settling what the outage left
  (``settle_missed_runs``): of the scheduled runs of each deployment already due, the newest stays and the others
  are cancelled as superseded by it; runs ``Pending`` for longer than a run takes to start are set ``Crashed``;
- stops when the API has been unreachable for ``RESTART_AFTER_SECONDS`` (``restart_when_unreachable``): ``serve``
  starts it again (``serving.restarts``), and it waits for the API as above.

The flows themselves also check at start that no later scheduled run covers them (``flows.catch_up``): that covers
outages shorter than the restart threshold and deployments run by work pools.
"""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.deployments.runner import RunnerDeployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Crashed

from prefect_webhooks.settings import get_settings
from prefect_webhooks.utilities.missed_runs import STUCK_PENDING_SECONDS, superseded_message

logger = logging.getLogger("prefect_webhooks.deployments")

RESTART_AFTER_SECONDS = 30.0
# After a stop is asked for, how long the runner may take (it tries to pause its deployments) before it is ended.
STOP_GRACE_SECONDS = 15.0


def api_answers(timeout: float = 5.0) -> bool:
    """Whether the Prefect API answers ``GET /health`` within ``timeout`` seconds (a thread: no call outlives it)."""
    answered: list[bool] = []

    def probe() -> None:
        try:
            with get_client(sync_client=True) as client:
                answered.append(client.api_healthcheck() is None)
        except Exception:
            answered.append(False)

    # The caller's context (its Prefect settings) goes with the thread.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(probe,), daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answered and answered[0])


def wait_for_api() -> None:
    """Return once the Prefect API answers, checking every ``api_probe_seconds``."""
    said = False
    while not api_answers():
        if not said:
            logger.warning("the Prefect API cannot be reached: the deployments are served once it answers")
            said = True
        time.sleep(get_settings().outage.api_probe_seconds)


def settle_missed_runs(deployments: Sequence[RunnerDeployment]) -> tuple[int, int]:
    """Before serving: keep only the newest due scheduled run of each deployment (the others are cancelled as
    superseded), and crash the runs left ``Pending`` by a runner that is gone. Returns (cancelled, crashed)."""
    now = datetime.now(timezone.utc)
    cancelled = crashed = 0
    with get_client(sync_client=True) as client:
        ids = []
        for deployment in deployments:
            try:
                ids.append(client.read_deployment_by_name(f"{deployment.flow_name}/{deployment.name}").id)
            except ObjectNotFound:
                continue  # new: nothing of it can be missed
        if not ids:
            return 0, 0
        of_these = DeploymentFilter(id=DeploymentFilterId(any_=ids))
        due = client.read_flow_runs(deployment_filter=of_these, sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                                    flow_run_filter=FlowRunFilter(
                                        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])),
                                        expected_start_time=FlowRunFilterExpectedStartTime(before_=now)), limit=200)
        newest: dict[object, object] = {}
        for run in due:  # newest first
            if run.deployment_id not in newest:
                newest[run.deployment_id] = run
                continue
            client.set_flow_run_state(run.id, Cancelled(message=superseded_message(newest[run.deployment_id])))
            cancelled += 1
        pending = client.read_flow_runs(deployment_filter=of_these, flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PENDING]))), limit=200)
        for run in pending:
            if run.state is not None and (now - run.state.timestamp).total_seconds() >= STUCK_PENDING_SECONDS:
                client.set_flow_run_state(run.id, Crashed(message=(
                    "This run crashed: it was taken by a runner that stopped while the Prefect API could not be "
                    "reached, and never started.")), force=True)
                crashed += 1
    if cancelled or crashed:
        logger.warning("runs missed while the Prefect API was unreachable: %d cancelled as superseded by a newer "
                       "one, %d that never started marked crashed", cancelled, crashed)
    return cancelled, crashed


def restart_when_unreachable(limit: float = RESTART_AFTER_SECONDS) -> threading.Thread:
    """Watch the API in a thread; once it has been unreachable for ``limit`` seconds, stop this process (``serve``
    starts it again, and it waits for the API)."""

    def watch() -> None:
        answered_at = time.monotonic()
        while True:
            time.sleep(get_settings().outage.api_probe_seconds)
            if api_answers():
                answered_at = time.monotonic()
            elif time.monotonic() - answered_at >= limit:
                break
        logger.warning("the Prefect API has not answered for %.0f s: the runner stops, and serves again once it "
                       "answers (the runs missed meanwhile run once)", limit)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(STOP_GRACE_SECONDS)
        os._exit(75)  # the runner is still trying to reach the API to stop: nothing of ours is left to finish

    thread = threading.Thread(target=watch, name="prefect-api-watch", daemon=True)
    thread.start()
    return thread
