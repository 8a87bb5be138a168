"""The deployments of prefect-webhooks (installed as ``prefect_webhooks.deployments``).

``prefect.yaml`` beside this file defines them once; ``serve`` serves that definition, ``prefect deploy`` deploys it
to a work pool.
"""
