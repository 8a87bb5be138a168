"""Async Prefect flows that also run when called from synchronous code.

Calling an ``async def`` flow without ``await`` returns a coroutine: the flow does not run, and nothing says so
until Python warns at exit. ``sync_compatible`` makes such a flow behave like Prefect's own ``save``/``asave``
pair in one name: called where no event loop is running (a script, a sync flow or task, a thread) it runs the flow
and returns its result; called inside a running event loop it returns the awaitable, as before. As with Prefect's
``save``, sync code calls it directly: ``deliver()``, not ``asyncio.run(deliver())`` (which now gets the result, not
a coroutine, and says so: "a coroutine was expected").
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, TypeVar

from prefect import Flow

F = TypeVar("F", bound=Flow)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class SyncCompatibleFlow(Flow):
    """An async flow whose call runs it to completion when there is no running event loop to await it in."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = super().__call__(*args, **kwargs)
        if inspect.iscoroutine(result) and not _loop_running():
            return asyncio.run(result)
        return result


def sync_compatible(flow: F) -> F:
    """Make an async ``flow`` callable from sync code (see the module docstring); returns the same flow object.

    Example:
        ```python
        from prefect import flow

        from prefect_webhooks.utilities.sync_flows import sync_compatible

        @sync_compatible
        @flow
        async def hello() -> str:
            return "hello"

        assert hello() == "hello"   # runs; inside async code: await hello()
        ```
    """
    if not isinstance(flow, Flow) or not flow.isasync:
        raise TypeError("sync_compatible takes an async Prefect flow")
    # The flow object keeps its identity (deployments load it by name from its module); only its call changes.
    flow.__class__ = SyncCompatibleFlow
    return flow
