"""The client's one logger, ``prefect_webhooks.client``, and ``DEBUG=analytics``."""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("prefect_webhooks.client")


def debug_requested() -> bool:
    """Whether the ``DEBUG`` environment variable names ``analytics`` (comma-separated, as the ``debug`` package)."""
    return "analytics" in [part.strip() for part in os.environ.get("DEBUG", "").split(",")]


def enable_debug_logging() -> None:
    """Log the client at DEBUG to stderr (once per process)."""
    if any(getattr(handler, "_prefect_webhooks_debug", False) for handler in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler._prefect_webhooks_debug = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
