"""The admin API on serve's HTTP server, under ``/v1/admin/``: look messages up and send them again, over HTTP.

It answers what ``prefect-webhooks messages`` answers, from the same lookups (``store.log.lookups``) and the same resend
(``store.queue.replay.resend_messages``), as JSON with cursor paging. It is behind its own credential, never a write
key: ``PREFECT_WEBHOOKS_ADMIN_TOKEN``, sent as ``Authorization: Bearer <token>``. Until one is set every admin path
answers 404 saying so; a request without it or with another answers 401. The token is compared in constant time and
never logged.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fastapi import FastAPI, Request
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED, PENDING
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.lookups import MessageQuery, StoredMessage, find_messages, message_document
from prefect_webhooks.store.log.message_search import Refinement, search_messages
from prefect_webhooks.store.queue.replay import resend_messages
from prefect_webhooks.utilities.durations import past_time

ADMIN_PREFIX = "/v1/admin"
STATES = (PENDING, DELIVERED, FILTERED, FAILED)
MAX_PAGE = 500
MAX_RESEND = 1000


class AdminError(Exception):
    """A refused admin request: status, code and a message naming the problem."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def check_admin(request: Request) -> None:
    """Let the request through only with the admin token (404 while none is set, 401 without it)."""
    token = get_settings().active_admin_token()
    if token is None:
        raise AdminError(404, "admin_api_off", "the admin API is off: set PREFECT_WEBHOOKS_ADMIN_TOKEN to turn it on")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise AdminError(401, "unauthorized", "send the admin token as Authorization: Bearer <token>")


def encode_cursor(position: tuple[datetime, int]) -> str:
    """The opaque cursor of a page's last message: the next page starts after it."""
    at, number = position
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{number}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        at, _, number = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().partition("|")
        return datetime.fromisoformat(at), int(number)
    except ValueError:
        raise AdminError(400, "invalid_cursor", "cursor: not a cursor this API gave (use next_cursor as it is)") \
            from None


def _time(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return past_time(value)
    except ValueError as exc:
        raise AdminError(400, "invalid_parameter", f"{name}: {exc}") from None


def _limit(value: str | None) -> int:
    if value is None:
        return 50
    if not value.isdigit() or not 1 <= int(value) <= MAX_PAGE:
        raise AdminError(400, "invalid_parameter", f"limit: a whole number from 1 to {MAX_PAGE}, got {value!r}")
    return int(value)


def message_query(parameters: Any) -> tuple[MessageQuery, Refinement, int]:
    """The lookup, its refinement and the page size a ``GET /v1/admin/messages`` query string asks for, or an error
    naming the parameter."""
    states: Sequence[str] = parameters.getlist("state")
    unknown = sorted(set(states) - set(STATES))
    if unknown:
        raise AdminError(400, "invalid_parameter", f"state: {', '.join(unknown)} is not one of {', '.join(STATES)}")
    cursor = parameters.get("cursor")
    query = MessageQuery(
        message_id=parameters.get("messageId"), user_id=parameters.get("userId"),
        destination=parameters.get("destination"), states=list(states) or None,
        since=_time("since", parameters.get("since")), until=_time("until", parameters.get("until")),
        before=decode_cursor(cursor) if cursor else None)
    refinement = Refinement(reason_prefix=parameters.get("reasonPrefix"), endpoint=parameters.get("endpoint"))
    return query, refinement, _limit(parameters.get("limit"))


def messages_page(engine: Engine, query: MessageQuery, refinement: Refinement, limit: int) -> dict[str, Any]:
    """One page of messages as JSON documents, with the cursor of the next page (None after the last)."""
    with engine.connect() as connection:
        page = search_messages(connection, query, refinement, limit=limit)
    return {"data": [message_document(message) for message in page.messages],
            "next_cursor": encode_cursor(page.resume_at) if page.resume_at else None}


def one_message(engine: Engine, number: int) -> StoredMessage | None:
    """Message ``number``, queued or kept, or None."""
    with engine.connect() as connection:
        found = find_messages(connection, MessageQuery(ids=[number]), limit=1)
    return found[0] if found else None


def add_admin_routes(app: FastAPI, engine: Engine | None = None) -> None:
    """Add ``/v1/admin/messages`` (list), ``/v1/admin/messages/{id}`` (one) and ``/v1/admin/messages/resend``.

    Args:
        app: The API app.
        engine: The store; the configured one by default.
    """
    import orjson

    def answer(status: int, content: Any) -> Response:
        return Response(orjson.dumps(content), status_code=status, media_type="application/json")

    def refused(error: AdminError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return Response(orjson.dumps({"code": error.code, "message": error.message}), status_code=error.status,
                        media_type="application/json", headers=headers)

    @app.get(f"{ADMIN_PREFIX}/messages", summary="List messages, newest first (admin)", tags=["admin"])
    async def list_messages(request: Request) -> Response:
        try:
            check_admin(request)
            query, refinement, limit = message_query(request.query_params)
        except AdminError as error:
            return refused(error)
        return answer(200, await run_in_threadpool(messages_page, engine or get_engine(), query, refinement, limit))

    # ``:int``: only a number names a message, so ``/messages/resend`` never reaches this route.
    @app.get(ADMIN_PREFIX + "/messages/{number:int}", summary="One message with every attempt (admin)",
             tags=["admin"])
    async def show_message(request: Request, number: int) -> Response:
        try:
            check_admin(request)
        except AdminError as error:
            return refused(error)
        message = await run_in_threadpool(one_message, engine or get_engine(), number)
        if message is None:
            return refused(AdminError(404, "not_found", f"no message {number} is queued or kept"))
        return answer(200, message_document(message))

    @app.post(f"{ADMIN_PREFIX}/messages/resend", summary="Send kept messages again (admin)", tags=["admin"])
    async def resend(request: Request) -> Response:
        try:
            check_admin(request)
            ids = _resend_ids(await request.body())
        except AdminError as error:
            return refused(error)
        outcomes = await run_in_threadpool(resend_messages, ids, engine=engine or get_engine())
        return answer(200, {"results": [{"id": number, "outcome": outcome} for number, outcome in outcomes.items()]})


def _resend_ids(body: bytes) -> list[int]:
    import orjson

    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise AdminError(400, "invalid_json", "the body is not JSON: send {\"ids\": [1, 2]}") from None
    ids = document.get("ids") if isinstance(document, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(n, int) and not isinstance(n, bool) for n in ids):
        raise AdminError(400, "invalid_parameter", "ids: a non-empty list of message ids (whole numbers)")
    if len(ids) > MAX_RESEND:
        raise AdminError(400, "invalid_parameter", f"ids: at most {MAX_RESEND} per request, got {len(ids)}")
    return ids
