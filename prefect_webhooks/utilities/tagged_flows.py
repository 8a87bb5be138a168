"""Every run of the package's flows carries the ``prefect-webhooks`` tag, however it was started.

Runs of the package's deployments get the tag from the deployment (``deployments/prefect.yaml``). A flow called by
hand (``audience_sync(...)`` in a script, ``await deliver()``) creates its run from the caller's tag context, which
holds no tag of ours: ``tagged`` makes the call itself enter ``prefect.tags(OUR_TAG)``, so those runs carry it too
and retention (``PREFECT_WEBHOOKS_RETENTION_RUNS``, which removes only runs with the tag) removes them with the rest.
"""

from __future__ import annotations

import inspect
from collections.abc import Coroutine
from typing import Any, TypeVar

from prefect import Flow, tags

from prefect_webhooks.utilities.sync_flows import SyncCompatibleFlow

OUR_TAG = "prefect-webhooks"
F = TypeVar("F", bound=Flow)


async def _in_our_tags(run: Coroutine[Any, Any, Any]) -> Any:
    # An async flow's run is created when its coroutine runs, not when the flow is called.
    with tags(OUR_TAG):
        return await run


class TaggedFlow(Flow):
    """A flow whose runs started by a call carry ``OUR_TAG``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with tags(OUR_TAG):
            result = super().__call__(*args, **kwargs)
        return _in_our_tags(result) if inspect.iscoroutine(result) else result


class TaggedSyncCompatibleFlow(TaggedFlow, SyncCompatibleFlow):
    """A ``sync_compatible`` flow whose runs started by a call carry ``OUR_TAG``."""


_TAGGED: dict[type, type] = {Flow: TaggedFlow, SyncCompatibleFlow: TaggedSyncCompatibleFlow}


def tagged(flow: F) -> F:
    """Make the runs ``flow``'s calls start carry ``OUR_TAG``; returns the same flow object (deployments load it by
    name from its module). Apply it outermost, over ``sync_compatible`` when there is one."""
    if type(flow) not in _TAGGED:
        raise TypeError(f"tagged takes a Prefect flow, got {type(flow).__name__}")
    flow.__class__ = _TAGGED[type(flow)]
    return flow
