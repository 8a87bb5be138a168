"""Blocks that are checked on every change, and saved blocks that say exactly what is wrong with them.

A pydantic model checks its fields when it is built, but not when a field is assigned or a copy is made with
``model_copy(update=...)``; Prefect's ``load`` of a stored block that does not validate names no field. So a block
edited in code could be saved broken and only fail later, far from the edit. ``ValidatedBlock`` closes each way:

- a keyword that is not a field (``batchsize=10``) is an error instead of a silent extra attribute;
- assignment is validated (``validate_assignment``; the block's model validators run again), and assigning a name
  that is not a field is an error too;
- ``model_copy(update=...)`` validates the copy;
- ``save`` validates the whole block again, so a change made in place (a list appended to, a nested model's field
  set; nested models validate their own assignments too) cannot be stored;
- ``load`` of a stored block that does not validate raises ``InvalidBlockError``, naming each field that is wrong,
  what is wrong, and the value when the field is not secret;
- the UI form (and ``prefect block create``, which links to it) checks what JSON Schema can express, from the
  constraints the blocks put in their schema.

Errors never quote a secret field's value (``hide_input_in_errors``, and the secret fields of the block's schema are
left out of ``InvalidBlockError``).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, TypeVar

from prefect.blocks.core import Block
from pydantic import ConfigDict, ValidationError

_VALUE_LENGTH = 80
BlockT = TypeVar("BlockT", bound="ValidatedBlock")
_LOADING: ContextVar[bool] = ContextVar("prefect_webhooks_block_loading", default=False)


def part_config(**options: Any) -> ConfigDict:
    """The configuration of a model nested in a block (an endpoint, a filter rule): unknown keys refused, assignments
    validated, and validated again as part of the block when it is built or saved."""
    return ConfigDict(extra="forbid", validate_assignment=True, revalidate_instances="always", **options)


class InvalidBlockError(ValueError):
    """A stored block that does not validate: each wrong field, what is wrong, and its value when not secret."""

    def __init__(self, block_type: str, name: str, problems: list[str]) -> None:
        self.block_type = block_type
        self.name = name
        self.problems = problems
        super().__init__(f"saved {block_type} block {name!r} is invalid (fix and save it again): "
                         + "; ".join(problems))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_LENGTH else text[: _VALUE_LENGTH - 1] + "…"


def describe_problems(error: ValidationError, secret_fields: frozenset[str] = frozenset()) -> list[str]:
    """One ``field.path: reason`` per error of ``error``, with ``(value …)`` unless the field's top-level name is in
    ``secret_fields``."""
    problems = []
    for item in error.errors(include_url=False):
        location = ".".join(map(str, item["loc"]))
        reason = item["msg"].removeprefix("Value error, ")
        problem = f"{location}: {reason}" if location else reason
        top = str(item["loc"][0]) if item["loc"] else ""
        if "input" in item and top and top not in secret_fields and not isinstance(item["input"], dict):
            problem += f" (value {_shown(item['input'])})"
        problems.append(problem)
    return problems


class ValidatedBlock(Block):
    """A Prefect block validated on construction, assignment, ``model_copy(update=...)`` and load."""

    model_config = ConfigDict(hide_input_in_errors=True, validate_assignment=True)

    @classmethod
    def secret_field_names(cls) -> frozenset[str]:
        """Top-level fields whose values are never shown in an error (from the block's schema)."""
        return frozenset(path.split(".", 1)[0] for path in cls.model_json_schema().get("secret_fields", []))

    def __init__(self, *args: Any, **data: Any) -> None:
        # Block keeps unknown keyword arguments as extras: a misspelt field (``batchsize=10``) would be stored and
        # do nothing. A saved document is not checked here, so one holding a field a later release dropped still
        # loads.
        unknown = [] if _LOADING.get() else [name for name in data if not name.startswith("_")
                                             and name != "block_type_slug" and name not in type(self).model_fields]
        if unknown:
            fields = ", ".join(type(self).model_fields)
            raise TypeError(f"{type(self).__name__} has no field {', '.join(map(repr, unknown))} "
                            f"(its fields: {fields})")
        super().__init__(*args, **data)

    def __setattr__(self, name: str, value: Any) -> None:
        # Block allows extra attributes; an assigned typo (``filter`` for ``filters``) would otherwise do nothing.
        if not name.startswith("_") and name not in type(self).model_fields:
            fields = ", ".join(type(self).model_fields)
            raise AttributeError(f"{type(self).__name__} has no field {name!r} (its fields: {fields})")
        before = self.__dict__.get(name)
        try:
            super().__setattr__(name, value)
        except ValidationError:
            # pydantic has already stored the value when a model validator refuses it: put the old one back.
            if name in type(self).model_fields:
                self.__dict__[name] = before
            raise

    def model_copy(self: BlockT, *, update: dict[str, Any] | None = None, deep: bool = False) -> BlockT:
        """A copy of the block, with ``update`` applied and validated like a new block (its saved name kept)."""
        copied = super().model_copy(update=update, deep=deep)
        if not update:
            return copied
        validated = type(self).model_validate({name: getattr(copied, name) for name in type(self).model_fields})
        validated.__pydantic_private__ = dict(copied.__pydantic_private__ or {})
        return validated

    def _take_fields(self, other: ValidatedBlock, names: tuple[str, ...]) -> None:
        """Take the values of ``names`` from ``other``, a validated block of the same type, all at once (assigning
        them one by one would validate states in between)."""
        for name in names:
            self.__dict__[name] = getattr(other, name)

    def _to_block_document(self, *args: Any, **kwargs: Any) -> Any:
        # Saving checks the block as a whole once more: a change made in place (an item appended to ``filters``, a
        # field of a nested model set) is refused here, before anything is stored. Nested models validate their own
        # assignments and are validated again as parts of the block (``revalidate_instances``).
        type(self).model_validate({name: getattr(self, name) for name in type(self).model_fields})
        return super()._to_block_document(*args, **kwargs)

    @classmethod
    def _load_from_block_document(cls: type[BlockT], block_document: Any, validate: bool = True) -> BlockT:
        loading = _LOADING.set(True)
        try:
            return super()._load_from_block_document(block_document, validate=validate)  # type: ignore[misc]
        except RuntimeError as exc:
            # Prefect turns a failed validation into a RuntimeError that names no field; its cause has them.
            if isinstance(exc.__cause__, ValidationError):
                problems = describe_problems(exc.__cause__, cls.secret_field_names())
                raise InvalidBlockError(cls.get_block_type_slug(), block_document.name, problems) from None
            raise
        finally:
            _LOADING.reset(loading)
