"""Destination filters: per-destination rules that drop messages, or allow only some, before they are sent.

Semantics follow Segment's destination filters (an "only send" filter is a drop of everything it does not match):

- a ``drop`` rule filters out every message it matches;
- an ``allow`` rule filters out every message it does **not** match, so with several allow rules a message must
  match each of them (put alternatives in one rule with ``match="any"``);
- rules are checked in order and the first one that filters a message names it in the row's ``reason``
  (``filtered: drop rule 'internal'``, ``filtered: allow rule #2 not matched`` for an unnamed second rule).

A rule matches a message when its criteria hold: ``types`` (the message type is one of them), ``events`` (a track
event name is one of them) and each of ``conditions`` (``match="all"``, the default) or at least one criterion
(``match="any"``). A condition addresses a field of the **outbound body**, the JSON the endpoint would receive:
``type``, ``event``, ``userId``, ``anonymousId``, ``groupId``, ``name``, ``Previous ID``, ``User ID``, or a dotted
path under ``properties``, ``traits`` or ``context`` (``properties.plan``, ``traits.email``,
``context.os.name``), with exactly one test: ``equals`` a JSON scalar, ``in`` a list of them, or ``exists`` (present
and not null: ``true``, or absent: ``false``). Comparisons are exact: strings are case-sensitive, ``true`` is not
``1``, ``1`` equals ``1.0``; a missing field equals nothing.

``delete`` messages (deletion requests) are never filtered: the destination is owed them.

Filters run at delivery time with the destination block's current rules, on each message due; a filtered row ends
in the ``filtered`` state, with the rule in ``reason``. Each body is parsed once, and only for a destination that
has rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

MessageType = Literal["identify", "track", "page", "screen", "group", "alias"]
Scalar = str | bool | int | float

# Fields of the outbound body a condition can test directly, and the objects it can look inside.
TOP_LEVEL_FIELDS = ("type", "event", "userId", "anonymousId", "groupId", "name", "Previous ID", "User ID")
NESTED_FIELDS = ("properties", "traits", "context")
NEVER_FILTERED = "delete"


class Condition(BaseModel):
    """One test on one field of the outbound body: ``equals``, ``in`` or ``exists`` (exactly one)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    field: str = Field(
        description=(
            "Field of the outbound body: type, event, userId, anonymousId, groupId, name, Previous ID, User ID, "
            "or a dotted path under properties, traits or context (e.g. properties.plan)."
        ),
        examples=["properties.plan", "traits.email", "context.os.name"],
    )
    equals: Scalar | None = Field(default=None, description="The field equals this string, number or boolean.")
    in_: list[Scalar] | None = Field(
        default=None, alias="in", description="The field equals one of these strings, numbers or booleans."
    )
    exists: bool | None = Field(
        default=None, description="True: the field is present and not null; false: it is absent or null."
    )


class FilterRule(BaseModel):
    """A destination filter rule: drop the messages it matches, or allow only those it matches."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None, max_length=100, description="A label for the rule, shown in the reason of filtered messages."
    )
    action: Literal["drop", "allow"] = Field(
        description="drop: filter out matching messages; allow: filter out every message that does not match."
    )
    types: list[MessageType] | None = Field(
        default=None, description="Message types the rule matches (identify, track, page, screen, group, alias)."
    )
    events: list[str] | None = Field(default=None, description="Track event names the rule matches.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Tests on fields of the outbound body (equals, in, exists)."
    )
    match: Literal["all", "any"] = Field(
        default="all", description="all: every criterion must hold; any: at least one must."
    )

    @model_validator(mode="after")
    def _well_formed(self) -> FilterRule:
        label = f"rule {self.name!r}" if self.name else "rule (unnamed)"
        if self.types is not None and not self.types:
            raise ValueError(f"{label}: types is empty; leave it out to match every type")
        if self.events is not None and not self.events:
            raise ValueError(f"{label}: events is empty; leave it out to match every event")
        if self.types is None and self.events is None and not self.conditions:
            raise ValueError(f"{label}: give types, events or conditions (a rule without criteria matches everything)")
        for condition in self.conditions:
            problem = _condition_problem(condition)
            if problem:
                raise ValueError(f"{label}: condition on field {condition.field!r}: {problem}")
        return self


def _condition_problem(condition: Condition) -> str | None:
    """What is wrong with a condition, or None."""
    tests = [name for name in ("equals", "in_", "exists") if getattr(condition, name) is not None]
    if len(tests) != 1:
        return f"give exactly one of equals, in, exists (got {len(tests)})"
    parts = condition.field.split(".")
    head = parts[0]
    if head in TOP_LEVEL_FIELDS:
        if len(parts) > 1:
            return f"{head} is not an object, so it has no {'.'.join(parts[1:])!r} inside"
    elif head in NESTED_FIELDS:
        if any(not part for part in parts[1:]):
            return "empty name in the dotted path"
        if len(parts) == 1 and condition.exists is None:
            return f"{head} is an object: test a field inside it ({head}.name) or use exists"
    else:
        known = ", ".join([*TOP_LEVEL_FIELDS, *(f"{name}.…" for name in NESTED_FIELDS)])
        return f"unknown field {head!r}; a condition addresses {known}"
    if condition.in_ is not None and not condition.in_:
        return "in needs at least one value"
    return None


def check_rules(rules: Sequence[FilterRule]) -> None:
    """Refuse rules that cannot be told apart in a reason (two rules with the same name)."""
    seen: set[str] = set()
    for rule in rules:
        if rule.name is not None:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}; a filtered message names the rule it met")
            seen.add(rule.name)


# -- Evaluation -------------------------------------------------------------------------------------------------

_MISSING = object()


def _kind(value: Any) -> str | None:
    """The comparison class of a JSON value: booleans, numbers and strings never equal one another."""
    if isinstance(value, bool):
        return "b"
    if isinstance(value, (int, float)):
        return "n"
    if isinstance(value, str):
        return "s"
    return None


def _getter(path: str) -> Callable[[dict[str, Any]], Any]:
    keys = path.split(".")
    if len(keys) == 1:
        key = keys[0]
        return lambda message: message.get(key, _MISSING)

    def get(message: dict[str, Any]) -> Any:
        value: Any = message
        for key in keys:
            if not isinstance(value, dict):
                return _MISSING
            value = value.get(key, _MISSING)
            if value is _MISSING:
                return value
        return value

    return get


Predicate = Callable[[dict[str, Any]], bool]


def _in_test(get: Callable[[dict[str, Any]], Any], values: Sequence[Scalar]) -> Predicate:
    wanted = frozenset((_kind(value), value) for value in values)

    def test(message: dict[str, Any]) -> bool:
        value = get(message)
        kind = _kind(value)
        return kind is not None and (kind, value) in wanted

    return test


def _compile_condition(condition: Condition) -> Predicate:
    get = _getter(condition.field)
    if condition.exists is not None:
        expected = condition.exists
        return lambda message: (get(message) not in (None, _MISSING)) is expected
    values = [condition.equals] if condition.equals is not None else list(condition.in_ or ())
    return _in_test(get, values)


class CompiledRule:
    """A rule turned into predicates over a parsed body."""

    __slots__ = ("action", "reason", "predicates", "match_all")

    def __init__(self, rule: FilterRule, position: int) -> None:
        self.action = rule.action
        label = repr(rule.name) if rule.name else f"#{position}"
        self.reason = (f"filtered: drop rule {label}" if rule.action == "drop"
                       else f"filtered: allow rule {label} not matched")
        predicates: list[Predicate] = []
        if rule.types is not None:
            predicates.append(_in_test(lambda message: message.get("type", _MISSING), rule.types))
        if rule.events is not None:
            predicates.append(_in_test(lambda message: message.get("event", _MISSING), rule.events))
        predicates.extend(_compile_condition(condition) for condition in rule.conditions)
        self.predicates = tuple(predicates)
        self.match_all = rule.match == "all"

    def matches(self, message: dict[str, Any]) -> bool:
        """Whether the rule's criteria hold for ``message``."""
        if self.match_all:
            return all(predicate(message) for predicate in self.predicates)
        return any(predicate(message) for predicate in self.predicates)


class Filters:
    """A destination's rules, compiled once per loaded block."""

    __slots__ = ("rules",)

    def __init__(self, rules: Sequence[FilterRule]) -> None:
        self.rules = tuple(CompiledRule(rule, position) for position, rule in enumerate(rules, start=1))

    def reason(self, body: bytes) -> str | None:
        """Why the message with this body is filtered out (the first rule that filters it), or None to send it."""
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(message, dict) or message.get("type") == NEVER_FILTERED:
            return None
        for rule in self.rules:
            if rule.matches(message) is (rule.action == "drop"):
                return rule.reason
        return None


def compile_filters(rules: Sequence[FilterRule]) -> Filters | None:
    """The compiled rules, or None when there are none (so an unfiltered destination pays nothing)."""
    return Filters(rules) if rules else None


Item = TypeVar("Item")


def split_filtered(
    items: Sequence[Item], body_of: Callable[[Item], bytes], filters_of: Callable[[Item], Filters | None]
) -> tuple[list[Item], list[tuple[Item, str]]]:
    """Separate what is sent from what a filter drops, with the reason of each dropped item.

    Args:
        items: Messages paired with their destination (any shape).
        body_of: The body bytes of an item.
        filters_of: The compiled filters of an item's destination (None: nothing is filtered).

    Returns:
        (items to send, (item, reason) for each filtered item), both in the original order.
    """
    send: list[Item] = []
    dropped: list[tuple[Item, str]] = []
    for item in items:
        filters = filters_of(item)
        reason = filters.reason(body_of(item)) if filters is not None else None
        if reason is None:
            send.append(item)
        else:
            dropped.append((item, reason))
    return send, dropped
