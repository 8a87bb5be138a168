"""Every ```python block of README.md runs as written, in order, against real parts.

Each block is run on its own (a fresh namespace, as a user pasting it into a new file), in README order, so what an
earlier block saved (blocks, sources) is there for the later ones. The environment every block gets:

- a test Prefect server (``prefect_harness``: ``PREFECT_API_URL`` is set);
- a fresh store (``PREFECT_WEBHOOKS_DATABASE_URL``, a SQLite file) and ``PREFECT_WEBHOOKS_HOME``;
- a real ingest API (uvicorn subprocess) on that store, reachable at ``PREFECT_WEBHOOKS_ENDPOINT``: an ``Analytics``
  client built without ``endpoint=`` sends there;
- a fresh working directory.

A block that needs more names setup steps in an HTML comment on the line before its fence (invisible on the
rendered page): ``<!-- readme-setup: warehouse -->``. Each name is a function in ``SETUPS`` below, run in the
working directory just before the block; add one there for a new kind of example.

A block fails when it raises, when it leaves a coroutine unawaited (a call that silently did nothing), or when
prefect_webhooks logs a warning or an error while it runs (e.g. analytics messages that were not uploaded).
"""

from __future__ import annotations

import gc
import logging
import os
import re
import sqlite3
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engines import dispose_engines, get_engine
from tests.servers import ingest_api_process

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
SETUP = re.compile(r"<!--\s*readme-setup:\s*([\w,\s-]+?)\s*-->\s*$")


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
    line: int
    code: str
    setups: tuple[str, ...]


def examples(text: str) -> list[Example]:
    """The ```python blocks of a Markdown text, with their line numbers and setup steps."""
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        setup = SETUP.search(before)
        names = tuple(name.strip() for name in setup.group(1).split(",")) if setup else ()
        found.append(Example(line, match.group(1), names))
    return found


EXAMPLES = examples(README.read_text())


def test_the_readme_has_python_examples_and_every_setup_they_name_exists() -> None:
    assert len(EXAMPLES) >= 4
    assert all(name in SETUPS for example in EXAMPLES for name in example.setups)


def test_python_blocks_and_their_setup_steps_are_found() -> None:
    text = "x\n<!-- readme-setup: warehouse -->\n```python\nprint(1)\n```\n\n```python\nx = 2\n```\n"
    assert examples(text) == [Example(3, "print(1)\n", ("warehouse",)), Example(7, "x = 2\n", ())]


@pytest.fixture(scope="module")
def readme_environment(
    prefect_harness: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("readme")
    store_url = f"sqlite:///{home / 'store.db'}"
    workdir = home / "work"
    workdir.mkdir()
    get_engine(store_url)
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value()) as server:
        saved = {key: os.environ.get(key) for key in ("PREFECT_WEBHOOKS_DATABASE_URL", "PREFECT_WEBHOOKS_HOME",
                                                        "PREFECT_WEBHOOKS_ENDPOINT")}
        os.environ.update(PREFECT_WEBHOOKS_DATABASE_URL=store_url, PREFECT_WEBHOOKS_HOME=str(home),
                          PREFECT_WEBHOOKS_ENDPOINT=server.url)
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


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"README.md:{example.line}" for example in EXAMPLES])
def test_readme_example_runs_as_written(readme_environment: Path, example: Example) -> None:
    for name in example.setups:
        SETUPS[name](readme_environment)
    collected = _Collect()
    package_logger = logging.getLogger("prefect_webhooks")
    package_logger.addHandler(collected)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            namespace: dict[str, object] = {"__name__": "__readme__"}
            exec(compile(example.code, f"README.md:{example.line}", "exec"), namespace)  # noqa: S102
            del namespace
            gc.collect()
    finally:
        package_logger.removeHandler(collected)
    unawaited = [str(warning.message) for warning in caught if "was never awaited" in str(warning.message)]
    assert unawaited == [], "a call in the example returned a coroutine that nobody awaited: it did nothing"
    assert [record.getMessage() for record in collected.records] == []
