"""The inbound message model shared by the Analytics client, the ingest API and the batch-ingest flow.

Field names follow the Segment wire format (``userId``, ``anonymousId``…); Python code may use the snake_case
names (``user_id``…). Every rule the specification gives for a call is checked here, once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from prefect_webhooks.messages.timestamps import parse_timestamp

MAX_MESSAGE_BYTES = 32 * 1024
MAX_BATCH_BYTES = 500 * 1024
MESSAGE_TYPES = ("identify", "track", "page", "screen", "group", "alias")

Id = Annotated[str, Field(min_length=1, max_length=1024)]
# Members of ``context`` that ingestion reads: ``integrations`` routes the call, ``traits`` completes an identify.
CONTEXT_OBJECTS = ("integrations", "traits")


class MessageError(ValueError):
    """A message that breaks a rule; ``field`` names the offending field (wire name)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class BaseMessage(BaseModel):
    """Fields every call carries."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        coerce_numbers_to_str=True,
        serialize_by_alias=True,
    )

    type: str
    user_id: Id | None = None
    anonymous_id: Id | None = None
    message_id: Id | None = None
    timestamp: datetime | None = None
    original_timestamp: datetime | None = None
    sent_at: datetime | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    integrations: dict[str, Any] = Field(default_factory=dict)

    @field_validator("timestamp", "original_timestamp", "sent_at", mode="before")
    @classmethod
    def _parse_time(cls, value: Any) -> Any:
        return None if value is None else parse_timestamp(value)

    @field_validator("context")
    @classmethod
    def _context_objects(cls, context: dict[str, Any]) -> dict[str, Any]:
        # Both are read (routing, identify traits): a value that is not an object cannot mean what the caller meant.
        for key in CONTEXT_OBJECTS:
            if key in context and context[key] is not None and not isinstance(context[key], dict):
                raise ValueError(f"context.{key} must be a JSON object, got {type(context[key]).__name__}")
        return context

    @model_validator(mode="after")
    def _needs_identity(self) -> BaseMessage:
        if self.type != "alias" and not (self.user_id or self.anonymous_id):
            raise ValueError("userId or anonymousId is required")
        return self


class Identify(BaseMessage):
    """Ties a user to traits.

    The traits are ``traits`` merged over ``context.traits`` (``traits`` wins key by key): RudderStack's Python SDK
    sends an identify's traits only in ``context.traits`` and its Node SDK in both places, Segment's SDKs only in
    ``traits``, so the receiver gets the same traits whichever SDK sent them.
    """

    type: Literal["identify"] = "identify"
    traits: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _traits_from_context(self) -> Identify:
        nested = self.context.get("traits")
        if nested:
            self.traits = {**nested, **self.traits}
        return self


class Track(BaseMessage):
    """Records a user action."""

    type: Literal["track"] = "track"
    event: Annotated[str, Field(min_length=1)]
    properties: dict[str, Any] = Field(default_factory=dict)


class Page(BaseMessage):
    """Records a page view; ``url``, ``title``, ``referrer`` and ``path`` are recognised in properties or traits."""

    type: Literal["page"] = "page"
    name: str | None = None
    category: str | None = None
    properties: dict[str, Any] = Field(default_factory=dict)
    traits: dict[str, Any] = Field(default_factory=dict)


class Screen(BaseMessage):
    """Records a mobile screen view."""

    type: Literal["screen"] = "screen"
    name: str | None = None
    category: str | None = None
    properties: dict[str, Any] = Field(default_factory=dict)


class Group(BaseMessage):
    """Associates a user with a group."""

    type: Literal["group"] = "group"
    group_id: Id
    traits: dict[str, Any] = Field(default_factory=dict)


class Alias(BaseMessage):
    """Associates a previous identity with a new ``userId``."""

    type: Literal["alias"] = "alias"
    previous_id: Id
    user_id: Id


Message = Annotated[Identify | Track | Page | Screen | Group | Alias, Field(discriminator="type")]
MESSAGE_MODELS: dict[str, type[BaseMessage]] = {
    "identify": Identify,
    "track": Track,
    "page": Page,
    "screen": Screen,
    "group": Group,
    "alias": Alias,
}
_MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def _first_error(exc: ValidationError) -> MessageError:
    error = exc.errors(include_url=False)[0]
    location = [str(part) for part in error["loc"] if not isinstance(part, int)]
    # The discriminated union puts the type name first in the location; the field is what follows it.
    if location and location[0] in MESSAGE_MODELS:
        location = location[1:]
    field = ".".join(location) or "message"
    if error["type"] == "missing":
        return MessageError(field, f"{field} is required")
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        return MessageError("type", f"type must be one of {', '.join(MESSAGE_TYPES)}")
    message = error["msg"].removeprefix("Value error, ")
    if field == "message" and "userId" in message:
        field = "userId"
    if field == "context" and message.startswith("context."):
        field = message.split(" ", 1)[0]
    return MessageError(field, message)


def parse_message(raw: Any) -> Message:
    """Validate one call in wire form (a dict) and return its typed model.

    Raises:
        MessageError: naming the first field that breaks a rule.
    """
    if not isinstance(raw, dict):
        raise MessageError("message", f"must be a JSON object, got {type(raw).__name__}")
    if "type" not in raw:
        raise MessageError("type", "type is required")
    if not isinstance(raw["type"], str) or raw["type"] not in MESSAGE_MODELS:
        raise MessageError("type", f"type must be one of {', '.join(MESSAGE_TYPES)}, got {str(raw['type'])[:40]!r}")
    try:
        return _MESSAGE_ADAPTER.validate_python(raw, by_alias=True, by_name=True)
    except ValidationError as exc:
        raise _first_error(exc) from None
