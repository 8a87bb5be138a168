"""Helpers every stage may use, knowing nothing of messages: tuning for long-running processes and lazy imports
(``runtime``), the Prefect server the commands use (``prefect_api``), lazy re-exports for a package's ``__init__``
(``exports``), flows that run when called from sync code (``sync_flows``), terminal tables as text (``tables``),
URLs with what may hold a secret taken out (``urls``) and the old paths of moved modules (``moved_modules``).
Nothing of the data flow passes through here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_webhooks.utilities.exports import lazy_exports

if TYPE_CHECKING:
    from prefect_webhooks.utilities.runtime import lazy_module, tune_gc_for_serving
    from prefect_webhooks.utilities.sync_flows import sync_compatible
    from prefect_webhooks.utilities.tables import table_text

__all__ = ["lazy_exports", "lazy_module", "sync_compatible", "table_text", "tune_gc_for_serving"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "lazy_module": "prefect_webhooks.utilities.runtime",
    "sync_compatible": "prefect_webhooks.utilities.sync_flows",
    "table_text": "prefect_webhooks.utilities.tables",
    "tune_gc_for_serving": "prefect_webhooks.utilities.runtime",
})
