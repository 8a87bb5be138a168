"""What a delivery worker could not record in Prefect while its API was down, recorded when it answers again.

- An **offline shift** (delivery without a flow run) becomes a run of ``deliver/continuous`` created ``Completed``,
  named ``offline-…``, whose state message says what it delivered, from when to when, and that its batches have no
  task runs; it gets the per-endpoint artifacts a run has.
- A **run that could not report its end** (or never started: created or taken just as the API went away) is set to
  its final state: ``Crashed`` with the reason when Prefect still shows it unfinished; its artifacts are published.
- Runs of the served deployments that Prefect's runner took but could not start during the outage stay ``Pending``
  for good; ``STUCK_PENDING_SECONDS`` after the API's return they are set ``Crashed`` (their slots are covered by
  the next scheduled runs). Runs of work-pool deployments are left to their workers (infrastructure may take time).
- What is still unrecorded when the worker stops is logged (counts and run ids), never silently dropped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import StateType
from prefect.states import Completed, Crashed

from prefect_webhooks.blocks.api_status import PrefectApi, PrefectApiUnavailable
from prefect_webhooks.delivery import DeliveryStats
from prefect_webhooks.deployments.serve import DELIVER_DEPLOYMENT, TAGS
from prefect_webhooks.flows.catch_up import STUCK_PENDING_SECONDS
from prefect_webhooks.flows.deliver import publish_artifacts

logger = logging.getLogger("prefect_webhooks.serving.delivery_worker")

TAG = TAGS[0]

# Recording is not on the path of a message: it may take its time, one Prefect call after another.
RECORD_WAIT_SECONDS = 30.0


@dataclass
class OfflineShift:
    """What an offline shift did."""

    stats: DeliveryStats
    started_at: float
    ended_at: float

    def message(self) -> str:
        """The recorded run's state message."""
        summary = self.stats.summary()
        return (f"Delivered {summary['delivered']} message(s) in {summary['batches']} batch(es) from "
                f"{_utc(self.started_at)} to {_utc(self.ended_at)} while the Prefect API could not be reached "
                f"(failed {summary['failed']}, rescheduled {summary['rescheduled']}, filtered {summary['filtered']}). "
                "Recorded after the fact; its batches ran without task runs.")


@dataclass
class Unsettled:
    """A run whose end Prefect may not know."""

    reason: str
    stats: DeliveryStats | None = None
    """Its artifacts, when they could not be published."""


@dataclass
class RunRecords:
    """The worker's ledger of what waits for the Prefect API."""

    api: PrefectApi
    parameters: dict[str, Any] = field(default_factory=dict)
    offline: list[OfflineShift] = field(default_factory=list)
    unsettled: dict[UUID, Unsettled] = field(default_factory=dict)
    swept_outages: int = 0
    sweeps: set[asyncio.Task[None]] = field(default_factory=set)

    def offline_shift_ended(self, stats: DeliveryStats | None, started_at: float, ended_at: float) -> None:
        """Keep an ended offline shift's record (one that claimed nothing is not worth a run)."""
        if stats is not None and stats.batches:
            self.offline.append(OfflineShift(stats, started_at, ended_at))

    def run_ended(self, flow_run_id: UUID, state: Any, unrecorded: DeliveryStats | None) -> None:
        """Note how a run's execution ended: without a final state reported, or with artifacts unpublished."""
        if state is None or not getattr(state, "is_final", lambda: False)():
            self.unsettled[flow_run_id] = Unsettled(
                "its end could not be reported: the Prefect API could not be reached", unrecorded)
        elif unrecorded is not None:
            self.unsettled[flow_run_id] = Unsettled("", unrecorded)

    def never_started(self, flow_run_id: UUID) -> None:
        """A run created or taken that did not start delivering (its start could not be reported)."""
        self.unsettled.setdefault(flow_run_id, Unsettled(
            "it did not start: the Prefect API could not be reached; another run delivered in its place"))

    @property
    def waiting(self) -> bool:
        """Whether anything waits to be recorded."""
        return bool(self.offline or self.unsettled)

    async def settle(self, client: PrefectClient, deployment_id: UUID | None) -> None:
        """Record what waits, one item at a time; an item that fails stays for the next return of the API."""
        if deployment_id is None:
            return
        for record in list(self.offline):
            if not await self._record(lambda item=record: self._record_offline(client, deployment_id, item)):
                return
            self.offline.remove(record)
        for flow_run_id, note in list(self.unsettled.items()):
            if not await self._record(lambda run=flow_run_id, item=note: self._settle_run(client, run, item)):
                return
            del self.unsettled[flow_run_id]

    async def _record(self, make: Callable[[], Awaitable[None]]) -> bool:
        """Record one item; False when the API went away again (the item stays). An item Prefect refuses is
        logged and dropped: it would be refused again."""
        try:
            await self.api.call(make, wait=RECORD_WAIT_SECONDS)
        except PrefectApiUnavailable:
            return False
        except Exception as exc:
            logger.warning("could not record what waited for the Prefect API: %s: %s", type(exc).__name__, exc)
        return True

    async def _record_offline(self, client: PrefectClient, deployment_id: UUID, record: OfflineShift) -> None:
        started = datetime.fromtimestamp(record.started_at, timezone.utc)
        name = f"offline-{socket.gethostname()[:30]}-{started:%Y%m%dT%H%M%S}"
        flow_run = await client.create_flow_run_from_deployment(
            deployment_id, parameters=self.parameters, name=name, tags=["offline"],
            state=Completed(message=record.message()))
        await publish_artifacts(record.stats, flow_run.id)
        logger.info("recorded the offline delivery of %s as run %s of deliver/%s", _span(record), flow_run.name,
                    DELIVER_DEPLOYMENT)

    async def _settle_run(self, client: PrefectClient, flow_run_id: UUID, note: Unsettled) -> None:
        flow_run = await client.read_flow_run(flow_run_id)
        if note.reason and not (flow_run.state and flow_run.state.is_final()):
            await client.set_flow_run_state(flow_run_id, Crashed(message=f"This run crashed: {note.reason}."),
                                            force=True)
            logger.info("deliver run %s marked Crashed: %s", flow_run.name, note.reason)
        if note.stats is not None:
            await publish_artifacts(note.stats, flow_run_id)

    def sweep_after_outage(self, client: PrefectClient) -> None:
        """After each outage, once runs taken during it have had time to start, crash those that never will."""
        if self.api.outages == self.swept_outages:
            return
        self.swept_outages = self.api.outages

        async def sweep() -> None:
            await asyncio.sleep(STUCK_PENDING_SECONDS)
            await self._record(lambda: self.crash_stuck_runs(client))

        task = asyncio.ensure_future(sweep())
        self.sweeps.add(task)
        task.add_done_callback(self.sweeps.discard)

    def cancel_sweeps(self) -> None:
        """The worker stops: no sweep after it."""
        for task in self.sweeps:
            task.cancel()

    async def crash_stuck_runs(self, client: PrefectClient) -> None:
        """Set ``Crashed`` the served runs of this package (tag ``prefect-webhooks``, no work pool) that have been
        ``Pending`` for ``STUCK_PENDING_SECONDS``."""
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=STUCK_PENDING_SECONDS)
        pending = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PENDING])),
            tags=FlowRunFilterTags(all_=[TAG])), limit=200)
        stuck = [run for run in pending if run.work_pool_name is None and run.state is not None
                 and run.state.timestamp < cutoff]
        for run in stuck:
            await client.set_flow_run_state(run.id, Crashed(message=(
                "This run crashed: it was taken while the Prefect API could not be reached and never started; the "
                "next scheduled run covers its slot.")), force=True)
            logger.info("run %s (Pending since the Prefect outage) marked Crashed", run.name)

    def log_unrecorded(self) -> None:
        """At exit: say what could not be recorded in Prefect (the store holds every delivery either way)."""
        for record in self.offline:
            logger.warning("not recorded in Prefect (its API could not be reached): %s", record.message())
        if self.unsettled:
            logger.warning("not recorded in Prefect (its API could not be reached): the end of deliver run(s) %s",
                           ", ".join(str(run_id) for run_id in self.unsettled))


def _utc(at: float) -> str:
    return f"{datetime.fromtimestamp(at, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def _span(record: OfflineShift) -> str:
    return f"{_utc(record.started_at)} to {_utc(record.ended_at)}"
