"""Messages by what only their record holds: the start of their reason, or an endpoint among their attempts.

These refine a lookup (``lookups.find_messages``: destination, state, user, time…) rather than replace it: the
lookup's indexes give the candidates newest first, a chunk at a time, and each is checked once decoded. A call
reads at most ``SCAN_LIMIT`` candidates, whatever the store keeps, and says where it stopped (``resume_at``), so the
next page goes on from there: a page may hold fewer matches than asked for, even none, before the last one.
Narrowing the lookup (a destination, a time window) is what makes such a search cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy.engine import Connection

from prefect_webhooks.store.log.lookups import MessageQuery, StoredMessage, find_messages
from prefect_webhooks.utilities.urls import display_url

SCAN_LIMIT = 1_000
CHUNK = 500


@dataclass(frozen=True)
class Refinement:
    """What a message's record must hold besides what the lookup matched.

    Attributes:
        reason_prefix: Its reason starts with this (``permanent: HTTP 4``, ``expired``…).
        endpoint: One of its attempts went to a URL that starts with this one (its query and credentials are not
            compared: attempts keep URLs without them).
    """

    reason_prefix: str | None = None
    endpoint: str | None = None

    def __bool__(self) -> bool:
        return self.reason_prefix is not None or self.endpoint is not None

    def matcher(self) -> Callable[[StoredMessage], bool]:
        """The check of one message (the endpoint asked for is shown as attempts keep URLs once, not per message)."""
        wanted = display_url(self.endpoint) if self.endpoint is not None else None

        def matches(message: StoredMessage) -> bool:
            if self.reason_prefix is not None and not (message.reason or "").startswith(self.reason_prefix):
                return False
            return wanted is None or any(display_url(attempt.url).startswith(wanted) for attempt in message.tries)

        return matches


@dataclass
class SearchPage:
    """One page of a search.

    Attributes:
        messages: The matches, newest first.
        resume_at: Where the next page starts (a ``MessageQuery.before``), or None when nothing is left.
        read: How many messages were read to find them.
    """

    messages: list[StoredMessage]
    resume_at: tuple[datetime, int] | None
    read: int


def search_messages(connection: Connection, query: MessageQuery, refinement: Refinement | None = None, *,
                    limit: int = 50, scan: int = SCAN_LIMIT) -> SearchPage:
    """A page of at most ``limit`` messages that ``query`` and ``refinement`` match, newest first, reading at most
    ``scan`` of the messages ``query`` matches.

    Example:
        ```python
        from prefect_webhooks.store import get_engine
        from prefect_webhooks.store.log.lookups import MessageQuery
        from prefect_webhooks.store.log.message_search import Refinement, search_messages

        with get_engine().connect() as connection:
            page = search_messages(connection, MessageQuery(states=["failed"]), Refinement(reason_prefix="permanent"))
        print([message.id for message in page.messages], page.resume_at)
        ```
    """
    if not refinement:
        found = find_messages(connection, query, limit=limit + 1)
        page = found[:limit]
        return SearchPage(page, page[-1].position if len(found) > limit else None, len(page))
    matches: list[StoredMessage] = []
    read, before, matching = 0, query.before, refinement.matcher()
    while True:
        wanted = min(CHUNK, scan - read)
        chunk = find_messages(connection, replace(query, before=before), limit=wanted)
        for message in chunk:
            read += 1
            if matching(message):
                matches.append(message)
            if len(matches) == limit or read >= scan:
                return SearchPage(matches, message.position, read)
        if len(chunk) < wanted:
            return SearchPage(matches, None, read)
        before = chunk[-1].position
