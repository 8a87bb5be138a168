"""The console's pages as HTML text: plain server-rendered pages and forms, no script, every value escaped.

Each function takes what a page shows (read by ``routes``) and returns the page; none reads the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from prefect_webhooks.delivery.endpoints.admin import EndpointView
from prefect_webhooks.store.figures.minute_counts import ReasonCount
from prefect_webhooks.store.log.message_search import SCAN_LIMIT

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222}header{background:#1f2937;color:#fff;padding:8px 16px}
header a{color:#fff;margin-right:16px;text-decoration:none}main{padding:12px 16px;max-width:1400px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f3f4f6}pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap}
.failed,.bad{color:#c62828}.delivered,.good{color:#2e7d32}.filtered{color:#757575}.notice{background:#fff8e1;
padding:8px}.axis{display:flex;justify-content:space-between;color:#666;font-size:12px;margin:0}
form.inline{display:inline}input,select,button{font:inherit;margin-right:6px}
"""


def page(title: str, body: str, *, signed_in: bool = True, csrf: str | None = None) -> str:
    """A whole console page around ``body``."""
    nav = ('<a href="/console">Destinations</a><a href="/console/messages">Messages</a>'
           + (f'<form class="inline" method="post" action="/console/sign-out"><input type="hidden" name="csrf" '
              f'value="{escape(csrf)}"><button>Sign out</button></form>' if csrf else "")) if signed_in else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)} · prefect-webhooks'
            f'</title><style>{STYLE}</style></head><body><header><strong>prefect-webhooks</strong> &nbsp; {nav}'
            f"</header><main><h1>{escape(title)}</h1>{body}</main></body></html>")


def sign_in_page(message: str, next_path: str) -> str:
    """The form that trades the admin token for a session."""
    return page("Sign in", f'<p>{escape(message)}</p><form method="post" action="/console/sign-in">'
                f'<input type="hidden" name="next" value="{escape(next_path)}">'
                '<label>Admin token <input type="password" name="token" autocomplete="current-password" '
                'required></label> <button>Sign in</button></form>', signed_in=False)


def refusal_page(message: str) -> str:
    return page("Refused", f"<p>{escape(message)}</p>", signed_in=False)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    if not rows:
        return f"<p>{escape(empty)}</p>"
    head = "".join(f"<th>{escape(name)}</th>" for name in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return (f"<table><thead><tr>{head}</tr></thead>" if any(headers) else "<table>") + f"<tbody>{body}</tbody></table>"


def _when(moment: datetime | str | None) -> str:
    if moment is None:
        return ""
    if isinstance(moment, str):
        return escape(moment.replace("T", " ")[:19])
    return f"{moment:%Y-%m-%d %H:%M:%S}"


def _age(seconds: float | None) -> str:
    if not seconds:
        return ""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 \
        else f"{seconds / 3600:.1f} h"


def destination_link(name: str) -> str:
    return f'<a href="/console/destinations/{quote(name, safe="")}">{escape(name)}</a>'


def overview_page(destinations: Mapping[str, Mapping[str, Any]], csrf: str) -> str:
    """Every destination the store knows with its backlog and outcome totals."""
    rows = [(destination_link(name), str(f["pending"]), str(f["in_flight"]), _age(f["oldest_pending_age_seconds"]),
             str(f["delivered"]), str(f["failed"]), str(f["filtered"])) for name, f in destinations.items()]
    return page("Destinations", _table(
        ["destination", "pending", "in flight", "oldest pending", "delivered", "failed", "filtered"], rows,
        "No destination has had a message yet."), csrf=csrf)


def _health(view: EndpointView) -> str:
    if view.state != "enabled":
        return f'<span class="bad">{escape(view.state)}</span>' + (
            f"<br>{escape(view.disabled_reason)}" if view.disabled_reason else "")
    if view.paused_until:
        return f"paused until {_when(view.paused_until)} UTC (Retry-After)"
    if view.failures:
        return f'<span class="bad">failing: {view.failures} in a row</span>'
    return '<span class="good">healthy</span>'


def _endpoint_rows(name: str, views: Sequence[EndpointView], prefect_ui: str | None) -> list[list[str]]:
    rows = []
    for view in views:
        action = "enable" if view.state != "enabled" else "disable"
        link = f"/console/destinations/{quote(name, safe='')}/endpoints/{view.position}/{action}"
        runs = (f'<a class="runs" href="{escape(prefect_ui.rstrip("/"))}/artifacts/key/{view.artifact_key}">its '
                "deliver runs</a>" if prefect_ui else "")
        rows.append([str(view.position), escape(view.url), escape(view.rate_limit), _health(view),
                     _when(view.failing_since), escape(view.last_error or ""), runs,
                     f'<a href="{link}">{action}…</a>'])
    return rows


def destination_page(name: str, figures: Mapping[str, Any], views: Sequence[EndpointView] | str, chart: str,
                     totals: Mapping[str, int], reasons: Sequence[ReasonCount], csrf: str,
                     notice: str | None = None, prefect_ui: str | None = None) -> str:
    """One destination: its endpoints' health (with a link to their runs in the Prefect UI at ``prefect_ui``), its
    outcomes per minute, its top failure reasons, replay."""
    quoted = quote(name, safe="")
    endpoints = (f"<p class='bad'>{escape(views)}</p>" if isinstance(views, str) else _table(
        ["#", "url", "rate limit", "health", "failing since (UTC)", "last error", "Prefect", ""],
        _endpoint_rows(name, views, prefect_ui), "No endpoint."))
    backlog = (f"<p>pending {figures.get('pending', 0)} (in flight {figures.get('in_flight', 0)}), oldest pending "
               f"{_age(figures.get('oldest_pending_age_seconds')) or '–'}</p>")
    legend = " · ".join(f'<span class="{outcome}" data-outcome="{outcome}">{outcome} {count}</span>'
                        for outcome, count in totals.items())
    reason_rows = [[escape(r.outcome), escape(r.reason), str(r.count),
                    f'<a href="/console/messages/{r.sample_id}">message {r.sample_id}</a>'] for r in reasons]
    messages = f"/console/messages?{urlencode({'destination': name})}"
    replay = (f'<form method="get" action="/console/destinations/{quoted}/replay">Put failed messages back: '
              '<select name="since"><option value="1h">of the last hour</option><option value="6h">of the last 6 '
              'hours</option><option value="24h" selected>of the last 24 hours</option><option value="7d">of the '
              'last 7 days</option></select><input name="reason_prefix" placeholder="reason starts with (optional)">'
              "<button>Replay…</button></form>")
    shown = f'<p class="notice">{escape(notice)}</p>' if notice else ""
    return page(name, f"{shown}<h2>Endpoints</h2>{endpoints}<h2>Backlog</h2>{backlog}"
                f"<h2>Last 24 hours, per minute</h2><p class='legend'>{legend}</p>{chart}"
                f"<h2>Top failure reasons (24 h)</h2>"
                + _table(["outcome", "reason", "messages", "sample"], reason_rows, "No message failed or was "
                         "filtered in the last 24 hours.")
                + f'<p><a href="{messages}">Messages of {escape(name)}</a></p><h2>Replay</h2>{replay}', csrf=csrf)


def search_form(parameters: Mapping[str, str]) -> str:
    def field(name: str, label: str) -> str:
        return f'<label>{label} <input name="{name}" value="{escape(parameters.get(name, ""))}"></label>'

    state = parameters.get("state", "")
    options = "".join(f'<option{" selected" if value == state else ""}>{value}</option>'
                      for value in ("", "pending", "delivered", "filtered", "failed"))
    return ('<form method="get" action="/console/messages">' + field("messageId", "messageId")
            + field("userId", "user") + field("destination", "destination")
            + f'<label>state <select name="state">{options}</select></label>' + field("since", "since (2h, ISO)")
            + field("reasonPrefix", "reason starts with") + field("endpoint", "endpoint URL")
            + "<button>Search</button></form>")


def messages_page(parameters: Mapping[str, str], found: Sequence[Mapping[str, Any]], next_cursor: str | None,
                  error: str | None, csrf: str) -> str:
    """The search form and one page of messages, newest first."""
    rows = [[f'<a href="/console/messages/{m["id"]}">{m["id"]}</a>', destination_link(m["destination"]),
             escape(m["type"]), escape(m.get("messageId") or ""), escape(m.get("userId") or ""),
             f'<span class="{escape(m["state"])}">{escape(m["state"])}</span>', escape(m.get("reason") or ""),
             str(m["attempts"]), _when(m["created_at"])] for m in found]
    more = ""
    if next_cursor:
        older = urlencode({**parameters, "cursor": next_cursor})
        more = (f'<p><a href="/console/messages?{older}">Older…</a>'
                + (f" (a search by reason or endpoint reads at most {SCAN_LIMIT:,} messages a page: narrow it by "
                   "destination or time to see more matches at once)" if "reasonPrefix" in parameters
                   or "endpoint" in parameters else "") + "</p>")
    return page("Messages", search_form(parameters) + (f'<p class="bad">{escape(error)}</p>' if error else "")
                + _table(["id", "destination", "type", "messageId", "user", "state", "reason", "attempts",
                          "stored (UTC)"], rows, "No message matches.") + more, csrf=csrf)


def message_page(document: Mapping[str, Any], requests: Sequence[str], notice: str | None, csrf: str) -> str:
    """One message: what it is, the request as sent now, every attempt with the receiver's answer, resend."""
    facts = [[escape(name), escape(str(document[name]) if document[name] is not None else "")]
             for name in ("state", "reason", "destination", "source", "type", "messageId", "userId", "attempts",
                          "created_at", "first_attempt_at", "next_attempt_at", "finished_at") if name in document]
    tries = [[str(number), _when(t["attempted_at"]), escape(t["url"]), escape(str(t["status_code"] or "")),
              str(t["latency_ms"]), escape(t["error"] or ""), escape(t["outcome"]),
              f"<pre>{escape(t['response'])}</pre>" if t.get("response") else ""]
             for number, t in enumerate(document["tries"], 1)]
    body = json.dumps(document["body"], indent=2) if document["body"] is not None else "(purged)"
    resend = (f'<p><a href="/console/messages/{document["id"]}/resend">Send again…</a></p>'
              if document["state"] in ("delivered", "failed") else "")
    shown = "".join(f"<pre>{escape(text)}</pre>" for text in requests)
    return page(f"Message {document['id']}", (f'<p class="notice">{escape(notice)}</p>' if notice else "")
                + _table(["", ""], facts, "") + resend + "<h2>Attempts</h2>"
                + _table(["#", "attempted at (UTC)", "url", "status", "latency ms", "error", "outcome",
                          "receiver's answer"], tries, "No attempt yet.")
                + f"<h2>Body</h2><pre>{escape(body)}</pre><h2>The request as sent now</h2>{shown}", csrf=csrf)


def confirm_page(question: str, action: str, csrf: str, back: str, fields: Mapping[str, str] | None = None) -> str:
    """Ask before an action: a form that posts ``fields`` to ``action``, or a link back."""
    hidden = "".join(f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">'
                     for name, value in (fields or {}).items())
    return page("Confirm", f'<p>{escape(question)}</p><form method="post" action="{escape(action)}">'
                f'<input type="hidden" name="csrf" value="{escape(csrf)}">{hidden}<button name="confirm" '
                f'value="yes">Yes, do it</button> <a href="{escape(back)}">Cancel</a></form>', csrf=csrf)
