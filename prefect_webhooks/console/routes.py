"""The console's routes on serve's HTTP server, under ``/console``: read the store, act through the same paths as
the command line (``messages resend``, ``replay``, ``endpoint enable/disable``).

Every page answers ``Cache-Control: no-store`` and may not be framed; none is in the OpenAPI document (they are
pages for a person, not an API).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from fastapi import FastAPI, Request
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.responses import HTMLResponse, RedirectResponse, Response

from prefect_webhooks.console import pages
from prefect_webhooks.console.access import (
    SESSION_COOKIE,
    SESSION_SECONDS,
    ConsoleRefusal,
    admin_token,
    check_form,
    check_signed_in,
    csrf_token,
    new_session,
    token_matches,
)
from prefect_webhooks.console.charts import outcome_chart

PREFIX = "/console"
HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                               "frame-ancestors 'none'",
}
Handler = Callable[[Request, str], Awaitable[Response]]


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=HEADERS)


def _refused(request: Request, refusal: ConsoleRefusal) -> Response:
    if refusal.status == 401:
        return _html(pages.sign_in_page(refusal.message, request.url.path), 401)
    return _html(pages.refusal_page(refusal.message), refusal.status)


def _back(path: str, notice: str | None = None) -> Response:
    target = path + (f"?{urlencode({'notice': notice})}" if notice else "")
    return RedirectResponse(target, status_code=303, headers=HEADERS)


async def _form(request: Request) -> dict[str, str]:
    return dict(parse_qsl((await request.body()).decode("utf-8", "replace")))


def _signed_in(handler: Handler) -> Callable[..., Awaitable[Response]]:
    """Run ``handler`` with the request's session, answering refusals as pages."""

    async def guarded(request: Request) -> Response:
        try:
            session = check_signed_in(request)
            if request.method == "POST":
                check_form(request, session, await _form(request))
            return await handler(request, session)
        except ConsoleRefusal as refusal:
            return _refused(request, refusal)

    return guarded


def add_console_routes(app: FastAPI, engine: Engine) -> None:
    """Add the console's pages under ``/console`` to the API app.

    Args:
        app: The API app.
        engine: The store.
    """

    def route(path: str, handler: Handler, methods: tuple[str, ...] = ("GET",)) -> None:
        app.add_api_route(PREFIX + path, _signed_in(handler), methods=list(methods), include_in_schema=False)

    async def sign_in(request: Request) -> Response:
        try:
            token = admin_token()
        except ConsoleRefusal as refusal:
            return _refused(request, refusal)
        form = await _form(request) if request.method == "POST" else {}
        target = form.get("next") or request.query_params.get("next") or PREFIX
        if not target.startswith(PREFIX) or target.startswith("//"):
            target = PREFIX
        if request.method == "GET" or not token_matches(form.get("token", ""), token):
            message = "That is not the admin token." if request.method == "POST" else "Sign in with the admin token."
            return _html(pages.sign_in_page(message, target), 401 if request.method == "POST" else 200)
        answer = RedirectResponse(target, status_code=303, headers=HEADERS)
        answer.set_cookie(SESSION_COOKIE, new_session(token), max_age=SESSION_SECONDS, path=PREFIX, httponly=True,
                          samesite="strict", secure=request.url.scheme == "https")
        return answer

    async def sign_out(_request: Request, _session: str) -> Response:
        answer = RedirectResponse(f"{PREFIX}/sign-in", status_code=303, headers=HEADERS)
        answer.delete_cookie(SESSION_COOKIE, path=PREFIX)
        return answer

    app.add_api_route(f"{PREFIX}/sign-in", sign_in, methods=["GET", "POST"], include_in_schema=False)
    route("/sign-out", sign_out, ("POST",))
    route("", lambda request, session: _overview(engine, session))
    # The destination and message pages read their block as delivery does: kept for the block cache's seconds, read
    # again at once after a change the store counts (an endpoint enabled or disabled here or by the command line).
    blocks = _destination_blocks()
    route("/destinations/{name}", lambda request, session: _destination(engine, blocks, request, session))
    route("/destinations/{name}/replay", lambda request, session: _replay(engine, request, session),
          ("GET", "POST"))
    route("/destinations/{name}/endpoints/{position:int}/{action}", _endpoint_action, ("GET", "POST"))
    route("/messages", lambda request, session: _messages(engine, request, session))
    route("/messages/{number:int}", lambda request, session: _message(engine, blocks, request, session))
    route("/messages/{number:int}/resend", lambda request, session: _resend(engine, request, session),
          ("GET", "POST"))


async def _overview(engine: Engine, session: str) -> Response:
    from prefect_webhooks.store.figures.metrics import backlog_snapshot

    snapshot = await run_in_threadpool(backlog_snapshot, engine)
    return _html(pages.overview_page(snapshot["destinations"], csrf_token(session)))


def _destination_blocks() -> Any:
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.blocks.saved import RecentBlocks
    from prefect_webhooks.settings import get_settings

    return RecentBlocks(WebhookDestination, get_settings().delivery.block_cache_seconds)


async def _block_or_notice(name: str, blocks: Any, generation: int | None) -> Any:
    """The destination's block, or why the page cannot show its endpoints (it still shows what the store knows)."""
    from prefect_webhooks.blocks.saved import is_missing_block

    try:
        return await blocks.get(name, generation)
    except Exception as exc:
        if is_missing_block(exc):
            return f"No WebhookDestination block named {name!r} is saved."
        return f"The destination block could not be loaded: {type(exc).__name__}"


async def _destination(engine: Engine, blocks: Any, request: Request, session: str) -> Response:
    from prefect_webhooks.delivery.endpoints.admin import views_of
    from prefect_webhooks.store.endpoints.destination_changes import destination_generations
    from prefect_webhooks.store.endpoints.states import read_states
    from prefect_webhooks.store.figures.metrics import backlog_snapshot
    from prefect_webhooks.store.figures.minute_counts import minute_series, top_reasons
    from prefect_webhooks.store.schema.tables import store_now

    name = request.path_params["name"]
    generation = (await run_in_threadpool(destination_generations, engine, [name])).get(name)

    def read() -> tuple[Any, Any, Any, Any]:
        now = store_now()
        with engine.connect() as connection:
            series, reasons = minute_series(connection, name, now), top_reasons(connection, name, now)
        states = read_states(engine, [name])
        return backlog_snapshot(engine, now)["destinations"].get(name, {}), series, reasons, states

    (figures, series, reasons, states), block = await asyncio.gather(
        run_in_threadpool(read), _block_or_notice(name, blocks, generation))
    views = block if isinstance(block, str) else views_of(name, block, states)
    return _html(pages.destination_page(name, figures, views, outcome_chart(series), series.totals(), reasons,
                                        csrf_token(session), request.query_params.get("notice"), _prefect_ui()))


def _prefect_ui() -> str | None:
    """The Prefect UI's address (links to an endpoint's ``deliver`` runs), when Prefect knows one."""
    from prefect.settings import PREFECT_UI_URL

    return PREFECT_UI_URL.value() or None


def _since(text: str) -> Any:
    from prefect_webhooks.utilities.durations import past_time

    try:
        return past_time(text)
    except ValueError as exc:
        raise ConsoleRefusal(400, f"since: {exc}") from None


async def _replay(engine: Engine, request: Request, session: str) -> Response:
    from prefect_webhooks.store.queue.replay import ReplaySelection, count_selected, replay_selection

    name = request.path_params["name"]
    values = await _form(request) if request.method == "POST" else dict(request.query_params)
    since_text, prefix = values.get("since") or "24h", values.get("reason_prefix") or None
    selection = ReplaySelection((name,), since=_since(since_text), reason_prefix=prefix)
    back = f"{PREFIX}/destinations/{quote(name, safe='')}"
    if request.method == "POST":
        count = await run_in_threadpool(replay_selection, selection, engine=engine)
        return _back(back, f"{count} failed message(s) are pending again.")
    count = await run_in_threadpool(count_selected, engine, selection)
    question = (f"Put back {count} failed message(s) of {name} attempted in the last {since_text}"
                + (f" whose reason starts with {prefix!r}" if prefix else "") + "? They are sent again at once.")
    return _html(pages.confirm_page(question, request.url.path, csrf_token(session), back,
                                    {"since": since_text, "reason_prefix": prefix or ""}))


async def _endpoint_action(request: Request, session: str) -> Response:
    from prefect_webhooks.delivery.endpoints.admin import adisable, aenable

    name, position, action = (request.path_params[key] for key in ("name", "position", "action"))
    if action not in ("enable", "disable"):
        raise ConsoleRefusal(404, f"No endpoint action {action!r}: enable or disable.")
    back = f"{PREFIX}/destinations/{quote(name, safe='')}"
    if request.method == "GET":
        question = (f"{action.capitalize()} endpoint {position} of {name}? "
                    + ("It gets requests again." if action == "enable" else "It gets no request until enabled."))
        return _html(pages.confirm_page(question, request.url.path, csrf_token(session), back))
    try:
        done = await (aenable(name, [position], False) if action == "enable" else adisable(name, [position]))
    except ValueError as exc:
        return _back(back, f"{action}: {exc}")
    changed = done[0] if action == "enable" else done
    return _back(back, f"Endpoint {position} {action}d." if changed else f"Endpoint {position} was already "
                 f"{action}d.")


async def _messages(engine: Engine, request: Request, session: str) -> Response:
    from prefect_webhooks.inbound.admin_api import AdminError, message_query, messages_page

    parameters = {key: value for key, value in request.query_params.items() if value and key != "notice"}
    try:
        query, refinement, limit = message_query(QueryParams(parameters))
    except AdminError as error:
        return _html(pages.messages_page(parameters, [], None, error.message, csrf_token(session)), 400)
    found = await run_in_threadpool(messages_page, engine, query, refinement, limit)
    shown = {key: value for key, value in parameters.items() if key != "cursor"}
    return _html(pages.messages_page(shown, found["data"], found["next_cursor"], None, csrf_token(session)))


async def _message(engine: Engine, blocks: Any, request: Request, session: str) -> Response:
    from prefect_webhooks.delivery.endpoints.preview import stored_message_requests
    from prefect_webhooks.inbound.admin_api import one_message
    from prefect_webhooks.store.endpoints.destination_changes import destination_generations
    from prefect_webhooks.store.engine.engines import store_key
    from prefect_webhooks.store.log.lookups import message_document

    number = request.path_params["number"]

    def read() -> tuple[Any, int | None, str]:
        message = one_message(engine, number)
        if message is None:
            return None, None, ""
        generations = destination_generations(engine, [message.destination])
        return message, generations.get(message.destination), store_key(engine)

    message, generation, key = await run_in_threadpool(read)
    if message is None:
        raise ConsoleRefusal(404, f"No message {number} is queued or kept.")
    try:
        block = await blocks.get(message.destination, generation) if message.body is not None else None
        requests = stored_message_requests(block, message.body, message.id, key, message.endpoint)
    except Exception as exc:  # the attempts are worth showing without the block
        requests = [f"(the destination block {message.destination!r} could not be loaded: {type(exc).__name__})"]
    return _html(pages.message_page(message_document(message), requests, request.query_params.get("notice"),
                                    csrf_token(session)))


async def _resend(engine: Engine, request: Request, session: str) -> Response:
    from prefect_webhooks.store.queue.replay import resend_messages

    number = request.path_params["number"]
    back = f"{PREFIX}/messages/{number}"
    if request.method == "GET":
        return _html(pages.confirm_page(f"Send message {number} again? The receiver gets it with the same id, "
                                        "signed with the destination's current secret.", request.url.path,
                                        csrf_token(session), back))
    outcome = (await run_in_threadpool(resend_messages, [number], engine=engine))[number]
    return _back(back, f"Message {number}: {outcome}.")
