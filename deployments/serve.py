"""Serve entry point: the same deployments as ``prefect.yaml``, with their schedules, in one ``prefect.serve``.

Run it with ``python -m deployments.serve`` (``prefect-webhooks serve`` runs it next to the ingest API).

Deployments (``flow/deployment``) and schedules:

- ``deliver/continuous``: every ``deliver_interval_seconds`` (60 s); each run polls the outbox for
  ``deliver_run_seconds`` (75 s), so consecutive runs overlap and delivery is continuous. ``prefect-webhooks serve``
  passes ``--no-deliver`` and runs this deployment in its delivery workers instead (no schedule; see
  ``prefect_webhooks.delivery_worker``).
- ``deletions/interval``: every ``deletions_interval_seconds`` (60 s); carries out requested deletions.
- ``replay/on-demand``: no schedule; run it with parameters to put failed messages back to pending.
- ``audience-sync/<name>``: one per entry of the audiences file, on that entry's cron.

The audiences file (``PREFECT_WEBHOOKS_AUDIENCES_FILE``, default ``<home>/audiences.yaml``) is a YAML list::

    - name: vip-users
      cron: "*/15 * * * *"
      parameters:
        definition: {name: VIP Users, sources: [web-app], snapshot: {kind: csv, path: /data/vip.csv}}
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from pydantic import BaseModel, ConfigDict, Field

from prefect_webhooks.settings import WebhooksSettings, get_settings

DELIVER_DEPLOYMENT = "continuous"
DELETIONS_DEPLOYMENT = "interval"
REPLAY_DEPLOYMENT = "on-demand"
TAGS = ["prefect-webhooks"]


class AudienceSchedule(BaseModel):
    """One served audience sync: a deployment name, its cron and the flow's parameters."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Deployment name: audience-sync/<name>.")
    cron: str | None = Field(default=None, description="Cron schedule; none means on demand only.")
    timezone: str = Field(default="UTC", description="Time zone of the cron schedule.")
    parameters: dict[str, Any] = Field(default_factory=dict, description="Parameters of the audience_sync flow.")


def audiences_path(settings: WebhooksSettings) -> Path:
    """Where the audiences file is read from."""
    return Path(settings.audiences_file) if settings.audiences_file else settings.home / "audiences.yaml"


def load_audience_schedules(path: Path) -> list[AudienceSchedule]:
    """Read the audiences file; no file means no audience deployments.

    Raises:
        ValueError: when the file is not a YAML list of ``{name, cron, parameters}`` entries.
    """
    if not path.exists():
        return []
    entries = yaml.safe_load(path.read_text()) or []
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a YAML list of audience syncs")
    return [AudienceSchedule.model_validate(entry) for entry in entries]


def _deployment(flow: Any, name: str, **options: Any) -> RunnerDeployment:
    # Module paths work from any working directory once the package is installed.
    return flow.to_deployment(name=name, tags=TAGS, entrypoint_type=EntrypointType.MODULE_PATH, **options)


def deliver_deployment(settings: WebhooksSettings | None = None, *, schedule: bool = True) -> RunnerDeployment:
    """``deliver/continuous``: scheduled for a runner or a work pool, or unscheduled for delivery workers.

    With ``schedule`` a run starts every ``deliver_interval_seconds`` and delivers for ``deliver_run_seconds``
    (longer), so consecutive runs overlap while the next run's process starts (leases keep their claims apart).
    Without it, the delivery workers of ``prefect-webhooks serve`` (``prefect_webhooks.delivery_worker``) start its
    runs back to back in their own processes, each handing over to the next once that one claims.
    """
    from flows.deliver import deliver

    settings = settings or get_settings()
    options: dict[str, Any] = {}
    if schedule:
        options["interval"] = timedelta(seconds=settings.deliver_interval_seconds)
        description = ("Delivers due outbox messages: a run every deliver_interval_seconds, each delivering for "
                       "run_for_seconds, so consecutive runs overlap.")
    else:
        description = ("Delivers due outbox messages continuously: the delivery workers of `prefect-webhooks serve` "
                       "start a run every deliver_interval_seconds; each hands over to the next once it claims.")
    return _deployment(deliver, DELIVER_DEPLOYMENT, parameters={"run_for_seconds": settings.deliver_run_seconds},
                       description=description, **options)


def build_deployments(settings: WebhooksSettings | None = None, *, deliver: bool = True) -> list[RunnerDeployment]:
    """The deployments to serve, with schedules from the settings and the audiences file.

    ``deliver=False`` leaves ``deliver/continuous`` out (``prefect-webhooks serve`` runs it in delivery workers).
    """
    from flows.audience_sync import audience_sync
    from flows.deletions import deletions
    from flows.replay import replay

    settings = settings or get_settings()
    deployments = [
        *([deliver_deployment(settings)] if deliver else []),
        _deployment(
            deletions,
            DELETIONS_DEPLOYMENT,
            interval=timedelta(seconds=settings.deletions_interval_seconds),
            description="Processes requested deletions: delete messages per affected source.",
        ),
        _deployment(replay, REPLAY_DEPLOYMENT, description="Puts failed messages back to pending (on demand)."),
    ]
    for audience in load_audience_schedules(audiences_path(settings)):
        schedule: dict[str, Any] = {"cron": audience.cron} if audience.cron else {}
        deployments.append(
            _deployment(
                audience_sync,
                audience.name,
                parameters=audience.parameters,
                description=f"Audience sync {audience.name}.",
                **schedule,
            )
        )
    return deployments


def main(argv: list[str] | None = None) -> None:
    """Serve every deployment until SIGTERM/SIGINT."""
    from prefect import serve

    parser = argparse.ArgumentParser(prog="python -m deployments.serve", description=main.__doc__)
    parser.add_argument("--limit", type=int, default=None, help="most flow runs executed at once")
    parser.add_argument("--no-deliver", action="store_true",
                        help="leave deliver/continuous to delivery workers (prefect-webhooks serve runs them)")
    args = parser.parse_args(argv)
    serve(*build_deployments(deliver=not args.no_deliver), limit=args.limit, print_starting_message=False)


if __name__ == "__main__":
    main()
