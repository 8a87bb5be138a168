"""A URL as the project shows it anywhere a person or a log reads it: what may hold a secret taken out."""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit


# Every request's attempt record and counters name its URL this way: a process sends to few URLs.
@lru_cache(maxsize=1024)
def display_url(url: str) -> str:
    """A URL for logs, reasons, artifacts and attempt records: scheme, host, port and path; the query (may hold
    tokens) and credentials dropped."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
