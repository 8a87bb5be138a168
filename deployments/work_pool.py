"""``prefect-webhooks deploy --pool NAME``: the served deployments, deployed to a process work pool from the installed
package.

The deployments are built exactly as ``serve`` builds them (the deployments file, ``deployments/prefect.yaml``
unless ``PREFECT_WEBHOOKS_DEPLOYMENTS_FILE`` says otherwise, plus one audience sync per entry of the audiences
file) and applied with the pool: the same names, entrypoints (module paths, so a worker runs the installed package
from any folder), schedules and parameters as ``prefect deploy --prefect-file deployments/prefect.yaml``, without a
clone or a ``prefect.yaml`` at hand. The pool is created (type ``process``) when it does not exist, and a first
``deliver/continuous`` run is created for now, so delivery starts as soon as a worker polls instead of at the
schedule's next slot.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from prefect_webhooks.deployments.serve import DELIVER_DEPLOYMENT, build_deployments
from prefect_webhooks.settings import WebhooksSettings

POOL_TYPE = "process"
DELIVER = f"deliver/{DELIVER_DEPLOYMENT}"


@dataclass(frozen=True)
class PoolDeployment:
    """What ``deploy_to_work_pool`` did."""

    pool: str
    pool_created: bool
    deployments: list[str]
    first_deliver_run: UUID | None


async def _ensure_pool(pool: str) -> bool:
    """Create the work pool ``pool`` (type process) unless it exists; True when it was created."""
    async with get_client() as client:
        try:
            existing = await client.read_work_pool(pool)
        except ObjectNotFound:
            await client.create_work_pool(WorkPoolCreate(name=pool, type=POOL_TYPE))
            return True
    if existing.type != POOL_TYPE:
        raise ValueError(f"work pool {pool!r} is of type {existing.type!r}; the deployments need a {POOL_TYPE!r} pool "
                         "(a worker on a host with the package installed)")
    return False


async def adeploy_to_work_pool(
    pool: str, *, start_delivery: bool = True, settings: WebhooksSettings | None = None
) -> PoolDeployment:
    """Deploy the served deployments to the process work pool ``pool`` and start a first deliver run.

    Args:
        pool: Work pool name; created (type process) when missing. Names starting with ``prefect`` are reserved by
            Prefect.
        start_delivery: Create a ``deliver/continuous`` run for now, so delivery starts at a worker's next poll.
        settings: The settings (deployments and audiences files); the environment's by default.

    Raises:
        ValueError: the pool exists with another type, or a deployments file entry is refused (as by ``serve``).
    """
    # Built in a thread: Prefect's to_deployment would hand back a coroutine inside this event loop.
    deployments = await asyncio.to_thread(build_deployments, settings)
    created = await _ensure_pool(pool)
    names = []
    for deployment in deployments:
        await deployment.apply(work_pool_name=pool, _sync=False)  # type: ignore[call-arg,misc]
        names.append(f"{deployment.flow_name}/{deployment.name}")
    first_run = None
    if start_delivery and DELIVER in names:
        flow_run = await run_deployment(DELIVER, timeout=0)  # type: ignore[misc]
        first_run = flow_run.id
    return PoolDeployment(pool=pool, pool_created=created, deployments=names, first_deliver_run=first_run)


def deploy_to_work_pool(
    pool: str, *, start_delivery: bool = True, settings: WebhooksSettings | None = None
) -> PoolDeployment:
    """``adeploy_to_work_pool`` for sync code (the command line)."""
    return asyncio.run(adeploy_to_work_pool(pool, start_delivery=start_delivery, settings=settings))
