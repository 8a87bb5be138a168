"""Sends every call of calls.json through one official Python SDK to an ingest API, then flushes.

Usage: python driver.py SDK HOST WRITE_KEY, SDK being a distribution name: segment-analytics-python
(module segment.analytics), rudder-sdk-python (rudderstack.analytics) or analytics-python (analytics, Segment's
legacy library; its pinned backoff==1.10.0 keeps it out of the project's virtualenv, so it runs from its own).
Exits 0 when the SDK reported no error, 1 otherwise (the errors on stderr).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

MODULES = {
    "segment-analytics-python": "segment.analytics.client",
    "rudder-sdk-python": "rudderstack.analytics.client",
    "analytics-python": "analytics.client",
}
# The SDKs' keyword arguments for the wire names of calls.json (the rest are the same in both).
KEYWORDS = {"userId": "user_id", "anonymousId": "anonymous_id", "groupId": "group_id", "previousId": "previous_id"}


def main(sdk: str, host: str, write_key: str) -> int:
    client_class = importlib.import_module(MODULES[sdk]).Client
    errors: list[str] = []
    client = client_class(write_key=write_key, host=host, max_retries=0,
                          on_error=lambda error, _batch: errors.append(repr(error)))
    calls = json.loads((Path(__file__).parent / "calls.json").read_text())["calls"]
    for call in calls:
        getattr(client, call["type"])(**{KEYWORDS.get(key, key): value for key, value in call["message"].items()})
    client.flush()
    client.join()
    for error in errors:
        print(f"{sdk}: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
