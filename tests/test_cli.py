"""The ``prefect-webhooks`` console command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prefect_webhooks.cli import COMMANDS, build_parser, main
from prefect_webhooks.settings import get_settings
from tests.servers import free_port


def test_ingest_defaults_come_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_INGEST_PORT", "9123")
    monkeypatch.setenv("PREFECT_WEBHOOKS_INGEST_HOST", "127.0.0.2")
    get_settings.cache_clear()
    try:
        args = build_parser().parse_args(["ingest"])
    finally:
        get_settings.cache_clear()
    assert (args.host, args.port) == ("127.0.0.2", 9123)


def test_ingest_options_override_settings() -> None:
    args = build_parser().parse_args(["ingest", "--host", "0.0.0.0", "--port", "8100"])
    assert (args.host, args.port, args.access_log) == ("0.0.0.0", 8100, False)


def test_a_subcommand_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_every_command_is_listed_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(command.name in out for command in COMMANDS)


def test_console_script_serves_the_api(tmp_path: Path) -> None:
    script = shutil.which("prefect-webhooks", path=str(Path(sys.executable).parent))
    assert script, "the console script is installed with the package"
    port = free_port()
    env = {**os.environ, "PREFECT_WEBHOOKS_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    process = subprocess.Popen(
        [script, "ingest", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert status == 200
        assert (tmp_path / "cli.db").exists()
    finally:
        process.terminate()
        process.wait(15)
