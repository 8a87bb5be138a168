"""Every example of the user documentation (README.md, then the pages of docs/ in the site's navigation order) runs as
written, in order, against real parts.

Each ```python block runs on its own (a fresh namespace, as a user pasting it into a new file); each ```bash block
runs with ``bash -euo pipefail`` from the repository root (as a user of a clone runs it), this virtualenv's commands
first on ``PATH``. Blocks run in reading order, so what an earlier block saved (blocks, sources) is there for the
later ones. The environment every block gets:

- a test Prefect server (``prefect_harness``: ``PREFECT_API_URL`` is set);
- a fresh store (``PREFECT_WEBHOOKS_DATABASE_URL``, a SQLite file) and ``PREFECT_WEBHOOKS_HOME``;
- a real ingest API (uvicorn subprocess) on that store, reachable at ``PREFECT_WEBHOOKS_ENDPOINT`` (its admin API
  on, with ``PREFECT_WEBHOOKS_ADMIN_TOKEN`` set): an ``Analytics``
  client built without ``endpoint=`` sends there;
- a fresh working directory for the python blocks.

An HTML comment on the line before a fence (invisible on the rendered page) says more about the block:

- ``<!-- readme-setup: warehouse -->``: setup steps, each a function in ``SETUPS`` below, run in the working
  directory just before the block;
- ``<!-- docs-file: receiver.py -->``: the block is a file the reader saves and runs in a later step; it is
  compiled here and run by the walkthrough test;
- ``<!-- docs-shell: REASON -->``: a bash block that is not run here, for one of the reasons in ``SHELL_REASONS``
  (nothing else: a free-text skip would let any block escape).

A python block fails when it raises, when it leaves a coroutine unawaited (a call that silently did nothing), or
when prefect_webhooks logs a warning or an error while it runs (e.g. analytics messages that were not uploaded). A
bash block fails on a non-zero exit or a traceback.

The walkthrough of the README ("Your first destination") runs end to end in its own test: a fresh ``prefect server
start``, the receiver saved from the README, ``prefect-webhooks serve``, the event, until the receiver prints the
verified delivery.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prefect.settings import PREFECT_API_URL

from prefect_webhooks.settings import get_settings
from prefect_webhooks.store import dispose_engines, get_engine
from tests.docs_pages import DOCS, ROOT, doc_pages, nav_pages
from tests.servers import background, free_port, ingest_api_process

FENCE = re.compile(r"^([ \t]*)```(\w*)[ \t]*\n(.*?)^\1```[ \t]*$", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*(readme-setup|docs-shell|docs-file):\s*([\w.,\s-]+?)\s*-->\s*$")
# Fence languages the pages use; python and bash blocks are run, the others are shown only (yaml files the tests
# read elsewhere, a Node.js snippet, program output, diagrams without a language).
LANGUAGES = {"python", "bash", "yaml", "js", "text", ""}
SHELL_REASONS = {
    "runs-until-stopped": "a server or worker (prefect server start, serve, ingest, worker start): it does not return; "
    "the tests start these their own way",
    "installs": "creates virtualenvs or installs packages (or runs CI, which does): .ci/run itself does this",
    "walkthrough": "a step of the README walkthrough: run in order with the others by test_the_walkthrough",
}
SHELL_TIMEOUT_SECONDS = 180
# serve stops in 3-4 s on the 2-core test machine (its delivery worker finishes its run first); ample headroom.
STOP_SECONDS = 20


def warehouse(directory: Path) -> None:
    """``warehouse.db``: a SQLite "warehouse" with a ``big_spenders`` table, for snapshot examples."""
    with sqlite3.connect(directory / "warehouse.db") as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS big_spenders (user_id TEXT, lifetime_value REAL)")
        connection.executemany("INSERT INTO big_spenders VALUES (?, ?)", [("u1", 1200.0), ("u2", 860.5)])


def certificates(directory: Path) -> None:
    """Throwaway PEM files for the mutual TLS examples: a partner CA, a client and a server certificate it issued."""
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "partner-ca.pem"))
    for name, identity in (("client", "sender@example.com"), ("server", "secure.example.com")):
        issued = ca.issue_cert(identity)
        (directory / f"{name}.pem").write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
        issued.private_key_pem.write_to_path(str(directory / f"{name}.key"))


SETUPS: dict[str, Callable[[Path], None]] = {"warehouse": warehouse, "certificates": certificates}


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    language: str
    code: str
    setups: tuple[str, ...] = ()
    shell: str | None = None
    file: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs_here(self) -> bool:
        return self.language == "python" and self.file is None or self.language == "bash" and self.shell is None


def examples(text: str, page: str = "README.md") -> list[Example]:
    """The fenced blocks of a Markdown text, with their line numbers and the comment before each."""
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        kind, value = (marker.group(1), marker.group(2).strip()) if marker else (None, "")
        found.append(Example(
            page, line, match.group(2), textwrap.dedent(match.group(3)),
            setups=tuple(name.strip() for name in value.split(",")) if kind == "readme-setup" else (),
            shell=value if kind == "docs-shell" else None,
            file=value if kind == "docs-file" else None,
        ))
    return found


def page_name(path: Path) -> str:
    return str(path.relative_to(DOCS)) if path.is_relative_to(DOCS) else path.name


EXAMPLES = [example for path in doc_pages() for example in examples(path.read_text(encoding="utf-8"),
                                                                      page_name(path))]
RUN_HERE = [example for example in EXAMPLES if example.runs_here]
RAN: set[str] = set()  # examples run in this module's environment, by name


def test_python_blocks_and_their_comments_are_found() -> None:
    text = ("x\n<!-- readme-setup: warehouse -->\n```python\nprint(1)\n```\n\n```python\nx = 2\n```\n"
            "<!-- docs-shell: installs -->\n```bash\npip install x\n```\n- item\n\n  ```yaml\n  a: 1\n  ```\n")
    assert examples(text, "p.md") == [
        Example("p.md", 3, "python", "print(1)\n", setups=("warehouse",)),
        Example("p.md", 7, "python", "x = 2\n"),
        Example("p.md", 11, "bash", "pip install x\n", shell="installs"),
        Example("p.md", 16, "yaml", "a: 1\n"),
    ]


def test_every_page_of_docs_is_in_the_navigation() -> None:
    assert sorted(nav_pages()) == sorted(DOCS.rglob("*.md"))


def test_the_comments_before_fences_are_ones_the_tests_know() -> None:
    assert len([example for example in EXAMPLES if example.language == "python"]) >= 10
    assert len([example for example in RUN_HERE if example.language == "bash"]) >= 3
    for example in EXAMPLES:
        assert example.language in LANGUAGES, f"{example.name}: a ```{example.language} block is neither run nor known"
        assert all(name in SETUPS for name in example.setups), example.name
        assert example.shell is None or (example.language == "bash" and example.shell in SHELL_REASONS), example.name
        assert example.file is None or example.language == "python", example.name


@pytest.mark.parametrize("example", [example for example in EXAMPLES if example.file],
                         ids=lambda example: example.name)
def test_a_file_to_save_compiles(example: Example) -> None:
    compile(example.code, example.file or "", "exec")


@pytest.fixture(scope="module")
def readme_environment(
    prefect_harness: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("readme")
    store_url = f"sqlite:///{home / 'store.db'}"
    workdir = home / "work"
    workdir.mkdir()
    get_engine(store_url)
    RAN.clear()
    admin = {"PREFECT_WEBHOOKS_ADMIN_TOKEN": "readme-admin-token"}  # the admin API's examples use it
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(), env=admin) as server:
        saved = {key: os.environ.get(key) for key in ("PREFECT_WEBHOOKS_DATABASE_URL", "PREFECT_WEBHOOKS_HOME",
                                                        "PREFECT_WEBHOOKS_ENDPOINT", *admin)}
        os.environ.update(PREFECT_WEBHOOKS_DATABASE_URL=store_url, PREFECT_WEBHOOKS_HOME=str(home),
                          PREFECT_WEBHOOKS_ENDPOINT=server.url, **admin)
        get_settings.cache_clear()
        cwd = Path.cwd()
        os.chdir(workdir)
        try:
            yield workdir
        finally:
            os.chdir(cwd)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            get_settings.cache_clear()
            dispose_engines()


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def run_python(example: Example, workdir: Path) -> None:
    for name in example.setups:
        SETUPS[name](workdir)
    collected = _Collect()
    package_logger = logging.getLogger("prefect_webhooks")
    package_logger.addHandler(collected)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            namespace: dict[str, object] = {"__name__": "__readme__"}
            exec(compile(example.code, example.name, "exec"), namespace)  # noqa: S102
            del namespace
            gc.collect()
    finally:
        package_logger.removeHandler(collected)
    unawaited = [str(warning.message) for warning in caught if "was never awaited" in str(warning.message)]
    assert unawaited == [], "a call in the example returned a coroutine that nobody awaited: it did nothing"
    assert [record.getMessage() for record in collected.records] == []


def shell_environment(base: dict[str, str]) -> dict[str, str]:
    """``base`` with this virtualenv's commands first on PATH (as an activated virtualenv)."""
    env = dict(base)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
    return env


def run_bash(example: Example) -> None:
    finished = subprocess.run(["bash", "-euo", "pipefail", "-c", example.code], cwd=ROOT,
                              env=shell_environment({**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}),
                              capture_output=True, text=True, timeout=SHELL_TIMEOUT_SECONDS)
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, f"{example.name} exited {finished.returncode}:\n{output}"
    assert "Traceback" not in output, output


# Bash examples start the Prefect CLI or this package's command (seconds each): they run in the whole suite, not in
# the fast one CI repeats on other Pythons and Prefects.
@pytest.mark.parametrize("example", [
    pytest.param(example, marks=[pytest.mark.slow, pytest.mark.shares_machine]) if example.language == "bash"
    else example for example in RUN_HERE
], ids=lambda example: example.name)
def test_example_runs_as_written(readme_environment: Path, example: Example) -> None:
    # An example may use blocks earlier python examples saved: those ``-m slow`` left out run first. (Python
    # examples never need what a bash example did, so the fast suite runs no bash example.)
    for earlier in RUN_HERE[: RUN_HERE.index(example)]:
        if earlier.language == "python" and earlier.name not in RAN:
            run_example(earlier, readme_environment)
    run_example(example, readme_environment)


def run_example(example: Example, workdir: Path) -> None:
    RAN.add(example.name)
    if example.language == "python":
        run_python(example, workdir)
    else:
        run_bash(example)


# -- The README walkthrough, end to end ---------------------------------------------------------------------------

WALKTHROUGH_START, WALKTHROUGH_END = "<!-- --8<-- [start:walkthrough] -->", "<!-- --8<-- [end:walkthrough] -->"
# The ports the walkthrough names, replaced by free ones: other servers run on this machine while tests do.
WALKTHROUGH_PORTS = ("4200", "8088", "9000")


def walkthrough() -> list[Example]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return examples(text.split(WALKTHROUGH_START, 1)[1].split(WALKTHROUGH_END, 1)[0])


def walkthrough_environment(home: Path, ports: dict[str, int]) -> dict[str, str]:
    """A newcomer's terminal: no Prefect or package settings, an activated virtualenv, a Prefect home of its own."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env.update(HOME=str(home), PREFECT_HOME=str(home / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               # What the walkthrough leaves at their defaults, moved to the free ports:
               PREFECT_SERVER_API_PORT=str(ports["4200"]), PREFECT_WEBHOOKS_INGEST_PORT=str(ports["8088"]))
    return shell_environment(env)


@pytest.mark.slow
@pytest.mark.shares_machine
def test_the_walkthrough_from_an_empty_prefect_to_a_verified_delivery(tmp_path: Path) -> None:
    steps = walkthrough()
    assert [(step.language, step.shell or step.file) for step in steps] == [
        ("bash", "walkthrough"), ("bash", "walkthrough"), ("bash", "walkthrough"), ("python", "receiver.py"),
        ("python", None), ("bash", "walkthrough"), ("python", None), ("bash", "walkthrough"),
    ]
    activate, server, export, receiver, blocks, serve, send, status = steps
    # This interpreter's virtualenv is first on PATH in every step instead.
    assert activate.code == "source .venv/bin/activate\n"
    ports = {port: free_port() for port in WALKTHROUGH_PORTS}

    def here(code: str) -> str:
        for port, free in ports.items():
            code = code.replace(port, str(free))
        return code

    env = walkthrough_environment(tmp_path, ports)

    def run(command: list[str], stdin: str | None = None) -> str:
        finished = subprocess.run(command, input=stdin, env=env, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=SHELL_TIMEOUT_SECONDS)
        assert finished.returncode == 0, finished.stdout + finished.stderr
        return finished.stdout + finished.stderr

    with contextlib.ExitStack() as running:
        prefect = running.enter_context(background(["bash", "-c", here(server.code)], env=env, cwd=tmp_path,
                                                   name="prefect-server"))
        for line in here(export.code).splitlines():
            name, value = line.removeprefix("export ").split("=", 1)
            env[name] = value
        deadline = time.monotonic() + 120
        while not _healthy(f"{env['PREFECT_API_URL']}/health"):
            assert prefect.process.poll() is None and time.monotonic() < deadline, prefect.output()
            time.sleep(0.5)

        (tmp_path / "receiver.py").write_text(here(receiver.code))
        customer = running.enter_context(background([sys.executable, "receiver.py"], env=env, cwd=tmp_path,
                                                    name="receiver"))
        customer.wait_for("receiver on", timeout=30)
        run([sys.executable, "-"], here(blocks.code))
        service = running.enter_context(background(["bash", "-c", here(serve.code)], env=env, cwd=tmp_path,
                                                   name="serve"))
        service.wait_for("ingest API on", timeout=120)
        run([sys.executable, "-"], here(send.code))
        customer.wait_for("verified track Order Completed for u1", timeout=90)
        assert "REJECTED" not in customer.output()
        shown = run(["bash", "-c", here(status.code)])
        row = next(line for line in shown.splitlines() if "my-first-destination" in line)
        # destination, pending, in flight, oldest pending (s), delivered, failed, filtered
        assert re.findall(r"[\w.-]+", row) == ["my-first-destination", "0", "0", "0.0", "1", "0", "0"], shown
        # serve says where its store is, and Ctrl-C stops it cleanly and at once.
        assert f"store {tmp_path / '.prefect-webhooks' / 'webhooks.db'}" in service.output()
        assert service.stop(signal.SIGINT) < STOP_SECONDS and service.process.returncode == 0, service.output()
        assert "Traceback" not in service.output() and "temporary server" not in service.output()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
