"""Snapshot providers (SQL, CSV, Parquet, callable) and snapshot validation."""

from __future__ import annotations

import re
import sqlite3
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import TypeAdapter

from prefect_webhooks.audiences.snapshots import (
    CallableSnapshot,
    CsvSnapshot,
    ParquetSnapshot,
    SnapshotError,
    SnapshotProvider,
    SqlSnapshot,
    canonical_text,
    encode_value,
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
    by_path = load_snapshot(CallableSnapshot(function="tests.audiences.test_snapshots:make_frame"), ["user_id"])
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
        (pd.DataFrame({"user_id": ["a", None, "c", None]}),
         "2 rows have a null or empty user id: row 2: user_id=null; row 4: user_id=null;"),
        (pd.DataFrame({"user_id": ["a", "", "c"]}), "1 row has a null or empty user id: row 2: user_id='';"),
        (pd.DataFrame({"user_id": ["a", "b", "a", "c", "b"]}),
         "4 rows have a duplicate user id [(]2 user ids appear more than once[)]: 'a' on rows 1, 3; 'b' on rows 2, 5;"),
        (pd.DataFrame({"user_id": [1.5, 2.0]}),
         "1 row has a user id that is not a string or an integer: row 1: user_id=1.5;"),
        (pd.DataFrame({"user_id": [True, False]}),
         "2 rows have a user id that is not a string or an integer: row 1: user_id=True; row 2: user_id=False;"),
        (pd.DataFrame({"user_id": pd.Series(["a", 1.5, b"x"], dtype=object)}),
         "2 rows have a user id that is not a string or an integer: row 2: user_id=1.5; row 3: user_id=b'x';"),
        (pd.DataFrame({"user_id": [1, None]}), "1 row has a null user id: row 2: user_id=null;"),
    ],
)
def test_bad_ids_give_count_and_first_rows(frame: pd.DataFrame, message: str) -> None:
    with pytest.raises(SnapshotError, match=message) as error:
        validate_snapshot(frame, "user_id")
    if "no column" not in message:
        assert str(error.value).endswith("; rows are numbered from 1 in snapshot order, a CSV header not counted")


def test_the_first_offending_rows_are_shown_and_capped() -> None:
    frame = pd.DataFrame({"user_id": ["ok"] + [None] * 9})
    with pytest.raises(SnapshotError) as error:
        validate_snapshot(frame, "user_id")
    text = str(error.value)
    assert text.startswith("9 rows have a null or empty user id: row 2: user_id=null; ")
    assert "row 6:" in text and "row 7:" not in text and "row 1:" not in text and "(first 5 shown)" in text


def test_duplicates_show_their_rows() -> None:
    with pytest.raises(SnapshotError) as error:
        validate_snapshot(pd.DataFrame({"user_id": ["a", "b", "a"]}), "user_id")
    assert "'a' on rows 1, 3;" in str(error.value) and "'b'" not in str(error.value)


@pytest.mark.parametrize(
    ("values", "value_type", "message"),
    [
        ([1, "two", 3], "number", "1 row has a 'score' that is not a number: row 2: user_id='b', score='two';"),
        ([1.0, np.inf, 2.0], "number", "1 row has a 'score' that is not finite: row 2: user_id='b', score=inf;"),
        ([True, 1, "x"], "boolean", "2 rows have a 'score' that is not a boolean: row 2: user_id='b', score=1; row 3"),
        (["a", 2, 3.5], "string", "2 rows have a 'score' that is not a string: row 2: user_id='b', score=2; row 3"),
        ([1, 2, 3], "string", "3 rows have a 'score' that is not a string"),
        ([1.0, None, 3.0], "number", "1 row has a null value in 'score': row 2: user_id='b', score=null;"),
        ([True, 1.0, 0], "number", "1 row has a 'score' that is not a number: row 1: user_id='a', score=True;"),
    ],
)
def test_wrong_value_types(values: list[object], value_type: str, message: str) -> None:
    frame = pd.DataFrame({"user_id": ["a", "b", "c"], "score": pd.Series(values, dtype=object)})
    with pytest.raises(SnapshotError, match=message):
        validate_snapshot(frame, "user_id", "score", value_type)  # type: ignore[arg-type]


def test_values_are_json_encoded() -> None:
    frame = pd.DataFrame({"user_id": ["a", "b"], "score": [1, 2], "ratio": [0.5, 2.0], "tier": ["gold", "é"]})
    assert validate_snapshot(frame, "user_id", "score", "number")["value"].tolist() == ["1", "2"]
    assert validate_snapshot(frame, "user_id", "ratio", "number")["value"].tolist() == ["0.5", "2"]
    assert validate_snapshot(frame, "user_id", "tier", "string")["value"].tolist() == ['"gold"', '"é"']


def test_empty_snapshot_with_the_column_is_valid() -> None:
    assert validate_snapshot(pd.DataFrame({"user_id": pd.Series([], dtype=object)}), "user_id").empty


# -- every kind of bad row, in every kind of snapshot: only the wrong rows are counted and shown --------------------


def write_snapshot(kind: str, path: Path, ids: list[object], values: list[object] | None) -> SnapshotProvider:
    """The rows as a real snapshot of ``kind``: a CSV or Parquet file, a SQLite table, or a DataFrame callable."""
    columns = {"user_id": pd.Series(ids, dtype=object)}
    if values is not None:
        columns["score"] = pd.Series(values, dtype=object)
    frame = pd.DataFrame(columns)
    if kind == "csv":
        lines = ["user_id" + (",score" if values is not None else "")]
        for index, user in enumerate(ids):
            cells = [user] + ([values[index]] if values is not None else [])
            lines.append(",".join("" if cell is None else str(cell) for cell in cells))
        file = path / "snapshot.csv"
        file.write_text("\n".join(lines) + "\n")
        return CsvSnapshot(path=str(file))
    if kind == "parquet":
        file = path / "snapshot.parquet"
        frame.infer_objects().to_parquet(file)
        return ParquetSnapshot(path=str(file))
    if kind == "sql":
        with sqlite3.connect(path / "warehouse.db") as connection:
            connection.execute("CREATE TABLE snapshot (user_id, score)")
            connection.executemany("INSERT INTO snapshot VALUES (?, ?)",
                                   [(user, values[i] if values is not None else None) for i, user in enumerate(ids)])
        query = "SELECT user_id" + (", score" if values is not None else "") + " FROM snapshot ORDER BY rowid"
        return SqlSnapshot(url=f"sqlite:///{path / 'warehouse.db'}", query=query)
    return CallableSnapshot(function=lambda: frame)


TEN = [0, 11, 2, 3, 4, 5, 6, 7, 8, 9]
BAD_ROWS = [
    # (case, snapshot kinds that can hold it, ids, values, value type, message start, bad row numbers)
    ("null id", ["csv", "parquet", "sql", "callable"], ["u1", None, "u3", None], [1, 2, 3, 4], "number",
     "2 rows have a null or empty user id", [2, 4]),
    ("empty id", ["parquet", "sql", "callable"], ["u1", "", "u3"], None, None,
     "1 row has a null or empty user id", [2]),
    ("duplicate id", ["csv", "parquet", "sql", "callable"], ["a", "b", "a", "c"], None, None,
     "2 rows have a duplicate user id", [1, 3]),
    ("id of a wrong type", ["parquet", "sql", "callable"], [1.0, 1.5, 3.0], None, None,
     "1 row has a user id that is not a string or an integer", [2]),
    ("null value", ["csv", "parquet", "sql", "callable"], [f"u{i}" for i in range(10)], TEN[:4] + [None] + TEN[5:],
     "number", "1 row has a null value in 'score'", [5]),
    ("not a number", ["csv", "sql", "callable"], [f"u{i}" for i in range(11)], TEN + ["lots"],
     "number", "1 row has a 'score' that is not a number", [11]),
    ("not finite", ["csv", "parquet", "sql", "callable"], [f"u{i}" for i in range(4)], [1.5, float("inf"), 2, 3],
     "number", "1 row has a 'score' that is not finite", [2]),
    ("not a boolean", ["csv", "sql", "callable"], [f"u{i}" for i in range(4)], [True, "yes", False, True],
     "boolean", "1 row has a 'score' that is not a boolean", [2]),
    ("not a string", ["sql", "callable"], [f"u{i}" for i in range(3)], ["gold", 7, "silver"],
     "string", "1 row has a 'score' that is not a string", [2]),
]


@pytest.mark.parametrize(
    ("case", "kind"), [(case[0], kind) for case in BAD_ROWS for kind in case[1]],
)
def test_a_snapshot_error_counts_and_shows_only_the_wrong_rows(case: str, kind: str, tmp_path: Path) -> None:
    from prefect_webhooks.audiences.sync import AudienceDefinition, prepare_snapshot

    _, _, ids, values, value_type, message, bad_rows = next(row for row in BAD_ROWS if row[0] == case)
    snapshot = write_snapshot(kind, tmp_path, ids, values)
    trait = {"kind": "computed_trait", "value_column": "score", "value_type": value_type} if value_type else {}
    definition = AudienceDefinition(name="Scores", sources=["web"], snapshot=snapshot, **trait)
    with pytest.raises(SnapshotError) as caught:
        prepare_snapshot(definition)
    text = str(caught.value)
    assert text.startswith(message), text
    assert [int(number) for number in re.findall(r"row (\d+): ", text) or
            re.findall(r"rows? (\d+(?:, \d+)*);", text)[0].split(", ")] == bad_rows, text
    assert text.endswith("rows are numbered from 1 in snapshot order, a CSV header not counted")


def test_text_numbers_and_booleans_in_a_csv_are_read_as_what_they_are(tmp_path: Path) -> None:
    from prefect_webhooks.audiences.sync import AudienceDefinition, prepare_snapshot

    file = tmp_path / "scores.csv"
    file.write_text("user_id,score,vip,tier\n007,11, true,007\n8,2.50,FALSE,gold\n")
    def trait(column: str, value_type: str) -> list[str]:
        definition = AudienceDefinition(name=column, kind="computed_trait", sources=["web"],
                                        snapshot=CsvSnapshot(path=str(file)), value_column=column,
                                        value_type=value_type)
        return prepare_snapshot(definition)["value"].tolist()

    assert trait("score", "number") == ["11", "2.5"]
    assert trait("vip", "boolean") == ["true", "false"]
    assert trait("tier", "string") == ['"007"', '"gold"']  # a string trait keeps its text


@pytest.mark.parametrize(
    ("value", "text"),
    [(11, "11"), (11.0, "11"), (np.int64(11), "11"), (np.float64(11.0), "11"), (Decimal("11.00"), "11"),
     (2.5, "2.5"), (Decimal("2.50"), "2.5"), (-0.0, "0"), (1e300, "1e+300"), (True, "true"), ("11", '"11"')],
)
def test_one_json_value_has_one_text(value: object, text: str) -> None:
    assert encode_value(value) == text


def test_stored_texts_from_before_are_read_canonically() -> None:
    assert canonical_text("11.0") == "11" and canonical_text("2.5") == "2.5" and canonical_text('"a"') == '"a"'
