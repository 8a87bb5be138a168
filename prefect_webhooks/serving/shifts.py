"""A delivery worker's shifts: runs of ``deliver/continuous``, or the same claim loop without a flow run.

A shift is normally a flow run of the deployment (``start_flow_run_shift``): the UI shows it with its task runs and
artifacts. When no flow run can be started — the worker started while the Prefect API was down, or its current run
ended during an outage — the worker runs an **offline shift** (``start_offline_shift``): the same claim loop with
the deployment's parameters, in plain tries (no task runs: those would need a flow run), until a flow run can start
and takes over by the usual handover. What it did is recorded in Prefect when the API answers again
(``serving.run_records``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any
from uuid import UUID

from prefect.flow_engine import run_flow

from prefect_webhooks.blocks.api_status import PrefectApi
from prefect_webhooks.delivery import DeliveryOptions, DeliveryStats, Sender, Shift, current_shift, deliver_due
from prefect_webhooks.delivery.sending.destinations import DestinationCache
from prefect_webhooks.deployments.serve import DELIVER_DEPLOYMENT, schedule_interval
from prefect_webhooks.flows.deliver import deliver

logger = logging.getLogger("prefect_webhooks.serving.delivery_worker")


def shift_seconds(definition: dict[str, Any]) -> float:
    """How long a shift lasts before the worker starts the next run: the schedule's interval; without an interval
    schedule, four fifths of the run's ``run_for_seconds``."""
    interval = schedule_interval(definition)
    if interval is not None:
        return interval
    run_for = (definition.get("parameters") or {}).get("run_for_seconds")
    if not run_for:
        raise ValueError(f"deliver/{DELIVER_DEPLOYMENT} needs an interval schedule or run_for_seconds to run in a "
                         "delivery worker (a run without run_for_seconds stops once nothing is due)")
    return float(run_for) * 0.8


@dataclass(eq=False)
class RunningShift:
    """A shift and the task executing it."""

    shift: Shift
    task: asyncio.Task[Any]
    flow_run_id: UUID | None
    """The flow run it executes; None for an offline shift."""
    started_at: float
    """Unix time."""

    @property
    def offline(self) -> bool:
        """Whether it runs without a flow run."""
        return self.flow_run_id is None

    def goes_on_quietly(self, quiet_run_seconds: float, now: float) -> bool:
        """Whether this shift, due to hand over, goes on instead: a run that has claimed nothing since it started,
        for less than ``quiet_run_seconds`` (``now`` is a Unix time). A quiet service thus adds one run per that
        period to the Prefect UI, not one per interval; an offline shift hands over as soon as a run can start."""
        return (not self.offline and self.shift.batches_claimed == 0
                and now - self.started_at < quiet_run_seconds)


def start_flow_run_shift(sender: Sender, destinations: DestinationCache, flow_run: Any) -> RunningShift:
    """Execute ``flow_run`` (a run of ``deliver/continuous``) as a shift of this process."""
    shift = Shift(sender, destinations)

    async def execute() -> Any:
        current_shift.set(shift)  # this task's own context: the flow and its batches see the shift
        try:
            return await run_flow(deliver, flow_run=flow_run, return_type="state")
        except Exception as exc:
            logger.error("deliver run %s ended with %s: %s", flow_run.id, type(exc).__name__, exc)
            return None

    return RunningShift(shift, asyncio.ensure_future(execute()), flow_run.id, time.time())


def offline_options(parameters: Mapping[str, Any]) -> DeliveryOptions:
    """The deployment's parameters as a claim loop's options, in plain tries (no flow run to hold task runs)."""
    known = {field.name for field in fields(DeliveryOptions)} - {"prefect_tasks", "run_for_seconds", "until_empty"}
    # A worker ends its shifts by handover; the loop keeps claiming until then.
    return DeliveryOptions(**{name: value for name, value in parameters.items() if name in known},
                           run_for_seconds=float("inf"), prefect_tasks=False)


def start_offline_shift(sender: Sender, destinations: DestinationCache, options: DeliveryOptions) -> RunningShift:
    """Run the claim loop as a shift without a flow run; its task returns the ``DeliveryStats``."""
    shift = Shift(sender, destinations)

    async def execute() -> DeliveryStats | None:
        current_shift.set(shift)
        try:
            return await deliver_due(options)
        except Exception as exc:
            logger.error("offline delivery ended with %s: %s", type(exc).__name__, exc)
            return None

    return RunningShift(shift, asyncio.ensure_future(execute()), None, time.time())


async def end_shifts(shifts: list[RunningShift], api: PrefectApi, grace: float) -> None:
    """Stop every shift claiming and wait up to ``grace`` seconds for them to finish their batches and complete.

    While the Prefect API is down a run whose flow has returned only waits to report its end: it is not waited
    for (the run records keep it for the API's return).
    """
    for running in shifts:
        running.shift.handed_over.set()
    deadline = time.monotonic() + grace
    pending = {running.task: running for running in shifts}
    while pending and time.monotonic() < deadline:
        done, _ = await asyncio.wait(pending, timeout=0.2)
        for task in done:
            del pending[task]
        for task, running in list(pending.items()):
            if not api.reachable and running.shift.unrecorded is not None:
                task.cancel()
                del pending[task]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5)
