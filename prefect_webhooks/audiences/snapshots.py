"""Snapshot providers and snapshot validation for audience and computed-trait syncs.

A snapshot is the full current membership of an audience (one row per user) or the full current values of a
computed trait (one row per user with a value). Providers:

- ``SqlSnapshot``: a query on any SQLAlchemy URL (the URL is a secret: it may hold a password).
- ``CsvSnapshot`` / ``ParquetSnapshot``: a file path (the id column of a CSV is read as text, so ``007`` stays ``007``).
- ``CallableSnapshot``: a Python callable returning a ``pandas.DataFrame``, given as ``"package.module:function"``
  (serialisable as a flow parameter) or as the callable itself.

``validate_snapshot`` turns any of them into a frame with a ``user_id`` column of non-empty unique strings (integers
are accepted and written in decimal) and, for traits, a ``value`` column holding each value's canonical JSON text
(``encode_value``: ``11`` and ``11.0`` are one number, one text); anything else raises ``SnapshotError`` with the
count of offending rows and the first of them, numbered from 1 in snapshot order, before anything is written. A
CSV file's cells are text and are read as the trait's type (``11`` → 11, ``true`` → true).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from sqlalchemy import create_engine

from prefect_webhooks.utilities.runtime import lazy_module

np = lazy_module("numpy")
pd = lazy_module("pandas")

ValueType = Literal["boolean", "number", "string"]
Reading = Literal["typed", "text", "sql"]
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
    function: str | Callable[[], Any] = Field(
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
        # Every needed column is read as text: ids keep leading zeros and long numbers, and values are read as the
        # trait's type by validate_snapshot(reading="text"), whatever type pandas would guess for the column
        # (one "2.5" would turn a day's integers into floats; one "lots" all of them into text).
        return pd.read_csv(provider.path, usecols=wanted, dtype=dict.fromkeys(wanted or [], str), keep_default_na=True)
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


def reading_for(provider: SnapshotProvider) -> Reading:
    """How ``validate_snapshot`` reads the values of a provider's snapshot (see its ``reading`` argument)."""
    if isinstance(provider, CsvSnapshot):
        return "text"
    return "sql" if isinstance(provider, SqlSnapshot) else "typed"


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


ROW_NUMBERING = "rows are numbered from 1 in snapshot order, a CSV header not counted"
# Integral floats up to 2**53 are exact integers: written as one, 11.0 and 11 are the same JSON text.
_EXACT_INTEGER = 2.0**53


def _plain_value(item: Any) -> Any:
    return item.item() if isinstance(item, np.generic) else item


def _shown_value(item: Any) -> str:
    item = _plain_value(item)
    if item is None or (isinstance(item, float) and math.isnan(item)) or item is pd.NA or item is pd.NaT:
        return "null"
    text = repr(item)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(what: str, frame: pd.DataFrame, mask: pd.Series | np.ndarray, columns: list[str]) -> None:
    """Raise ``SnapshotError`` naming the rows where ``mask`` is true: their count, numbers and values.

    Args:
        what: What is wrong with each row, after "N rows have" ("a null user id").
        frame: The raw snapshot (positions are snapshot order).
        mask: True for each offending row.
        columns: The columns shown for each offending row (the id, and the value for value errors).
    """
    flags = np.asarray(mask, dtype=bool)
    count = int(np.count_nonzero(flags))
    if not count:
        return
    positions = np.flatnonzero(flags)[:MAX_SHOWN_ROWS]
    shown = "; ".join(
        f"row {position + 1}: "
        + ", ".join(f"{column}={_shown_value(frame[column].iat[position])}" for column in columns)
        for position in positions
    )
    more = f" (first {MAX_SHOWN_ROWS} shown)" if count > MAX_SHOWN_ROWS else ""
    raise SnapshotError(f"{count} {'row has' if count == 1 else 'rows have'} {what}: {shown}{more}; {ROW_NUMBERING}")


def _fail_duplicates(frame: pd.DataFrame, ids: pd.Series) -> None:
    duplicated = ids.duplicated(keep=False).to_numpy()
    count = int(np.count_nonzero(duplicated))
    if not count:
        return
    rows_of: dict[str, list[int]] = {}
    for position in np.flatnonzero(duplicated):
        rows_of.setdefault(ids.iat[position], []).append(int(position) + 1)
    shown = "; ".join(f"{user!r} on rows {', '.join(map(str, rows))}"
                      for user, rows in list(rows_of.items())[:MAX_SHOWN_ROWS])
    more = f" (first {MAX_SHOWN_ROWS} ids shown)" if len(rows_of) > MAX_SHOWN_ROWS else ""
    raise SnapshotError(
        f"{count} rows have a duplicate user id ({len(rows_of)} user ids appear more than once): {shown}{more}; "
        f"{ROW_NUMBERING}"
    )


def _user_ids(frame: pd.DataFrame, id_column: str) -> pd.Series:
    ids = frame[id_column]
    shown = [id_column]
    wrong_type = "a user id that is not a string or an integer"
    if pd.api.types.is_bool_dtype(ids):
        _fail(wrong_type, frame, np.ones(len(ids), dtype=bool), shown)
    if pd.api.types.is_float_dtype(ids):
        # An integer column with NULLs arrives as float: the nulls are the error, integral floats are ids.
        _fail("a null user id", frame, ids.isna(), shown)
        _fail(wrong_type, frame, ids.to_numpy() % 1 != 0, shown)
    if pd.api.types.is_numeric_dtype(ids):
        _fail("a null user id", frame, ids.isna(), shown)
        return ids.astype("int64").astype(str).astype(object)
    _fail("a null or empty user id", frame, ids.isna().to_numpy() | (ids.to_numpy(dtype=object) == ""), shown)
    # infer_dtype is one C pass; the per-element type check below only runs when the ids are not all strings.
    if pd.api.types.is_object_dtype(ids) and pd.api.types.infer_dtype(ids, skipna=True) != "string":
        # Integers, and integral floats as in a float column (a SQL REAL column of whole numbers), are ids.
        as_text = ids.map(_id_text)
        _fail(wrong_type, frame, as_text.isna().to_numpy(), shown)
        ids = as_text
    return ids.astype(object)


def _id_text(item: Any) -> str | None:
    """An id cell of an object column as text, or None when it is not a string or a whole number."""
    if isinstance(item, str):
        return item
    if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
        return str(int(item))
    if isinstance(item, (float, np.floating)) and math.isfinite(item) and float(item).is_integer():
        return str(int(item))
    return None


def encode_value(item: Any) -> str:
    """The canonical JSON text of one trait value: one text per JSON value, so equal values compare equal.

    ``11``, ``11.0``, ``np.int64(11)`` and ``Decimal("11.00")`` are all ``11`` (integral numbers up to 2**53 are
    written as integers); other numbers as orjson writes them (``2.5``); booleans ``true``/``false``; strings quoted.
    """
    item = _plain_value(item)
    if isinstance(item, bool) or item is None or isinstance(item, str):
        return orjson.dumps(item).decode()
    if isinstance(item, int):
        return str(item)
    if isinstance(item, Decimal):
        item = int(item) if item == item.to_integral_value() and abs(item) < _EXACT_INTEGER else float(item)
        return encode_value(item)
    if isinstance(item, float):
        # Python's shortest round-trip repr is valid JSON for a finite float and, unlike a JSON library's output,
        # the same on every release: state written today must compare equal after an upgrade.
        return str(int(item)) if item.is_integer() and abs(item) < _EXACT_INTEGER else repr(item)
    return orjson.dumps(item).decode()


def canonical_text(text: str) -> str:
    """The canonical form (see ``encode_value``) of a value's JSON text, e.g. state stored as ``11.0``."""
    return encode_value(orjson.loads(text))


def _encoded_numbers(values: pd.Series) -> list[str]:
    """Canonical JSON texts of a numeric column, vectorised for integer and float columns."""
    array = values.to_numpy()
    if array.dtype.kind in "iu":
        return array.astype(str).tolist()
    if array.dtype.kind == "f":
        integral = (np.trunc(array) == array) & (np.abs(array) < _EXACT_INTEGER)
        texts = np.empty(len(array), dtype=object)
        texts[integral] = array[integral].astype(np.int64).astype(str)
        texts[~integral] = [repr(item) for item in array[~integral].tolist()]
        return texts.tolist()
    return [encode_value(item) for item in array.tolist()]


def _from_sql(values: pd.Series, value_type: ValueType) -> pd.Series:
    """SQL results read as the value type: SQLite and MySQL hold booleans as the integers 0 and 1."""
    if value_type != "boolean" or pd.api.types.is_bool_dtype(values):
        return values
    flags = values.map(lambda item: bool(item) if _is_number(item) and item in (0, 1) else item)
    return flags.astype(object)


def _from_text(values: pd.Series, value_type: ValueType) -> pd.Series:
    """CSV cells (text) read as the value type: numbers as the numbers they are, ``true``/``false`` as booleans.

    A cell that does not read as the type is left as text, so the type check names exactly that row.
    """
    if value_type == "number":
        numbers = pd.to_numeric(values.str.strip(), errors="coerce")
        unreadable = numbers.isna() & values.notna()
        if not unreadable.any():
            return numbers
        return pd.Series(np.where(unreadable, values.to_numpy(dtype=object), numbers.to_numpy(dtype=object)),
                         index=values.index, dtype=object)
    if value_type == "boolean":
        lowered = values.str.strip().str.lower()
        readable = lowered.isin(["true", "false"])
        return pd.Series(np.where(readable, lowered.eq("true").to_numpy(dtype=object), values.to_numpy(dtype=object)),
                         index=values.index, dtype=object)
    return values


def _encoded_values(frame: pd.DataFrame, value_column: str, value_type: ValueType, id_column: str,
                    reading: Reading) -> list[str]:
    values = frame[value_column]
    shown = [id_column, value_column]
    _fail(f"a null value in {value_column!r}", frame, values.isna(), shown)
    if reading == "text" and (pd.api.types.is_string_dtype(values) or pd.api.types.is_object_dtype(values)):
        values = _from_text(values, value_type)
    elif reading == "sql":
        values = _from_sql(values, value_type)
    if value_type == "boolean":
        if not pd.api.types.is_bool_dtype(values):
            _fail(f"a {value_column!r} that is not a boolean", frame, ~values.map(_is_bool), shown)
        return np.where(values.to_numpy(dtype=bool), "true", "false").tolist()
    if value_type == "number":
        if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
            _fail(f"a {value_column!r} that is not a number", frame, ~values.map(_is_number), shown)
        if pd.api.types.is_float_dtype(values):
            _fail(f"a {value_column!r} that is not finite", frame, ~np.isfinite(values.to_numpy()), shown)
        elif not pd.api.types.is_integer_dtype(values):
            _fail(f"a {value_column!r} that is not finite", frame, ~values.map(_is_finite), shown)
        return _encoded_numbers(values)
    if not pd.api.types.is_string_dtype(values) or pd.api.types.is_object_dtype(values):
        _fail(f"a {value_column!r} that is not a string", frame, ~values.map(lambda item: isinstance(item, str)),
              shown)
    return [orjson.dumps(item).decode() for item in values.tolist()]


def _is_bool(item: Any) -> bool:
    return isinstance(item, (bool, np.bool_))


def _is_number(item: Any) -> bool:
    return isinstance(item, (int, float, Decimal, np.integer, np.floating)) and not _is_bool(item)


def _is_finite(item: Any) -> bool:
    if isinstance(item, Decimal):
        return item.is_finite()
    return not isinstance(item, (float, np.floating)) or math.isfinite(item)


def validate_snapshot(
    frame: pd.DataFrame,
    id_column: str,
    value_column: str | None = None,
    value_type: ValueType | None = None,
    *,
    reading: Reading = "typed",
) -> pd.DataFrame:
    """Check a raw snapshot and normalise it for diffing.

    Args:
        frame: The raw snapshot.
        id_column: Column holding the user ids.
        value_column: For computed traits, the column holding each user's value.
        value_type: For computed traits, the JSON type every value must have.
        reading: How values are read as ``value_type``: ``"text"`` for a CSV file (``11`` is the number 11,
            ``true`` the boolean), ``"sql"`` for a query result (0 and 1 are booleans, as SQLite and MySQL store
            them), ``"typed"`` (Parquet, a DataFrame) as they are. ``reading_for(provider)`` gives it.

    Returns:
        A frame with ``user_id`` (str) and, for traits, ``value``: the value's canonical JSON text
        (``encode_value``), so a value that did not change compares equal whatever dtype the snapshot had.

    Raises:
        SnapshotError: A missing column, null/empty or duplicate user ids, or values of the wrong type; the message
            gives the count of offending rows and the first of them with their row numbers (from 1, in snapshot
            order, a CSV header not counted) and values.
    """
    required = [id_column] + ([value_column] if value_column else [])
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise SnapshotError(f"snapshot has no column {missing[0]!r}; columns are {list(frame.columns)}")
    frame = frame.reset_index(drop=True)
    ids = _user_ids(frame, id_column)
    _fail_duplicates(frame, ids)
    normalised = pd.DataFrame({"user_id": ids})
    if value_column:
        normalised["value"] = _encoded_values(frame, value_column, value_type or "string", id_column, reading)
    return normalised
