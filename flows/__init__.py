"""The Prefect flows of prefect-webhooks: ``from prefect_webhooks.flows import deliver, audience_sync, …``.

Installed, this folder is the ``prefect_webhooks.flows`` package. The flows are imported here, not on first use:
each flow has the name of its module, and a lazily filled package attribute would be the module instead of the flow
whenever the module was imported first (as a deployment's entrypoint does).
"""

from prefect_webhooks.flows.audience_sync import audience_sync
from prefect_webhooks.flows.deletions import deletions
from prefect_webhooks.flows.deliver import deliver
from prefect_webhooks.flows.ingest import ingest
from prefect_webhooks.flows.prune import prune
from prefect_webhooks.flows.replay import replay

__all__ = ["audience_sync", "deletions", "deliver", "ingest", "prune", "replay"]
