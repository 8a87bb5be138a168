"""Disabled endpoints: the entries a destination block keeps for endpoints that get no requests.

The delivery engine adds an entry when an endpoint has failed without a break for the destination's
``disable_after``; a user removes it (in the block's form, or ``prefect-webhooks endpoint enable``) to enable the
endpoint again. Entries name an endpoint by its position, because the endpoint list itself is a secret field the
Prefect UI masks.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class DisabledEndpoint(BaseModel):
    """One endpoint of a destination that gets no requests until the entry is removed."""

    model_config = ConfigDict(extra="forbid")

    position: int = Field(ge=1, description="Which endpoint: 1 is the first of the destination's endpoints.")
    disabled_at: datetime = Field(description="When it was disabled.")
    reason: str = Field(default="", description="Why it was disabled (no URL, header or secret).")
    failing_since: datetime | None = Field(
        default=None, description="When its run of failures began, for an endpoint disabled by the delivery engine.")


def disabled_positions(entries: list[DisabledEndpoint]) -> set[int]:
    """The positions (from 1) of the disabled endpoints."""
    return {entry.position for entry in entries}


def check_disabled_entries(entries: list[DisabledEndpoint], endpoint_count: int) -> None:
    """Refuse an entry naming a position the destination does not have, or a position named twice."""
    seen: set[int] = set()
    for entry in entries:
        if entry.position > endpoint_count:
            raise ValueError(
                f"disabled_endpoints: position {entry.position} does not exist, the destination has "
                f"{endpoint_count} endpoint(s)"
            )
        if entry.position in seen:
            raise ValueError(f"disabled_endpoints: position {entry.position} is listed twice")
        seen.add(entry.position)
