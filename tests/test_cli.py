"""The ``prefect-webhooks`` console command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import typer

from prefect_webhooks.cli import app, main
from tests.docs_pages import page, section
from tests.servers import free_port

COMMANDS = ("ingest", "serve", "status", "prune", "demo", "preview")


def _script() -> str:
    script = shutil.which("prefect-webhooks", path=str(Path(sys.executable).parent))
    assert script, "the console script is installed with the package"
    return script


def _help(*args: str) -> str:
    """What ``prefect-webhooks ARGS --help`` prints, as a user's terminal (80 columns) shows it."""
    done = subprocess.run(
        [_script(), *args, "--help"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"}
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_a_command_the_help_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    main([])
    printed = capsys.readouterr()
    assert "Usage: prefect-webhooks" in printed.out + printed.err
    assert all(name in printed.out + printed.err for name in COMMANDS)


def test_an_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--no-such-option"]) == 2
    assert "No such option" in capsys.readouterr().err


def test_every_command_is_listed_in_help() -> None:
    out = _help()
    assert all(re.search(rf"^\W*{name}\s+\S", out, re.M) for name in COMMANDS), out


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_of_every_command_has_a_help_text(name: str) -> None:
    sub = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    assert sub.help, name
    options = [param for param in sub.params if param.param_type_name == "option"]
    assert options, name
    for option in options:
        assert option.help and option.help.endswith((".", ")")), (name, option.name)
    out = _help(name)
    for option in options:
        assert option.opts[0] in out, (name, option.opts[0])
    # The command-line reference documents every command and option.
    documented = section(page("reference/cli.md"), f"`{name}`")
    assert [option.opts[0] for option in options if f"`{option.opts[0]}" not in documented] == []


@contextmanager
def _ingest(args: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [_script(), "ingest", *args], env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        process.terminate()
        process.wait(15)


def _health(port: int, process: subprocess.Popen[bytes], timeout: float = 60) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code
        except httpx.HTTPError:
            time.sleep(0.1)
    return None


def test_ingest_defaults_come_from_settings(tmp_path: Path) -> None:
    port = free_port()
    env = {
        "PREFECT_WEBHOOKS_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PREFECT_WEBHOOKS_INGEST_HOST": "127.0.0.1",
        "PREFECT_WEBHOOKS_INGEST_PORT": str(port),
    }
    with _ingest([], env) as process:
        assert _health(port, process) == 200
    assert (tmp_path / "cli.db").exists()


def test_ingest_options_override_settings(tmp_path: Path) -> None:
    setting_port, option_port = free_port(), free_port()
    env = {
        "PREFECT_WEBHOOKS_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PREFECT_WEBHOOKS_INGEST_HOST": "127.0.0.2",
        "PREFECT_WEBHOOKS_INGEST_PORT": str(setting_port),
    }
    with _ingest(["--host", "127.0.0.1", "--port", str(option_port)], env) as process:
        assert _health(option_port, process) == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{setting_port}/health", timeout=1)


def test_the_command_line_loads_without_prefect_or_settings() -> None:
    # `prefect-webhooks serve` starts its delivery workers before it reads anything heavy: every second of imports
    # here would be a second before what is due moves.
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, prefect_webhooks.cli; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    heavy = {"prefect", "httpx", "pydantic", "pydantic_settings", "sqlalchemy", "prefect_webhooks.settings"}
    assert "prefect_webhooks.cli" in loaded
    assert sorted(heavy.intersection(loaded)) == []


def test_prune_store_only_prints_what_it_removed(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from prefect_webhooks.store.engines import get_engine
    from prefect_webhooks.store.outbox import enqueue

    enqueue("crm", [{"type": "track", "userId": "u", "event": "E"}])
    assert main(["prune", "--store-only"]) == 0
    out = capsys.readouterr().out
    # Nothing had ended yet: the pending message is kept, and the table says so.
    assert "pending messages" in out and "pruned 0 delivered" in out
    with get_engine().connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM outbox").scalar_one() == 1
