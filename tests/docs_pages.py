"""The user documentation the tests check: README.md and the pages of the MkDocs site, in reading order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _nav_files(entries: list[Any]) -> Iterator[str]:
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from _nav_files(value)
        else:
            yield value


def nav_pages() -> list[Path]:
    """The site's pages in the order of its navigation (mkdocs.yml)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    return [DOCS / name for name in _nav_files(config["nav"])]


def doc_pages() -> list[Path]:
    """README.md, then every page of the site in navigation order."""
    return [ROOT / "README.md", *nav_pages()]


def page(relative: str) -> str:
    """One page's Markdown, by its path under docs/ (``"reference/settings.md"``)."""
    return (DOCS / relative).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The Markdown under ``heading`` (any level), up to the next heading of the same or a higher level."""
    for level in range(1, 5):
        marker = f"\n{'#' * level} {heading}\n"
        if marker in text:
            body = text.split(marker, 1)[1]
            ends = [body.find(f"\n{'#' * up} ") for up in range(1, level + 1)]
            ends = [end for end in ends if end >= 0]
            return body[: min(ends)] if ends else body
    raise KeyError(heading)
