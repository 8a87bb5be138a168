"""Settings read from the environment (prefix ``PREFECT_WEBHOOKS_``), grouped by concern.

``get_settings().delivery.request_timeout`` is ``PREFECT_WEBHOOKS_REQUEST_TIMEOUT``: each group reads the same
environment variables as before the grouping, so a deployment's configuration does not change.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, BeforeValidator, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from prefect_webhooks.utilities.durations import duration_seconds

DEFAULT_HOME = Path.home() / ".prefect-webhooks"


# Seconds, written in the environment as ``90``, ``90s``, ``15m``, ``24h`` or ``7d``.
Duration = Annotated[float, BeforeValidator(duration_seconds)]


class _SettingsGroup(BaseSettings):
    """One group of settings; each field maps to ``PREFECT_WEBHOOKS_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="PREFECT_WEBHOOKS_", extra="ignore")


class StoreSettings(_SettingsGroup):
    """The store: where messages are kept."""

    home: Path = Field(default=DEFAULT_HOME, description="Folder for the embedded SQLite store and run files.")
    database_url: str = Field(
        default="",
        description="SQLAlchemy URL of the store; empty means a SQLite file in `home`.",
    )

    def resolved_database_url(self) -> str:
        """The store URL, defaulting to a SQLite file under ``home``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / 'webhooks.db'}"

    def location(self) -> str:
        """Where the store is, to show people: the SQLite file's path, or the URL with its password hidden."""
        return store_location(self.resolved_database_url())


def store_location(url: str) -> str:
    """``url`` as people read it: a SQLite file's path, or the URL with ``***`` for its password.

    The netloc is not parsed into host and port: libpq's several hosts (``db1:5432,db2:5432``) have no one port,
    and ``urlsplit``'s ``port`` raises on them. A password given as a query parameter is hidden too.
    """
    if url.startswith("sqlite"):
        return url.split("///", 1)[-1] or url
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if ":" in userinfo:
        parts = parts._replace(netloc=f"{userinfo.split(':', 1)[0]}:***{at}{hosts}")
    query = (
        "&".join("password=***" if pair.lower().startswith("password=") else pair for pair in parts.query.split("&"))
        if parts.query
        else parts.query
    )
    return urlunsplit(parts._replace(query=query))


class DeliverySettings(_SettingsGroup):
    """Delivery from the outbox to webhook endpoints: requests, retries, claims, circuits."""

    request_timeout: float = Field(default=5.0, gt=0, description="Seconds an endpoint has to answer.")
    max_retry_age: float = Field(
        default=4 * 3600.0,
        gt=0,
        description="Seconds after a message's first attempt after which it is no longer attempted.",
    )
    retry_base_delay: float = Field(default=5.0, gt=0, description="First retry delay in seconds.")
    min_secret_length: int = Field(
        default=0,
        ge=0,
        description="Shortest shared secret a destination accepts; 0 accepts any non-empty secret, as Segment's "
        "Webhooks destination does (one under 16 characters is accepted with a warning).",
    )
    retry_max_delay: float = Field(default=1800.0, gt=0, description="Largest retry delay in seconds.")
    task_retries: int = Field(
        default=2,
        ge=0,
        description="Retries of a delivery batch inside a flow run that ends once nothing is due (Prefect task "
        "retries); a run that keeps delivering sends each retry from the outbox when it is due.",
    )
    task_run_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Batches a delivery process claims within this many seconds share one Prefect task run "
        "(`deliver-batches`): at most one task run per this many seconds per process, whatever the rate.",
    )
    lease_seconds: float = Field(
        default=120.0, gt=0, description="How long a claim holds messages before another run may take them."
    )
    claim_batch_size: int = Field(
        default=2000,
        gt=0,
        description="Most messages claimed per delivery task run (a backlog is delivered in batches this big; a steady "
        "stream in batches of what arrived since the last claim).",
    )
    delivery_concurrency: int = Field(
        default=64, gt=0, description="Concurrent requests a delivery process keeps in flight."
    )
    endpoint_concurrency: int = Field(
        default=32,
        gt=0,
        description="Concurrent requests one endpoint URL may hold (capped by `delivery_concurrency`), so a hanging "
        "endpoint cannot take every slot.",
    )
    circuit_failure_threshold: int = Field(
        default=5,
        gt=0,
        description="Retryable failures in a row after which an endpoint's circuit opens and its requests are "
        "skipped (rescheduled with the error `circuit open`).",
    )
    circuit_cooldown_seconds: float = Field(
        default=2.0,
        gt=0,
        description="Seconds an open circuit waits before letting one probe request through (half-open): a down "
        "endpoint gets one request this often, and a recovery is seen at most this late.",
    )
    store_retry_seconds: float = Field(
        default=30.0,
        ge=0,
        description="How long a delivery process keeps retrying a store write or claim that failed because the "
        "database was unreachable, before giving the batch up to lease expiry.",
    )
    tls_ca_file: str = Field(
        default="",
        description="Extra CA bundle (PEM) trusted for https endpoints, besides the system's; empty means none.",
    )
    endpoint_failing_threshold: int = Field(
        default=5,
        gt=0,
        description="Failed requests in a row after which an endpoint counts as failing (event "
        "`prefect-webhooks.endpoint.failing`).",
    )
    ramp_up_start_rate: float = Field(
        default=5.0,
        gt=0,
        description="Least requests per second an endpoint gets when its circuit closes or a Retry-After pause ends; "
        "the rate then doubles six times over `ramp_up_seconds`.",
    )
    ramp_up_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Share of the rate a recovered endpoint took in its best 10 seconds of the last 2 minutes (2xx "
        "answers per second from the delivering process) it gets back at once, when that is more than "
        "`ramp_up_start_rate` (0: start from `ramp_up_start_rate` alone).",
    )
    ramp_up_seconds: float = Field(
        default=10.0,
        ge=0,
        description="How long an endpoint ramps back up from `ramp_up_start_rate` after a recovery (from its own "
        "recent rate: at most 2 s; 0: its backlog at once).",
    )
    block_cache_seconds: float = Field(
        default=10.0, ge=0, description="How long a loaded block is reused before it is read again."
    )
    block_private_networks: bool = Field(
        default=False, description="Refuse destination URLs on loopback or private networks (SSRF guard)."
    )


class IngestSettings(_SettingsGroup):
    """The ingest API: where it listens, how much it buffers, how it deduplicates."""

    ingest_host: str = Field(default="127.0.0.1", description="Address the ingest API listens on.")
    ingest_port: int = Field(default=8088, description="Port the ingest API listens on.")
    ingest_max_pending: int = Field(
        default=50_000,
        gt=0,
        description="Messages waiting for the ingest writer above which the API answers 429 with Retry-After.",
    )
    unknown_key_refresh_seconds: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Least time between two source reloads triggered by an unknown write key; a request with an unknown key "
            "waits for the next reload, so a source saved just before it is found."
        ),
    )
    dedupe_window_seconds: float | None = Field(
        default=None,
        gt=0,
        description="How long a messageId is remembered per source; empty: as long as delivered messages are kept "
        "(`PREFECT_WEBHOOKS_RETENTION_DELIVERED`, 24 h).",
    )


class ClientSettings(_SettingsGroup):
    """The Analytics client."""

    endpoint: str = Field(
        default="",
        description="Ingest API base URL the Analytics client sends to; empty means http://ingest_host:ingest_port.",
    )


class ServeSettings(_SettingsGroup):
    """What `prefect-webhooks serve` serves."""

    deployments_file: str = Field(
        default="",
        description=(
            "prefect.yaml whose deployments `serve` serves (schedules, parameters); empty: the one shipped with the "
            "package (deployments/prefect.yaml), which `prefect deploy` uses too."
        ),
    )
    audiences_file: str = Field(
        default="",
        description="YAML list of audience syncs to serve (name, cron, parameters); empty: `home`/audiences.yaml.",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token of the admin API (`/v1/admin/`: look messages up, send them again) and the console "
            "(`/console`); not a write key. Empty: both are off."
        ),
    )
    console_url: str = Field(
        default="",
        description=(
            "The console's address as a person's browser reaches it (behind a proxy: its public URL), for the links "
            "in Prefect events and artifacts; empty: http://ingest_host:ingest_port/console. No link while the admin "
            "token is unset."
        ),
    )
    quiet_run_seconds: Duration = Field(
        default=3600.0,
        gt=0,
        description=(
            "Longest a deliver run of `serve`'s delivery worker lasts while it claims nothing: a run that delivered "
            "something hands over after the deliver schedule's interval, a quiet one goes on, so a quiet service adds "
            "one run per this period to the Prefect UI instead of one a minute."
        ),
    )


class RetentionSettings(_SettingsGroup):
    """How long the store and the Prefect server keep what delivery leaves behind, and how often it is pruned."""

    retention_delivered: Duration = Field(
        default=24 * 3600.0,
        gt=0,
        description="How long delivered and filtered messages, with their attempt records, are kept after they got "
        "there (`90s`, `15m`, `24h`, `7d` or seconds).",
    )
    retention_failed: Duration = Field(
        default=7 * 86400.0,
        gt=0,
        description="How long failed messages, with their attempt records, are kept after they failed: the window "
        "`replay` can put them back in.",
    )
    retention_interval: Duration = Field(
        default=300.0, gt=0, description="How often `serve` runs a pruning pass over the store."
    )
    retention_runs: Duration = Field(
        default=7 * 86400.0,
        gt=0,
        description="How long the Prefect server keeps the finished flow runs (with their task runs, logs and "
        "artifacts) of prefect-webhooks' own deployments and pruning passes, counted from their start.",
    )


class OutageSettings(_SettingsGroup):
    """While the Prefect API cannot be reached: what each process keeps locally and how long it waits for Prefect."""

    local_copy: bool = Field(
        default=True,
        description="Keep a local copy of the destinations (with their secrets, file mode 0600) and of the sources' "
        "write-key hashes in `home`/local-copy, so a process started while the Prefect API is down delivers and "
        "accepts known keys; false keeps nothing on disk (such a process waits for the API).",
    )
    api_wait_seconds: float = Field(
        default=2.0,
        gt=0,
        description="Longest a delivery or ingest step waits for the Prefect API before going on without it.",
    )
    api_probe_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often a process checks whether an unreachable Prefect API is back.",
    )
    stuck_run_seconds: float = Field(
        default=30.0,
        gt=0,
        description="After the Prefect API's return, how long a served run taken before or just after it may stay "
        "Pending before `serve` marks it Crashed (it never started; the next run covers its slot).",
    )


class WebhooksSettings(BaseModel):
    """Every knob of prefect-webhooks, by concern; each group reads its own ``PREFECT_WEBHOOKS_*`` variables."""

    store: StoreSettings = Field(default_factory=StoreSettings, description="The store.")
    delivery: DeliverySettings = Field(default_factory=DeliverySettings, description="Delivery to endpoints.")
    ingest: IngestSettings = Field(default_factory=IngestSettings, description="The ingest API.")
    client: ClientSettings = Field(default_factory=ClientSettings, description="The Analytics client.")
    serve: ServeSettings = Field(default_factory=ServeSettings, description="What `serve` serves.")
    retention: RetentionSettings = Field(default_factory=RetentionSettings, description="Retention and pruning.")
    outage: OutageSettings = Field(
        default_factory=OutageSettings, description="While the Prefect API cannot be reached."
    )

    def dedupe_window(self) -> float:
        """Seconds a messageId is remembered: the dedupe setting, or else the delivered messages' retention (what the
        store keeps of a delivered message, its row, its attempts and its messageId, it keeps equally long)."""
        return self.ingest.dedupe_window_seconds or self.retention.retention_delivered

    def resolved_endpoint(self) -> str:
        """The ingest API base URL clients send to."""
        return self.client.endpoint or f"http://{self.ingest.ingest_host}:{self.ingest.ingest_port}"

    def active_admin_token(self) -> str | None:
        """The admin token of the admin API and the console, or None while both are off (unset or empty)."""
        token = self.serve.admin_token
        return token.get_secret_value() if token is not None and token.get_secret_value() else None

    def console_link(self, path: str = "") -> str | None:
        """The console's URL of ``path`` (``/messages/12``), or None while the console is off (no admin token)."""
        if self.active_admin_token() is None:
            return None
        base = self.serve.console_url or f"http://{self.ingest.ingest_host}:{self.ingest.ingest_port}/console"
        return base.rstrip("/") + path


@lru_cache(maxsize=1)
def get_settings() -> WebhooksSettings:
    """Settings read once per process; call ``get_settings.cache_clear()`` after changing the environment."""
    return WebhooksSettings()
