"""Snapshot providers (SQL, CSV, Parquet, callable) and snapshot validation."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import TypeAdapter

from prefect_webhooks.snapshots import (
    CallableSnapshot,
    CsvSnapshot,
    ParquetSnapshot,
    SnapshotError,
    SnapshotProvider,
    SqlSnapshot,
    load_snapshot,
    validate_snapshot,
)


def make_frame() -> pd.DataFrame:
    """A snapshot callable importable by path."""
    return pd.DataFrame({"user_id": ["a", "b"], "score": [1, 2]})


def not_a_frame() -> list[str]:
    return ["a"]


def sql_source(path: Path, rows: list[tuple[object, ...]]) -> str:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE members (user_id, score)")
        connection.executemany("INSERT INTO members VALUES (?, ?)", rows)
    return f"sqlite:///{path}"


def test_sql_snapshot_reads_the_query(tmp_path: Path) -> None:
    url = sql_source(tmp_path / "warehouse.db", [("u1", 10), ("u2", 20), ("u3", None)])
    provider = SqlSnapshot(url=url, query="SELECT user_id, score FROM members WHERE score IS NOT NULL")
    frame = load_snapshot(provider, ["user_id", "score"])
    assert frame["user_id"].tolist() == ["u1", "u2"]
    assert frame["score"].tolist() == [10, 20]


def test_sql_url_is_secret_in_repr() -> None:
    provider = SqlSnapshot(url="postgresql://me:hunter2@db/x", query="select 1")
    assert "hunter2" not in repr(provider)
    assert "hunter2" not in str(provider.model_dump())


def test_csv_snapshot_keeps_ids_as_text(tmp_path: Path) -> None:
    path = tmp_path / "members.csv"
    path.write_text("user_id,score,other\n007,1.5,x\n42,2,y\n")
    frame = load_snapshot(CsvSnapshot(path=str(path)), ["user_id", "score"])
    assert list(frame.columns) == ["user_id", "score"]
    assert validate_snapshot(frame, "user_id")["user_id"].tolist() == ["007", "42"]


def test_parquet_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "members.parquet"
    pd.DataFrame({"user_id": ["x", "y"], "flag": [True, False], "unused": [1, 2]}).to_parquet(path)
    frame = load_snapshot(ParquetSnapshot(path=str(path)), ["user_id", "flag"])
    assert list(frame.columns) == ["user_id", "flag"]
    normalised = validate_snapshot(frame, "user_id", "flag", "boolean")
    assert normalised["value"].tolist() == ["true", "false"]


def test_callable_snapshot_by_path_and_by_object() -> None:
    by_path = load_snapshot(CallableSnapshot(function="tests.test_snapshots:make_frame"), ["user_id"])
    by_object = load_snapshot(CallableSnapshot(function=make_frame), ["user_id"])
    assert by_path.equals(by_object)
    with pytest.raises(SnapshotError, match="not a pandas DataFrame"):
        load_snapshot(CallableSnapshot(function=not_a_frame), ["user_id"])
    with pytest.raises(SnapshotError, match="package.module:function"):
        load_snapshot(CallableSnapshot(function="no_colon_here"), ["user_id"])


def test_providers_are_a_discriminated_union() -> None:
    adapter = TypeAdapter(SnapshotProvider)
    assert isinstance(adapter.validate_python({"kind": "csv", "path": "a.csv"}), CsvSnapshot)
    assert isinstance(adapter.validate_python({"kind": "sql", "url": "sqlite://", "query": "q"}), SqlSnapshot)


def test_integer_ids_become_decimal_strings() -> None:
    normalised = validate_snapshot(pd.DataFrame({"user_id": [1, 20, 300]}), "user_id")
    assert normalised["user_id"].tolist() == ["1", "20", "300"]
    mixed = validate_snapshot(pd.DataFrame({"user_id": pd.Series(["a", 5], dtype=object)}), "user_id")
    assert mixed["user_id"].tolist() == ["a", "5"]


def test_integral_float_ids_are_accepted() -> None:
    # An integer SQL column read through a NaN-able path arrives as float.
    assert validate_snapshot(pd.DataFrame({"user_id": [1.0, 2.0]}), "user_id")["user_id"].tolist() == ["1", "2"]


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"id": ["a"]}), "no column 'user_id'"),
        (pd.DataFrame({"user_id": ["a", None, "c", None]}), "2 rows have a null or empty user id"),
        (pd.DataFrame({"user_id": ["a", "", "c"]}), "1 rows have a null or empty user id"),
        (pd.DataFrame({"user_id": ["a", "b", "a", "c", "b"]}), "4 rows have a duplicate user id"),
        (pd.DataFrame({"user_id": [1.5, 2.0]}), "1 rows have a user id that is not a string or an integer"),
        (pd.DataFrame({"user_id": [True, False]}), "2 rows have a user id that is not a string or an integer"),
        (pd.DataFrame({"user_id": pd.Series(["a", 1.5, b"x"], dtype=object)}), "2 rows have a user id that is not"),
        (pd.DataFrame({"user_id": [1, None]}), "1 rows have a null user id"),
    ],
)
def test_bad_ids_give_count_and_first_rows(frame: pd.DataFrame, message: str) -> None:
    with pytest.raises(SnapshotError, match=message) as error:
        validate_snapshot(frame, "user_id")
    if "no column" not in message:
        assert "first offending rows: row " in str(error.value)


def test_the_first_offending_rows_are_shown_and_capped() -> None:
    frame = pd.DataFrame({"user_id": ["ok"] + [None] * 9})
    with pytest.raises(SnapshotError) as error:
        validate_snapshot(frame, "user_id")
    text = str(error.value)
    assert text.startswith("9 rows have a null or empty user id")
    assert "row 1:" in text and "row 5:" in text and "row 6:" not in text


def test_duplicates_show_their_rows() -> None:
    with pytest.raises(SnapshotError) as error:
        validate_snapshot(pd.DataFrame({"user_id": ["a", "b", "a"]}), "user_id")
    assert "row 0: {'user_id': 'a'}" in str(error.value) and "row 2: {'user_id': 'a'}" in str(error.value)


@pytest.mark.parametrize(
    ("values", "value_type", "message"),
    [
        ([1, "two", 3], "number", "1 rows have a 'score' that is not a number"),
        ([1.0, np.inf, 2.0], "number", "1 rows have a 'score' that is not finite"),
        ([True, 1, "x"], "boolean", "2 rows have a 'score' that is not a boolean"),
        (["a", 2, 3.5], "string", "2 rows have a 'score' that is not a string"),
        ([1, 2, 3], "string", "3 rows have a 'score' that is not a string"),
        ([1.0, None, 3.0], "number", "1 rows have a null value in 'score'"),
        ([True, 1.0, 0], "number", "1 rows have a 'score' that is not a number"),
    ],
)
def test_wrong_value_types(values: list[object], value_type: str, message: str) -> None:
    frame = pd.DataFrame({"user_id": ["a", "b", "c"], "score": pd.Series(values, dtype=object)})
    with pytest.raises(SnapshotError, match=message):
        validate_snapshot(frame, "user_id", "score", value_type)  # type: ignore[arg-type]


def test_values_are_json_encoded() -> None:
    frame = pd.DataFrame({"user_id": ["a", "b"], "score": [1, 2], "ratio": [0.5, 2.0], "tier": ["gold", "é"]})
    assert validate_snapshot(frame, "user_id", "score", "number")["value"].tolist() == ["1", "2"]
    assert validate_snapshot(frame, "user_id", "ratio", "number")["value"].tolist() == ["0.5", "2.0"]
    assert validate_snapshot(frame, "user_id", "tier", "string")["value"].tolist() == ['"gold"', '"é"']


def test_empty_snapshot_with_the_column_is_valid() -> None:
    assert validate_snapshot(pd.DataFrame({"user_id": pd.Series([], dtype=object)}), "user_id").empty
