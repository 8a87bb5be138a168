"""The modules that moved, importable by their old names: when the package was grouped into one folder per stage,
and when ``store/`` and ``delivery/`` were grouped into one folder per mechanism.

``import prefect_webhooks.metrics`` still works and gives ``prefect_webhooks.store.figures.metrics`` (the same module
object, so a name patched through either path is patched for both), with a ``DeprecationWarning`` naming the new
path; ``python -m`` runs an old path too. An old name may sit inside a package: ``prefect_webhooks.store.log_rows``
gives ``prefect_webhooks.store.log.rows`` (the package is imported as usual; only the module it no longer holds is
found here). New code uses the new paths. The store's and delivery's old paths are removed on 2027-06-01
(docs/changelog.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

# Old module → its successor, both under ``prefect_webhooks``. A module split in two names the part that holds what
# users imported from it. An old name with a dot is a module of a package that still exists (``store.log_rows``).
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
    # store/ and delivery/ grouped by mechanism (docs/changelog.md): removed on 2027-06-01.
    "delivery.answers": "delivery.sending.answers",
    "delivery.auth": "delivery.sending.auth",
    "delivery.batch": "delivery.batches.batch",
    "delivery.batch_bodies": "delivery.sending.batch_bodies",
    "delivery.batching": "delivery.batches.batching",
    "delivery.circuit": "delivery.sending.circuit",
    "delivery.claims": "delivery.batches.claims",
    "delivery.context": "delivery.pacing.context",
    "delivery.controls": "delivery.pacing.controls",
    "delivery.decision": "delivery.pacing.decision",
    "delivery.destinations": "delivery.sending.destinations",
    "delivery.endpoint_admin": "delivery.endpoints.admin",
    "delivery.events": "delivery.endpoints.events",
    "delivery.fan_out": "delivery.batches.fan_out",
    "delivery.filters": "delivery.sending.filters",
    "delivery.lifecycle": "delivery.pacing.lifecycle",
    "delivery.network": "delivery.sending.network",
    "delivery.ordering": "delivery.pacing.ordering",
    "delivery.preview": "delivery.endpoints.preview",
    "delivery.rate_limits": "delivery.pacing.rate_limits",
    "delivery.request_shape": "delivery.sending.request_shape",
    "delivery.retry_wakeups": "delivery.pacing.retry_wakeups",
    "delivery.sender": "delivery.sending.sender",
    "delivery.shared_state": "delivery.endpoints.shared_state",
    "delivery.stats": "delivery.endpoints.stats",
    "delivery.task": "delivery.batches.task",
    "delivery.transport": "delivery.sending.transport",
    "delivery.waves": "delivery.batches.waves",
    "store.budget": "store.endpoints.budget",
    "store.bulk_insert": "store.schema.bulk_insert",
    "store.checkpointer": "store.engine.checkpointer",
    "store.clock": "store.schema.clock",
    "store.counters": "store.figures.counters",
    "store.destination_changes": "store.endpoints.destination_changes",
    "store.endpoint_counters": "store.figures.endpoint_counters",
    "store.endpoint_states": "store.endpoints.states",
    "store.engines": "store.engine.engines",
    "store.fan_out": "store.queue.fan_out",
    "store.file_modes": "store.engine.file_modes",
    "store.followers": "store.queue.followers",
    "store.footprint": "store.upkeep.footprint",
    "store.kept_purges": "store.log.kept_purges",
    "store.key_filters": "store.log.key_filters",
    "store.leases": "store.upkeep.leases",
    "store.log_filters": "store.log.filters",
    "store.log_names": "store.log.names",
    "store.log_partitions": "store.log.partitions",
    "store.log_records": "store.log.records",
    "store.log_rows": "store.log.rows",
    "store.log_statements": "store.log.statements",
    "store.lookups": "store.log.lookups",
    "store.message_log": "store.log.message_log",
    "store.message_search": "store.log.message_search",
    "store.metrics": "store.figures.metrics",
    "store.minute_counts": "store.figures.minute_counts",
    "store.ordering": "store.queue.ordering",
    "store.outbox": "store.queue.outbox",
    "store.pacing": "store.log.pacing",
    "store.replay": "store.queue.replay",
    "store.retention": "store.upkeep.retention",
    "store.seen_ids": "store.dedupe.seen_ids",
    "store.tables": "store.schema.tables",
    "store.upgrades": "store.engine.upgrades",
    "store.write_gate": "store.engine.write_gate",
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
    """Finds old module paths of this package (``prefect_webhooks.metrics``, ``prefect_webhooks.store.log_rows``…).

    It sits last on ``sys.meta_path``: a path that still names a module is imported as usual, and an old dotted path
    is asked for here once its package (imported first, as for any submodule) does not hold it any more.
    """

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
