"""Audience and computed-trait syncs against a real SQLite store and a real SQL snapshot source."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import insert, select

from prefect_webhooks.audiences import diff as audience_diff
from prefect_webhooks.audiences import sync as audiences
from prefect_webhooks.audiences.snapshots import CsvSnapshot, ParquetSnapshot, SnapshotError, SqlSnapshot
from prefect_webhooks.audiences.sync import AudienceDefinition, AudienceError, sync_audience
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.tables import Audience, AudienceState, OutboxMessage, SuppressedUser, store_now

DESTINATIONS = {"web": ["crm", "ads"], "app": ["ads", "mail"], "quiet": []}


class Warehouse:
    """A second SQLite database queried through its SQLAlchemy URL: the snapshot source."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE members (user_id TEXT, segment TEXT)")
            connection.execute("CREATE TABLE scores (user_id TEXT, score)")

    def members(self, *user_ids: Any, segment: str = "vip") -> None:
        with sqlite3.connect(self.path) as connection:
            connection.execute("DELETE FROM members")
            connection.executemany("INSERT INTO members VALUES (?, ?)", [(user, segment) for user in user_ids])

    def scores(self, values: dict[str, Any]) -> None:
        with sqlite3.connect(self.path) as connection:
            connection.execute("DELETE FROM scores")
            connection.executemany("INSERT INTO scores VALUES (?, ?)", list(values.items()))

    def audience(self, name: str = "Big Spenders 2024", **extra: Any) -> AudienceDefinition:
        query = "SELECT user_id FROM members WHERE segment = 'vip'"
        extra.setdefault("sources", ["web"])
        return AudienceDefinition(name=name, snapshot=SqlSnapshot(url=self.url, query=query), **extra)

    def trait(self, name: str = "Lifetime Value", value_type: str = "number") -> AudienceDefinition:
        return AudienceDefinition(
            name=name,
            kind="computed_trait",
            sources=["web"],
            snapshot=SqlSnapshot(url=self.url, query="SELECT user_id, score FROM scores"),
            value_column="score",
            value_type=value_type,
        )


@pytest.fixture
def warehouse(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "warehouse.db")


def outbox(store_url: str) -> list[dict[str, Any]]:
    """Every outbox row, body decoded, in insertion order."""
    table = OutboxMessage.__table__
    with get_engine(store_url).connect() as connection:
        rows = connection.execute(select(table).order_by(table.c.id)).mappings().all()
    return [{**row, "body": orjson.loads(row["body"])} for row in rows]


def traits_sent(store_url: str, destination: str = "crm") -> dict[str, Any]:
    """userId → traits of the identify messages queued for ``destination``, in order (later wins)."""
    return {row["user_id"]: row["body"]["traits"] for row in outbox(store_url) if row["destination"] == destination}


def state(store_url: str, destination: str = "crm") -> dict[str, str]:
    table = AudienceState.__table__
    with get_engine(store_url).connect() as connection:
        rows = connection.execute(select(table.c.user_id, table.c.value).where(table.c.destination == destination))
        return dict(rows.all())


def registry(store_url: str) -> list[dict[str, Any]]:
    with get_engine(store_url).connect() as connection:
        return [dict(row) for row in connection.execute(select(Audience.__table__)).mappings()]


def test_first_sync_sends_every_member_to_every_destination(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1", "u2", "u3")
    definition = warehouse.audience(sources=["web", "app", "quiet"])
    result = sync_audience(definition, DESTINATIONS)

    assert result.key == "big_spenders_2024" and result.members == 3
    per_destination = {row.destination: row for row in result.destinations}
    # ads is enabled on web and app: synced once, under the first source naming it.
    assert {name: row.source for name, row in per_destination.items()} == {"crm": "web", "ads": "web", "mail": "app"}
    assert all((row.added, row.queued, row.removed, row.unchanged) == (3, 3, 0, 0) for row in result.destinations)

    rows = outbox(store_url)
    assert Counter((row["destination"], row["source"]) for row in rows) == {
        ("crm", "web"): 3, ("ads", "web"): 3, ("mail", "app"): 3,
    }
    first = rows[0]
    assert first["message_type"] == "identify" and first["state"] == "pending"
    assert list(first["body"]) == ["version", "type", "userId", "timestamp", "traits"]
    assert first["body"]["version"] == 1 and first["body"]["type"] == "identify"
    assert first["body"]["traits"] == {"big_spenders_2024": True}
    assert first["body"]["timestamp"].endswith("Z") and len(first["body"]["timestamp"]) == 24
    assert {row["user_id"] for row in rows} == {"u1", "u2", "u3"}
    assert state(store_url) == {"u1": "true", "u2": "true", "u3": "true"}
    assert registry(store_url)[0]["member_count"] == 3


def test_incremental_syncs_send_only_changes(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1", "u2", "u3")
    sync_audience(warehouse.audience(), DESTINATIONS)
    warehouse.members("u2", "u3", "u4")
    result = sync_audience(warehouse.audience(), DESTINATIONS)

    crm = next(row for row in result.destinations if row.destination == "crm")
    assert (crm.members, crm.added, crm.removed, crm.changed, crm.unchanged, crm.queued) == (3, 1, 1, 0, 2, 2)
    second = outbox(store_url)[6:]
    assert sorted((row["destination"], row["user_id"], row["body"]["traits"]["big_spenders_2024"])
                  for row in second) == [("ads", "u1", False), ("ads", "u4", True),
                                         ("crm", "u1", False), ("crm", "u4", True)]
    assert state(store_url) == {"u2": "true", "u3": "true", "u4": "true"}

    unchanged = sync_audience(warehouse.audience(), DESTINATIONS)
    assert len(outbox(store_url)) == 10
    assert all(row.queued == 0 and row.unchanged == 3 for row in unchanged.destinations)

    # A user who left and comes back is added again.
    warehouse.members("u1", "u2", "u3", "u4")
    sync_audience(warehouse.audience(), DESTINATIONS)
    assert [row["body"]["traits"] for row in outbox(store_url)[10:]] == [{"big_spenders_2024": True}] * 2


def test_a_destination_enabled_later_gets_a_first_sync(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1", "u2")
    sync_audience(warehouse.audience(), {"web": ["crm"]})
    warehouse.members("u1", "u2", "u3")
    result = sync_audience(warehouse.audience(), {"web": ["crm", "ads"]})
    assert {row.destination: row.queued for row in result.destinations} == {"crm": 1, "ads": 3}


def test_rename_keeps_the_key(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1")
    sync_audience(warehouse.audience("VIP users (EU)"), DESTINATIONS)
    warehouse.members("u1", "u2")
    renamed = sync_audience(warehouse.audience("European VIPs", key="vip_users_eu"), DESTINATIONS)

    assert renamed.key == "vip_users_eu"
    assert [(row["key"], row["name"]) for row in registry(store_url)] == [("vip_users_eu", "European VIPs")]
    assert traits_sent(store_url)["u2"] == {"vip_users_eu": True}
    # Its current name now finds it without the key; the old name's key is still taken.
    warehouse.members("u1", "u2", "u3")
    assert sync_audience(warehouse.audience("European VIPs"), DESTINATIONS).key == "vip_users_eu"
    assert traits_sent(store_url)["u3"] == {"vip_users_eu": True}
    with pytest.raises(AudienceError, match="'VIP users [(]EU[)]'.*'European VIPs'"):
        sync_audience(warehouse.audience("VIP users (EU)"), DESTINATIONS)


def test_key_collision_at_creation_names_both(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1")
    sync_audience(warehouse.audience("High-Value Users"), DESTINATIONS)
    before = outbox(store_url)
    with pytest.raises(AudienceError) as error:
        sync_audience(warehouse.audience("high value users!"), DESTINATIONS)
    assert "'high value users!'" in str(error.value) and "'High-Value Users'" in str(error.value)
    assert "high_value_users" in str(error.value)
    assert outbox(store_url) == before
    assert len(registry(store_url)) == 1


def test_rename_to_another_audiences_name_is_an_error(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1")
    sync_audience(warehouse.audience("Big Spenders 2024"), DESTINATIONS)
    sync_audience(warehouse.audience("Churn Risk"), DESTINATIONS)
    expected = "cannot name audience 'churn_risk' 'Big Spenders 2024': audience 'big_spenders_2024' already"
    with pytest.raises(AudienceError, match=expected):
        sync_audience(warehouse.audience("Big Spenders 2024", key="churn_risk"), DESTINATIONS)


def test_unknown_explicit_key_and_kind_change_are_errors(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1")
    with pytest.raises(AudienceError, match="no audience has key 'other'"):
        sync_audience(warehouse.audience("Big Spenders 2024", key="other"), DESTINATIONS)
    sync_audience(warehouse.audience("Lifetime Value"), DESTINATIONS)
    warehouse.scores({"u1": 3})
    with pytest.raises(AudienceError, match="is a audience, not a computed_trait"):
        sync_audience(warehouse.trait("Lifetime Value"), DESTINATIONS)


def test_definition_rules() -> None:
    snapshot = SqlSnapshot(url="sqlite://", query="select 1")
    with pytest.raises(ValueError, match="needs a value_column"):
        AudienceDefinition(name="x", kind="computed_trait", sources=[], snapshot=snapshot)
    with pytest.raises(ValueError, match="has no value_column"):
        AudienceDefinition(name="x", sources=[], snapshot=snapshot, value_column="v")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT segment FROM members", "no column 'user_id'"),
        ("SELECT NULL AS user_id UNION ALL SELECT 'u1'", "1 row has a null or empty user id: row 1: user_id=null;"),
        ("SELECT 'u1' AS user_id UNION ALL SELECT 'u1' UNION ALL SELECT 'u2'",
         "2 rows have a duplicate user id .*'u1' on rows 1, 2;"),
        ("SELECT 1.5 AS user_id", "1 row has a user id that is not a string or an integer: row 1: user_id=1.5;"),
    ],
)
def test_bad_snapshots_write_nothing(store_url: str, warehouse: Warehouse, query: str, message: str) -> None:
    warehouse.members("u1")
    sync_audience(warehouse.audience(), DESTINATIONS)
    before = (outbox(store_url), state(store_url), registry(store_url))
    bad = warehouse.audience().model_copy(update={"snapshot": SqlSnapshot(url=warehouse.url, query=query)})
    with pytest.raises(SnapshotError, match=message):
        sync_audience(bad, DESTINATIONS)
    assert (outbox(store_url), state(store_url), registry(store_url)) == before


def test_bad_snapshot_on_first_sync_registers_nothing(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1", "u1")
    with pytest.raises(SnapshotError, match="2 rows have a duplicate user id .*'u1' on rows 1, 2;"):
        sync_audience(warehouse.audience(), DESTINATIONS)
    assert registry(store_url) == [] and outbox(store_url) == []


def test_bad_trait_values_write_nothing(store_url: str, warehouse: Warehouse) -> None:
    warehouse.scores({"u1": 1, "u2": "lots", "u3": 2.5, "u4": "many"})
    expected = ("2 rows have a 'score' that is not a number: row 2: user_id='u2', score='lots'; "
                "row 4: user_id='u4', score='many'; rows are numbered from 1")
    with pytest.raises(SnapshotError, match=expected):
        sync_audience(warehouse.trait(), DESTINATIONS)
    warehouse.scores({"u1": 1, "u2": None})
    with pytest.raises(SnapshotError, match="1 row has a null value in 'score': row 2: user_id='u2', score=null;"):
        sync_audience(warehouse.trait(), DESTINATIONS)
    assert registry(store_url) == [] and outbox(store_url) == []


def test_empty_snapshot_after_members_is_refused_unless_allowed(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members("u1", "u2")
    sync_audience(warehouse.audience(), DESTINATIONS)
    warehouse.members()
    with pytest.raises(SnapshotError, match="empty but the last sync had members.*allow_empty=True"):
        sync_audience(warehouse.audience(), DESTINATIONS)
    assert len(outbox(store_url)) == 4 and len(state(store_url)) == 2

    result = sync_audience(warehouse.audience(), DESTINATIONS, allow_empty=True)
    assert all(row.removed == 2 and row.queued == 2 for row in result.destinations)
    assert traits_sent(store_url) == {"u1": {"big_spenders_2024": False}, "u2": {"big_spenders_2024": False}}
    assert state(store_url) == {}
    # Once an empty sync was accepted, the next empty one is no longer suspicious.
    assert sync_audience(warehouse.audience(), DESTINATIONS).members == 0


def test_an_empty_first_sync_is_fine(store_url: str, warehouse: Warehouse) -> None:
    result = sync_audience(warehouse.audience(), DESTINATIONS)
    assert result.members == 0 and outbox(store_url) == []


def test_computed_trait_sends_only_changed_values(store_url: str, warehouse: Warehouse) -> None:
    warehouse.scores({"u1": 10, "u2": 20.5, "u3": 30})
    first = sync_audience(warehouse.trait(), DESTINATIONS)
    assert first.key == "lifetime_value"
    assert traits_sent(store_url) == {"u1": {"lifetime_value": 10}, "u2": {"lifetime_value": 20.5},
                                      "u3": {"lifetime_value": 30}}

    warehouse.scores({"u1": 10, "u2": 25, "u4": 1})
    result = sync_audience(warehouse.trait(), DESTINATIONS)
    crm = next(row for row in result.destinations if row.destination == "crm")
    assert (crm.added, crm.changed, crm.removed, crm.unchanged, crm.queued) == (1, 1, 1, 1, 3)
    latest = [row for row in outbox(store_url)[6:] if row["destination"] == "crm"]
    assert sorted([(row["user_id"], row["body"]["traits"]["lifetime_value"]) for row in latest]) == [
        ("u2", 25), ("u3", None), ("u4", 1)]
    assert state(store_url) == {"u1": "10", "u2": "25", "u4": "1"}


def test_string_trait(store_url: str, warehouse: Warehouse) -> None:
    warehouse.scores({"u1": "gold"})
    sync_audience(warehouse.trait("Loyalty Tier", value_type="string"), DESTINATIONS)
    warehouse.scores({"u1": "platinum"})
    sync_audience(warehouse.trait("Loyalty Tier", value_type="string"), DESTINATIONS)
    assert [row["body"]["traits"] for row in outbox(store_url) if row["destination"] == "crm"] == [
        {"loyalty_tier": "gold"}, {"loyalty_tier": "platinum"}]


def test_integer_user_ids_from_sql(store_url: str, warehouse: Warehouse) -> None:
    warehouse.members(101, 102)
    sync_audience(warehouse.audience(), {"web": ["crm"]})
    assert sorted(traits_sent(store_url)) == ["101", "102"]


def test_suppressed_users_are_left_out(store_url: str, warehouse: Warehouse) -> None:
    with get_engine(store_url).begin() as connection:
        connection.execute(insert(SuppressedUser.__table__), [
            {"user_id": "u2", "source": "*", "created_at": store_now()},
            {"user_id": "u3", "source": "app", "created_at": store_now()},
        ])
    warehouse.members("u1", "u2", "u3")
    result = sync_audience(warehouse.audience(sources=["web", "app"]), DESTINATIONS)
    assert {row.destination: row.members for row in result.destinations} == {"crm": 2, "ads": 2, "mail": 1}
    assert sorted(traits_sent(store_url, "crm")) == ["u1", "u3"]
    assert sorted(traits_sent(store_url, "mail")) == ["u1"]


def test_progress_reaches_one(store_url: str, warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audiences, "CHUNK_ROWS", 2)
    warehouse.members(*[f"u{i}" for i in range(7)])
    seen: list[float] = []
    sync_audience(warehouse.audience(), {"web": ["crm", "ads"]}, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) >= 8


class Crash(RuntimeError):
    """Stands in for a process dying inside the transaction."""


@pytest.mark.parametrize("crash_on_chunk", [1, 3])
def test_crash_between_diff_and_commit_then_rerun_queues_each_change_once(
    store_url: str, warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch, crash_on_chunk: int
) -> None:
    warehouse.members("u1", "u2", "u3", "u4")
    sync_audience(warehouse.audience(), {"web": ["crm"]})
    warehouse.members("u3", "u4", "u5", "u6", "u7")  # u1, u2 leave; u5, u6, u7 join
    monkeypatch.setattr(audiences, "CHUNK_ROWS", 2)
    real_write_state = audiences.write_state
    calls = {"n": 0}

    def crashing_write_state(*args: Any, **kwargs: Any) -> None:
        # Runs inside the transaction, after this chunk's outbox rows were inserted.
        calls["n"] += 1
        real_write_state(*args, **kwargs)
        if calls["n"] == crash_on_chunk:
            raise Crash("killed after the outbox insert")

    monkeypatch.setattr(audiences, "write_state", crashing_write_state)
    with pytest.raises(Crash):
        sync_audience(warehouse.audience(), {"web": ["crm"]})
    assert len(outbox(store_url)) == 4, "nothing of the crashed run may be committed"
    assert state(store_url) == {"u1": "true", "u2": "true", "u3": "true", "u4": "true"}

    monkeypatch.setattr(audiences, "write_state", real_write_state)
    sync_audience(warehouse.audience(), {"web": ["crm"]})
    sync_audience(warehouse.audience(), {"web": ["crm"]})  # and a further run adds nothing
    changes = Counter((row["user_id"], row["body"]["traits"]["big_spenders_2024"]) for row in outbox(store_url)[4:])
    assert changes == {("u1", False): 1, ("u2", False): 1, ("u5", True): 1, ("u6", True): 1, ("u7", True): 1}
    assert state(store_url) == {user: "true" for user in ("u3", "u4", "u5", "u6", "u7")}


def test_crash_in_one_destination_keeps_the_committed_one(
    store_url: str, warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    warehouse.members("u1", "u2")
    real = audiences.add_to_outbox

    def failing_for_ads(connection: Any, rows: Any) -> int:
        if rows and rows[0]["destination"] == "ads":
            real(connection, rows)
            raise Crash("killed while writing ads")
        return real(connection, rows)

    monkeypatch.setattr(audiences, "add_to_outbox", failing_for_ads)
    with pytest.raises(Crash):
        sync_audience(warehouse.audience(), {"web": ["crm", "ads"]})
    monkeypatch.setattr(audiences, "add_to_outbox", real)
    assert Counter(row["destination"] for row in outbox(store_url)) == {"crm": 2}
    result = sync_audience(warehouse.audience(), {"web": ["crm", "ads"]})
    assert {row.destination: row.queued for row in result.destinations} == {"crm": 0, "ads": 2}


def test_concurrent_syncs_of_one_audience_queue_each_change_once(store_url: str, warehouse: Warehouse) -> None:
    from concurrent.futures import ThreadPoolExecutor

    warehouse.members(*[f"u{i}" for i in range(2000)])
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: sync_audience(warehouse.audience(), {"web": ["crm"]}), range(3)))
    assert sorted(result.destinations[0].queued for result in results) == [0, 0, 2000]
    assert len(outbox(store_url)) == 2000


@given(before=st.dictionaries(st.text(min_size=1, max_size=4), st.sampled_from(["1", "2", '"x"']), max_size=30),
       after=st.dictionaries(st.text(min_size=1, max_size=4), st.sampled_from(["1", "2", '"x"']), max_size=30))
def test_diff_matches_a_set_based_reference(before: dict[str, str], after: dict[str, str]) -> None:
    def frame(values: dict[str, str]) -> pd.DataFrame:
        return pd.DataFrame({"user_id": pd.Series(list(values), dtype=object),
                             "value": pd.Series(list(values.values()), dtype=object)})

    diff = audience_diff.diff_snapshot(frame(after), frame(before))
    assert dict(zip(diff.added["user_id"], diff.added["value"], strict=True)) == {
        user: value for user, value in after.items() if user not in before}
    assert set(diff.removed) == set(before) - set(after)
    assert dict(zip(diff.changed["user_id"], diff.changed["value"], strict=True)) == {
        user: value for user, value in after.items() if user in before and before[user] != value}
    assert diff.unchanged == sum(1 for user, value in after.items() if before.get(user) == value)


KILLED_CHILD = """
import sys, time
from pathlib import Path
from prefect_webhooks.audiences import sync as audiences
from prefect_webhooks.audiences.sync import AudienceDefinition, sync_audience
from prefect_webhooks.audiences.snapshots import SqlSnapshot
from prefect_webhooks.store.engine.engines import get_engine

store, warehouse, marker = sys.argv[1:4]
audiences.CHUNK_ROWS = 1000
definition = AudienceDefinition(name="Big Spenders 2024", sources=["web"],
                                snapshot=SqlSnapshot(url=warehouse, query="SELECT user_id FROM members"))

def progress(fraction):
    if 0.3 < fraction < 1.0 and not Path(marker).exists():
        Path(marker).write_text("inside the transaction")
        time.sleep(30)  # the parent kills us here, chunks already inserted but not committed

sync_audience(definition, {"web": ["crm"]}, engine=get_engine(store), progress=progress)
"""


@pytest.mark.shares_machine
@pytest.mark.slow
def test_a_killed_sync_leaves_nothing_and_the_rerun_sends_each_member_once(
    store_url: str, warehouse: Warehouse, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    warehouse.members(*[f"u{i}" for i in range(20_000)])
    marker = tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, store_url, warehouse.url, str(marker)],
                             cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, "the child ended before reaching the transaction"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert outbox(store_url) == [] and state(store_url) == {}

    result = sync_audience(warehouse.audience(), {"web": ["crm"]})
    assert result.destinations[0].queued == 20_000
    users = Counter(row["user_id"] for row in outbox(store_url))
    assert len(users) == 20_000 and set(users.values()) == {1}


# -- computed-trait values compare as JSON values, whatever dtype the snapshot had -------------------------------


def lifetime_value(snapshot: Any) -> AudienceDefinition:
    return AudienceDefinition(name="Lifetime Value", kind="computed_trait", sources=["web"], snapshot=snapshot,
                              value_column="lifetime_value", value_type="number")


def write_day(kind: str, path: Path, values: dict[str, Any]) -> Any:
    """One day's snapshot file, written by pandas as a warehouse export would be (a float column: ``11.0``)."""
    frame = pd.DataFrame({"user_id": list(values), "lifetime_value": list(values.values())})
    if kind == "csv":
        frame.to_csv(path / "ltv.csv", index=False)
        return CsvSnapshot(path=str(path / "ltv.csv"))
    frame.to_parquet(path / "ltv.parquet")
    return ParquetSnapshot(path=str(path / "ltv.parquet"))


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_a_value_whose_column_dtype_drifted_is_not_sent_again(store_url: str, tmp_path: Path, kind: str) -> None:
    day_one = write_day(kind, tmp_path, {"u1": 11, "u2": 20, "u3": 0})
    sync_audience(lifetime_value(day_one), DESTINATIONS)
    assert traits_sent(store_url) == {"u1": {"lifetime_value": 11}, "u2": {"lifetime_value": 20},
                                      "u3": {"lifetime_value": 0}}

    # One 2.5 turns the column into floats: u1 and u3 read as 11.0 and 0.0, the same numbers as yesterday.
    day_two = write_day(kind, tmp_path, {"u1": 11, "u2": 20.5, "u3": 0, "u4": 2.5})
    assert kind == "parquet" or "11.0" in (tmp_path / "ltv.csv").read_text()
    result = sync_audience(lifetime_value(day_two), DESTINATIONS)
    crm = next(row for row in result.destinations if row.destination == "crm")
    assert (crm.added, crm.changed, crm.unchanged, crm.queued) == (1, 1, 2, 2)
    second = [row for row in outbox(store_url)[6:] if row["destination"] == "crm"]
    assert {row["user_id"]: row["body"]["traits"] for row in second} == {
        "u2": {"lifetime_value": 20.5}, "u4": {"lifetime_value": 2.5}}

    # And back to integers: only the real changes again.
    day_three = write_day(kind, tmp_path, {"u1": 11, "u2": 21, "u3": 0, "u4": 2.5})
    result = sync_audience(lifetime_value(day_three), DESTINATIONS)
    assert [(row.changed, row.queued) for row in result.destinations if row.destination == "crm"] == [(1, 1)]
    assert outbox(store_url)[-1]["body"]["traits"] == {"lifetime_value": 21}
    assert state(store_url) == {"u1": "11", "u2": "21", "u3": "0", "u4": "2.5"}


def test_state_stored_before_values_were_canonical_is_not_a_change(store_url: str, warehouse: Warehouse) -> None:
    warehouse.scores({"u1": 11, "u2": 2.5, "u3": 7})
    sync_audience(warehouse.trait(), DESTINATIONS)
    sent = len(outbox(store_url))
    # What an earlier version stored for a float column: "11.0".
    with get_engine(store_url).begin() as connection:
        table = AudienceState.__table__
        connection.execute(table.update().where(table.c.user_id == "u1").values(value="11.0"))
        connection.execute(table.update().where(table.c.user_id == "u3").values(value="7.0"))
    warehouse.scores({"u1": 11, "u2": 2.5, "u3": 8})
    result = sync_audience(warehouse.trait(), DESTINATIONS)
    assert all((row.changed, row.unchanged, row.queued) == (1, 2, 1) for row in result.destinations)
    assert [row["user_id"] for row in outbox(store_url)[sent:]] == ["u3", "u3"]
    # The old text is rewritten in canonical form, so the next sync compares it directly.
    assert state(store_url) == {"u1": "11", "u2": "2.5", "u3": "8"}


def test_sql_booleans_stored_as_0_and_1_are_booleans(store_url: str, warehouse: Warehouse) -> None:
    warehouse.scores({"u1": 1, "u2": 0})
    sync_audience(warehouse.trait("Is Active", value_type="boolean"), DESTINATIONS)
    assert traits_sent(store_url) == {"u1": {"is_active": True}, "u2": {"is_active": False}}
