"""The console: a page served by ``serve`` (under ``/console``) where a person finds a message and sees what happened.

Takes in: requests from a browser signed in with the admin token (``PREFECT_WEBHOOKS_ADMIN_TOKEN``). Hands on:
pages read from the store (destinations and endpoints with their health, outcomes per minute, top failure reasons,
message search and detail with every attempt) and actions through the command line's own paths (send a message
again, replay a window, enable or disable an endpoint), each behind a confirmation and safe against cross-site
requests (``access``).
"""

from prefect_webhooks.console.routes import add_console_routes

__all__ = ["add_console_routes"]
