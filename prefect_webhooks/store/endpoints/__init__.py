"""What every delivering process of a store shares about endpoints and destinations. It takes in what delivery
learns (a receiver's ``Retry-After``, failures in a row, a block changed) and hands back, across processes and
hosts, rate budget slots, pauses and ramps, health transitions decided once, and destinations' block generations.

Read in this order:

- ``states``: an endpoint's row: its request budget cell, pauses and ramps, and its health.
- ``budget``: time slots for requests to rate-limited endpoints (GCRA), messages without one parked in the queue.
- ``destination_changes``: a destination's generation, counted up by a change every process must hear of at once.
"""

from prefect_webhooks.store.endpoints.budget import Admission, Limit, Ramp, admit, release_parked
from prefect_webhooks.store.endpoints.destination_changes import destination_generations, note_destination_changed
from prefect_webhooks.store.endpoints.states import (
    HealthReport,
    needs_recording,
    pause,
    read_states,
    record_health,
    reset_health,
    start_ramps,
    undo_disable,
    url_key,
)

__all__ = [
    "Admission",
    "HealthReport",
    "Limit",
    "Ramp",
    "admit",
    "destination_generations",
    "needs_recording",
    "note_destination_changed",
    "pause",
    "read_states",
    "record_health",
    "release_parked",
    "reset_health",
    "start_ramps",
    "undo_disable",
    "url_key",
]
