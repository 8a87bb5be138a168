"""The several-hosts guide (docs/operations/several-hosts.md) shows the configuration the tests run."""

from __future__ import annotations

import re

from tests.docs_pages import page
from tests.hosts import HAPROXY_CONFIG, SERVER_KEEPALIVES
from tests.hosts.test_several_hosts import CONNECTION_OPTIONS


def _settings(config: str) -> list[str]:
    """The lines of an haproxy configuration, addresses aside (the guide's are examples)."""
    return [line.strip() for line in config.splitlines()
            if line.strip() and not line.strip().startswith(("bind ", "server ", "{"))]


def test_the_guides_haproxy_configuration_is_the_tested_one() -> None:
    guide = page("operations/several-hosts.md")
    shown = re.search(r"```text\n(global\n.*?)```", guide, re.S)
    assert shown, "the guide's haproxy.cfg block"
    assert _settings(shown.group(1)) == _settings(HAPROXY_CONFIG)


def test_the_guides_connection_string_has_the_tested_options() -> None:
    guide = page("operations/several-hosts.md")
    assert f"/webhooks?{CONNECTION_OPTIONS}'" in guide


def test_the_guides_server_settings_are_the_tested_ones() -> None:
    guide = page("operations/several-hosts.md")
    for setting in SERVER_KEEPALIVES[1::2]:
        name, value = setting.split("=")
        assert f"{name} = {value}\n" in guide, setting


def test_the_guides_failover_connection_string_is_the_tested_form_and_reaches_both_hosts() -> None:
    # The failover tests give every process libpq's several hosts with target_session_attrs=read-write and the
    # options above (tests/hosts/test_failover.py); the guide shows that form, which the store must take as written.
    from sqlalchemy import create_engine

    from prefect_webhooks.store.engine.engines import sqlalchemy_url

    guide = page("operations/several-hosts.md")
    shown = re.search(r"'(postgresql://[^']*,[^']*)'", guide)
    assert shown, "the guide's connection string with several hosts"
    assert shown.group(1).endswith(f"/webhooks?target_session_attrs=read-write&{CONNECTION_OPTIONS}")
    engine = create_engine(sqlalchemy_url(shown.group(1)))
    _, arguments = engine.dialect.create_connect_args(engine.url)
    assert arguments["host"] == "db1.internal,db2.internal" and arguments["target_session_attrs"] == "read-write"
