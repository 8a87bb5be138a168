"""Every import path a user meets keeps working: the names the README shows, the blocks' entry point, the
deployments' entry points, and the old paths of the modules that moved into one folder per stage."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from prefect import Flow
from prefect.blocks.core import Block

from prefect_webhooks.utilities.moved_modules import MOVED_MODULES, MovedModuleFinder
from tests.docs_pages import doc_pages

ROOT = Path(__file__).resolve().parents[1]
README = "\n".join(path.read_text(encoding="utf-8") for path in doc_pages())  # README.md and docs/


def resolve(dotted: str) -> object:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def readme_names() -> list[str]:
    names = set()
    for module, imported in re.findall(r"from (prefect_webhooks[\w.]*) import ([\w, ]+)", README):
        names.update(f"{module}.{name.strip()}" for name in imported.split(",") if name.strip())
    names.update(re.findall(r"`(prefect_webhooks(?:\.\w+)+)", README))
    return sorted(names)


def test_the_readme_names_paths() -> None:
    found = readme_names()
    assert "prefect_webhooks.signing.verify" in found
    assert len(found) >= 15


@pytest.mark.parametrize("dotted", readme_names())
def test_every_name_the_readme_shows_imports(dotted: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the README shows the current paths, not the old ones
        assert resolve(dotted) is not None


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_a_moved_module_is_importable_by_its_old_path(old: str, new: str) -> None:
    successor = importlib.import_module(f"prefect_webhooks.{new}")
    sys.modules.pop(f"prefect_webhooks.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"prefect_webhooks.{new}"):
        module = importlib.import_module(f"prefect_webhooks.{old}")
    assert module is successor
    assert module.__spec__.name == f"prefect_webhooks.{new}"  # the successor keeps its own spec


# Every module store/ and delivery/ held before they were grouped by mechanism (removed on 2027-06-01).
FLAT_STORE = [
    "budget", "bulk_insert", "checkpointer", "clock", "counters", "destination_changes", "endpoint_counters",
    "endpoint_states", "engines", "fan_out", "file_modes", "followers", "footprint", "kept_purges", "key_filters",
    "leases", "log_filters", "log_names", "log_partitions", "log_records", "log_rows", "log_statements", "lookups",
    "message_log", "message_search", "metrics", "minute_counts", "ordering", "outbox", "pacing", "replay",
    "retention", "seen_ids", "tables", "upgrades", "write_gate",
]
FLAT_DELIVERY = [
    "answers", "auth", "batch", "batch_bodies", "batching", "circuit", "claims", "context", "controls", "decision",
    "destinations", "endpoint_admin", "events", "fan_out", "filters", "lifecycle", "network", "ordering", "preview",
    "rate_limits", "request_shape", "retry_wakeups", "sender", "shared_state", "stats", "task", "transport", "waves",
]
FLAT_PATHS = [f"store.{name}" for name in FLAT_STORE] + [f"delivery.{name}" for name in FLAT_DELIVERY]


def test_every_flat_store_and_delivery_module_has_moved() -> None:
    assert len(FLAT_STORE) == 36 and len(FLAT_DELIVERY) == 28
    missing = [old for old in FLAT_PATHS if old not in MOVED_MODULES]
    assert missing == []
    for old in FLAT_PATHS:
        package, _, name = old.partition(".")
        assert not (ROOT / "prefect_webhooks" / package / f"{name}.py").exists(), old  # the folder holds mechanisms
        # Its successor sits one folder down, in the same stage.
        assert MOVED_MODULES[old].split(".")[0] == package and MOVED_MODULES[old].count(".") == 2, old


@pytest.mark.parametrize("old", FLAT_PATHS)
def test_an_old_store_or_delivery_path_gives_the_same_module(old: str) -> None:
    new = f"prefect_webhooks.{MOVED_MODULES[old]}"
    successor = importlib.import_module(new)
    assert Path(successor.__file__).parent.parent.name == old.partition(".")[0]
    sys.modules.pop(f"prefect_webhooks.{old}", None)
    with pytest.warns(DeprecationWarning, match=new):
        module = importlib.import_module(f"prefect_webhooks.{old}")
    assert module is successor
    package, _, name = old.partition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec(f"from prefect_webhooks.{package} import {name} as found", namespace := {})  # the other spelling
    assert namespace["found"] is successor


def test_an_old_dotted_path_runs_with_python_dash_m() -> None:
    spec = MovedModuleFinder().find_spec("prefect_webhooks.store.log_rows")
    assert spec is not None and spec.loader is not None
    assert spec.loader.get_code("prefect_webhooks.store.log_rows").co_filename.endswith(str(Path("log", "rows.py")))
    answer = subprocess.run([sys.executable, "-W", "ignore", "-m", "prefect_webhooks.store.pacing"],
                            capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr


@pytest.mark.parametrize("dotted", [
    "prefect_webhooks.messages.Track",
    "prefect_webhooks.messages.parse_message",
    "prefect_webhooks.signing.verify",
    "prefect_webhooks.signing.sign",
    "prefect_webhooks.blocks.WebhookDestination",
    "prefect_webhooks.blocks.Source",
    "prefect_webhooks.store.get_engine",
    "prefect_webhooks.store.OutboxMessage",
    "prefect_webhooks.audiences.AudienceDefinition",
    "prefect_webhooks.audiences.sync_audience",
    "prefect_webhooks.deletions.request_deletion",
    "prefect_webhooks.delivery.deliver_due",
    "prefect_webhooks.metrics.backlog_snapshot",
    "prefect_webhooks.sources.register_source",
    "prefect_webhooks.snapshots.SqlSnapshot",
    "prefect_webhooks.runtime.lazy_module",
])
def test_names_users_imported_before_the_move_still_import(dotted: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert resolve(dotted) is not None


def test_an_old_module_path_runs_with_python_dash_m() -> None:
    # ``python -m prefect_webhooks.delivery_worker`` (an old path) runs the successor's code.
    spec = MovedModuleFinder().find_spec("prefect_webhooks.delivery_worker")
    assert spec is not None and spec.loader is not None
    code = spec.loader.get_code("prefect_webhooks.delivery_worker")
    assert code.co_filename.endswith(str(Path("serving", "delivery_worker.py")))
    answer = subprocess.run([sys.executable, "-W", "ignore", "-m", "prefect_webhooks.tables"], capture_output=True,
                            text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr


def test_the_blocks_entry_point_registers_both_blocks() -> None:
    (entry,) = [entry for entry in importlib.metadata.entry_points(group="prefect.collections")
                if entry.name == "prefect_webhooks"]
    module = entry.load()
    slugs = {getattr(module, name).get_block_type_slug() for name in module.__all__
             if isinstance(getattr(module, name), type) and issubclass(getattr(module, name), Block)}
    assert {"webhook-destination", "webhooks-source"} <= slugs


def test_every_deployment_entrypoint_names_a_flow() -> None:
    definition = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    entrypoints = [deployment["entrypoint"] for deployment in definition["deployments"]]
    assert entrypoints
    for entrypoint in entrypoints:
        assert isinstance(resolve(entrypoint), Flow), entrypoint
