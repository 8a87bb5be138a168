"""Snapshot providers and snapshot validation for audience and computed-trait syncs.

A snapshot is the full current membership of an audience (one row per user) or the full current values of a
computed trait (one row per user with a value). Providers:

- ``SqlSnapshot``: a query on any SQLAlchemy URL (the URL is a secret: it may hold a password).
- ``CsvSnapshot`` / ``ParquetSnapshot``: a file path (the id column of a CSV is read as text, so ``007`` stays ``007``).
- ``CallableSnapshot``: a Python callable returning a ``pandas.DataFrame``, given as ``"package.module:function"``
  (serialisable as a flow parameter) or as the callable itself.

``validate_snapshot`` turns any of them into a frame with a ``user_id`` column of non-empty unique strings (integers
are accepted and written in decimal) and, for traits, a ``value`` column of JSON-encoded values; anything else raises
``SnapshotError`` with the count and the first offending rows, before anything is written.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

import numpy as np
import orjson
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from sqlalchemy import create_engine

ValueType = Literal["boolean", "number", "string"]
MAX_SHOWN_ROWS = 5


class SnapshotError(ValueError):
    """A snapshot that cannot be synced: what is wrong, how many rows, and the first offending rows."""


class SqlSnapshot(BaseModel):
    """Rows returned by a SQL query on a SQLAlchemy URL."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    kind: Literal["sql"] = "sql"
    url: SecretStr = Field(description="SQLAlchemy URL of the database to query; kept secret.")
    query: str = Field(description="A SELECT returning the id column (and the value column for traits).")


class CsvSnapshot(BaseModel):
    """A CSV file with a header row."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["csv"] = "csv"
    path: str = Field(description="Path of the CSV file.")


class ParquetSnapshot(BaseModel):
    """A Parquet file (or dataset folder)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["parquet"] = "parquet"
    path: str = Field(description="Path of the Parquet file or dataset.")


class CallableSnapshot(BaseModel):
    """A Python callable, called with no arguments, returning a pandas DataFrame."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    kind: Literal["callable"] = "callable"
    function: str | Callable[[], pd.DataFrame] = Field(
        description="Import path 'package.module:function', or the callable itself."
    )


SnapshotProvider = Annotated[
    SqlSnapshot | CsvSnapshot | ParquetSnapshot | CallableSnapshot, Field(discriminator="kind")
]


def resolve_callable(path: str) -> Callable[[], pd.DataFrame]:
    """The object named by ``"package.module:attribute"``."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise SnapshotError(f"callable must be given as 'package.module:function', got {path!r}")
    return getattr(importlib.import_module(module_name), attribute)


def load_snapshot(provider: SnapshotProvider, columns: list[str]) -> pd.DataFrame:
    """Read a snapshot with pandas.

    Args:
        provider: Where the snapshot comes from.
        columns: The columns the sync needs (id, and value for traits); files read only these when they exist.

    Returns:
        The raw frame, not yet validated.
    """
    if isinstance(provider, SqlSnapshot):
        return _load_sql(provider)
    if isinstance(provider, CsvSnapshot):
        header = pd.read_csv(provider.path, nrows=0).columns
        wanted = [column for column in columns if column in header] or None
        # ids are text: read the id column as str so leading zeros and long numbers survive.
        return pd.read_csv(provider.path, usecols=wanted, dtype={columns[0]: str}, keep_default_na=True)
    if isinstance(provider, ParquetSnapshot):
        import pyarrow.parquet as pq

        names = pq.read_schema(provider.path).names
        wanted = [column for column in columns if column in names] or None
        return pd.read_parquet(provider.path, columns=wanted)
    function = provider.function
    if isinstance(function, str):
        function = resolve_callable(function)
    frame = function()
    if not isinstance(frame, pd.DataFrame):
        raise SnapshotError(f"the snapshot callable returned {type(frame).__name__}, not a pandas DataFrame")
    return frame


def _load_sql(provider: SqlSnapshot) -> pd.DataFrame:
    engine = create_engine(provider.url.get_secret_value())
    try:
        # The driver's cursor: read_sql and SQLAlchemy rows cost seconds per million rows in conversions.
        connection = engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(provider.query)
            names = [column[0] for column in cursor.description]
            rows = cursor.fetchall()
            cursor.close()
        finally:
            connection.close()
    finally:
        engine.dispose()
    # Object columns keep ids as plain Python values (pandas' string dtype is very slow to hash-join).
    return pd.DataFrame({name: pd.Series([row[i] for row in rows], dtype=object) for i, name in enumerate(names)})


def _shown(frame: pd.DataFrame, mask: pd.Series | np.ndarray) -> str:
    """The first offending rows, as ``row N: {...}`` (row numbers count from 0 in snapshot order)."""
    positions = np.flatnonzero(np.asarray(mask))[:MAX_SHOWN_ROWS]
    rows = frame.iloc[positions]
    return "; ".join(f"row {position}: {row}" for position, row in zip(positions, rows.to_dict("records"), strict=True))


def _fail(what: str, frame: pd.DataFrame, mask: pd.Series | np.ndarray) -> None:
    count = int(np.count_nonzero(np.asarray(mask)))
    if count:
        raise SnapshotError(f"{count} rows {what}; first offending rows: {_shown(frame, mask)}")


def _user_ids(frame: pd.DataFrame, id_column: str) -> pd.Series:
    ids = frame[id_column]
    if pd.api.types.is_bool_dtype(ids):
        _fail("have a user id that is not a string or an integer", frame, np.ones(len(ids), dtype=bool))
    if pd.api.types.is_float_dtype(ids):
        # An integer column with NULLs arrives as float: the nulls are the error, integral floats are ids.
        _fail("have a null user id", frame, ids.isna())
        _fail("have a user id that is not a string or an integer", frame, ids.to_numpy() % 1 != 0)
    if pd.api.types.is_numeric_dtype(ids):
        _fail("have a null user id", frame, ids.isna())
        return ids.astype("int64").astype(str).astype(object)
    _fail("have a null or empty user id", frame, ids.isna().to_numpy() | (ids.to_numpy(dtype=object) == ""))
    # infer_dtype is one C pass; the per-element type check below only runs when the ids are not all strings.
    if pd.api.types.is_object_dtype(ids) and pd.api.types.infer_dtype(ids, skipna=True) != "string":
        kinds = ids.map(type)
        integer = kinds.isin((int, np.int64, np.int32))
        _fail("have a user id that is not a string or an integer", frame, ~(kinds.eq(str) | integer))
        if integer.any():
            ids = ids.where(~integer, ids.map(str))
    return ids.astype(object)


def _encoded_values(frame: pd.DataFrame, value_column: str, value_type: ValueType) -> list[str]:
    values = frame[value_column]
    _fail(f"have a null value in {value_column!r}", frame, values.isna())
    if value_type == "boolean":
        if not pd.api.types.is_bool_dtype(values):
            _fail(f"have a {value_column!r} that is not a boolean", frame, ~values.map(_is_bool))
    elif value_type == "number":
        if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
            _fail(f"have a {value_column!r} that is not a number", frame, ~values.map(_is_number))
        _fail(f"have a {value_column!r} that is not finite", frame, ~values.map(_is_finite))
    elif not pd.api.types.is_string_dtype(values) or pd.api.types.is_object_dtype(values):
        _fail(f"have a {value_column!r} that is not a string", frame, ~values.map(lambda item: isinstance(item, str)))
    return [orjson.dumps(item, option=orjson.OPT_SERIALIZE_NUMPY).decode() for item in values.tolist()]


def _is_bool(item: Any) -> bool:
    return isinstance(item, (bool, np.bool_))


def _is_number(item: Any) -> bool:
    return isinstance(item, (int, float, np.integer, np.floating)) and not _is_bool(item)


def _is_finite(item: Any) -> bool:
    return not isinstance(item, (float, np.floating)) or math.isfinite(item)


def validate_snapshot(
    frame: pd.DataFrame,
    id_column: str,
    value_column: str | None = None,
    value_type: ValueType | None = None,
) -> pd.DataFrame:
    """Check a raw snapshot and normalise it for diffing.

    Args:
        frame: The raw snapshot.
        id_column: Column holding the user ids.
        value_column: For computed traits, the column holding each user's value.
        value_type: For computed traits, the JSON type every value must have.

    Returns:
        A frame with ``user_id`` (str) and, for traits, ``value`` (the JSON-encoded value).

    Raises:
        SnapshotError: A missing column, null/empty or duplicate user ids, or values of the wrong type; the message
            gives the count and the first offending rows.
    """
    required = [id_column] + ([value_column] if value_column else [])
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise SnapshotError(f"snapshot has no column {missing[0]!r}; columns are {list(frame.columns)}")
    frame = frame.reset_index(drop=True)
    ids = _user_ids(frame, id_column)
    _fail("have a duplicate user id", frame, ids.duplicated(keep=False))
    normalised = pd.DataFrame({"user_id": ids})
    if value_column:
        normalised["value"] = _encoded_values(frame, value_column, value_type or "string")
    return normalised
