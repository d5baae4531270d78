"""Typed records of the three memory layers.

Validation is strict: a wrong type, a missing field, a record of the wrong layer,
NaN or Infinity, a lone surrogate or any value JSON cannot hold is a pydantic
`ValidationError` at write time. Nothing is coerced: ``None`` never becomes
``"None"`` and a string is never split into a list of characters.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, Self, get_args

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autopersona_flows.memory.ids import MEMORY_ID_PATTERN, new_memory_id
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.users import check_user_id

__all__ = [
    "LAYERS",
    "Embedding",
    "JsonValue",
    "LayerContent",
    "MemoryLayer",
    "MemoryRecord",
    "PersonaMemory",
    "RawTaskRecord",
    "TrajectoryMemory",
    "WorkspaceMemory",
    "as_content",
    "as_record",
    "check_json",
    "content_type",
]

MemoryLayer = Literal["trajectory", "workspace", "persona"]
"""The three layers of a user's memory bank."""

LAYERS: tuple[MemoryLayer, ...] = get_args(MemoryLayer)
"""All layers, in the fixed order stores lock and list them."""

_MAX_DEPTH = 128
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson, and most JSON readers, hold exactly


def _check_text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text contains a lone surrogate at index {exc.start}, which is not valid Unicode"
        ) from None
    return value


def check_json(value: Any, where: str = "", depth: int = 0) -> Any:  # noqa: PLR0912 - one branch per JSON type
    """Return ``value`` if JSON can hold it exactly; else raise ``ValueError`` saying where."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"value{where} is nested deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError(f"integer{where} does not fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r}{where} is not a JSON number")
        return value
    if isinstance(value, str):
        try:
            return _check_text(value)
        except ValueError as exc:
            raise ValueError(f"string{where}: {exc}") from None
    if isinstance(value, list):
        for index, item in enumerate(value):
            check_json(item, f"{where}[{index}]", depth + 1)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"object key {key!r}{where} is not a string")
            _check_text(key)
            check_json(item, f"{where}[{key!r}]", depth + 1)
        return value
    raise ValueError(f"a {type(value).__name__}{where} cannot be stored as JSON")


def non_blank(value: str) -> str:
    """Return ``value`` unless it is empty or only white space."""
    if not value.strip():
        raise ValueError("must not be empty")
    return value


Text = Annotated[str, AfterValidator(_check_text)]
JsonValue = Annotated[Any, AfterValidator(check_json)]
"""Any value JSON can hold: null, booleans, 64-bit integers, finite floats, text, lists, objects."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TrajectoryMemory(_Strict):
    """A past request: what was asked, the key actions taken, the outcome and the insight.

    Attributes:
        query: The request as the user made it.
        trace: The key actions, in order.
        outcome: What came of it, if anything.
        insight: What to remember for next time.
    """

    layer: ClassVar[MemoryLayer] = "trajectory"

    query: Annotated[Text, AfterValidator(non_blank)]
    trace: list[JsonValue] = Field(default_factory=list)
    outcome: JsonValue = None
    insight: Text = ""


class WorkspaceMemory(_Strict):
    """The state of the user's workspace and how the assistant interacted with it.

    Attributes:
        task: The task the state belongs to.
        interaction: Environment interactions, in order.
        state: The resulting workspace state.
    """

    layer: ClassVar[MemoryLayer] = "workspace"

    task: JsonValue = None
    interaction: list[JsonValue] = Field(default_factory=list)
    state: JsonValue = None

    @model_validator(mode="after")
    def _not_empty(self) -> WorkspaceMemory:
        if self.task is None and not self.interaction and self.state is None:
            raise ValueError("a workspace memory needs a task, an interaction or a state")
        return self


def _empty(value: Any) -> bool:
    return not value


# Left out of the stored form while empty, so that a memory written before these
# fields existed keeps its exact bytes, digest and snapshot fingerprint.
_Texts = Annotated[list[Annotated[Text, AfterValidator(non_blank)]], Field(exclude_if=_empty)]


class PersonaMemory(_Strict):
    """A preference or constraint of the person, and how to assist them with it.

    Attributes:
        topic: What the preference is about, e.g. ``"citation style"``.
        preference: The preference or constraint itself, e.g. ``"APA"``.
        strategy: How an assistant should act on it.
        aliases: Other names of the topic: how the need was asked for (requirement
            names, descriptions, questions), so that a later request naming it in
            other words finds it.
        options: The choices offered when it was asked, if it was a choice.
        contexts: Where it was learned: node ids, node instructions and requests.
        sources: The ids of the memories it was drawn from, if it was consolidated
            from others (a choice repeated across past tasks).
        request: The request it was answered for, when it was learned from a
            question or a correction: what a person wants for one request ("the
            client pitch in Leeds") may not be what they want for another ("a
            weekend with the girls"), so answers for different requests are kept
            side by side, and the one learned for the most similar request applies.
    """

    layer: ClassVar[MemoryLayer] = "persona"

    topic: Annotated[Text, AfterValidator(non_blank)]
    preference: Annotated[Text, AfterValidator(non_blank)]
    strategy: Text = ""
    aliases: _Texts = Field(default_factory=list)
    options: _Texts = Field(default_factory=list)
    contexts: _Texts = Field(default_factory=list)
    sources: _Texts = Field(default_factory=list)
    request: Annotated[Text, Field(exclude_if=_empty)] = ""


LayerContent = TrajectoryMemory | WorkspaceMemory | PersonaMemory
"""The content of a record of any layer."""

_CONTENT_TYPES: dict[str, type[TrajectoryMemory | WorkspaceMemory | PersonaMemory]] = {
    cls.layer: cls for cls in (TrajectoryMemory, WorkspaceMemory, PersonaMemory)
}


def content_type(layer: MemoryLayer) -> type[LayerContent]:
    """Return the content model of ``layer``.

    Raises:
        ValueError: If ``layer`` is not one of `LAYERS`.
    """
    try:
        return _CONTENT_TYPES[layer]
    except (KeyError, TypeError):
        raise ValueError(f"unknown memory layer {layer!r}; expected one of {LAYERS}") from None


def as_content(content: LayerContent | dict[str, Any], layer: MemoryLayer) -> LayerContent:
    """Return ``content`` as ``layer``'s content model, validating a dict.

    Raises:
        TypeError: If ``content`` is a model of another layer.
        pydantic.ValidationError: If a dict is not valid content of ``layer``.
    """
    expected = content_type(layer)
    if isinstance(content, dict):
        return expected.model_validate(content)
    if not isinstance(content, expected):
        raise TypeError(
            f"a {layer} memory's content must be a {expected.__name__}, "
            f"got {type(content).__name__}"
        )
    return content


def _datetime_or_iso(value: Any) -> Any:
    # Stored timestamps are ISO 8601 text; numbers are not timestamps here.
    if not isinstance(value, datetime | str):
        raise ValueError(f"expected a datetime or ISO 8601 text, got {type(value).__name__}")
    return value


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamps must be timezone-aware")
    return value.astimezone(UTC)


def _check_id(value: str) -> str:
    if not MEMORY_ID_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a memory id (26 characters of Crockford base32)")
    return value


UtcDatetime = Annotated[
    datetime, Field(strict=False), BeforeValidator(_datetime_or_iso), AfterValidator(_utc)
]


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamps must be timezone-aware")
    return value


AwareDatetime = Annotated[
    datetime, Field(strict=False), BeforeValidator(_datetime_or_iso), AfterValidator(_aware)
]
"""A timezone-aware time kept in its own zone: "today" and "Friday" are the person's."""
MemoryId = Annotated[str, AfterValidator(_check_id)]


def _now() -> datetime:
    return datetime.now(UTC)


class Embedding(_Strict):
    """A record's embedding, stored with it so retrieval never re-embeds the bank.

    The vector is kept as little-endian float32 bytes (base64 in JSON): four bytes
    a dimension instead of some twenty characters a number. Build one with
    `Embedding.of` and read it with `Embedding.array`.

    Attributes:
        model: The name of the embedder that made it.
        dim: The number of dimensions.
        vector: ``dim`` finite little-endian float32 values, as bytes.
    """

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    model: Annotated[Text, AfterValidator(non_blank)]
    dim: Annotated[int, Field(gt=0)]
    vector: bytes

    @classmethod
    def of(cls, model: str, vector: Any) -> Self:
        """Build an embedding from any 1-D sequence of numbers."""
        values = np.asarray(vector, dtype="<f4")
        if values.ndim != 1:
            raise ValueError(f"an embedding is one vector, got shape {values.shape}")
        return cls(model=model, dim=values.size, vector=values.tobytes())

    def array(self) -> np.ndarray:
        """Return the vector as a read-only float32 array of ``dim`` values."""
        return np.frombuffer(self.vector, dtype="<f4")

    @model_validator(mode="after")
    def _check_vector(self) -> Self:
        if len(self.vector) != 4 * self.dim:
            raise ValueError(f"vector has {len(self.vector) / 4:g} values, dim says {self.dim}")
        if not np.isfinite(self.array()).all():
            raise ValueError("vector values must be finite")
        return self


def _none(value: Any) -> bool:
    return value is None


# Left out of the stored form while unset, like the persona fields above.
_OptionalTime = Annotated[UtcDatetime | None, Field(exclude_if=_none)]
_OptionalProvenance = Annotated[Provenance | None, Field(exclude_if=_none)]


class MemoryRecord(_Strict):
    """A stored memory: its content in an envelope with identity and timestamps.

    ``layer`` must match the content's layer; `MemoryRecord.of` fills it in.

    Two clocks are kept apart: when the record was *written* (``created_at``,
    ``updated_at``) and when what it says was *stated* (``stated_at``, and
    ``valid_until`` for a fact that stops holding). A history loaded long after it
    happened keeps the times it happened at; `at` is the time that recency,
    supersession and expiry go by.

    Attributes:
        id: Unique and time-sortable; made on creation.
        layer: The layer the record belongs to.
        content: The layer's content model.
        created_at: When the record was first written (UTC).
        updated_at: When its content last changed (UTC).
        embedding: The embedding of the content, if one was computed.
        stated_at: When the person said it or it was observed, if that is not when
            it was written (a backfilled history); ``None`` means `updated_at`.
        valid_until: When it stops holding ("until March"), if it is time-bounded.
        buried_at: When a person buried it, if they did: a buried record is kept
            (and shown) but never retrieved, so no decision uses it, until it is
            unburied. Revisions keep it buried.
        provenance: Where its current content came from (a clarification, an
            ingested file's line, a consolidation, a person's edit), if the writer
            said; see `Provenance`. What changed it is in its history entries.
    """

    id: MemoryId = Field(default_factory=new_memory_id)
    layer: MemoryLayer
    content: LayerContent
    created_at: UtcDatetime = Field(default_factory=_now)
    updated_at: UtcDatetime = Field(default_factory=lambda data: data.get("created_at", _now()))
    embedding: Embedding | None = None
    stated_at: _OptionalTime = None
    valid_until: _OptionalTime = None
    buried_at: _OptionalTime = None
    provenance: _OptionalProvenance = None

    @classmethod
    def of(cls, content: LayerContent, **fields: Any) -> Self:
        """Wrap layer content in a new record of its layer; ``fields`` set the rest."""
        return cls(layer=content.layer, content=content, **fields)

    @property
    def at(self) -> datetime:
        """When what the record says was stated: `stated_at`, else `updated_at`."""
        return self.stated_at or self.updated_at

    def holds_at(self, when: datetime) -> bool:
        """Whether the record was stated by ``when`` and had not expired by then."""
        return self.at <= when and (self.valid_until is None or when < self.valid_until)

    def revised(
        self,
        content: LayerContent,
        *,
        embedding: Embedding | None = None,
        at: datetime | None = None,
        valid_until: datetime | None = None,
        buried: bool | None = None,
        provenance: Provenance | None = None,
    ) -> Self:
        """This record with new content: same id and creation time, updated now.

        Args:
            content: The new content, of this record's layer.
            embedding: The embedding of the new content; the old one described the old
                content, so it is dropped if none is given.
            at: When the new content was stated, if not now.
            valid_until: When the new content stops holding, if it does.
            buried: Bury it (``True``, keeping an earlier burial's time) or unbury it
                (``False``); ``None`` keeps it as it is.
            provenance: Where the new content came from. Content that changed takes
                it (``None``: unknown), since the old source no longer says where it
                came from; content that did not (a burial, a restatement) keeps its own.
        """
        if content == self.content:
            provenance = self.provenance
        buried_at = self.buried_at
        if buried is not None and buried != (buried_at is not None):
            buried_at = _now() if buried else None
        return type(self)(
            id=self.id,
            layer=self.layer,
            content=content,
            created_at=self.created_at,
            updated_at=max(_now(), self.created_at),  # a clock behind creation stays valid
            embedding=embedding,
            stated_at=at,
            valid_until=valid_until,
            buried_at=buried_at,
            provenance=provenance,
        )

    @field_validator("content", mode="before")
    @classmethod
    def _content_of_layer(cls, value: Any, info: ValidationInfo) -> Any:
        layer = info.data.get("layer")
        if layer is None:  # the layer itself failed validation; it reports its own error
            return value
        expected = _CONTENT_TYPES[layer]
        if isinstance(value, dict):
            return expected.model_validate(value)
        if isinstance(value, BaseModel) and not isinstance(value, expected):
            raise ValueError(
                f"content is a {type(value).__name__}, but the record's layer is {layer!r} "
                f"(expected {expected.__name__})"
            )
        return value

    @model_validator(mode="after")
    def _timestamps(self) -> MemoryRecord:
        if self.updated_at < self.created_at:
            raise ValueError("updated_at is earlier than created_at")
        if self.stated_at and self.valid_until and self.valid_until <= self.stated_at:
            raise ValueError("valid_until is not later than stated_at")
        return self


class RawTaskRecord(_Strict):
    """One completed task as it happened: the input of ingestion.

    Attributes:
        user_id: Whose task it was.
        query: The request.
        trace: The key actions taken.
        outcome: What came of it.
        insight: What to remember.
        task: The task as the workspace saw it.
        interaction: Environment interactions.
        state: The workspace state afterwards.
        persona: Preferences and constraints the task revealed.
        at: When the task happened, if not now: every memory ingested from it is
            stated at that time. Its zone is kept, so that "today only" ends at the
            person's midnight.
        provenance: Where the task was read from: `read_task_records` sets the
            file and line, replacing any a line gives. Every memory ingested from
            it records it (a bare ``ingestion`` if unset).
    """

    user_id: Annotated[Text, AfterValidator(non_blank), AfterValidator(check_user_id)]
    query: Annotated[Text, AfterValidator(non_blank)]
    trace: list[JsonValue] = Field(default_factory=list)
    outcome: JsonValue = None
    insight: Text = ""
    task: JsonValue = None
    interaction: list[JsonValue] = Field(default_factory=list)
    state: JsonValue = None
    persona: list[PersonaMemory] = Field(default_factory=list)
    at: AwareDatetime | None = None
    provenance: _OptionalProvenance = None


def as_record(
    item: MemoryRecord | LayerContent, *, layer: MemoryLayer | None = None, index: int | None = None
) -> MemoryRecord:
    """``item`` as a record: itself, or layer content wrapped in a new one.

    Args:
        item: A record, or the content of one.
        layer: The layer a batch is for; another layer is an error.
        index: The item's place in a batch, for the error message.

    Raises:
        TypeError: If ``item`` is neither.
        ValueError: If it belongs to another layer than ``layer``.
    """
    where = "" if index is None else f"item {index}: "
    if isinstance(item, MemoryRecord):
        record = item
    elif isinstance(item, TrajectoryMemory | WorkspaceMemory | PersonaMemory):
        record = MemoryRecord.of(item)
    else:
        raise TypeError(
            f"{where}expected a MemoryRecord or a layer content model "
            f"(TrajectoryMemory, WorkspaceMemory, PersonaMemory), got {type(item).__name__}"
        )
    if layer is not None and record.layer != layer:
        raise ValueError(f"{where}is a {record.layer} memory, but the batch is for {layer!r}")
    return record
