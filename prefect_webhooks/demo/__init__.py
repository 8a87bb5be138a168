"""The main job, end to end on embedded defaults (``prefect-webhooks demo``, ``scripts/quickstart``): ``stack``
starts a local Prefect server, a receiver that verifies every signature (``receiver``) and ``prefect-webhooks
serve``, and saves the blocks; ``run`` sends every call type through the ``Analytics`` client, runs an audience
sync and a deletion, and reports what the receiver got.
"""

from prefect_webhooks.demo.run import run_demo

__all__ = ["run_demo"]
