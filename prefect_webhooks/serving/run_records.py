"""What a delivery worker could not record in Prefect while its API was down, recorded when it answers again.

- An **offline shift** (delivery without a flow run) becomes a run of ``deliver/continuous`` created ``Completed``,
  named ``offline-…``, whose state message says what it delivered, from when to when, and that its batches have no
  task runs; it gets the per-endpoint artifacts a run has.
- A **run that could not report its end** gets its final state when Prefect still shows it unfinished:
  ``Completed`` with its counts when its flow returned (only the report waited), ``Crashed`` with the reason when it
  never started (created or taken just as the API went away) or was cut short; its artifacts are published.
- Runs of the served deployments that Prefect's runner took but could not start during the outage stay ``Pending``
  for good: ``SWEEP_MARGIN_SECONDS`` after the API's return (time enough for a run being started then to report itself
  running, through its client's retries) the worker notes which are ``Pending``, and those still in that same state
  ``PREFECT_WEBHOOKS_STUCK_RUN_SECONDS`` (30 s) later are set ``Crashed``; the next scheduled runs cover their slots.
  Watched on this host's monotonic clock, never dated: the hosts' wall clocks may disagree. Runs of work-pool
  deployments are left to their workers.

The ledger is kept in ``<home>/local-copy/run-records.json`` (run ids, counts, the artifacts' rows: no secret), so
what a worker stopped during an outage could not record is recorded by the next worker of the host (``serve``
restarted) once Prefect answers; a worker takes an entry out of the file before recording it. What is still
unrecorded when the last worker stops is logged, never silently dropped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

from prefect.artifacts import TableArtifact
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterName,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.states import Completed, Crashed

from prefect_webhooks.blocks.api_status import PrefectApi, PrefectApiUnavailable
from prefect_webhooks.blocks.local_copy import LocalCopy
from prefect_webhooks.delivery import DeliveryStats
from prefect_webhooks.delivery.endpoints.stats import summary_in_words
from prefect_webhooks.deployments.serve import DELIVER_DEPLOYMENT, TAGS
from prefect_webhooks.flows.deliver import publish_artifacts, run_artifacts

logger = logging.getLogger("prefect_webhooks.serving.delivery_worker")

# Recording is not on the path of a message: it may take its time, one Prefect call after another.
RECORD_WAIT_SECONDS = 30.0
# The sweep after an outage comes this long after a run taken at the return would count as stuck.
SWEEP_MARGIN_SECONDS = 15.0
_ARTIFACT_FIELDS = {"key", "description", "table"}


def _utc(at: float) -> str:
    return f"{datetime.fromtimestamp(at, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def _rows(stats: DeliveryStats | None) -> list[dict[str, Any]] | None:
    """A run's artifacts as plain data (what the ledger file keeps)."""
    if stats is None:
        return None
    return [artifact.model_dump(include=_ARTIFACT_FIELDS) for artifact in run_artifacts(stats)]


def offline_message(entry: dict[str, Any]) -> str:
    """The state message of the run recording an offline shift."""
    summary = entry["summary"]
    return (f"Delivered {summary['delivered']} message(s) in {summary['batches']} batch(es) from "
            f"{_utc(entry['started_at'])} to {_utc(entry['ended_at'])} while the Prefect API could not be reached "
            f"(failed {summary['failed']}, rescheduled {summary['rescheduled']}, filtered {summary['filtered']}). "
            "Recorded after the fact; its batches ran without task runs.")


@dataclass
class RunRecords:
    """The worker's ledger of what waits for the Prefect API (kept in memory and in the ledger file)."""

    api: PrefectApi
    parameters: dict[str, Any] = field(default_factory=dict)
    ledger: LocalCopy = field(default_factory=lambda: LocalCopy("run-records"))
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    stuck_run_seconds: float = 30.0
    """How long a served run may stay Pending after an outage before it is marked Crashed."""
    swept_outages: int = 0
    sweeps: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        # What an earlier worker of this host left (serve restarted during an outage).
        self.entries.update(self.ledger.read())

    def _keep(self, key: str, entry: dict[str, Any]) -> None:
        self.entries[key] = entry
        self.ledger.update({key: entry})

    def offline_shift_ended(self, stats: DeliveryStats | None, started_at: float, ended_at: float) -> None:
        """Keep an ended offline shift's record (one that claimed nothing is not worth a run)."""
        if stats is not None and stats.batches:
            self._keep(f"offline:{started_at:.6f}", {"started_at": started_at, "ended_at": ended_at,
                                                     "summary": stats.summary(), "artifacts": _rows(stats)})

    def run_ended(self, flow_run_id: UUID, state: Any, unrecorded: DeliveryStats | None) -> None:
        """Note how a run's execution ended: without a final state reported, or with artifacts unpublished."""
        final = state is not None and getattr(state, "is_final", lambda: False)()
        if not final or unrecorded is not None:
            reason = "" if final else "its end could not be reported: the Prefect API could not be reached"
            self._keep(f"run:{flow_run_id}", {"reason": reason, "artifacts": _rows(unrecorded),
                                              "summary": unrecorded.summary() if unrecorded else None})

    def never_started(self, flow_run_id: UUID) -> None:
        """A run created or taken that did not start delivering (its start could not be reported)."""
        if f"run:{flow_run_id}" not in self.entries:
            self._keep(f"run:{flow_run_id}", {"reason": "it did not start: the Prefect API could not be reached; "
                                                        "another run delivered in its place", "artifacts": None,
                                              "summary": None})

    @property
    def waiting(self) -> bool:
        """Whether anything waits to be recorded."""
        return bool(self.entries)

    async def settle(self, client: PrefectClient, deployment_id: UUID | None) -> None:
        """Record what waits, one entry at a time; an entry the API could not take stays for its next return."""
        if deployment_id is None:
            return
        for key in sorted(self.entries):
            entry = self.entries.pop(key)
            if self.ledger.enabled and self.ledger.take(key) is None:
                continue  # another worker of this host took it
            kind, _, ident = key.partition(":")
            if kind == "offline":
                record = self._record_offline(client, deployment_id, entry)
            else:
                record = self._settle_run(client, UUID(ident), entry)
            try:
                recorded = await self._record(lambda made=record: made)
            except asyncio.CancelledError:
                self._keep(key, entry)  # the worker stops mid-record: kept for the next start to record
                raise
            if not recorded:
                self._keep(key, entry)
                return

    async def _record(self, make: Callable[[], Awaitable[None]]) -> bool:
        """Record one item; False when the API went away again. An item Prefect refuses is logged and dropped:
        it would be refused again."""
        try:
            await self.api.call(make, wait=RECORD_WAIT_SECONDS)
        except PrefectApiUnavailable:
            return False
        except Exception as exc:
            logger.warning("could not record what waited for the Prefect API: %s: %s", type(exc).__name__, exc)
        return True

    async def _record_offline(self, client: PrefectClient, deployment_id: UUID, entry: dict[str, Any]) -> None:
        started = datetime.fromtimestamp(entry["started_at"], timezone.utc)
        name = f"offline-{socket.gethostname()[:30]}-{started:%Y%m%dT%H%M%S}"
        # A record cut off between the run and its artifacts is taken up again: the run is found by its name,
        # not made twice.
        made = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])),
                                           limit=1)
        flow_run = made[0] if made else await client.create_flow_run_from_deployment(
            deployment_id, parameters=self.parameters, tags=["offline"], name=name,
            state=Completed(message=offline_message(entry)))
        await publish_artifacts([TableArtifact(**row) for row in entry["artifacts"] or []], flow_run.id)
        logger.info("recorded the delivery of %s to %s without Prefect as run %s of deliver/%s",
                    _utc(entry["started_at"]), _utc(entry["ended_at"]), flow_run.name, DELIVER_DEPLOYMENT)

    async def _settle_run(self, client: PrefectClient, flow_run_id: UUID, entry: dict[str, Any]) -> None:
        flow_run = await client.read_flow_run(flow_run_id)
        if entry["reason"] and not (flow_run.state and flow_run.state.is_final()):
            summary = entry.get("summary")
            # A run whose flow returned (its batches done) completed; only its report waited for the API.
            state = (Completed(message=f"deliver: {summary_in_words(summary)} (reported after the Prefect API came "
                               "back)") if summary
                     else Crashed(message=f"This run crashed: {entry['reason']}."))
            await client.set_flow_run_state(flow_run_id, state, force=True)
            logger.info("deliver run %s set %s: %s", flow_run.name, state.name, entry["reason"])
        if entry["artifacts"]:
            await publish_artifacts([TableArtifact(**row) for row in entry["artifacts"]], flow_run_id)

    def sweep_after_outage(self, client: PrefectClient) -> None:
        """After each outage, once runs taken during it have had time to start, crash those that never will."""
        if self.api.outages == self.swept_outages:
            return
        self.swept_outages = self.api.outages

        async def sweep() -> None:
            # Runs taken during the outage, and just after the return by a runner that lived through it (serve
            # replaces that runner within seconds: serving.api_watch), have been Pending for longer than any start.
            await asyncio.sleep(SWEEP_MARGIN_SECONDS)
            first_look: dict[UUID, UUID | None] = {}

            async def look() -> None:
                pending = await _pending_served_runs(client)
                first_look.update({run_id: _state_id(run) for run_id, run in pending.items()})

            if await self._record(look) and first_look:
                await asyncio.sleep(self.stuck_run_seconds)
                await self._record(lambda: self.crash_stuck_runs(client, first_look))

        task = asyncio.ensure_future(sweep())
        self.sweeps.add(task)
        task.add_done_callback(self.sweeps.discard)

    def cancel_sweeps(self) -> None:
        """The worker stops: no sweep after it."""
        for task in self.sweeps:
            task.cancel()

    async def crash_stuck_runs(self, client: PrefectClient, first_look: dict[UUID, UUID | None]) -> None:
        """Set ``Crashed`` the served runs of this package still in the ``Pending`` state they were in at
        ``first_look`` (run id → state id), ``stuck_run_seconds`` ago by this host's monotonic clock.

        Watched, not dated: a Pending state's timestamp comes from the clock of the host whose runner took the run,
        and this host's wall clock may be a minute off from it (several hosts): a cut-off on either would crash a run
        another host has just taken, or never crash a stuck one."""
        for run_id, run in (await _pending_served_runs(client)).items():
            if run_id in first_look and first_look[run_id] == _state_id(run):
                await client.set_flow_run_state(run_id, Crashed(message=(
                    "This run crashed: it was taken while the Prefect API could not be reached and never started; "
                    "the next scheduled run covers its slot.")), force=True)
                logger.info("run %s (Pending since the Prefect outage) marked Crashed", run.name)

    def log_unrecorded(self) -> None:
        """At exit: say what could not be recorded in Prefect (the ledger file keeps it for the next worker)."""
        for key, entry in sorted(self.entries.items()):
            what = offline_message(entry) if key.startswith("offline:") else f"the end of deliver run {key[4:]}"
            logger.warning("not recorded in Prefect yet (its API could not be reached; the next worker of this host "
                           "records it): %s", what)


async def _pending_served_runs(client: PrefectClient) -> dict[UUID, FlowRun]:
    """The ``Pending`` runs of the deployments ``serve`` runs itself (this package's tag, no work pool), by id."""
    pending = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PENDING])),
        tags=FlowRunFilterTags(all_=TAGS)), limit=200)
    return {run.id: run for run in pending if run.work_pool_name is None}


def _state_id(run: FlowRun) -> UUID | None:
    return run.state.id if run.state is not None else None
