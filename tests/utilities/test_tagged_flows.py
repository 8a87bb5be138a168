"""Runs of the package's flows started by hand carry the ``prefect-webhooks`` tag (real Prefect test server)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, get_client

from prefect_webhooks.audiences import AudienceDefinition, CsvSnapshot
from prefect_webhooks.flows import audience_sync, deletions, deliver
from prefect_webhooks.utilities.sync_flows import sync_compatible
from prefect_webhooks.utilities.tagged_flows import OUR_TAG, tagged

pytestmark = pytest.mark.usefixtures("prefect_harness")


async def _tags_of(state: Any) -> list[str]:
    async with get_client() as client:
        return (await client.read_flow_run(state.state_details.flow_run_id)).tags


def test_hand_run_sync_flows_and_async_flows_from_sync_code_are_tagged(store_url: str, tmp_path: Path) -> None:
    import asyncio

    from prefect_webhooks import Source, register_source

    suffix = uuid.uuid4().hex[:8]
    register_source(f"tagged-{suffix}", Source(write_key=f"wk_tagged_{suffix}", destinations=[]))
    snapshot = tmp_path / "members.csv"
    snapshot.write_text("user_id\nu1\n")
    definition = AudienceDefinition(name=f"tagged {suffix}", sources=[f"tagged-{suffix}"],
                                    snapshot=CsvSnapshot(path=str(snapshot)))
    states = [audience_sync(definition, return_state=True), deletions(return_state=True),
              deliver(return_state=True)]  # deliver is async: run from sync code
    for state in states:
        assert state.is_completed(), state
        assert OUR_TAG in asyncio.run(_tags_of(state))


async def test_an_awaited_async_flow_is_tagged_and_other_tags_are_kept(store_url: str) -> None:
    from prefect import tags

    with tags("mine"):
        state = await deliver(return_state=True)
    assert {OUR_TAG, "mine"} <= set(await _tags_of(state))


def test_tagged_takes_flows_only_and_keeps_a_sync_compatible_flow_callable_from_sync_code() -> None:
    @tagged
    @sync_compatible
    @flow
    async def hello() -> str:
        return "hello"

    assert hello() == "hello"
    with pytest.raises(TypeError, match="takes a Prefect flow"):
        tagged(lambda: None)  # type: ignore[type-var]
