"""The modules that moved when the package was grouped into one folder per stage, importable by their old names.

``import prefect_webhooks.metrics`` still works and gives ``prefect_webhooks.store.figures.metrics`` (the same module
object, so a name patched through either path is patched for both), with a ``DeprecationWarning`` naming the new
path; ``python -m`` runs an old path too. New code uses the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

# Old module → its successor. A module split in two names the part that holds what users imported from it.
MOVED_MODULES = {
    "api": "inbound.api",
    "audience_definition": "audiences.definition",
    "audience_diff": "audiences.diff",
    "audience_registry": "audiences.registry",
    "batch_writer": "inbound.batch_writer",
    "circuit": "delivery.sending.circuit",
    "delivery_worker": "serving.delivery_worker",
    "demo_receiver": "demo.receiver",
    "demo_stack": "demo.stack",
    "destinations": "delivery.sending.destinations",
    "envelope": "inbound.envelope",
    "events": "delivery.endpoints.events",
    "filters": "blocks.filter_rules",
    "ingest": "inbound.ingestion",
    "message_headers": "signing.headers",
    "metrics": "store.figures.metrics",
    "naming": "audiences.naming",
    "network": "delivery.sending.network",
    "outbox": "store.queue.outbox",
    "outcomes": "messages.outcomes",
    "payloads": "messages.payloads",
    "retry": "messages.retry",
    "rotation": "blocks.rotation",
    "routing": "inbound.routing",
    "runtime": "utilities.runtime",
    "saved_blocks": "blocks.saved",
    "service": "serving.service",
    "snapshots": "audiences.snapshots",
    "sources": "inbound.sources",
    "sync_flows": "utilities.sync_flows",
    "tables": "utilities.tables",
    "timestamps": "messages.timestamps",
    "webhook_endpoint": "blocks.endpoint",
}
_PACKAGE = "prefect_webhooks"


class _MovedModuleLoader(importlib.abc.Loader):
    """Gives the successor module for an old name (``python -m`` gets the successor's code)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{self.old} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self._successor_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The successor is already executed; importlib gave it the old name's spec, which is given back here.
        module.__spec__ = self._successor_spec

    def get_code(self, fullname: str) -> CodeType | None:
        spec = importlib.util.find_spec(self.new)
        assert spec is not None and spec.loader is not None
        return spec.loader.get_code(self.new)  # type: ignore[attr-defined]


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds old module paths of this package (``prefect_webhooks.metrics``…)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != _PACKAGE or name not in MOVED_MODULES:
            return None
        new = f"{_PACKAGE}.{MOVED_MODULES[name]}"
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(fullname, new))


def install() -> None:
    """Make the old module paths importable (once per process)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
