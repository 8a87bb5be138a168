"""Serving: the processes of ``prefect-webhooks serve`` on one machine. ``service`` supervises them: the ingest API
(uvicorn, one or several processes on one port) with ``/metrics`` and ``/health/backlog``, the delivery workers
and the runner of the other served deployments. A ``delivery_worker`` runs the ``deliver/continuous`` deployment's
runs back to back in one warm process. It takes in the settings and the deployments file and hands on running
processes; stopping ``serve`` stops them all.

Names load on first use: the command line starts children before it loads Prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_webhooks.utilities.exports import lazy_exports

if TYPE_CHECKING:
    from prefect_webhooks.serving.delivery_worker import DeliveryWorker
    from prefect_webhooks.serving.service import create_service_app, serve

__all__ = ["DeliveryWorker", "create_service_app", "serve"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "DeliveryWorker": "prefect_webhooks.serving.delivery_worker",
    "create_service_app": "prefect_webhooks.serving.service",
    "serve": "prefect_webhooks.serving.service",
})
