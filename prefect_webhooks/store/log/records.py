"""A kept message as the message log stores it: one compressed record, and 64-bit keys for its lookups.

A message leaving the queue keeps what support asks about (its type, ids, reason, times, body and every attempt)
in one zlib stream. Small JSON bodies compress badly alone (the compressor has not yet seen the keys by the time
the body ends), so the stream starts from a preset dictionary of what every outbound message and record repeats:
the seed's field names and the record's own layout. The record's header is a JSON array (positions, not names; times as
milliseconds before the finish; URLs as numbers of the log's names) and the body follows it unchanged, so a body is
never escaped.

Lookups by messageId and by user go through 8-byte keys (BLAKE2b of the text) instead of the text itself: an index
entry costs the same whatever the id's length; a reader checks the decoded id, so two ids that share a key are
never confused.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from prefect_webhooks.messages.outcomes import Attempt

# What outbound messages (seed 000's formats) and the record header repeat; the most frequent strings last, where
# zlib finds them at the shortest distance.
_PRESET = (
    b'"groupId":"previousId":"category":"name":"screen","page","alias","group","delete","identify",'
    b'"context":{"device":{"os":{"app":{"version":"build":"model":"manufacturer":'
    b'"traits":{"email":"@example.com","firstName":"lastName":"plan":"createdAt":'
    b'"properties":{"revenue":"currency":"USD","EUR","sku":"price":"quantity":"url":"https://","path":"/",'
    b'"title":"referrer":"search":"product_id":"order_id":"value":"total":'
    b'permanent: HTTP 4,retry: HTTP 5,expired after ,connection error: ,timeout after ,disabled: ,'
    b'[1,"delivered","failed","filtered",null,0,[[17'
    b'{"version":1,"type":"track","userId":"user-","anonymousId":"timestamp":"20'
    b'T00:00:00.000Z","event":"Order Completed","properties":{'
)
_LEVEL = 6
RECORD_VERSION = 1


def text_key(text: str | None) -> int | None:
    """The signed 64-bit lookup key of a messageId or user id (None for None)."""
    if text is None:
        return None
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)


_EPOCH = datetime(1970, 1, 1)
_MILLISECOND = timedelta(milliseconds=1)


def epoch_ms(moment: datetime | None) -> int | None:
    """A naive-UTC time as whole milliseconds since the epoch (truncated: never later than the time itself)."""
    if moment is None:
        return None
    if moment.tzinfo is not None:  # the store's times are naive already: ``replace`` costs a copy of each
        moment = moment.replace(tzinfo=None)
    return (moment - _EPOCH) // _MILLISECOND


def from_epoch_ms(value: int | None) -> datetime | None:
    """Milliseconds since the epoch as a naive-UTC time."""
    if value is None:
        return None
    return _EPOCH + value * _MILLISECOND


@dataclass(slots=True)
class RecordContent:
    """What a record holds besides the columns its lookups use."""

    message_type: str
    source: str | None
    message_id: str | None
    user_id: str | None
    reason: str | None
    attempts: int
    created_at: datetime
    first_attempt_at: datetime | None
    body: bytes | None
    tries: list[Attempt] = field(default_factory=list)
    endpoint: str | None = None
    """The key of the one endpoint a fan-out message went to (``store.queue.fan_out``); None for every one."""


class EpochMillis(dict):  # type: ignore[type-arg]
    """``epoch_ms`` of times, each computed once: a batch's rows share their finish time, and the rows of one ingest
    call their creation time (a time read back from SQLite as its text is read here)."""

    def __missing__(self, moment: datetime | str | None) -> int | None:
        value = self[moment] = epoch_ms(datetime.fromisoformat(moment) if isinstance(moment, str) else moment)
        return value


def pack_record(
    content: RecordContent, finished_at: datetime, codes: Mapping[str, int], millis: EpochMillis | None = None
) -> bytes:
    """The compressed record of ``content`` for a message that finished at ``finished_at``.

    Times are kept as milliseconds before the finish (small numbers), each attempt's URL as its number in ``codes``
    (the log's names), and the source not at all: the row's ``source_id`` column holds it. ``millis``: the times'
    milliseconds shared by a batch's records.
    """
    return pack_fields(content.message_type, content.message_id, content.user_id, content.reason, content.attempts,
                       content.created_at, content.first_attempt_at, content.tries, content.body, content.endpoint,
                       finished_at, codes, millis if millis is not None else EpochMillis())


def pack_fields(
    message_type: str, message_id: str | None, user_id: str | None, reason: str | None, attempts: int,
    created_at: datetime | str | None, first_attempt_at: datetime | None, tries: Sequence[Attempt], body: bytes | None,
    endpoint: str | None, finished_at: datetime, codes: Mapping[str, int], millis: EpochMillis,
) -> bytes:
    """``pack_record`` of a record's fields as they are, with no ``RecordContent`` made: what recording a batch
    calls once per message."""
    finished = millis[finished_at] or 0
    first = millis[first_attempt_at]
    header = [
        RECORD_VERSION, message_type, message_id, user_id, reason, attempts,
        finished - (millis[created_at] or 0), None if first is None else finished - first,
        [[finished - (millis[a.attempted_at] or 0), codes[a.url], a.status_code, a.error, round(a.latency_ms, 1),
          a.outcome, *([a.response] if a.response else [])] for a in tries],
        body is not None,
        # Only a fan-out destination's records carry it: a replay puts the message back for that endpoint alone.
        *([endpoint] if endpoint else []),
    ]
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, _PRESET)
    return compressor.compress(orjson.dumps(header) + b"\n" + (body or b"")) + compressor.flush()


@dataclass(slots=True)
class PackedRecord:
    """A record decompressed, before its numbers are turned back into names (``content``)."""

    header: list[Any]
    body: bytes

    @classmethod
    def read(cls, record: bytes) -> PackedRecord:
        decompressor = zlib.decompressobj(-15, _PRESET)
        data = decompressor.decompress(bytes(record)) + decompressor.flush()
        header, _, body = data.partition(b"\n")
        return cls(orjson.loads(header), body)

    @property
    def url_codes(self) -> set[int]:
        """The numbers of the URLs its attempts went to."""
        return {attempt[1] for attempt in self.header[8]}

    def content(
        self, message: int, finished_at: datetime, source: str | None, names: Mapping[int, str]
    ) -> RecordContent:
        """The record as ``pack_record`` took it; ``message`` is the kept message's id, which its attempts name."""
        (_version, message_type, message_id, user_id, reason, attempts, created, first, tries, has_body,
         *endpoint) = self.header
        finished = epoch_ms(finished_at) or 0
        return RecordContent(
            message_type=message_type, source=source, message_id=message_id, user_id=user_id, reason=reason,
            attempts=attempts, created_at=from_epoch_ms(finished - created) or datetime.min,
            first_attempt_at=None if first is None else from_epoch_ms(finished - first),
            body=self.body if has_body else None,
            tries=[Attempt(message, from_epoch_ms(finished - before) or datetime.min, names.get(code, "?"), status,
                           error, latency, outcome, response[0] if response else None)
                   for before, code, status, error, latency, outcome, *response in tries],
            endpoint=endpoint[0] if endpoint else None,
        )
