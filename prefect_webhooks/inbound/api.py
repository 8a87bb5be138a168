"""The ingest API: a Segment-compatible HTTP Tracking API (``/v1/batch`` and the single-call endpoints).

Answers:

- ``200`` once every accepted call is committed to the store. The body lists calls refused on their own:
  ``{"success": true, "accepted": n, "duplicates": n, "suppressed": n, "rejected": [{index, field, reason}]}``.
- ``400 {code, message}``: invalid JSON, bad gzip, a body over 500 KB (after decompression), a call over 32 KB,
  a body that is not a batch, or (single-call endpoints) a call that breaks a rule.
- ``401``: a missing or unknown write key. ``403``: the source is disabled (the key is known, the source is off).
- ``429`` with ``Retry-After``: too many calls are waiting for the store writer.
- ``503`` with ``Retry-After``: the store is unavailable, or the write key is not among the sources known while the
  Prefect API holding them cannot be reached (it may belong to a source saved since: clients keep the batch).

Auth is HTTP Basic with the write key as the user name (the password is ignored; SDKs send it empty) or
``writeKey`` in the body. Bodies and keys are never logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import math
import zlib
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from sqlalchemy import text
from sqlalchemy.engine import Engine
from starlette.exceptions import HTTPException as StarletteHTTPException

from prefect_webhooks.inbound.admin_api import add_admin_routes
from prefect_webhooks.inbound.batch_writer import BatchWriter, OverloadedError
from prefect_webhooks.inbound.envelope import Envelope, EnvelopeError, batch_envelope
from prefect_webhooks.inbound.ingestion import prepare_batch
from prefect_webhooks.inbound.sources import SourceInfo, SourceRegistry, SourcesUnavailableError
from prefect_webhooks.messages.model import MAX_BATCH_BYTES, MESSAGE_TYPES
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.metrics import add_metrics_routes

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1


class ApiError(Exception):
    """An answer other than 200: status, machine-readable code and a message naming the problem."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def json_response(status: int, content: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON response serialised with orjson."""
    return Response(orjson.dumps(content), status_code=status, media_type="application/json", headers=headers)


def error_response(error: ApiError) -> Response:
    """The ``{code, message}`` body of a refused request."""
    return json_response(error.status, {"code": error.code, "message": error.message}, error.headers)


class _Inflater:
    """Gzip/deflate decoding that stops as soon as the output passes ``limit`` (gzip bomb guard)."""

    def __init__(self, encoding: str, limit: int) -> None:
        # 16 + MAX_WBITS: gzip header; 32 + MAX_WBITS: detect zlib or gzip (for "deflate").
        wbits = 16 + zlib.MAX_WBITS if encoding in ("gzip", "x-gzip") else 32 + zlib.MAX_WBITS
        self._decompressor = zlib.decompressobj(wbits)
        self._limit = limit
        self.output = bytearray()

    def feed(self, data: bytes) -> None:
        while data:
            self.output += self._decompressor.decompress(data, self._limit + 1 - len(self.output))
            if len(self.output) > self._limit:
                raise _too_large()
            data = self._decompressor.unconsumed_tail

    def finish(self) -> bytes:
        if not self._decompressor.eof:
            raise ApiError(400, "invalid_encoding", "the compressed body is truncated")
        return bytes(self.output)


def _too_large() -> ApiError:
    return ApiError(400, "body_too_large", f"the body is over {MAX_BATCH_BYTES} bytes (after decompression)")


async def read_body(request: Request, limit: int = MAX_BATCH_BYTES) -> bytes:
    """The request body, decompressed when ``Content-Encoding`` says gzip/deflate, refused past ``limit``."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
        raise ApiError(400, "invalid_encoding", f"unsupported Content-Encoding {encoding[:32]!r}")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit and encoding in ("identity", ""):
        raise _too_large()
    inflater = _Inflater(encoding, limit) if encoding not in ("identity", "") else None
    raw = bytearray()
    try:
        async for chunk in request.stream():
            if inflater is not None:
                inflater.feed(chunk)
            else:
                raw += chunk
                if len(raw) > limit:
                    raise _too_large()
        return inflater.finish() if inflater is not None else bytes(raw)
    except zlib.error:
        raise ApiError(400, "invalid_encoding", f"the body is not valid {encoding} data") from None


def basic_auth_user(request: Request) -> str | None:
    """The user name of an HTTP Basic ``Authorization`` header (the write key), or None."""
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise ApiError(401, "invalid_auth", "the Authorization header is not valid HTTP Basic") from None
    return decoded.partition(":")[0] or None


def parse_json(body: bytes) -> Any:
    """The body as JSON, or a 400."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {str(exc)[:120]}") from None


def single_envelope(body: Any, call_type: str) -> Envelope:
    """A single-call body as a batch of one; the call's type comes from the path."""
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_message", "the body must be a JSON object")
    message = dict(body)
    write_key = message.pop("writeKey", None)
    message["type"] = call_type
    return Envelope(messages=[message], write_key=write_key if isinstance(write_key, str) else None)


BATCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["batch"],
    "properties": {
        "batch": {
            "type": "array",
            "description": "Calls (identify, track, page, screen, group, alias) in Segment wire form.",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": list(MESSAGE_TYPES)},
                    "userId": {"type": "string"},
                    "anonymousId": {"type": "string"},
                    "messageId": {"type": "string"},
                    "timestamp": {"type": "string", "format": "date-time"},
                    "context": {"type": "object"},
                    "integrations": {"type": "object"},
                },
                "additionalProperties": True,
            },
        },
        "context": {"type": "object", "description": "Merged into each call's context (the call's values win)."},
        "integrations": {"type": "object", "description": "Merged into each call's integrations."},
        "sentAt": {"type": "string", "format": "date-time", "description": "Client time the batch was sent."},
        "writeKey": {"type": "string", "description": "The source's write key (instead of HTTP Basic)."},
    },
}


def _single_schema(call_type: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"One {call_type} call in Segment wire form; its type is taken from the path.",
        "properties": {
            "userId": {"type": "string"},
            "anonymousId": {"type": "string"},
            "messageId": {"type": "string"},
            "timestamp": {"type": "string", "format": "date-time"},
            "writeKey": {"type": "string"},
        },
        "additionalProperties": True,
    }


def _request_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Invalid JSON, body over 500 KB, call over 32 KB, or not a batch: {code, message}."},
    401: {"description": "Missing or unknown write key."},
    403: {"description": "The source is disabled."},
    429: {"description": "Too many calls waiting to be written; retry after Retry-After seconds."},
    503: {"description": "The store is unavailable, or the key is unknown while the Prefect API cannot be reached; "
               "retry after Retry-After seconds."},
}


class IngestService:
    """The state behind the routes: the source registry and the store writer."""

    def __init__(self, engine: Engine, registry: SourceRegistry, writer: BatchWriter) -> None:
        self.engine = engine
        self.registry = registry
        self.writer = writer

    async def authenticate(self, request: Request, envelope: Envelope | None, basic_key: str | None) -> SourceInfo:
        """The source of the request's write key (Basic first, then the body's ``writeKey``)."""
        key = basic_key or (envelope.write_key if envelope else None)
        if not key:
            raise ApiError(401, "missing_write_key", "no write key: use HTTP Basic (key as user) or writeKey")
        try:
            source = await self.registry.lookup(key)
        except SourcesUnavailableError as exc:
            # Asked again once the Prefect API may be back (its probe interval).
            retry_after = max(RETRY_AFTER_SECONDS, math.ceil(get_settings().outage.api_probe_seconds))
            raise ApiError(503, "sources_unavailable", str(exc), {"Retry-After": str(retry_after)}) from None
        if source is None:
            raise ApiError(401, "invalid_write_key", "the write key is not known")
        if not source.enabled:
            raise ApiError(403, "source_disabled", f"source {source.name!r} is disabled")
        return source

    async def ingest(self, request: Request, call_type: str | None) -> Response:
        """Handle one request end to end; ``call_type`` is None for ``/v1/batch`` and ``/v1/import``."""
        try:
            basic_key = basic_auth_user(request)
            # With HTTP Basic a wrong key is refused before the body is read.
            source = await self.authenticate(request, None, basic_key) if basic_key else None
            body = parse_json(await read_body(request))
            envelope = batch_envelope(body) if call_type is None else single_envelope(body, call_type)
            if source is None:
                source = await self.authenticate(request, envelope, None)
            prepared = prepare_batch(
                envelope.messages,
                source,
                context=envelope.context,
                integrations=envelope.integrations,
                sent_at=envelope.sent_at,
            )
            if call_type is not None and prepared.rejected:
                rejection = prepared.rejected[0]
                raise ApiError(400, "invalid_message", f"{rejection.field}: {rejection.reason}")
        except ApiError as error:
            return error_response(error)
        except EnvelopeError as error:
            return error_response(ApiError(400, error.code, error.message))
        except Exception:
            # A defect, not the caller's fault and not the store's: said as such rather than as "retry later".
            logger.exception("ingest failed before the store was reached")
            return error_response(ApiError(500, "internal_error", "the request could not be processed"))
        try:
            result = await self.writer.submit(prepared)
        except OverloadedError:
            return error_response(
                ApiError(429, "overloaded", "too many calls waiting", {"Retry-After": str(RETRY_AFTER_SECONDS)})
            )
        except Exception as exc:
            logger.error("ingest failed: %s", type(exc).__name__)
            return error_response(
                ApiError(503, "store_unavailable", "the store is unavailable", {"Retry-After": "5"})
            )
        return json_response(200, {"success": True, **result.model_dump()})

    def health(self) -> tuple[bool, str | None]:
        """Whether the store answers a query."""
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            return True, None
        except Exception as exc:
            return False, type(exc).__name__


def _single_route(service: IngestService, call_type: str) -> Any:
    # A closure, not a default argument: FastAPI would publish a default argument as a query parameter.
    async def single(request: Request) -> Response:
        return await service.ingest(request, call_type)

    return single


def create_app(
    *,
    engine: Engine | None = None,
    database_url: str | None = None,
    registry: SourceRegistry | None = None,
) -> FastAPI:
    """The ingest API as an ASGI app.

    Args:
        engine: The store; by default the one at ``database_url`` or the configured store.
        database_url: Store URL when no engine is given.
        registry: Write key → source lookup; by default one reading the saved Source blocks.
    """
    engine = engine or get_engine(database_url)
    service = IngestService(engine, registry or SourceRegistry(), BatchWriter(engine))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        # The writer needs no start (it runs on the event loop when there is work); at shutdown it writes what waits.
        try:
            yield
        finally:
            await service.writer.stop()

    app = FastAPI(
        title="prefect-webhooks ingest API",
        version="1.0",
        description="Segment-compatible HTTP Tracking API. Accepted calls are committed before the 200.",
        lifespan=lifespan,
    )
    app.state.service = service

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        # Routing refusals (404, 405…) answer like every other refusal: a {code, message} body.
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        return json_response(exc.status_code, {"code": code, "message": str(exc.detail)}, exc.headers)

    async def batch(request: Request) -> Response:
        return await service.ingest(request, None)

    for path, name in (("/v1/batch", "batch"), ("/v1/import", "import")):
        app.add_api_route(
            path,
            batch,
            methods=["POST"],
            name=name,
            summary=f"Send a batch of calls ({name})",
            openapi_extra=_request_body(BATCH_SCHEMA),
            responses=_RESPONSES,
        )

    for call_type in MESSAGE_TYPES:
        app.add_api_route(
            f"/v1/{call_type}",
            _single_route(service, call_type),
            methods=["POST"],
            name=call_type,
            summary=f"Send one {call_type} call",
            openapi_extra=_request_body(_single_schema(call_type)),
            responses=_RESPONSES,
        )

    @app.get("/health", summary="Liveness and store reachability")
    async def health() -> Response:
        ok, error = await asyncio.to_thread(service.health)
        content = {"ok": ok, "store": ok, "pending": service.writer.pending}
        if error:
            content["error"] = error
        return json_response(200 if ok else 503, content)

    # Backlog depth and oldest pending age: Prometheus text at /metrics, JSON at /health/backlog.
    add_metrics_routes(app, engine)
    add_admin_routes(app, engine)
    return app
