"""Calls to the Prefect API are bounded and skipped while it is down; its return runs the work that waited.

The faults are real: a closed port (refused connections), and the session's Prefect test server behind a forwarder
that goes down, hangs (a hung server, a partition) and comes back on the same address (``tests.outages``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prefect.client.orchestration import get_client
from prefect.context import AsyncClientContext
from prefect.settings import PREFECT_API_URL, temporary_settings

from prefect_webhooks.blocks.api_status import PrefectApi, PrefectApiUnavailable, is_unreachable
from tests.outages import switched_api
from tests.servers import free_port


@contextmanager
def api_at(url: str) -> Iterator[None]:
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


async def health() -> None:
    async with get_client() as client:
        await client.hello()


async def test_a_refused_api_is_marked_down_and_then_not_called_at_all(prefect_harness: None) -> None:
    api = PrefectApi(wait_seconds=2, probe_seconds=0.2)
    calls = 0

    async def counted() -> None:
        nonlocal calls
        calls += 1
        await health()

    with api_at(f"http://127.0.0.1:{free_port()}/api"):
        with pytest.raises(PrefectApiUnavailable):
            await api.call(counted)
        assert not api.reachable and api.down_since is not None
        started = time.monotonic()
        with pytest.raises(PrefectApiUnavailable):
            await api.call(counted)
        assert calls == 1 and time.monotonic() - started < 0.05


async def test_a_hung_api_costs_a_caller_at_most_the_wait(prefect_harness: None) -> None:
    api = PrefectApi(wait_seconds=0.5, probe_seconds=30)
    with switched_api() as switch:
        await health()  # the client's first connection and API check, outside the bound (slow on a loaded machine)
        await api.call(health)
        switch.hang()
        started = time.monotonic()
        with pytest.raises(PrefectApiUnavailable):
            await api.call(health)
        assert time.monotonic() - started < 1.5
    assert not api.reachable


async def test_a_call_waiting_on_a_hung_api_stops_when_another_finds_it_down(prefect_harness: None) -> None:
    """A run's artifacts (a 15 s bound) sent just as the server hangs are not waited for once a batch's 0.5 s call
    has found the API down: a run, and a stop of the process, do not wait out the longest bound."""
    api = PrefectApi(wait_seconds=0.5, probe_seconds=30)
    with switched_api() as switch:
        await health()
        await api.call(health)
        switch.hang()
        started = time.monotonic()
        long_call = asyncio.ensure_future(api.call(health, wait=30))
        with pytest.raises(PrefectApiUnavailable):
            await api.call(health)
        with pytest.raises(PrefectApiUnavailable, match="found down by another call"):
            await long_call
        assert time.monotonic() - started < 10  # not its own 30 s
    assert not api.reachable


async def test_the_probe_finds_the_api_back_and_runs_what_waited(prefect_harness: None) -> None:
    api = PrefectApi(wait_seconds=2, probe_seconds=0.2)
    back = asyncio.Event()

    async def record() -> None:
        back.set()

    api.on_back(record)
    with switched_api() as switch:
        switch.down()
        with pytest.raises(PrefectApiUnavailable):
            await api.call(health)
        await asyncio.sleep(0.5)
        assert not api.reachable and not back.is_set()
        # The server is back on the same address: the probe sees it and the waiting work runs.
        switch.up()
        await asyncio.wait_for(back.wait(), 10)
        assert api.reachable and api.outages == 1
        await api.call(health)


async def test_an_outage_noticed_in_a_flow_run_is_followed_after_that_run_closed_its_client(
    prefect_harness: None,
) -> None:
    api = PrefectApi(wait_seconds=2, probe_seconds=0.2)
    recorded = asyncio.Event()

    async def record() -> None:
        await health()  # the work left for the return calls Prefect with a client of its own
        recorded.set()

    api.on_back(record)
    with switched_api() as switch:
        # A flow run's client (its context's): the run notices the outage, then ends and closes it.
        async with AsyncClientContext():
            switch.down()
            with pytest.raises(PrefectApiUnavailable):
                await api.call(health)
        switch.up()
        await asyncio.wait_for(recorded.wait(), 10)
    assert api.reachable


async def test_an_answer_that_is_an_error_is_not_an_outage(prefect_harness: None) -> None:
    from prefect.exceptions import ObjectNotFound

    api = PrefectApi()

    async def missing() -> None:
        async with get_client() as client:
            await client.read_block_document_by_name("nothing-here", block_type_slug="webhook-destination")

    with pytest.raises(ObjectNotFound):
        await api.call(missing)
    assert api.reachable


def test_what_counts_as_unreachable() -> None:
    import httpx

    assert is_unreachable(httpx.ConnectError("refused"))
    assert is_unreachable(TimeoutError())
    wrapped = RuntimeError("block could not load")
    wrapped.__cause__ = httpx.ReadTimeout("slow")
    assert is_unreachable(wrapped)
    request = httpx.Request("GET", "http://x/api/health")
    assert is_unreachable(httpx.HTTPStatusError("bad gateway", request=request,
                                                response=httpx.Response(502, request=request)))
    assert not is_unreachable(httpx.HTTPStatusError("missing", request=request,
                                                    response=httpx.Response(404, request=request)))
    assert not is_unreachable(ValueError("a bad block"))
