"""Command groups and commands of the ``prefect-webhooks`` command line that ``cli`` mounts (``endpoint``, ``replay``).

Takes in a user's command-line arguments and hands them to the stages that do the work (the blocks and the store);
re-exports nothing: ``prefect_webhooks.cli`` is the command line's entry point.
"""
