"""What a delivering run did: messages by outcome, and requests and latencies per endpoint (the run's artifacts)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prefect_webhooks.delivery.sending.sender import RequestResult, display_url
from prefect_webhooks.messages.outcomes import DELIVERED, RETRY


@dataclass
class EndpointStats:
    """Per-URL request counts and latencies of one delivering run."""

    destination: str
    url: str
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """One table-artifact row."""
        latencies = sorted(self.latencies_ms)
        return {
            "destination": self.destination,
            "endpoint": display_url(self.url),
            "delivered": self.delivered,
            "retried": self.retried,
            "failed": self.failed,
            "p50_ms": round(_percentile(latencies, 0.50), 1),
            "p95_ms": round(_percentile(latencies, 0.95), 1),
        }


def _slug(destination: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", destination.lower()).strip("-")[:40] or "destination"


def artifact_key(destination: str, url: str) -> str:
    """A stable artifact key per endpoint, so the UI shows each endpoint's history across runs (the console links
    to it)."""
    return f"delivery-{_slug(destination)}-{hashlib.sha1(url.encode()).hexdigest()[:10]}"


def filtered_artifact_key(destination: str) -> str:
    """A stable artifact key per destination for what its filters dropped."""
    return f"filtered-{_slug(destination)}-{hashlib.sha1(destination.encode()).hexdigest()[:10]}"


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted values, interpolated as ``statistics.quantiles(method="inclusive")``.

    Read straight from the sorted list: a run of a busy delivery worker holds hundreds of thousands of latencies,
    and ``statistics.quantiles`` would sort them again on the worker's event loop.
    """
    if not ordered:
        return 0.0
    if len(ordered) == 1:
        return ordered[0]
    position = fraction * (len(ordered) - 1)
    below = int(position)
    if below + 1 >= len(ordered):
        return ordered[-1]
    return ordered[below] + (ordered[below + 1] - ordered[below]) * (position - below)


@dataclass
class MessageCounts:
    """Messages by what became of them."""

    delivered: int = 0
    failed: int = 0
    rescheduled: int = 0
    filtered: int = 0

    def add(self, other: MessageCounts) -> None:
        """Add ``other``'s counts to these."""
        self.delivered += other.delivered
        self.failed += other.failed
        self.rescheduled += other.rescheduled
        self.filtered += other.filtered

    def counts(self) -> dict[str, int]:
        """The counts as a dict, for logs and results."""
        return {"delivered": self.delivered, "failed": self.failed, "rescheduled": self.rescheduled,
                "filtered": self.filtered}


@dataclass
class DeliveryStats(MessageCounts):
    """What a delivering run did: messages by outcome and requests per endpoint."""

    batches: int = 0
    endpoints: dict[tuple[str, str], EndpointStats] = field(default_factory=dict)
    filtered_by_rule: dict[tuple[str, str], int] = field(default_factory=dict)
    """Filtered messages per (destination, reason naming the rule)."""

    def add_requests(self, destination: str, results: Sequence[RequestResult]) -> None:
        """Count requests (2xx → delivered, retryable → retried, permanent → failed) and their latencies."""
        for result in results:
            stats = self.endpoints.get((destination, result.url))
            if stats is None:
                stats = self.endpoints[(destination, result.url)] = EndpointStats(destination, result.url)
            if result.outcome == DELIVERED:
                stats.delivered += 1
            elif result.outcome == RETRY:
                stats.retried += 1
            else:
                stats.failed += 1
            stats.latencies_ms.append(result.latency_ms)

    def summary(self) -> dict[str, int]:
        """Message counts for flow results."""
        return {**self.counts(), "batches": self.batches}

    def in_words(self) -> str:
        """The counts as a person reads them in a log line."""
        return summary_in_words(self.summary())


def summary_in_words(summary: dict[str, int]) -> str:
    """``{'delivered': 3, 'failed': 0, 'rescheduled': 8, 'filtered': 0, 'batches': 2}`` as "3 delivered, 8 to be
    retried, in 2 batches" (counts of 0 left out; nothing at all said as such)."""
    names = {"delivered": "delivered", "failed": "failed", "rescheduled": "to be retried", "filtered": "filtered"}
    said = [f"{summary[key]:,} {name}" for key, name in names.items() if summary.get(key)]
    batches = summary.get("batches", 0)
    if not said:
        return "no message due" if not batches else f"nothing sent in {batches:,} batch(es)"
    return f"{', '.join(said)} in {batches:,} batch{'es' if batches != 1 else ''}"
