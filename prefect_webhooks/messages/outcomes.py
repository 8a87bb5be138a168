"""What becomes of a message: the names of its states and of one request's outcome, and the records of an attempt.

A delivery attempt ends each message of a batch in one of four records, which ``outbox.record_outcomes`` writes in
one transaction together with one ``Attempt`` per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

# States of an outbox row.
PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
# Dropped by one of the destination's filter rules (named in ``reason``); never sent.
FILTERED = "filtered"

# Reason prefixes of rows that no request was made for: a pending row waiting for its endpoint's rate budget, and a
# failed row whose every endpoint is disabled (``replay --reason-prefix disabled`` puts these back).
THROTTLED_REASON = "throttled:"
DISABLED_REASON = "disabled:"

# Outcomes of one request (``DELIVERED`` is both: any 2xx delivers the message).
RETRY = "retry"
PERMANENT = "permanent"


@dataclass(slots=True)
class Delivered:
    """A message one of its URLs accepted (which one is in its attempt records)."""

    id: int
    attempts: int
    first_attempt_at: datetime
    at: datetime
    destination: str
    """The message's destination: its outcome counts there."""


@dataclass(slots=True)
class Failed:
    """A message that will not be attempted again, and why."""

    id: int
    reason: str
    attempts: int
    first_attempt_at: datetime | None
    destination: str


@dataclass(slots=True)
class Rescheduled:
    """A message to try again at ``next_attempt_at``; leased when this process retries it itself."""

    id: int
    attempts: int
    first_attempt_at: datetime | None
    reason: str | None
    next_attempt_at: datetime
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None


@dataclass(slots=True)
class Filtered:
    """A message a destination filter dropped (never sent); ``reason`` names the rule."""

    id: int
    reason: str
    destination: str


@dataclass(slots=True)
class Attempt:
    """One request of a message to one URL (or the refusal to send it), for the ``delivery_attempts`` log."""

    outbox_id: int
    attempted_at: datetime
    url: str
    status_code: int | None
    error: str | None
    latency_ms: float
    outcome: str
    response: str | None = None
    """The start of the receiver's answer (``delivery.sending.answers``), the place a receiver says what it refused."""


@dataclass(slots=True)
class EndpointRequest:
    """One request made to one endpoint URL (or refused before sending), for the per-endpoint counters."""

    destination: str
    url: str
    outcome: str
    status_code: int | None
    latency_ms: float


@dataclass
class OutcomeRecords:
    """Everything one try of a batch writes back."""

    delivered: list[Delivered] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)
    rescheduled: list[Rescheduled] = field(default_factory=list)
    filtered: list[Filtered] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    requests: list[EndpointRequest] = field(default_factory=list)
    """Each request once (a batch request carries many messages' attempts), for ``/metrics`` per endpoint."""
    owner: str | None = None
    """The lease owner the batch's rows were claimed by. A row another owner has taken since (this one's lease ran
    out) is not rescheduled from here: that would clear the other's live lease and let a third claim send it again."""
