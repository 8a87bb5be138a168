"""What an audience or computed trait is: its definition (name, sources, snapshot, columns) and its errors."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prefect_webhooks.audiences.snapshots import SnapshotProvider, ValueType


class AudienceError(ValueError):
    """An audience definition that conflicts with the registry (key collision, unknown key, kind change)."""


class AudienceDefinition(BaseModel):
    """What an audience or computed trait is and where its snapshot comes from.

    Example:
        ```python
        from prefect_webhooks.audiences.sync import AudienceDefinition
        from prefect_webhooks.audiences.snapshots import SqlSnapshot

        AudienceDefinition(
            name="Big Spenders 2024",
            sources=["web-app"],
            snapshot=SqlSnapshot(url="postgresql://…", query="select user_id from big_spenders"),
        )
        ```
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Display name; its snake_case form is the key at creation.")
    key: str | None = Field(
        default=None, description="Key of an existing audience (to rename it); defaults to snake_case(name)."
    )
    kind: Literal["audience", "computed_trait"] = Field(default="audience", description="Membership or a value.")
    sources: list[str] = Field(description="Names of Source blocks whose Webhooks destinations receive it.")
    snapshot: SnapshotProvider = Field(description="Where the full current snapshot is read from.")
    id_column: str = Field(default="user_id", description="Snapshot column holding the user id.")
    value_column: str | None = Field(default=None, description="Computed traits: the column holding the value.")
    value_type: ValueType = Field(default="string", description="Computed traits: the JSON type of every value.")

    @model_validator(mode="after")
    def _value_column_for_traits(self) -> AudienceDefinition:
        if self.kind == "computed_trait" and not self.value_column:
            raise ValueError("a computed trait needs a value_column")
        if self.kind == "audience" and self.value_column:
            raise ValueError("an audience has no value_column (use kind='computed_trait')")
        return self
