"""Parsing inbound ISO 8601 timestamps and formatting outbound ones (UTC, milliseconds, ``Z``)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_ISO = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<time>\d{2}:\d{2}(?::\d{2})?)"
    r"(?:[.,](?P<frac>\d{1,9}))?"
    r"(?P<tz>[Zz]|[+-]\d{2}(?::?\d{2})?)?$"
)
# What every SDK sends (``_sdk_shape``).
_SDK_SHAPE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", re.ASCII)


class TimestampError(ValueError):
    """A timestamp that is not ISO 8601."""


def _sdk_shape(value: str) -> datetime | None:
    """``2026-12-02T05:00:00.123Z``, the shape every SDK sends, read in a quarter of the time; None for any other
    shape, which ``parse_timestamp`` reads in full."""
    if not _SDK_SHAPE.fullmatch(value):
        return None
    try:
        # With its offset written out: ``replace(tzinfo=...)`` costs more than the parse.
        return datetime.fromisoformat(value[:23] + "+00:00")
    except ValueError:
        return None  # e.g. month 13: the full reading names what is wrong


def parse_timestamp(value: str | datetime) -> datetime:
    """Parse ISO 8601 with ``Z``, ``+00:00`` or ``-0800`` and 0–9 fraction digits into an aware UTC datetime.

    A timestamp without an offset is taken as UTC.
    """
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    if not isinstance(value, str):
        raise TimestampError(f"expected an ISO 8601 string, got {type(value).__name__}")
    common = _sdk_shape(value)
    if common is not None:
        return common
    match = _ISO.match(value.strip())
    if not match:
        raise TimestampError(f"not an ISO 8601 timestamp: {value[:64]!r}")
    time_part = match["time"] if match["time"].count(":") == 2 else match["time"] + ":00"
    frac = (match["frac"] or "0")[:6].ljust(6, "0")
    try:
        parsed = datetime.fromisoformat(f"{match['date']}T{time_part}.{frac}")
    except ValueError as exc:
        raise TimestampError(f"not a valid date-time: {value[:64]!r}") from exc
    tz = match["tz"]
    if tz is None or tz in ("Z", "z"):
        offset = timedelta(0)
    else:
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:4] or 0)
        if hours > 23 or minutes > 59:
            raise TimestampError(f"invalid UTC offset in {value[:64]!r}")
        offset = sign * timedelta(hours=hours, minutes=minutes)
    try:
        return (parsed - offset).replace(tzinfo=timezone.utc)
    except OverflowError:
        # e.g. 0001-01-01T00:00:00+01:00 is in year 0 in UTC.
        raise TimestampError(f"outside the supported date range in UTC: {value[:64]!r}") from None


def format_timestamp(value: datetime) -> str:
    """Format as the outbound wire wants it: UTC, millisecond precision, ``Z`` suffix."""
    # isoformat, not strftime: it pads years before 1000 to four digits and costs half as much per call.
    if value.tzinfo is None:
        return value.isoformat(timespec="milliseconds") + "Z"
    if value.tzinfo is not timezone.utc:
        value = value.astimezone(timezone.utc)
    return value.isoformat(timespec="milliseconds")[:-6] + "Z"  # "+00:00" → "Z"


def utcnow() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(timezone.utc)
