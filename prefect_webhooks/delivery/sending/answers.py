"""What a receiver answered, kept with the attempt: where a receiver says what it refused and why.

A refusal keeps the first ``REFUSAL_BYTES`` of its answer (the receiver's own error message is what support needs);
an acceptance only ``ACCEPTANCE_BYTES`` (room for an acknowledgement id), so a receiver that echoes every message
back does not double what the log keeps. A receiver that echoes the request would hand back what the request carried
(an ``Authorization`` header, an API key, a URL's password): every such value is masked wherever the answer repeats
it, before anything is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

REFUSAL_BYTES = 1024
ACCEPTANCE_BYTES = 64
MASK = "****"
# Shorter values ("1", "yes") are no secret and would mask ordinary words of an answer.
_SHORTEST_MASKED = 8
# Headers every request carries that hold no secret (signatures are digests; the ids name the message): an answer
# that repeats them stays readable. Every other header (an endpoint's own, Authorization) is masked.
_NOT_SECRET = frozenset({"content-type", "content-encoding", "user-agent", "idempotency-key", "x-signature",
                         "webhook-id", "webhook-timestamp", "webhook-signature"})


def answer_excerpt(answer: bytes, status: int, url: str, headers: Mapping[str, str]) -> str | None:
    """The start of ``answer`` to keep with the attempt, with what the request carried masked; None when empty."""
    if not answer:
        return None
    limit = ACCEPTANCE_BYTES if 200 <= status < 300 else REFUSAL_BYTES
    if len(answer) < _SHORTEST_MASKED:  # "ok", "{}": most answers, and too short to hold a secret
        return answer.decode("utf-8", errors="replace")
    secrets = _sent_values(url, headers)
    # Masked before it is cut, so a secret that straddles the cut leaves no prefix behind.
    longest = max((len(secret) for secret in secrets), default=0)
    text = answer[: limit + longest].decode("utf-8", errors="replace")
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text[:limit] if len(text) > limit else text


def _sent_values(url: str, headers: Mapping[str, str]) -> set[str]:
    values = set()
    for name, value in headers.items():
        if name.lower() in _NOT_SECRET:
            continue
        values.add(value)
        values.update(value.split())  # "Bearer <token>": the token may come back alone
    password = urlsplit(url).password if "@" in url else None
    if password:
        values.update((password, unquote(password)))
    return {value for value in values if len(value) >= _SHORTEST_MASKED}
