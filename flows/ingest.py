"""The ``ingest`` flow: bulk-import calls for a Source through the same path as the ingest API.

Inputs: a list of call dicts, a pandas DataFrame, or a path to a JSON-lines (``.jsonl``/``.ndjson``/``.json``,
one call per line), CSV (``.csv``) or Parquet (``.parquet``/``.pq``) file.

Table inputs (CSV, Parquet, DataFrame) use wire names as columns (``type``, ``userId``, ``event``, ``timestamp``…).
Nested fields come either as a whole JSON object in a ``properties``/``traits``/``context``/``integrations``
column, or as dot-columns (``properties.plan``, ``context.os.name``), which are combined. Empty cells are left out.
CSV cells are read as text (so ``00123`` stays a string); put typed values (numbers, booleans) in a JSON column.
Parquet/DataFrame columns keep their types; struct columns come through as objects.

Calls are cut into chunks of ``batch_size``; each chunk is one task run and one transaction through
``prefect_webhooks.inbound.ingestion.ingest_batch`` (validation, timestamps, dedupe, suppression, routing,
outbox). A call over 32 KB is rejected on its own here (the API refuses the whole request instead). The run
publishes two table artifacts: ``ingest-summary`` (counts) and ``ingest-rejected`` (row, field, reason; rows are
1-based positions in the input, the CSV header not counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import orjson
from prefect import flow, task
from prefect.artifacts import acreate_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from prefect_webhooks.inbound.ingestion import IngestResult, Rejection, ingest_batch
from prefect_webhooks.inbound.sources import SourceInfo, aread_source
from prefect_webhooks.utilities.runtime import lazy_module
from prefect_webhooks.utilities.sync_flows import sync_compatible
from prefect_webhooks.utilities.tagged_flows import tagged

pd = lazy_module("pandas")

JSON_COLUMNS = ("properties", "traits", "context", "integrations")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
MAX_REJECTED_ROWS = 10_000


class UnreadableLine:
    """A JSON-lines line that is not JSON; rejected like any invalid call."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _is_empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and value == ""


def _plain(value: Any) -> Any:
    """A cell value as plain JSON-able Python (numpy scalars and arrays, pandas timestamps)."""
    if isinstance(value, (pd.Timestamp, datetime, date)):
        return value.isoformat()
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items() if not _is_empty(item)}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _set_path(call: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = call
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


def record_to_call(record: dict[str, Any]) -> dict[str, Any]:
    """One table row (column → cell) as a call in wire form."""
    call: dict[str, Any] = {}
    dotted = []
    for column, cell in record.items():
        if _is_empty(cell):
            continue
        value = _plain(cell)
        if "." in str(column):
            dotted.append((str(column), value))
            continue
        if column in JSON_COLUMNS and isinstance(value, str):
            # Text that is not JSON is left as is: validation rejects it naming the column.
            with contextlib.suppress(orjson.JSONDecodeError):
                value = orjson.loads(value)
        call[str(column)] = value
    for column, value in dotted:
        _set_path(call, column, value)
    return call


def frame_calls(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Every row of a DataFrame as a call."""
    return [record_to_call(record) for record in frame.to_dict(orient="records")]


def json_lines_calls(path: Path) -> list[Any]:
    """Every non-empty line of a JSON-lines file; a line that is not JSON becomes an ``UnreadableLine``."""
    calls: list[Any] = []
    with path.open("rb") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                calls.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                calls.append(UnreadableLine(f"not valid JSON: {str(exc)[:120]}"))
    return calls


def load_calls(calls: Any) -> list[Any]:
    """The calls of any supported input, in input order."""
    if isinstance(calls, pd.DataFrame):
        return frame_calls(calls)
    if isinstance(calls, (str, Path)):
        path = Path(calls)
        suffix = path.suffix.lower()
        if suffix in JSON_LINES_SUFFIXES:
            return json_lines_calls(path)
        if suffix == ".csv":
            return frame_calls(pd.read_csv(path, dtype=str, keep_default_na=False))
        if suffix in PARQUET_SUFFIXES:
            return frame_calls(pd.read_parquet(path))
        raise ValueError(f"unsupported file type {suffix!r}: use .jsonl, .ndjson, .json, .csv or .parquet")
    if isinstance(calls, Sequence):
        return list(calls)
    raise TypeError(f"calls must be a list of dicts, a DataFrame or a file path, got {type(calls).__name__}")


def chunks(calls: Sequence[Any], size: int) -> Iterator[tuple[int, Sequence[Any]]]:
    """``(first_index, chunk)`` pairs covering ``calls``."""
    for start in range(0, len(calls), size):
        yield start, calls[start : start + size]


def _ingest_chunk_now(calls: Sequence[Any], source: SourceInfo, first_index: int) -> IngestResult:
    readable = []
    unreadable: list[Rejection] = []
    for offset, call in enumerate(calls):
        if isinstance(call, UnreadableLine):
            unreadable.append(Rejection(index=first_index + offset, field="message", reason=call.reason))
            readable.append(None)  # keeps positions; rejected again below, so drop it from the result there
        else:
            readable.append(call)
    result = ingest_batch(readable, source, oversize="reject", first_index=first_index)
    if unreadable:
        positions = {rejection.index for rejection in unreadable}
        kept = [rejection for rejection in result.rejected if rejection.index not in positions]
        result.rejected = sorted([*kept, *unreadable], key=lambda rejection: rejection.index)
    return result


@task(name="ingest-chunk", cache_policy=NO_CACHE)
async def ingest_chunk(calls: Sequence[Any], source: SourceInfo, first_index: int) -> IngestResult:
    """Ingest one chunk of calls in one transaction (the store write runs off the event loop)."""
    return await asyncio.to_thread(_ingest_chunk_now, calls, source, first_index)


async def load_source(name: str) -> SourceInfo:
    """The saved Source block ``name`` as ingestion sees it; refuses a disabled source."""
    info = await aread_source(name)
    if info is None:
        raise ValueError(f"no Source block named {name!r}")
    if not info.enabled:
        raise ValueError(f"source {name!r} is disabled")
    return info


def summarize(source: str, total: int, results: Sequence[IngestResult]) -> dict[str, Any]:
    """The counts of a run."""
    return {
        "source": source,
        "calls": total,
        "accepted": sum(result.accepted for result in results),
        "rejected": sum(len(result.rejected) for result in results),
        "duplicates": sum(result.duplicates for result in results),
        "suppressed": sum(result.suppressed for result in results),
        "rows_written": sum(result.rows_written for result in results),
    }


def rejected_rows(results: Sequence[IngestResult]) -> list[dict[str, Any]]:
    """Rejected calls as table rows: 1-based input row, field, reason."""
    return [
        {"row": rejection.index + 1, "field": rejection.field, "reason": rejection.reason}
        for result in results
        for rejection in result.rejected
    ]


async def publish_artifacts(summary: dict[str, Any], rejections: list[dict[str, Any]]) -> None:
    """The run's two table artifacts: counts, and rejected rows with their reasons."""
    await acreate_table_artifact(
        key="ingest-summary",
        table=[summary],
        description=f"Calls imported for source {summary['source']!r}: accepted, rejected, duplicates, suppressed.",
    )
    shown = rejections[:MAX_REJECTED_ROWS]
    note = "" if len(shown) == len(rejections) else f" (first {len(shown)} of {len(rejections)})"
    await acreate_table_artifact(
        key="ingest-rejected",
        table=shown or [{"row": None, "field": None, "reason": "no call was rejected"}],
        description=f"Rejected calls{note}: input row (1-based), field and reason.",
    )


@tagged
@sync_compatible
@flow(name="ingest")
async def ingest(source: str, calls: Any, batch_size: int = 1000) -> dict[str, Any]:
    """Import calls for a saved Source through the same validation, routing and outbox code as the API.

    Args:
        source: Name of a saved Source block.
        calls: A list of call dicts, a pandas DataFrame, or a path to a .jsonl/.ndjson/.json, .csv or .parquet file.
        batch_size: Calls per chunk; each chunk is one task run and one transaction.

    Returns:
        The counts (``accepted``, ``rejected``, ``duplicates``, ``suppressed``, ``rows_written``) and
        ``rejections``: ``[{row, field, reason}]``.

    Example:
        ```python
        from prefect_webhooks.flows.ingest import ingest

        ingest("web-app", "events.jsonl")   # in async code: await ingest("web-app", "events.jsonl")
        ```
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    info = await load_source(source)
    loaded = load_calls(calls)
    results = [await ingest_chunk(chunk, info, first) for first, chunk in chunks(loaded, batch_size)]
    summary = summarize(source, len(loaded), results)
    rejections = rejected_rows(results)
    await publish_artifacts(summary, rejections)
    get_run_logger().info("ingest: %s", summary)
    return {**summary, "rejections": rejections}
