"""No public call silently does nothing: async flows run when called from sync code; every other public coroutine
function has a plain twin (``x``/``ax``, as Prefect's ``save``/``asave``) or is an internal step named below."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import uuid
import warnings

import pytest
from prefect import Flow, Task, flow

import prefect_webhooks
import prefect_webhooks.flows
from prefect_webhooks.blocks.source import Source
from prefect_webhooks.flows.deliver import deliver
from prefect_webhooks.flows.ingest import ingest
from prefect_webhooks.flows.replay import replay
from prefect_webhooks.utilities.sync_flows import SyncCompatibleFlow, sync_compatible

# Coroutine functions that are steps of a flow or of the ingest API's event loop, not calls a user makes: each is
# awaited by the code named here (checked below: the name must still exist and still be a coroutine function).
INTERNAL_STEPS = {
    "prefect_webhooks.inbound.api.read_body": "the ingest API's request handler",
    "prefect_webhooks.blocks.saved.save_block": "async code on every Prefect 3 release (plain code calls Block.save)",
    "prefect_webhooks.blocks.saved.load_block": "async code on every Prefect 3 release (plain code calls Block.load)",
    "prefect_webhooks.delivery.pacing.context.store_call": "deliver_due",
    "prefect_webhooks.blocks.secret_length.saved_short_secret_warnings": "the status command (asyncio.run)",
    "prefect_webhooks.delivery.pacing.lifecycle.fail_where_all_disabled": "process_batch, through before_sending",
    "prefect_webhooks.delivery.batches.batch.process_batch": "deliver_due",
    "prefect_webhooks.delivery.batches.fan_out.bind_to_endpoints": "process_batch (a destination with each_endpoint)",
    "prefect_webhooks.delivery.batches.batching.hold_for_batch_wait": "process_batch (a destination with batch_wait)",
    "prefect_webhooks.delivery.batches.batching.send_batched": "process_batch (a destination with batch_size)",
    "prefect_webhooks.delivery.batches.task.deliver_batches": "the deliver flow's task",
    "prefect_webhooks.delivery.batches.claims.deliver_due":
        "the deliver flow (users run the flow: prefect_webhooks.flows.deliver)",
    "prefect_webhooks.flows.deliver.publish_artifacts": "the deliver flow and a delivery worker's run records",
    "prefect_webhooks.flows.deliver.record_run": "the deliver flow",
    "prefect_webhooks.flows.deliver.finish_ended_rotations": "the deliver flow",
    "prefect_webhooks.flows.catch_up.run_newest_only": "the delivery worker's poll",
    "prefect_webhooks.serving.shifts.end_shifts": "the delivery worker's stop",
    "prefect_webhooks.serving.deletion_runs.start_deletion_runs": "serve's first delivery worker",
    "prefect_webhooks.serving.deletion_runs.start_deletion_run_if_requested": "start_deletion_runs",
    "prefect_webhooks.flows.ingest.ingest_chunk": "the ingest flow (a task)",
    "prefect_webhooks.flows.ingest.load_source": "the ingest flow",
    "prefect_webhooks.flows.ingest.publish_artifacts": "the ingest flow",
    "prefect_webhooks.flows.old_runs.remove_old_runs": "the prune flow (or `prefect-webhooks prune`)",
    "prefect_webhooks.blocks.saved.saved_documents": "rotation and endpoint enabling (block listings)",
    "prefect_webhooks.blocks.enabling.adisable_endpoint": "delivery's endpoint health (disable_after)",
    "prefect_webhooks.blocks.enabling.aenable_endpoints": "`prefect-webhooks endpoint enable`",
    "prefect_webhooks.blocks.enabling.adisable_positions": "`prefect-webhooks endpoint disable`",
    "prefect_webhooks.blocks.enabling.adestinations_with_url": "the replay flow (a replay by endpoint URL)",
    "prefect_webhooks.delivery.endpoints.admin.endpoint_views": "`prefect-webhooks endpoint list`",
    "prefect_webhooks.delivery.endpoints.admin.aenable": "`prefect-webhooks endpoint enable`",
    "prefect_webhooks.delivery.endpoints.admin.adisable": "`prefect-webhooks endpoint disable`",
    "prefect_webhooks.delivery.pacing.controls.before_sending":
        "process_batch (rate limits, order, disabled endpoints)",
    "prefect_webhooks.delivery.pacing.controls.after_sending": "process_batch (endpoint health, pauses)",
    "prefect_webhooks.delivery.pacing.lifecycle.observe_health": "process_batch, through after_sending",
    "prefect_webhooks.delivery.pacing.ordering.sync_ordered": "deliver_due (ordered destinations)",
    "prefect_webhooks.delivery.pacing.ordering.hold_back": "process_batch, through before_sending",
    "prefect_webhooks.delivery.pacing.ordering.take_in_order": "process_batch",
    "prefect_webhooks.delivery.pacing.rate_limits.admit_ready": "process_batch, through before_sending",
    "prefect_webhooks.delivery.pacing.rate_limits.slots_for": "admit_ready and batched sends",
    "prefect_webhooks.delivery.pacing.rate_limits.record_pauses": "process_batch, through after_sending (Retry-After)",
    "prefect_webhooks.delivery.pacing.rate_limits.start_ramp":
        "process_batch, through after_sending (a circuit closed)",
    "prefect_webhooks.delivery.sending.sender.run_paced": "process_batch and batched sends (sends at their slots)",
}


def is_async(value: object) -> bool:
    return inspect.iscoroutinefunction(value.fn if isinstance(value, Task) else value)


def public_members() -> list[tuple[str, object]]:
    found = []
    for package in (prefect_webhooks, prefect_webhooks.flows):
        # Subpackages too (the delivery engine, the client): each module's own names.
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__:
                    found.append((f"{module.__name__}.{name}", value))
    return found


def test_every_public_coroutine_function_has_a_plain_form() -> None:
    missing = []
    for qualified, value in public_members():
        if isinstance(value, Flow):
            if value.isasync and not isinstance(value, SyncCompatibleFlow):
                missing.append(f"{qualified}: async flow not sync_compatible")
            continue
        if not is_async(value) or qualified in INTERNAL_STEPS:
            continue
        module, _, name = qualified.rpartition(".")
        twin = getattr(importlib.import_module(module), name[1:], None) if name.startswith("a") else None
        if twin is None or inspect.iscoroutinefunction(twin):
            missing.append(f"{qualified}: no plain form")
    assert missing == []
    for qualified in INTERNAL_STEPS:
        module, _, name = qualified.rpartition(".")
        assert is_async(getattr(importlib.import_module(module), name)), qualified


def test_a_flow_called_from_sync_code_runs(prefect_harness: None, store_url: str) -> None:
    name = f"plain-{uuid.uuid4().hex[:8]}"
    Source(write_key=uuid.uuid4().hex, destinations=["crm"]).save(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        summary = ingest(name, [{"type": "track", "userId": "u1", "event": "E", "messageId": "m1"}])
        assert summary["accepted"] == 1 and summary["rows_written"] == 1
        assert deliver(destination="nobody-has-this") == {"delivered": 0, "failed": 0, "rescheduled": 0,
                                                           "filtered": 0, "batches": 0}
        assert replay(destination="nobody-has-this") == 0


async def test_an_async_caller_still_awaits_it(prefect_harness: None, store_url: str) -> None:
    call = replay(destination="nobody-has-this")
    assert inspect.isawaitable(call)
    assert await call == 0


def test_sync_compatible_refuses_what_is_not_an_async_flow() -> None:
    @flow
    def plain() -> None:
        return None

    with pytest.raises(TypeError):
        sync_compatible(plain)
