"""Durations written the way people write them: ``90`` or ``90s``, ``15m``, ``24h``, ``7d``; and times given as a
duration ago (``--since 2h``).

The one parser for every duration and past time the project reads from a person (retention settings, a rotation
window, a lookup's window on the command line or the admin API).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """A duration such as ``90`` (seconds), ``90s``, ``15m``, ``24h`` or ``7d``.

    Raises:
        ValueError: for anything else, naming the text and the accepted forms.
    """
    found = _DURATION.match(text)
    if not found:
        raise ValueError(f"not a duration: {text!r} (use seconds, or 90s, 15m, 24h, 7d)")
    return timedelta(seconds=float(found.group(1)) * _UNIT_SECONDS[found.group(2)])


def duration_seconds(value: object) -> object:
    """Seconds for a duration given as text (``"24h"``); numbers and anything else pass through unchanged.

    Meant as a pydantic ``BeforeValidator`` for settings kept in seconds.
    """
    if isinstance(value, str):
        return parse_duration(value).total_seconds()
    return value


def past_time(text: str) -> datetime:
    """An ISO 8601 time (naive means UTC), or a duration ago such as ``2h`` or ``7d``, as an aware UTC time.

    Raises:
        ValueError: naming what was given.
    """
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            return datetime.now(timezone.utc) - parse_duration(text)
        except ValueError:
            raise ValueError(f"{text!r} is neither an ISO 8601 time nor a duration (2h, 7d)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
