"""Property keys: the snake_case form of an audience or computed-trait name.

The rule, applied in this order:

1. Unicode NFKD, then accents (combining marks) dropped: ``Über`` → ``Uber``.
2. camelCase boundaries split: ``camelCase`` → ``camel_Case``, ``HTTPServer`` → ``HTTP_Server``.
3. Lower case; every run of characters other than ASCII letters and digits becomes one ``_``.
4. Leading and trailing ``_`` stripped. A name that leaves nothing (``"!!!"``, ``"日本"``) is rejected.

Examples:
    ``Big Spenders 2024`` → ``big_spenders_2024``, ``High-Value Users`` → ``high_value_users``,
    ``VIP users (EU)`` → ``vip_users_eu``, ``camelCaseName`` → ``camel_case_name``, ``ÜberFans`` → ``uber_fans``.
"""

from __future__ import annotations

import re
import unicodedata

# lower/digit followed by upper (camelCase), or an upper run followed by Upper+lower (HTTPServer).
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


class EmptyKeyError(ValueError):
    """A name whose snake_case form is empty."""


def strip_accents(text: str) -> str:
    """``text`` decomposed (NFKD) with its combining marks removed."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(char for char in decomposed if not unicodedata.combining(char))


def snake_case(name: str) -> str:
    """The property key for a display name (see the module docstring for the rule and examples).

    Args:
        name: An audience or computed-trait display name.

    Returns:
        The snake_case key, e.g. ``"VIP users (EU)"`` → ``"vip_users_eu"``.

    Raises:
        EmptyKeyError: When nothing usable is left of the name.
    """
    text = _CAMEL_BOUNDARY.sub("_", strip_accents(name))
    key = _NOT_ALNUM.sub("_", text.lower()).strip("_")
    if not key:
        raise EmptyKeyError(f"the name {name!r} has no letters or digits to build a key from")
    return key
