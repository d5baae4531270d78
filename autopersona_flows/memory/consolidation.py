"""Consolidation: a choice repeated across past tasks becomes a persona memory.

Three bookings that each took an aisle seat say "aisle seat" as clearly as the
person would: `promote_choices` finds such choices and writes them as persona
memories, through the updater (so a repeated run changes nothing and a changed
habit updates its slot), with the trajectories they came from as
`PersonaMemory.sources` and as a ``consolidation`` `Provenance`.

A choice is what follows a choice verb ("chose", "picked", "booked", "went
with", ...) in the text of a task's trace, outcome or insight (structured steps
are left out), up to the end of its clause, without the words of the task's own
request. It is promoted when it recurs in at least ``min_repeats`` tasks of one
kind: tasks whose requests are for the same thing, by their head and what it is of
("flight" of "book a flight to Rome" and of "flights to Oslo, please"; not "book a
table"; "hotel budget" of "Set a monthly hotel budget", not a grocery budget). Words
that say how a choice was made ("the new one, actually") are never what was chosen.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from autopersona_flows.memory.phrases import content_roots, phrase, words
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import MemoryRecord, PersonaMemory, TrajectoryMemory
from autopersona_flows.memory.updates import MemoryUpdater, UpdateDecision, embed_records
from autopersona_flows.memory.users import check_user_id

__all__ = ["promote_choices"]

_CHOICE = re.compile(
    r"\b(?:chose|chosen|choose|picked|pick|selected|select|booked|ordered|went with|"
    r"opted for|bought|preferred|asked for|filtered|settled on|stuck with|"
    r"switched to)\b:?\s*(?P<object>[^.;!?\n]+)",
    re.IGNORECASE,
)
_OBJECT_END = re.compile(
    r"\b(?:via|from|because|since|but|though|after|before|when|which|so|for|at|on|to)\b.*",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _Task:
    record: MemoryRecord
    query: str  # the request of its trajectory
    kind: str | None  # what the request is for: its head ("flight" of "book a flight")
    choices: tuple[str, ...]  # the chosen objects, as written, in order
    chosen: frozenset[str]  # their content roots, the request's left out
    surface: dict[str, str]  # root -> the word as written, the latest choice first


# A request's first word when it is an order, not what the task is for ("Set a monthly
# hotel budget" is for a hotel budget).
_ORDERS = frozenset(
    "book find get set plan order buy schedule arrange make create send draft write pick "
    "choose reserve rent hire renew pay sort update add organise organize need".split()
)
# Words that tell how a choice was said, never what was chosen ("the new one actually").
_NOT_CHOSEN = frozenset(
    content_roots(
        "actually new now again instead still just really also another same usual one ones "
        "different other first last next option thing done set"
    )
)


def _kind(query: str) -> str | None:
    """What a request is for: its head and the words before it that say of what.

    "book a flight to Rome" and "flights to Oslo, please" are for a flight; "Set a
    monthly hotel budget" is for a hotel budget, not a grocery budget.
    """
    tokens = words(query)
    if tokens and tokens[0] in _ORDERS:
        query = query.split(maxsplit=1)[1] if len(query.split()) > 1 else ""
    read = phrase(query)
    if read.head is None:
        return None
    return " ".join([*sorted(read.subject), read.head])


def _task(record: MemoryRecord) -> _Task | None:
    content = record.content
    if not isinstance(content, TrajectoryMemory):
        return None
    kind = _kind(content.query)
    # Text only: in structured steps ({"booked": true, "time": "20:00"}) keys and
    # values cannot be told from choices.
    told = " . ".join(
        part
        for part in (*content.trace, content.outcome, content.insight)
        if isinstance(part, str) and part.strip()
    )
    choices = tuple(
        cut
        for match in _CHOICE.finditer(told)
        if (cut := _OBJECT_END.sub("", match.group("object")).strip(" ,:-"))
    )
    surface: dict[str, str] = {}
    for choice in reversed(choices):
        for word in words(choice):
            for found in content_roots(word):
                surface.setdefault(found, word)
    chosen = frozenset(surface) - content_roots(content.query) - _NOT_CHOSEN
    return _Task(record, content.query, kind, choices, chosen, surface) if chosen and kind else None


def check_min_repeats(value: object) -> int:
    """Return ``value`` if it is an int of at least 2; else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"min_repeats must be an int of at least 2, got {value!r}")
    return value


def promote_choices(
    updater: MemoryUpdater, user_id: str, *, min_repeats: int = 3, now: datetime | None = None
) -> list[UpdateDecision]:
    """Write the choices repeated across the user's past tasks as persona memories.

    Args:
        updater: Writes through its store and resolver (see `MemoryUpdater`).
        user_id: Whose trajectories to read; no other user's are.
        min_repeats: In how many tasks of one kind a choice must recur.
        now: The time trajectories past their ``valid_until`` are left out at; the
            current time by default.

    Returns:
        The updater's decision for each choice found (``add`` the first time,
        ``noop`` when nothing changed since, ``update`` when the habit moved).

    Raises:
        InvalidUserIdError: If ``user_id`` is not a valid user id.
        ValueError: If ``min_repeats`` is not an int of at least 2.
    """
    check_user_id(user_id)
    check_min_repeats(min_repeats)
    now = now or datetime.now(UTC)
    tasks = [
        task
        for record in updater.store.list(user_id, "trajectory")
        if (record.valid_until is None or now < record.valid_until)
        and record.buried_at is None  # a buried task teaches nothing until unburied
        and (task := _task(record)) is not None
    ]
    groups = _groups(tasks, min_repeats)
    if not groups:  # no write lock (nor a new bank folder) for nothing
        return []
    with updater.store.locked(user_id, "persona"):
        return [_promote(updater, user_id, group) for group in groups]


@dataclass
class _Group:
    tasks: list[_Task]  # oldest first
    kind: str  # the head of their requests
    values: set[str] = field(default_factory=set)  # roots of the choice
    attributes: set[str] = field(default_factory=set)  # roots shared with other choices

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(task.record.id for task in self.tasks)


def _groups(tasks: list[_Task], min_repeats: int) -> list[_Group]:
    """The repeated choices: tasks of one kind, the words chosen in all of them.

    Words are taken from the rarest up: a word chosen in some tasks of a choice
    joins it ("seat" in two of the three bookings that took "aisle"); a word
    chosen across several choices is what they are choices of ("seat" of both
    "aisle" and "window"), and joins their topics.
    """
    repeated = []
    for chosen in {root for task in tasks for root in task.chosen}:
        holding = [task for task in tasks if chosen in task.chosen]
        kinds = Counter(task.kind for task in holding)
        for kind, count in sorted(kinds.items(), key=lambda item: (-item[1], str(item[0]))):
            if count >= min_repeats and kind is not None:
                repeated.append((chosen, kind, [t for t in holding if t.kind == kind]))
            break
    groups: list[_Group] = []
    for chosen, kind, among in sorted(repeated, key=lambda item: (len(item[2]), item[0])):
        ids = frozenset(task.record.id for task in among)
        overlapping = [group for group in groups if group.ids & ids]
        if not overlapping:
            ordered = sorted(among, key=lambda task: (task.record.at, task.record.id))
            groups.append(_Group(ordered, kind, {chosen}))
        elif len(overlapping) == 1:
            overlapping[0].values.add(chosen)
        else:
            for group in overlapping:
                group.attributes.add(chosen)
    return sorted(groups, key=lambda group: (group.tasks[-1].record.at, sorted(group.ids)))


def _promote(updater: MemoryUpdater, user_id: str, group: _Group) -> UpdateDecision:
    """Write one repeated choice: into the memory drawn from the same tasks, if any."""
    latest = group.tasks[-1]
    said: dict[str, str] = {}  # root -> its word, as the latest task with it wrote it
    for task in reversed(group.tasks):
        for root, word in task.surface.items():
            said.setdefault(root, word)
    query = latest.query
    head = group.kind.split()[-1]
    subject = next((w for w in words(query) if head in content_roots(w)), head)
    topic = " ".join([subject, *(said[root] for root in sorted(group.attributes))])
    memory = PersonaMemory(
        topic=topic,
        preference=" ".join(said[root] for root in said if root in group.values),
        strategy=f"chosen in {len(group.tasks)} past {subject} tasks; "
        f"the latest: {_latest_choice(latest, group.values)}",
        sources=sorted(group.ids),
    )
    source = Provenance.consolidation(group.ids)
    consolidated = [record for record in updater.store.list(user_id, "persona") if _sources(record)]
    drawn = [r for r in consolidated if group.ids & _sources(r)]
    if not drawn:
        for record in consolidated:
            for change in updater.store.history(user_id, "persona", record.id):
                old = change.before.content
                if isinstance(old, PersonaMemory) and group.ids <= set(old.sources):
                    return UpdateDecision(
                        operation="noop",
                        target_id=record.id,
                        reason="a later choice replaced it",
                        record=record,
                    )
        return updater.update(user_id, "persona", memory, at=latest.record.at, provenance=source)
    target = max(drawn, key=lambda record: len(group.ids & _sources(record)))
    if target.content == memory:
        return UpdateDecision(
            operation="noop", target_id=target.id, reason="the same choice", record=target
        )
    (embedded,) = embed_records(updater.embedder, [memory])
    reason = f"the choice of {len(group.tasks)} past tasks, revised"
    record = updater.store.update(
        user_id,
        "persona",
        target.id,
        memory,
        embedding=embedded.embedding,
        at=latest.record.at,
        valid_until=target.valid_until,
        reason=reason,
        provenance=source,
    )
    return UpdateDecision(
        operation="update", target_id=target.id, content=memory, reason=reason, record=record
    )


def _sources(record: MemoryRecord) -> set[str]:
    """The trajectories a persona memory was consolidated from (none for others)."""
    content = record.content
    return set(content.sources) if isinstance(content, PersonaMemory) else set()


def _latest_choice(task: _Task, values: set[str]) -> str:
    """The latest of a task's choices holding the promoted words."""
    for choice in reversed(task.choices):
        if values & {found for word in words(choice) for found in content_roots(word)}:
            return choice
    return task.choices[-1]
