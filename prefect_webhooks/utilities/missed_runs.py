"""Scheduled runs missed while Prefect was unreachable: the threshold and the state message shared by the flows'
own catch-up (``flows.catch_up``) and the runner's settling before it serves again (``deployments.outages``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

# A run is Pending for the seconds its process takes to start; one Pending this long was taken during an outage and
# will not start.
STUCK_PENDING_SECONDS = 60.0


def superseded_message(newer: FlowRun) -> str:
    """The state message of a run that a newer scheduled run covers."""
    return (f"Superseded: the later scheduled run {newer.name!r} was due too and covers this run's slot "
            "(scheduled runs missed while Prefect was unreachable run once).")
