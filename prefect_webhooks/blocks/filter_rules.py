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

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from prefect_webhooks.blocks.validated import part_config

MessageType = Literal["identify", "track", "page", "screen", "group", "alias"]
Scalar = str | bool | int | float

# Fields of the outbound body a condition can test directly, and the objects it can look inside.
TOP_LEVEL_FIELDS = ("type", "event", "userId", "anonymousId", "groupId", "name", "Previous ID", "User ID")
NESTED_FIELDS = ("properties", "traits", "context")
NEVER_FILTERED = "delete"
FIELD_PATTERN = (
    "^(" + "|".join(TOP_LEVEL_FIELDS) + "|(" + "|".join(NESTED_FIELDS) + r")(\.[^.]+)*)$"
)


class Condition(BaseModel):
    """One test on one field of the outbound body: ``equals``, ``in`` or ``exists`` (exactly one)."""

    model_config = part_config(populate_by_name=True)

    field: str = Field(
        description=(
            "Field of the outbound body: type, event, userId, anonymousId, groupId, name, Previous ID, User ID, "
            "or a dotted path under properties, traits or context (e.g. properties.plan)."
        ),
        examples=["properties.plan", "traits.email", "context.os.name"],
        # Checked in Python by FilterRule (a message that names the rule); here for the UI form.
        json_schema_extra={"pattern": FIELD_PATTERN},
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

    model_config = part_config()

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

