"""The built wheel installs into a Prefect its users already run, and works there, from the outside.

A fresh virtualenv first gets the oldest Prefect the package supports, with the versions of its dependencies a user of
that release has (``constraints-oldest.txt``); then ``pip install`` of the wheel, as a user would. Everything after
that runs the installed commands of that virtualenv, away from this repository.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import orjson
import pytest

from prefect_webhooks.demo.stack import start_group, stop_group
from prefect_webhooks.deployments.serve import DELIVER_DEPLOYMENT, write_definitions
from prefect_webhooks.signing.signatures import SIGNATURE_HEADER, verify
from tests.receivers import Receiver
from tests.servers import free_port
from tests.test_code_shape import PACKAGE_FOLDERS

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine, pytest.mark.timeout(900)]


def oldest_prefect() -> str:
    """The Prefect release pinned in constraints-oldest.txt, which is also the floor in pyproject.toml."""
    pinned = re.search(r"^prefect==(\S+)$", (ROOT / "constraints-oldest.txt").read_text(), re.M)
    assert pinned, "constraints-oldest.txt pins prefect"
    floor = re.search(r'"prefect>=([^,"]+),<4"', (ROOT / "pyproject.toml").read_text())
    assert floor and floor[1] == pinned[1], "pyproject's floor is the oldest release CI tests"
    return pinned[1]


def run(*command: str | Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=timeout, env=env, cwd="/"
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert found, "uv comes with the test extra"
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, ROOT)
    [built] = out.glob("prefect_webhooks-*.whl")
    return built


def test_the_wheel_is_the_file_getting_started_installs(wheel: Path) -> None:
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert set(re.findall(r"prefect_webhooks-[\w.]+-py3-none-any\.whl", page)) == {wheel.name}


def test_an_editable_install_ends_without_a_build_backend_notice(tmp_path: Path) -> None:
    venv = tmp_path / "editable"
    run(sys.executable, "-m", "venv", venv)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-deps", "-e", str(ROOT)], capture_output=True,
                          text=True, timeout=600, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "Warning" not in output and "same name as your package" not in output, output[-3000:]
    # The editable install imports the source tree, its two folders from outside the package folder included.
    # (Found, not imported: the virtualenv holds the package alone, without Prefect.)
    found = run(venv / "bin" / "python", "-c", "from importlib.util import find_spec as f; "
                "print(*(f(f'prefect_webhooks.{n}').submodule_search_locations[0] for n in ('flows', 'deployments')))")
    assert found.split() == [str(ROOT / "flows"), str(ROOT / "deployments")]


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"prefect_webhooks"}
    # Every module and data file of the source tree, wherever it lives in the repository (a subpackage missing from
    # pyproject's list installs a package that fails on import).
    expected = {f"prefect_webhooks/{path.relative_to(ROOT / folder)}" if folder == "prefect_webhooks"
                else f"prefect_webhooks/{path.relative_to(ROOT)}"
                for folder in PACKAGE_FOLDERS
                for path in (ROOT / folder).rglob("*")
                if path.suffix in {".py", ".yaml"} and "__pycache__" not in path.parts}
    assert "prefect_webhooks/delivery/batches/claims.py" in expected and "prefect_webhooks/flows/deliver.py" in expected
    assert sorted(expected - set(names)) == []


@pytest.fixture(scope="module")
def user_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A virtualenv with the oldest supported Prefect, then the wheel installed into it by pip."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    version = oldest_prefect()
    # The user's existing Prefect (uv only makes this faster; its cache is reused from run to run).
    run(_uv(), "venv", "-q", "--seed", "-p", sys.executable, venv)
    run(_uv(), "pip", "install", "-q", "-p", venv / "bin" / "python", "-c", ROOT / "constraints-oldest.txt", "prefect")
    before = run(venv / "bin" / "pip", "show", "prefect")
    assert f"Version: {version}\n" in before
    # The user's command.
    run(venv / "bin" / "pip", "install", "-q", wheel)
    return venv, before


def test_pip_install_keeps_the_users_prefect(user_venv: tuple[Path, str]) -> None:
    venv, before = user_venv
    after = run(venv / "bin" / "pip", "show", "prefect")
    assert re.search(r"^Version: .*$", after, re.M)[0] == re.search(r"^Version: .*$", before, re.M)[0]  # type: ignore[index]
    # Only prefect_webhooks is added to site-packages (no `flows` or `deployments` of ours).
    site = Path(run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    assert not (site / "flows").exists() and not (site / "deployments").exists()
    out = run(venv / "bin" / "prefect-webhooks", "--help")
    for command in ("ingest", "serve", "status", "demo"):
        assert command in out


@contextmanager
def _process(command: list[str | Path], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    # Away from the repository: `python -m` puts the working directory first on sys.path.
    process = start_group([str(part) for part in command], env, log, cwd=log.parent)
    try:
        yield process
    finally:
        stop_group(process, grace=60)


def _wait_for(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        with suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"{url} not up after {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def test_blocks_register_and_serve_delivers_from_the_installed_package(
    user_venv: tuple[Path, str], tmp_path: Path
) -> None:
    venv, _ = user_venv
    bin_dir = venv / "bin"
    prefect_port, ingest_port = free_port(), free_port()
    api_url = f"http://127.0.0.1:{prefect_port}/api"
    base = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_", "VIRTUAL_"))}
    env = {
        **base,
        "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '')}",
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "PREFECT_WEBHOOKS_HOME": str(tmp_path),
        "PREFECT_WEBHOOKS_DATABASE_URL": f"sqlite:///{tmp_path / 'webhooks.db'}",
        # One delivery run, started below, that claims for 20 s; no scheduled runs.
        "PREFECT_WEBHOOKS_DEPLOYMENTS_FILE": str(write_definitions(
            tmp_path / "prefect.yaml",
            {DELIVER_DEPLOYMENT: {"schedules": [], "parameters": {"run_for_seconds": 20}}},
        )),
    }
    server_log = tmp_path / "server.log"
    server_command = [bin_dir / "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)]
    with _process(server_command, env, server_log) as server:
        _wait_for(f"{api_url}/health", server, server_log)

        registered = run(bin_dir / "prefect", "block", "register", "-m", "prefect_webhooks", env=env)
        assert "Successfully registered 2 blocks" in registered, registered
        assert "Webhook Destination" in registered and "Webhooks Source" in registered, registered

        with Receiver() as receiver:
            secret = "pkg-test-secret-16"
            run(bin_dir / "python", "-c", (
                "from prefect_webhooks import Source, WebhookDestination\n"
                f"WebhookDestination(endpoints=[{{'url': {receiver.url!r}}}], shared_secret={secret!r})"
                ".save('pkg-dest')\n"
                "Source(write_key='wk_pkg_test', destinations=['pkg-dest']).save('pkg-source')\n"
            ), env=env)
            service_log = tmp_path / "service.log"
            serve_command = [bin_dir / "prefect-webhooks", "serve", "--host", "127.0.0.1", "--port", str(ingest_port)]
            with _process(serve_command, env, service_log) as service:
                _wait_for(f"http://127.0.0.1:{ingest_port}/health/backlog", service, service_log)
                auth = base64.b64encode(b"wk_pkg_test:").decode()
                batch = {"batch": [{"type": "track", "userId": "u1", "event": "Installed", "messageId": "pkg-1"}]}
                answer = httpx.post(f"http://127.0.0.1:{ingest_port}/v1/batch", json=batch,
                                    headers={"Authorization": f"Basic {auth}"}, timeout=30)
                assert answer.status_code == 200, answer.text
                # The served deployment is registered by the runner; run it once.
                deadline = time.monotonic() + 120
                while True:
                    started = subprocess.run(
                        [str(bin_dir / "prefect"), "deployment", "run", f"deliver/{DELIVER_DEPLOYMENT}"],
                        env=env, capture_output=True, text=True, timeout=120, cwd="/",
                    )
                    if started.returncode == 0:
                        break
                    assert time.monotonic() < deadline, started.stdout + started.stderr + service_log.read_text()
                    time.sleep(1)
                [request] = receiver.wait_for(1, timeout=120)
                service.send_signal(signal.SIGTERM)
                assert service.wait(90) == 0, service_log.read_text(errors="replace")[-3000:]
    body = orjson.loads(request.body)
    assert (body["type"], body["userId"], body["event"]) == ("track", "u1", "Installed")
    assert verify(request.body, request.headers[SIGNATURE_HEADER], secret)
