"""After an outage, the sweep of served runs left Pending: watched on this host's clock, never dated."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Pending, Running

import prefect_webhooks.serving.run_records as run_records
from prefect_webhooks.blocks.api_status import PrefectApi
from prefect_webhooks.blocks.local_copy import LocalCopy
from prefect_webhooks.deployments.serve import TAGS
from prefect_webhooks.serving.run_records import RunRecords

pytestmark = pytest.mark.usefixtures("prefect_harness")


@flow(name="run-records-sweep")
def served() -> None:
    """Stands for a served deployment's flow: the sweep knows runs by their tags, not their flow."""


async def pending_run(client, *, stamped: timedelta) -> UUID:  # noqa: ANN001 - Prefect's client
    """A run of ``serve``'s tags taken by a runner whose clock reads ``stamped`` off this host's."""
    state = Pending(timestamp=datetime.now(timezone.utc) + stamped)
    run = await client.create_flow_run(served, tags=list(TAGS), state=state)
    return run.id


async def state_of(client, run_id: UUID) -> str:  # noqa: ANN001
    return (await client.read_flow_run(run_id)).state.type.value


@pytest.mark.timeout(60)
def test_the_sweep_crashes_what_stayed_pending_whatever_the_clocks_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs Pending when the sweep first looks and still in that state ``stuck_run_seconds`` later are Crashed, even
    one stamped a minute ahead (taken by a host whose clock runs ahead). A run that went on, or was first seen
    Pending only at the second look, is left alone however old its stamp: a cut-off on this host's wall clock would
    crash a run another host has just taken when this one runs ahead, and never crash a stuck one when it runs
    behind."""
    monkeypatch.setattr(run_records, "SWEEP_MARGIN_SECONDS", 0.0)

    async def scenario() -> dict[str, str]:
        async with get_client() as client:
            ahead = await pending_run(client, stamped=timedelta(seconds=60))
            behind = await pending_run(client, stamped=timedelta(seconds=-60))
            started = await pending_run(client, stamped=timedelta(0))
            api = PrefectApi(wait_seconds=10)
            api.outages = 1
            records = RunRecords(api, ledger=LocalCopy("run-records-test", enabled=False), stuck_run_seconds=1.0)
            records.sweep_after_outage(client)
            await asyncio.sleep(0.5)  # the sweep has looked
            await client.set_flow_run_state(started, Running(), force=True)
            # Taken after the first look, stamped ten minutes ago (a host whose clock runs behind).
            late = await pending_run(client, stamped=timedelta(minutes=-10))
            await asyncio.gather(*records.sweeps)
            return {name: await state_of(client, run_id) for name, run_id in
                    (("ahead", ahead), ("behind", behind), ("started", started), ("late", late))}

    states = asyncio.run(scenario())
    assert states == {"ahead": "CRASHED", "behind": "CRASHED", "started": "RUNNING", "late": "PENDING"}
