"""The Analytics client's in-memory queue and the framing of batch request bodies.

Messages are queued already serialised (``bytes``): the 32 KB check needs the encoded size anyway, a batch body is
then a join of those bytes, and a queued message costs a few hundred bytes instead of a dict tree.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from prefect_webhooks.client.errors import QueueFullError
from prefect_webhooks.messages.model import MAX_BATCH_BYTES

_BATCH_HEAD = b'{"batch":['
# `],"sentAt":"2026-01-01T00:00:00.000Z"}` is 38 bytes; the margin keeps the bound exact without measuring each time.
_BATCH_TAIL_RESERVE = 64


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """One validated message waiting to be sent: its sequence number (for ``flush``) and wire bytes."""

    seq: int
    data: bytes


def encode_batch(messages: Iterable[QueuedMessage], sent_at: str) -> bytes:
    """The request body ``{"batch": [...], "sentAt": ...}`` built from already-encoded messages.

    Args:
        messages: Messages in wire form, each a JSON object in bytes.
        sent_at: The attempt's time, ISO 8601 (set again on every retry).
    """
    return b"".join((_BATCH_HEAD, b",".join(m.data for m in messages), b'],"sentAt":', orjson.dumps(sent_at), b"}"))


def decode_messages(messages: Iterable[QueuedMessage]) -> list[dict]:
    """The messages as dicts, for callbacks (only done when a callback asks for them)."""
    return [orjson.loads(m.data) for m in messages]


def batch_fits(count: int, size: int, next_size: int, max_bytes: int = MAX_BATCH_BYTES) -> bool:
    """Whether one more message of ``next_size`` bytes keeps a body of ``count`` messages/``size`` bytes in bounds."""
    return len(_BATCH_HEAD) + size + count + next_size + _BATCH_TAIL_RESERVE <= max_bytes


class MessageQueue:
    """A bounded FIFO of encoded messages shared by the callers' threads and one sender thread.

    It also knows which messages are settled (sent or failed), so ``wait_settled`` can wait for "everything queued
    so far" while other threads keep adding messages.

    ``flush_at`` is both the count that triggers a batch and the most one batch carries (as in every Segment
    library): a backlog goes out as several batches of ``flush_at``, the remainder waits for the next trigger.
    """

    def __init__(self, max_size: int, flush_at: int) -> None:
        self.max_size = max_size
        self.flush_at = flush_at
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the sender waits here for enough messages or a flush
        self._room = threading.Condition(self._lock)  # blocked callers wait here for room
        self._settled = threading.Condition(self._lock)  # flush() waits here
        self._items: deque[QueuedMessage] = deque()
        self._seq = itertools.count(1)
        self._last_seq = 0
        self._in_flight: dict[int, int] = {}  # batch id -> lowest seq it holds
        self._batch_ids = itertools.count(1)
        self._flush_waiters = 0
        self._room_waiters = 0
        self._senders_waiting = 0
        self._closing = False
        self._last_flush = time.monotonic()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, data: bytes, block_timeout: float | None) -> int:
        """Queue one message; return its sequence number.

        Args:
            data: The message's wire bytes.
            block_timeout: ``0`` to fail at once when full, seconds to wait for room, ``None`` to wait forever.

        Raises:
            QueueFullError: when the queue stayed full (the message is not queued).
        """
        with self._lock:
            if len(self._items) >= self.max_size:
                self._wait_for_room(block_timeout)
            seq = next(self._seq)
            self._last_seq = seq
            self._items.append(QueuedMessage(seq, data))
            # Waking the sender on every call would cost a context switch per message; wake it when a batch is ready.
            if self._senders_waiting and len(self._items) >= self.flush_at:
                self._work.notify()
            return seq

    def _wait_for_room(self, block_timeout: float | None) -> None:
        if block_timeout is not None and block_timeout <= 0:
            raise self._full()
        deadline = None if block_timeout is None else time.monotonic() + block_timeout
        self._room_waiters += 1
        try:
            while len(self._items) >= self.max_size:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise self._full()
                self._room.wait(remaining)
        finally:
            self._room_waiters -= 1

    def _full(self) -> QueueFullError:
        return QueueFullError(f"queue full ({self.max_size} messages); message dropped")

    def take(self, flush_after: float) -> tuple[int, list[QueuedMessage]] | None:
        """Wait for a batch (``flush_at`` messages, ``flush_after`` elapsed, a flush, or closing) and take it.

        The batch holds at most ``flush_at`` messages; what is left stays queued for the next trigger (at once when
        ``flush_at`` or more are left, or a flush or close is waiting).

        Returns:
            ``(batch_id, messages)``, or ``None`` when the queue is closing and empty.
        """
        with self._lock:
            while True:
                due = self._last_flush + flush_after
                now = time.monotonic()
                ready = len(self._items) >= self.flush_at or self._flush_waiters or self._closing or now >= due
                if ready and self._items:
                    break
                if ready and not self._items:
                    if self._closing:
                        return None
                    # Nothing to send when the timer fired: the timer restarts from now.
                    self._last_flush = now
                    due = now + flush_after
                self._senders_waiting += 1
                try:
                    self._work.wait(max(due - now, 0.001))
                finally:
                    self._senders_waiting -= 1
            batch = self._pop_batch()
            batch_id = next(self._batch_ids)
            self._in_flight[batch_id] = batch[0].seq
            self._last_flush = time.monotonic()
            if self._room_waiters:
                self._room.notify_all()
            return batch_id, batch

    def _pop_batch(self) -> list[QueuedMessage]:
        """The oldest messages, at most ``flush_at`` of them and at most 500 KB as a request body."""
        batch: list[QueuedMessage] = []
        size = 0
        while self._items and len(batch) < self.flush_at:
            item = self._items[0]
            if batch and not batch_fits(len(batch), size, len(item.data)):
                break
            batch.append(self._items.popleft())
            size += len(item.data)
        return batch

    def settle(self, batch_id: int) -> None:
        """Mark a taken batch as sent or failed."""
        with self._lock:
            self._in_flight.pop(batch_id, None)
            if self._flush_waiters:
                self._settled.notify_all()

    def drain(self) -> list[QueuedMessage]:
        """Remove and return everything still queued (used when a close runs out of time)."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            if self._room_waiters:
                self._room.notify_all()
            if self._flush_waiters:
                self._settled.notify_all()
            return items

    def _oldest_unsettled(self) -> int | None:
        candidates = list(self._in_flight.values())
        if self._items:
            candidates.append(self._items[0].seq)
        return min(candidates) if candidates else None

    def wait_settled(self, timeout: float | None) -> bool:
        """Wait until every message queued before this call is sent or failed.

        Returns:
            True when they all settled, False when ``timeout`` ran out first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            target = self._last_seq
            self._flush_waiters += 1
            self._work.notify()
            try:
                while True:
                    oldest = self._oldest_unsettled()
                    if oldest is None or oldest > target:
                        return True
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._settled.wait(remaining if remaining is not None else 1.0)
            finally:
                self._flush_waiters -= 1

    def close(self) -> None:
        """Stop accepting waits: the sender sends what is left and then ``take`` returns None."""
        with self._lock:
            self._closing = True
            self._work.notify_all()
