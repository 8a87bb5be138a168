"""Which Prefect server the commands talk to, and never a hidden one.

Without an API URL, Prefect starts a temporary server inside whichever process first calls it (its "ephemeral
mode", on in Prefect's default profile): ``serve`` would run each of its processes against a server of its own that
loses its records at exit. The commands that need Prefect therefore ask for an API URL up front, and the processes
they start are forbidden to start a temporary server.
"""

from __future__ import annotations

import os
import sys

START_A_SERVER = ("set PREFECT_API_URL to a running Prefect server: run `prefect server start` in another terminal, "
                  "then `export PREFECT_API_URL=http://127.0.0.1:4200/api` (or use Prefect Cloud)")


def prefect_api_url() -> str | None:
    """The Prefect API URL: ``PREFECT_API_URL`` from the environment, else from Prefect's active profile; None when
    neither sets one. Prefect's settings are only read when the environment has none (they take a moment to load)."""
    url = os.environ.get("PREFECT_API_URL", "").strip()
    if url:
        return url
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or None


def require_prefect_api(*, export: bool = False) -> str:
    """The Prefect API URL; with ``export``, also put in this process's environment, with temporary servers
    forbidden, for the processes it starts (whose Prefect profile could differ).

    Raises:
        LookupError: no API URL is set; the message says what to set and how to start a server.
    """
    url = prefect_api_url()
    if not url:
        raise LookupError(f"no Prefect server: {START_A_SERVER}")
    if export:
        os.environ["PREFECT_API_URL"] = url
        # The alias every Prefect 3 release reads (``server.ephemeral.enabled``).
        os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"
    return url


def exit_without_prefect_api(command: str, also: str = "") -> None:
    """Exit with status 1 and one line saying what to set when no Prefect API URL is set: a command that needs
    Prefect would otherwise start a temporary server that loses its records.

    Raises:
        SystemExit: no API URL is set.
    """
    try:
        require_prefect_api()
    except LookupError as exc:
        print(f"{command}: {exc}" + (f"; {also}" if also else ""), file=sys.stderr)
        raise SystemExit(1) from None
