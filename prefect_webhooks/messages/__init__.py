"""The vocabulary every stage speaks, below all of them: the inbound call model that the Analytics client, the
ingest API and the ingest flow validate with (``model``), timestamps in and out (``timestamps``), the outbound
bodies of the destination spec, serialised once (``payloads``), what becomes of a message (``outcomes``: its states
and the records of an attempt), the retry policy both senders follow (``retry``) and the declarative mappings an
endpoint can apply to a body (``mapping``). It takes in raw calls and hands
on validated messages, outbound bodies and outcome records; it imports no other stage.
"""

from prefect_webhooks.messages.model import (
    MAX_BATCH_BYTES,
    MAX_MESSAGE_BYTES,
    MESSAGE_TYPES,
    Alias,
    BaseMessage,
    Group,
    Identify,
    Message,
    MessageError,
    Page,
    Screen,
    Track,
    parse_message,
)
from prefect_webhooks.messages.outcomes import (
    DELIVERED,
    FAILED,
    FILTERED,
    PENDING,
    Attempt,
    Delivered,
    Failed,
    Filtered,
    OutcomeRecords,
    Rescheduled,
)
from prefect_webhooks.messages.payloads import delete_payload, identify_payload, outbound_payload, serialize
from prefect_webhooks.messages.timestamps import TimestampError, format_timestamp, parse_timestamp, utcnow

__all__ = [
    "DELIVERED",
    "FAILED",
    "FILTERED",
    "MAX_BATCH_BYTES",
    "MAX_MESSAGE_BYTES",
    "MESSAGE_TYPES",
    "PENDING",
    "Alias",
    "Attempt",
    "BaseMessage",
    "Delivered",
    "Failed",
    "Filtered",
    "Group",
    "Identify",
    "Message",
    "MessageError",
    "OutcomeRecords",
    "Page",
    "Rescheduled",
    "Screen",
    "TimestampError",
    "Track",
    "delete_payload",
    "format_timestamp",
    "identify_payload",
    "outbound_payload",
    "parse_message",
    "parse_timestamp",
    "serialize",
    "utcnow",
]
