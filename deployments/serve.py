"""Serve entry point: the deployments defined in ``prefect.yaml``, with their schedules, in one ``prefect.serve``.

Run it with ``python -m prefect_webhooks.deployments.serve`` (``prefect-webhooks serve`` runs it next to the ingest
API). ``prefect.yaml`` beside this file is the one definition of the deployments (names, entrypoints, schedules,
parameters, descriptions): ``prefect deploy --prefect-file deployments/prefect.yaml`` deploys the same ones to a
work pool. ``PREFECT_WEBHOOKS_DEPLOYMENTS_FILE`` points serve at an edited copy.

Deployments (``flow/deployment``) as shipped:

- ``deliver/continuous``: every 60 s; each run claims due messages for 75 s, so consecutive runs overlap and
  delivery does not pause. ``prefect-webhooks serve`` leaves it out here (``--no-deliver``) and runs its runs in
  warm delivery workers instead (``prefect_webhooks.serving.delivery_worker``), with the same definition; they pace
  the runs themselves (a run per interval while messages flow, one an hour while none do), without a schedule.
- ``deletions/interval``: every 60 s; carries out requested deletions. ``prefect-webhooks serve`` serves it without
  the schedule and its first delivery worker starts a run when a request waits (``serving.deletion_runs``).
- ``prune/retention``: every 300 s; a retention pass. ``prefect-webhooks serve`` leaves it out here (``--no-prune``)
  and runs its passes in its pruner every ``PREFECT_WEBHOOKS_RETENTION_INTERVAL`` instead.
- ``replay/on-demand``: no schedule; run it with parameters to put failed messages back to pending.
- ``audience-sync/<name>``: one per entry of the audiences file, on that entry's cron.

The audiences file (``PREFECT_WEBHOOKS_AUDIENCES_FILE``, default ``<home>/audiences.yaml``) is a YAML list::

    - name: vip-users
      cron: "*/15 * * * *"
      parameters:
        definition: {name: VIP Users, sources: [web-app], snapshot: {kind: csv, path: /data/vip.csv}}
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from prefect.client.schemas.actions import DeploymentScheduleCreate
from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule, RRuleSchedule
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.flows import load_flow_from_entrypoint
from pydantic import BaseModel, ConfigDict, Field

from prefect_webhooks.settings import WebhooksSettings, get_settings

DEFINITION_FILE = Path(__file__).with_name("prefect.yaml")
DELIVER_DEPLOYMENT = "continuous"
DELETIONS_DEPLOYMENT = "interval"
PRUNE_ENTRYPOINT = "prefect_webhooks.flows.prune.prune"
REPLAY_DEPLOYMENT = "on-demand"
AUDIENCE_SYNC_ENTRYPOINT = "prefect_webhooks.flows.audience_sync.audience_sync"
TAGS = ["prefect-webhooks"]
# What the deletions deployment's description adds in the Prefect UI when serve starts its runs.
DELETIONS_ON_DEMAND = ("Served by prefect-webhooks serve, whose delivery worker starts a run when a deletion request "
                       "waits (checked every schedule interval), instead of a run every interval.")

# The keys of a prefect.yaml deployment that serve applies; `work_pool` only concerns `prefect deploy`.
_SERVED_KEYS = {"name", "entrypoint", "description", "tags", "parameters", "schedules", "version"}
_WORK_POOL_KEYS = {"work_pool"}
_SCHEDULE_KEYS = {"interval", "cron", "rrule", "timezone", "active"}
# Settings that once set the served schedules; the deployments file holds them now, so serve and deploy agree.
_REPLACED_SETTINGS = (
    "PREFECT_WEBHOOKS_DELIVER_INTERVAL_SECONDS",
    "PREFECT_WEBHOOKS_DELIVER_RUN_SECONDS",
    "PREFECT_WEBHOOKS_DELETIONS_INTERVAL_SECONDS",
)


class AudienceSchedule(BaseModel):
    """One served audience sync: a deployment name, its cron and the flow's parameters."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Deployment name: audience-sync/<name>.")
    cron: str | None = Field(default=None, description="Cron schedule; none means on demand only.")
    timezone: str = Field(default="UTC", description="Time zone of the cron schedule.")
    parameters: dict[str, Any] = Field(default_factory=dict, description="Parameters of the audience_sync flow.")


def audiences_path(settings: WebhooksSettings) -> Path:
    """Where the audiences file is read from."""
    configured = settings.serve.audiences_file
    return Path(configured) if configured else settings.store.home / "audiences.yaml"


def deployments_path(settings: WebhooksSettings) -> Path:
    """The prefect.yaml whose deployments are served: the setting's, or the one shipped with the package."""
    return Path(settings.serve.deployments_file) if settings.serve.deployments_file else DEFINITION_FILE


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


def audience_entry(audience: AudienceSchedule) -> dict[str, Any]:
    """The prefect.yaml deployment entry of one audience sync (serve builds it from this entry, like the others)."""
    schedules = [{"cron": audience.cron, "timezone": audience.timezone, "active": True}] if audience.cron else []
    return {
        "name": audience.name,
        "entrypoint": AUDIENCE_SYNC_ENTRYPOINT,
        "description": f"Audience sync {audience.name}.",
        "tags": list(TAGS),
        "parameters": audience.parameters,
        "schedules": schedules,
    }


def load_definitions(path: Path = DEFINITION_FILE) -> list[dict[str, Any]]:
    """The deployment entries of a prefect.yaml, YAML anchors resolved.

    Raises:
        ValueError: when the file has no ``deployments`` list, or an entry has no name or entrypoint.
    """
    document = yaml.safe_load(path.read_text()) or {}
    entries = document.get("deployments") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a prefect.yaml with a `deployments` list")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("entrypoint"):
            raise ValueError(f"{path}: deployments[{index}] needs a `name` and an `entrypoint`")
    return entries


def write_definitions(
    path: Path, changes: Mapping[str, Mapping[str, Any]], source: Path = DEFINITION_FILE
) -> Path:
    """Write a copy of a prefect.yaml with some fields of named deployments replaced; returns ``path``.

    Args:
        path: Where to write the copy.
        changes: Deployment name → the fields to replace in that entry (for example
            ``{"continuous": {"schedules": [{"interval": 20}], "parameters": {"run_for_seconds": 15}}}``).
        source: The prefect.yaml to copy; the one shipped with the package by default.

    Raises:
        KeyError: when a deployment named in ``changes`` is not in the file.
    """
    document = yaml.safe_load(source.read_text())
    entries = {entry["name"]: entry for entry in document["deployments"]}
    for name, fields in changes.items():
        if name not in entries:
            raise KeyError(f"no deployment named {name!r} in {source}")
        entries[name].update(copy.deepcopy(dict(fields)))
    # Anchors are written out in full: the copy stands on its own.
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def deployment_schedule(config: Mapping[str, Any]) -> DeploymentScheduleCreate:
    """A prefect.yaml schedule: ``interval`` (seconds), ``cron`` or ``rrule``, with ``timezone`` and ``active``.

    Raises:
        ValueError: for a key serve does not apply, or a schedule with none of interval, cron and rrule.
    """
    unknown = set(config) - _SCHEDULE_KEYS
    if unknown:
        raise ValueError(f"schedule keys not supported by serve: {', '.join(sorted(unknown))}")
    options = {"timezone": config["timezone"]} if config.get("timezone") else {}
    if config.get("cron"):
        schedule: Any = CronSchedule(cron=config["cron"], **options)
    elif config.get("interval"):
        schedule = IntervalSchedule(interval=timedelta(seconds=config["interval"]), **options)
    elif config.get("rrule"):
        schedule = RRuleSchedule(rrule=config["rrule"], **options)
    else:
        raise ValueError(f"a schedule needs interval, cron or rrule: {dict(config)}")
    return DeploymentScheduleCreate(schedule=schedule, active=config.get("active", True))


def served_deployment(entry: Mapping[str, Any]) -> RunnerDeployment:
    """A ``RunnerDeployment`` built from one prefect.yaml deployment entry.

    Raises:
        ValueError: for a key that serve would not apply (it would otherwise be silently ignored).
    """
    unknown = set(entry) - _SERVED_KEYS - _WORK_POOL_KEYS
    if unknown:
        raise ValueError(f"deployment {entry['name']!r}: keys not supported by serve: {', '.join(sorted(unknown))}")
    entrypoint = str(entry["entrypoint"])
    flow = load_flow_from_entrypoint(entrypoint)
    return flow.to_deployment(
        name=entry["name"],
        description=entry.get("description"),
        tags=list(entry.get("tags") or []),
        parameters=dict(entry.get("parameters") or {}),
        schedules=[deployment_schedule(schedule) for schedule in entry.get("schedules") or []],
        version=entry.get("version"),
        # Module paths work from any working directory once the package is installed.
        entrypoint_type=EntrypointType.FILE_PATH if ":" in entrypoint else EntrypointType.MODULE_PATH,
    )


def deliver_definition(settings: WebhooksSettings | None = None) -> dict[str, Any]:
    """The ``deliver/continuous`` entry of the deployments file (the delivery workers run it).

    Raises:
        ValueError: when the deployments file has no deployment of that name.
    """
    return definition_named(DELIVER_DEPLOYMENT, settings)


def build_deployments(
    settings: WebhooksSettings | None = None,
    *,
    deliver: bool = True,
    prune: bool = True,
    deletions_on_demand: bool = False,
) -> list[RunnerDeployment]:
    """The deployments to serve: those of the deployments file, then one per entry of the audiences file.

    ``deliver=False`` leaves ``deliver/continuous`` out: the delivery workers of ``prefect-webhooks serve`` run it.
    ``prune=False`` leaves out the deployments of the ``prune`` flow: ``serve``'s pruner runs a pass every
    ``PREFECT_WEBHOOKS_RETENTION_INTERVAL`` in its own process. ``deletions_on_demand=True`` serves
    ``deletions/interval`` without its schedule: ``serve``'s first delivery worker starts a run when a request waits
    (``serving.deletion_runs``).

    Raises:
        ValueError: when a setting that no longer applies is set (it would be silently ignored otherwise).
    """
    replaced = [name for name in _REPLACED_SETTINGS if name in os.environ]
    if replaced:
        raise ValueError(
            f"{', '.join(replaced)} no longer set(s) the served schedules: edit a copy of deployments/prefect.yaml "
            "and set PREFECT_WEBHOOKS_DEPLOYMENTS_FILE to it"
        )
    settings = settings or get_settings()
    entries = [entry for entry in load_definitions(deployments_path(settings))
               if (deliver or entry["name"] != DELIVER_DEPLOYMENT)
               and (prune or entry["entrypoint"] != PRUNE_ENTRYPOINT)]
    if deletions_on_demand:
        entries = [without_schedule(entry, DELETIONS_ON_DEMAND) if entry["name"] == DELETIONS_DEPLOYMENT else entry
                   for entry in entries]
    entries += [audience_entry(audience) for audience in load_audience_schedules(audiences_path(settings))]
    return [served_deployment(entry) for entry in entries]


def without_schedule(entry: Mapping[str, Any], who_starts_runs: str) -> dict[str, Any]:
    """A deployment entry as ``serve`` registers it when something of its own starts the runs (a run each interval
    would mostly find nothing): no schedule, and the description saying who starts them."""
    description = " ".join(part for part in (entry.get("description"), who_starts_runs) if part)
    return {**entry, "schedules": [], "description": description}


def schedule_interval(entry: Mapping[str, Any]) -> float | None:
    """The shortest active interval schedule of a deployment entry, in seconds; None without one."""
    intervals = [float(schedule["interval"]) for schedule in entry.get("schedules") or []
                 if schedule.get("interval") and schedule.get("active", True)]
    return min(intervals) if intervals else None


def definition_named(name: str, settings: WebhooksSettings | None = None) -> dict[str, Any]:
    """The entry of the deployments file named ``name``.

    Raises:
        ValueError: when the deployments file has no deployment of that name.
    """
    path = deployments_path(settings or get_settings())
    for entry in load_definitions(path):
        if entry["name"] == name:
            return entry
    raise ValueError(f"{path}: no deployment named {name!r}")


def main(
    limit: Annotated[
        int | None, typer.Option(help="Most flow runs executed at once (default: Prefect's).", min=1)
    ] = None,
    deliver: Annotated[
        bool,
        typer.Option(help="Serve deliver/continuous too; --no-deliver when delivery workers run it."),
    ] = True,
    prune: Annotated[
        bool,
        typer.Option(help="Serve prune/retention too; --no-prune when serve's pruner runs the passes."),
    ] = True,
    deletions_on_demand: Annotated[
        bool,
        typer.Option(help="Serve deletions/interval without its schedule: a delivery worker starts its runs."),
    ] = False,
) -> None:
    """Serve every deployment (deployments file and audiences file) until SIGTERM/SIGINT.

    It serves only once the Prefect API answers, after settling the runs an outage left, and stops when the API has
    been unreachable for a while (``deployments.outages``): ``prefect-webhooks serve`` starts it again.
    """
    from prefect import serve

    from prefect_webhooks.deployments.outages import restart_when_unreachable, settle_missed_runs, wait_for_api

    deployments = build_deployments(deliver=deliver, prune=prune, deletions_on_demand=deletions_on_demand)
    wait_for_api()
    settle_missed_runs(deployments)
    if not deliver:
        # Not while it runs deliver/continuous itself (no delivery workers): its runs deliver through an outage.
        restart_when_unreachable()
    serve(*deployments, limit=limit, print_starting_message=False)


if __name__ == "__main__":
    typer.run(main)
