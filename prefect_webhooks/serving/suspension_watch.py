"""Prefect's watch for a run's suspension, kept off the event loop that delivers.

For a run of a deployment, Prefect's flow engine watches whether the run gets suspended: on the loop that runs the
flow it starts a thread with an event loop of its own and a websocket to the events API, waits until that watch is
ready, and at the run's end joins the thread (for up to 2 s). In a delivery worker that loop sends every request of
the process, and a shift handover (a new run a minute) held every send for 120-460 ms. ``watch_beside_the_loop``
makes the engine start the same watch from a thread of its own and leave it without waiting for it: a run is
watched from a moment after it starts, and the loop goes on sending meanwhile.

Only the delivery worker installs it, in its own process; a Prefect without this watch is left as it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger("prefect_webhooks.serving.suspension_watch")


def beside_the_loop(observe: Callable[..., contextlib.AbstractContextManager[Any]]) -> Callable[..., Any]:
    """``observe`` (a context manager that watches while it is entered) entered and left on a thread of its own:
    entering returns at once, and leaving only tells that thread to leave it."""

    @contextlib.contextmanager
    def observe_beside(*args: Any, **kwargs: Any) -> Iterator[None]:
        leave = threading.Event()

        def watch() -> None:
            try:
                with observe(*args, **kwargs):
                    leave.wait()
            except Exception:  # the watch is Prefect's; a run goes on without it, as Prefect's own would
                logger.debug("the suspension watch ended with an error", exc_info=True)

        # The watch reads the run's settings and client from the context the engine entered it in.
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(watch,), name="suspension watch", daemon=True).start()
        try:
            yield
        finally:
            leave.set()

    observe_beside.beside_the_loop = True  # type: ignore[attr-defined]
    return observe_beside


def watch_beside_the_loop() -> bool:
    """Make this process's flow engine watch for suspensions beside the loop; False when this Prefect has no such
    watch (releases before it), which is then left as it is."""
    from prefect import flow_engine

    observe = getattr(flow_engine, "observe_flow_run_suspension", None)
    if observe is None:
        return False
    if not getattr(observe, "beside_the_loop", False):
        flow_engine.observe_flow_run_suspension = beside_the_loop(observe)
    return True
