"""The exception tree of autopersona-flows.

Every error the library raises on purpose derives from `AutopersonaError`, and
each also inherits the builtin it refines, so ``except ValueError`` keeps working::

    AutopersonaError
    ├── MemoryStoreError
    │   ├── InvalidUserIdError (ValueError)
    │   ├── MemoryNotFoundError (KeyError)
    │   ├── DuplicateMemoryError (ValueError)
    │   ├── MemoryStoreCorruptionError
    │   ├── UnsafeLinkError
    │   ├── StoreUnavailableError (ConnectionError): transient, worth a retry
    │   └── SnapshotError (ValueError)
    ├── EmbedderError (ValueError)
    │   └── EmbeddingMismatchError
    ├── RetrievalError (ValueError)
    ├── ResolverError (ValueError)
    ├── CorrectionError (ValueError)
    ├── IngestionError (ValueError)
    │   └── ExtractionError
    ├── PolicyError (ValueError)
    ├── EvaluationError (ValueError)
    ├── ConfigurationError: a developer's mistake, never retried
    │   ├── GraphError (ValueError)
    │   ├── FlowConfigurationError (ValueError)
    │   ├── MemoryBankError (TypeError)
    │   ├── NodeOutputError (TypeError)
    │   └── NotificationError (ValueError)
    ├── ClarificationTimeoutError
    ├── ClarificationBudgetError
    ├── StepLockTimeoutError (TimeoutError)
    └── AnswerRejectedError (ValueError)
        ├── BlankAnswerError
        └── RunGoneError

Invalid record contents raise pydantic's `ValidationError` (a `ValueError`),
which names every offending field.

A persona node's run task retries (under the node's ``retries``) a tool's own
failures and `StoreUnavailableError`, never any other error of this tree: those
would fail again the same way.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "AnswerRejectedError",
    "AutopersonaError",
    "BlankAnswerError",
    "ClarificationBudgetError",
    "ClarificationTimeoutError",
    "ConfigurationError",
    "CorrectionError",
    "DuplicateMemoryError",
    "EmbedderError",
    "EmbeddingMismatchError",
    "EvaluationError",
    "ExtractionError",
    "FlowConfigurationError",
    "GraphError",
    "IngestionError",
    "InvalidUserIdError",
    "MemoriesExistError",
    "MemoryBankError",
    "MemoryNotFoundError",
    "MemoryStoreCorruptionError",
    "MemoryStoreError",
    "NodeOutputError",
    "NotificationError",
    "PolicyError",
    "ResolverError",
    "RetrievalError",
    "RunGoneError",
    "SnapshotError",
    "StepLockTimeoutError",
    "StoreUnavailableError",
    "UnsafeLinkError",
]


class AutopersonaError(Exception):
    """Base class of every error raised by autopersona-flows."""


class MemoryStoreError(AutopersonaError):
    """A memory store refused or failed an operation."""


class InvalidUserIdError(MemoryStoreError, ValueError):
    """A user id is not a non-empty string of valid Unicode."""


class MemoryNotFoundError(MemoryStoreError, KeyError):
    """No record with this id exists in the user's bank for this layer."""

    def __init__(self, user_id: str, layer: str, memory_id: str) -> None:
        self.user_id = user_id
        self.layer = layer
        self.memory_id = memory_id
        super().__init__(f"no {layer} memory with id {memory_id!r} for user {user_id!r}")

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0])


class DuplicateMemoryError(MemoryStoreError, ValueError):
    """A record id that already exists was written again as new."""


class MemoryStoreCorruptionError(MemoryStoreError):
    """A stored file is malformed; nothing was modified.

    Writes to the affected bank are refused until a person repairs the file, or
    restores a snapshot over the user's banks with ``replace``: the corrupt file is
    then kept under a timestamped ``.corrupt`` name and the bank starts afresh.

    Attributes:
        path: The malformed file.
        line: The 1-based line number of the first bad line, if known.
        reason: What is wrong with it.
    """

    def __init__(
        self, path: Path | str, line: int | None, reason: str, *, advice: str | None = None
    ) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}. Nothing was modified; {advice or _REPAIR}")


_REPAIR = (
    "writes to this bank are refused until the file is repaired: fix or remove the line, "
    "or restore an exported snapshot with replace (`autopersona import --replace`), which "
    "keeps the corrupt file as *.corrupt beside it."
)


class UnsafeLinkError(MemoryStoreError):
    """A path inside a store is a link that leads outside it; it was not followed.

    The store's folder itself may be a link (wherever it leads is the store), but
    nothing inside it may lead out: a bank or history linked elsewhere would be read
    from, or written to, a file the store does not own. Nothing was read or written.

    Attributes:
        path: The path inside the store.
        target: Where it leads.
    """

    def __init__(self, path: Path, target: Path, root: Path) -> None:
        self.path = path
        self.target = target
        super().__init__(
            f"{path} leads to {target}, outside the store {root}: refusing to follow it, "
            "nothing was read or written. Replace the link with the file itself."
        )


class StoreUnavailableError(MemoryStoreError, ConnectionError):
    """The store could not be reached or gave up mid-operation; trying again may work.

    The PostgreSQL store raises it when the server refuses or drops the
    connection, shuts down, or cancels the statement; the next call opens a new
    connection. A write it interrupts was rolled back as a whole.
    """


class SnapshotError(MemoryStoreError, ValueError):
    """A snapshot cannot be exported, read or restored as asked."""


class MemoriesExistError(SnapshotError):
    """A snapshot would be restored over a user's memories without ``replace``.

    Attributes:
        user_id: Whose memories.
        count: How many they have.
    """

    def __init__(self, user_id: str, count: int) -> None:
        super().__init__(
            f"user {user_id!r} already has {count} memories; restore with replace=True to "
            "overwrite them"
        )
        self.user_id = user_id
        self.count = count

    def __reduce__(self) -> tuple[type[MemoriesExistError], tuple[str, int]]:
        return type(self), (self.user_id, self.count)


class EmbedderError(AutopersonaError, ValueError):
    """An embedder is missing, misconfigured, or returned vectors of the wrong shape."""


class EmbeddingMismatchError(EmbedderError):
    """Stored embeddings were made by another embedder (or another dimension).

    Re-embed the store with ``autopersona reindex STORE --embedder NAME``.
    """


class RetrievalError(AutopersonaError, ValueError):
    """A retrieval was asked with invalid arguments (layer, top_k, threshold)."""


class ResolverError(AutopersonaError, ValueError):
    """An update resolver returned a decision that cannot be applied; nothing was written."""


class CorrectionError(AutopersonaError, ValueError):
    """A person's correction of a memory cannot be applied as asked; nothing was written.

    For example an id that is not a memory id, a field the memory's layer does not
    have, or a value the field cannot hold.
    """


class IngestionError(AutopersonaError, ValueError):
    """A task-history file or record cannot be ingested; the message names the field."""


class ExtractionError(IngestionError):
    """An extractor could not read the memories of a task.

    For example a model server that kept failing, or a model that kept answering
    with invalid memories (a quote the person never wrote); the message says which.
    Ingestion extracts before it writes, so nothing of the task was stored.
    """


class PolicyError(AutopersonaError, ValueError):
    """A decision policy failed to produce a valid decision.

    For example an unknown action (``"Clarify"`` is not ``"clarify"``), a
    clarification without a question, or an LLM endpoint that kept failing. A
    policy may retry within its own budget; the agent never retries it.
    """


class EvaluationError(AutopersonaError, ValueError):
    """An evaluation set is empty or its labels are invalid."""


class ConfigurationError(AutopersonaError):
    """A developer's mistake in how the library is wired or called; never retried."""


class GraphError(ConfigurationError, ValueError):
    """A task graph is malformed; the message names the nodes involved.

    A duplicate id, an unknown dependency, a cycle, or a tool that cannot be imported.
    """


class FlowConfigurationError(ConfigurationError, ValueError):
    """A persona flow is missing its agent or has invalid options; never retried."""


class MemoryBankError(ConfigurationError, TypeError):
    """A `MemoryBank` was given a part of the wrong kind; never retried.

    A store that is neither a `MemoryStore` nor an address, an embedder that is not
    an `Embedder`, an extractor that is not an `Extractor`.
    """


class NodeOutputError(ConfigurationError, TypeError):
    """A node's tool was given or returned something that is not a JSON value.

    Arguments and results feed cache keys and are stored as JSON, so a persona
    function's arguments and a tool's output must be JSON values (dicts, lists,
    text, numbers, booleans, None), and a sync tool must not return an awaitable.
    """


class NotificationError(ConfigurationError, ValueError):
    """A notification of waiting runs cannot be set up as asked; nothing was created.

    Neither or both of a webhook URL and a block slug were given, or the block named
    does not exist or cannot send notifications; the message says how to fix it.
    """


class ClarificationTimeoutError(AutopersonaError):
    """Nobody answered a clarifying question in time.

    Raised in the flow with the question in its message. The Prefect server records
    the run itself as ``Failed("The flow was failed and never resumed.")``; the
    question is in the run's logs and its clarification artifact.
    """


class ClarificationBudgetError(AutopersonaError):
    """A run needs more answers than its ``question_budget`` lets it ask.

    Raised before the question that would exceed it is asked, naming the
    requirement; a requirement with a declared ``default`` runs with it instead.
    """


class StepLockTimeoutError(AutopersonaError, TimeoutError):
    """A step waited longer than ``step_lock_timeout`` for another run holding it.

    Of two runs of one episode at once, one runs a step and the other waits for its
    result; a tool that never returns would make the other wait forever. Raised in
    the waiting run, naming who holds the step and since when; the holder is not
    touched.

    Attributes:
        key: The step's key.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


class AnswerRejectedError(AutopersonaError, ValueError):
    """The Prefect server refused an answer (e.g. not one of the options); the run stays paused."""


class BlankAnswerError(AnswerRejectedError):
    """An answer is empty or only whitespace; nothing was resumed or remembered.

    Attributes:
        question: The question it was meant to answer.
    """

    def __init__(self, question: str, answer: object) -> None:
        self.question = question
        super().__init__(
            f"the answer to {question!r} is blank ({answer!r}): answer with some text, "
            "or one of the options"
        )


class RunGoneError(AnswerRejectedError):
    """A run was paused in a process that is gone: an answer would resume a run nothing runs.

    Cancel it (``autopersona cancel``, `cancel_clarification`) and start it again; the
    message says when its process was last seen.
    """
