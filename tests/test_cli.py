"""The ``prefect-webhooks`` console command."""

from __future__ import annotations

import json
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
from prefect_webhooks.store.engine.engines import get_engine
from tests.docs_pages import page, section
from tests.servers import free_port

COMMANDS = ("ingest", "serve", "status", "prune", "deploy", "demo", "preview", "replay")
GROUPS = ("endpoint", "messages")


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
    assert all(re.search(rf"^\W*{name}\s+\S", out, re.M) for name in COMMANDS + GROUPS), out


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


def _newcomer_env(home: Path, **extra: str) -> dict[str, str]:
    """A shell with no Prefect or package settings, a Prefect home of its own (so Prefect's default profile, whose
    "ephemeral" mode starts temporary servers) and a package home in ``home``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(home / ".prefect"), "PREFECT_WEBHOOKS_HOME": str(home / "store"), **extra}


def test_serve_without_a_prefect_server_refuses_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run([_script(), "serve", "--port", str(free_port())], env=_newcomer_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "prefect-webhooks serve: no Prefect server: set PREFECT_API_URL" in done.stderr
    assert "`prefect server start`" in done.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "store").exists()  # nothing started, not even the store


def test_rotate_secret_without_a_prefect_server_refuses_too(tmp_path: Path) -> None:
    done = subprocess.run([_script(), "rotate-secret", "crm", "--generate"], env=_newcomer_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "rotate-secret: no Prefect server: set PREFECT_API_URL" in done.stderr
    assert "temporary server" not in done.stdout + done.stderr


def test_prune_without_a_prefect_server_refuses_and_names_the_store_only_pass(tmp_path: Path) -> None:
    done = subprocess.run([_script(), "prune"], env=_newcomer_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "prune: no Prefect server: set PREFECT_API_URL" in done.stderr
    assert "--store-only" in done.stderr and "temporary server" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", [("replay", "crm"), ("endpoint", "list", "crm")])
def test_replay_and_endpoint_commands_without_a_prefect_server_refuse(tmp_path: Path, command: tuple[str, ...]) -> None:
    done = subprocess.run([_script(), *command], env=_newcomer_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert f"{' '.join(command[:-1])}: no Prefect server: set PREFECT_API_URL" in done.stderr


def test_status_never_creates_a_store_and_names_the_one_it_reads(tmp_path: Path) -> None:
    env = _newcomer_env(tmp_path)
    missing = subprocess.run([_script(), "status"], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and missing.stdout == ""
    assert f"status: no store at {tmp_path / 'store' / 'webhooks.db'}" in missing.stderr
    assert "PREFECT_WEBHOOKS_HOME" in missing.stderr
    assert not (tmp_path / "store").exists()

    get_engine(f"sqlite:///{tmp_path / 'store' / 'webhooks.db'}")  # a store, as serve creates it
    table = subprocess.run([_script(), "status"], env=env, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and table.stdout.startswith(f"store: {tmp_path / 'store' / 'webhooks.db'}\n")
    as_json = subprocess.run([_script(), "status", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(as_json.stdout)["totals"]["pending"] == 0  # stdout stays JSON: the store goes to stderr
    assert f"store: {tmp_path / 'store' / 'webhooks.db'}" in as_json.stderr


def test_status_warns_of_a_saved_destination_with_a_short_secret(prefect_harness: None, store_url: str) -> None:
    from prefect.settings import PREFECT_API_URL

    from prefect_webhooks.blocks.destination import WebhookDestination

    WebhookDestination(endpoints=[{"url": "https://a.example.com/in"}], shared_secret="short1").save(
        "cli-short-secret", overwrite=True)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_DATABASE_URL": store_url}
    done = subprocess.run([_script(), "status"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert ("warning: destination 'cli-short-secret': its shared secret has 6 characters, fewer than the 16 "
            "recommended") in done.stderr
    assert "short1" not in done.stdout + done.stderr


def test_status_shows_a_database_url_without_its_password(tmp_path: Path) -> None:
    url = "postgresql://webhooks:pa55word@127.0.0.1:1/nowhere"
    done = subprocess.run([_script(), "status"], env=_newcomer_env(tmp_path, PREFECT_WEBHOOKS_DATABASE_URL=url),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "postgresql://webhooks:***@127.0.0.1:1/nowhere" in done.stderr
    assert "pa55word" not in done.stderr


def test_status_help_names_the_store() -> None:
    shown = " ".join(_help("status").split())
    assert "PREFECT_WEBHOOKS_DATABASE_URL" in shown and "PREFECT_WEBHOOKS_HOME" in shown
    assert "never creates one" in shown


def test_prune_store_only_prints_what_it_removed(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import enqueue

    enqueue("crm", [{"type": "track", "userId": "u", "event": "E"}])
    assert main(["prune", "--store-only"]) == 0
    out = capsys.readouterr().out
    # Nothing had ended yet: the pending message is kept, and the table says so.
    assert "pending messages" in out and "pruned 0 delivered" in out
    with get_engine().connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM outbox").scalar_one() == 1


def test_prune_help_reads_as_sentences() -> None:
    # A setting's name split from its partner ("... _DELIVERED" / "/ _FAILED") read as a stray line break.
    assert not [line for line in _help("prune").splitlines() if line.strip().startswith("/")]
    assert "PREFECT_WEBHOOKS_RETENTION_FAILED" in " ".join(_help("prune").split())


def test_prune_lists_removed_rows_and_says_the_store_size_apart(
    prefect_harness: None, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prune"]) == 0
    out = capsys.readouterr().out
    table, size = out.rsplit("\n", 2)[0], out.rsplit("\n", 2)[1]
    assert table.splitlines()[0].split() == ["removed", "count"]
    assert "store_bytes" not in out and "flow_runs" in table
    assert re.fullmatch(r"store size after the pass: \d+\.\d MB", size), out


def test_endpoint_commands_show_and_switch_a_destinations_endpoints(prefect_harness: None, store_url: str) -> None:
    from prefect.settings import PREFECT_API_URL

    from prefect_webhooks.blocks.destination import WebhookDestination

    WebhookDestination(endpoints=[{"url": "https://a.example.com/in?token=secret", "rate_limit": 10},
                                  {"url": "https://b.example.com/in"}]).save("cli-endpoints", overwrite=True)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_DATABASE_URL": store_url}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([_script(), "endpoint", *args], capture_output=True, text=True, timeout=120, env=env)

    assert run("disable", "cli-endpoints", "--position", "2").stdout.strip() == (
        "disabled endpoint(s) [2] of cli-endpoints")
    listed = run("list", "cli-endpoints").stdout
    # The URL's query (it may hold a token) is not shown.
    assert "secret" not in listed and "https://a.example.com/in" in listed
    assert re.search(r"1\s+https://a.example.com/in\s+10/s \(burst 1\)\s+enabled", listed), listed
    assert re.search(r"2\s+https://b.example.com/in\s+none\s+disabled", listed), listed
    wrong = run("enable", "cli-endpoints", "--position", "3")
    assert wrong.returncode == 1 and "has no endpoint 3 (it has 2)" in wrong.stderr
    last = run("enable", "cli-endpoints")
    assert last.stdout.strip() == "enabled endpoint(s) [2] of cli-endpoints"
    # A short command ends quietly: no "Still processing items" from Prefect's event worker after its answer.
    assert last.stderr == "", last.stderr


MISSING_BLOCK_COMMANDS = [("endpoint", "list"), ("endpoint", "enable"), ("endpoint", "disable", "--position", "1"),
                          ("replay",), ("rotate-secret", "--generate")]


@pytest.mark.parametrize("command", MISSING_BLOCK_COMMANDS, ids=lambda command: " ".join(command[:2]))
def test_a_missing_destination_is_one_line_and_exit_code_1_before_anything_runs(
        prefect_harness: None, store_url: str, command: tuple[str, ...]) -> None:
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_DATABASE_URL": store_url}
    with get_client(sync_client=True) as client:
        runs_before = len(client.read_flow_runs())
    name, *options = command
    args = [name, *options[:1], "no-such-dest", *options[1:]] if name == "endpoint" else [name, "no-such-dest",
                                                                                           *options]
    done = subprocess.run([_script(), *args], capture_output=True, text=True, timeout=120, env=env)
    said = " ".join(args[:2] if name == "endpoint" else args[:1])
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"{said}: no WebhookDestination block named 'no-such-dest' is saved"
    assert "Traceback" not in done.stderr and done.stdout == ""
    with get_client(sync_client=True) as client:
        assert len(client.read_flow_runs()) == runs_before


def test_replay_prints_its_result_alone_on_stdout_and_logs_on_stderr(prefect_harness: None, store_url: str) -> None:
    from prefect.settings import PREFECT_API_URL

    from prefect_webhooks.blocks.destination import WebhookDestination

    WebhookDestination(endpoints=[{"url": "https://a.example.com/in"}]).save("cli-replay", overwrite=True)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_DATABASE_URL": store_url}
    done = subprocess.run([_script(), "replay", "cli-replay", "--since", "1h"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "replay: 0 message(s) are pending again\n"
    assert "Finished in state Completed" in done.stderr


def test_replay_of_an_endpoint_no_destination_has_is_refused(prefect_harness: None, store_url: str) -> None:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_DATABASE_URL": store_url}
    done = subprocess.run([_script(), "replay", "--endpoint", "https://nowhere.example.com/in?token=t0k3n"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "replay: no saved WebhookDestination has an endpoint at https://nowhere.example.com/in")


def test_replay_needs_a_destination_or_an_endpoint() -> None:
    def error(*args: str) -> str:
        done = subprocess.run([_script(), "replay", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        return " ".join(done.stderr.replace("│", " ").split())

    assert "give a destination or --endpoint URL" in error("--since", "2h")
    assert "'yesterday' is neither an ISO 8601 time nor a duration (2h, 7d)" in error("d", "--since", "yesterday")


def test_prefects_drain_progress_line_never_closes_a_command() -> None:
    # Prefect logs it at exit when an event is still queued as its worker drains (timing decides): logged here on
    # purpose, after a command ran, through Prefect's own console handler.
    code = ("import logging, prefect\n"
            "from prefect_webhooks.cli import main\n"
            "main(['status', '--help'])\n"
            "logging.getLogger('EventsWorker').warning('Still processing items: 1 items remaining...')\n"
            "logging.getLogger('EventsWorker').warning('another warning')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Still processing items" not in done.stderr and "another warning" in done.stderr


def test_messages_list_and_show_find_queued_and_kept_messages_with_their_attempts(tmp_path: Path) -> None:
    from tests.store.test_message_log import deliver_all, track

    env = _newcomer_env(tmp_path)
    missing = subprocess.run([_script(), "messages", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "messages list: no store at" in missing.stderr

    from prefect_webhooks.store.queue.outbox import add_to_outbox, outbox_rows

    engine = get_engine(f"sqlite:///{tmp_path / 'store' / 'webhooks.db'}")
    with engine.begin() as connection:
        add_to_outbox(connection, outbox_rows("crm", [track("ann", n) for n in range(3)], source="web",
                                              message_ids=["m-0", "m-1", "m-2"]))
    deliver_all(engine, {2: "failed"})
    with engine.begin() as connection:
        add_to_outbox(connection, outbox_rows("crm", [track("bob")], source="web", message_ids=["m-3"]))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([_script(), "messages", *args], env=env, capture_output=True, text=True, timeout=60)

    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split()[:2] for line in listed.stdout.splitlines()[2:]]
    # The queued one first (stored last); the kept ones by when they got there (the failure is recorded a moment
    # after the deliveries, within the same millisecond or not).
    assert rows[0] == ["4", "pending"] and sorted(rows[1:]) == [["1", "delivered"], ["2", "failed"], ["3", "delivered"]]
    failed = json.loads(run("list", "--state", "failed", "--json").stdout)
    assert [(m["id"], m["reason"], m["tries"][0]["status_code"]) for m in failed] == [(2, "permanent: HTTP 410", 410)]
    assert [m["id"] for m in json.loads(run("list", "--user", "bob", "--json").stdout)] == [4]
    by_reason = json.loads(run("list", "--reason-prefix", "permanent", "--json").stdout)
    by_endpoint = json.loads(run("list", "--endpoint", "https://hooks.example.com/", "--json").stdout)
    assert [m["id"] for m in by_reason] == [2] and sorted(m["id"] for m in by_endpoint) == [1, 2, 3]
    shown = run("show", "m-1")
    assert shown.returncode == 0 and "state: failed" in shown.stdout and "reason: permanent: HTTP 410" in shown.stdout
    assert "https://hooks.example.com/in      410" in shown.stdout and '"n": 1' in shown.stdout
    assert json.loads(run("show", "1", "--json").stdout)["messageId"] == "m-0"
    unknown = run("show", "nope")
    assert unknown.returncode == 1 and "no message with id or messageId 'nope'" in unknown.stderr
    assert run("list", "--state", "bogus").returncode == 2
    resent = run("resend", "2")
    assert resent.returncode == 0 and resent.stdout == "2: queued again\n", resent.stderr
    again = json.loads(run("show", "2", "--json").stdout)
    assert again["state"] == "pending" and [t["status_code"] for t in again["tries"]] == [410]
    refused = run("resend", "4", "99")
    assert refused.returncode == 1 and "4: still queued" in refused.stderr and "99: neither queued nor kept" in \
        refused.stderr


def test_messages_show_request_prints_the_request_as_sent_with_secrets_masked(prefect_harness: None,
                                                                              store_url: str) -> None:
    import hashlib
    import hmac

    from prefect.settings import PREFECT_API_URL

    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.store.engine.engines import store_key
    from prefect_webhooks.store.queue.outbox import enqueue

    WebhookDestination(endpoints=[{"url": "https://user:pa55word-9@a.example.com/in?token=q-secret-1",
                                   "headers": {"X-Api-Key": "k3y-0123456789"}}],
                       shared_secret="show-s3cret-00001").save("cli-show-request", overwrite=True)
    enqueue("cli-show-request", [{"type": "track", "userId": "ann", "event": "E",
                                  "timestamp": "2026-03-04T05:06:07.123Z"}])
    number = 1
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WEBHOOKS_DATABASE_URL": store_url}
    done = subprocess.run([_script(), "messages", "show", str(number), "--request"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    request = done.stdout.split("\n\nPOST ", 1)[1]
    assert request.startswith("https://a.example.com/in?********  (endpoint 1)")
    # The message's own id, as the receiver sees it, and a signature a receiver can check with the current secret.
    assert f"Idempotency-Key: msg_{store_key(get_engine(store_url))}_{number}" in request
    body = request.split("\n\n", 1)[1].strip().encode()
    assert f"X-Signature: {hmac.new(b'show-s3cret-00001', body, hashlib.sha1).hexdigest()}" in request
    assert "X-Api-Key: ********" in request
    for secret in ("pa55word-9", "q-secret-1", "k3y-0123456789", "show-s3cret-00001"):
        assert secret not in done.stdout + done.stderr
    missing = subprocess.run([_script(), "messages", "show", "999", "--request"], capture_output=True, text=True,
                             timeout=120, env=env)
    assert missing.returncode == 1
