"""The console's chart of a destination's outcomes per minute, drawn as inline SVG on the server (no script).

One stacked bar per minute that had an outcome: delivered at the bottom, then filtered, then failed; each bar part
carries a ``<title>`` (the minute and its count) that a browser shows on hover. The counts come from
``store.figures.minute_counts.minute_series``: per-minute counters, never a scan of messages.
"""

from __future__ import annotations

from datetime import timedelta
from html import escape

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.store.figures.minute_counts import MinuteSeries

COLOURS = {DELIVERED: "#2e7d32", FILTERED: "#9e9e9e", FAILED: "#c62828"}
STACK = (DELIVERED, FILTERED, FAILED)
HEIGHT = 120


def outcome_chart(series: MinuteSeries) -> str:
    """The SVG of ``series``: one unit of width per minute, the tallest minute as high as the chart."""
    minutes = len(series.counts[DELIVERED])
    per_minute = [sum(series.counts[outcome][index] for outcome in STACK) for index in range(minutes)]
    peak = max(per_minute, default=0) or 1
    parts = []
    for index, total in enumerate(per_minute):
        if not total:
            continue
        # Formatted once a minute, not once a bar part: a day's chart has up to 4,320 parts.
        minute = (series.start + timedelta(minutes=index)).strftime("%Y-%m-%d %H:%M")
        data_minute = minute.replace(" ", "T")
        bottom = float(HEIGHT)
        for outcome in STACK:
            count = series.counts[outcome][index]
            if not count:
                continue
            height = HEIGHT * count / peak
            bottom -= height
            parts.append(
                f'<rect class="{outcome}" x="{index}" y="{bottom:.2f}" width="1" height="{height:.2f}" '
                f'fill="{COLOURS[outcome]}" data-minute="{data_minute}" data-count="{count}">'
                f"<title>{minute} UTC: {count} {outcome}</title></rect>")
    first, last = series.start, series.start + timedelta(minutes=minutes - 1)
    label = f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC, at most {peak} a minute"
    return (f'<svg class="chart" viewBox="0 0 {minutes} {HEIGHT}" preserveAspectRatio="none" role="img" '
            f'aria-label="{escape(label)}" width="100%" height="{HEIGHT}">'
            f'<rect x="0" y="0" width="{minutes}" height="{HEIGHT}" fill="#fafafa"/>{"".join(parts)}</svg>'
            f'<p class="axis"><span>{first:%H:%M}</span> <span>{escape(label)}</span> '
            f"<span>{last:%H:%M} UTC</span></p>")
