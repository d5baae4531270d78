"""The memory-review flow: a person's memories as a markdown artifact, with a warning."""

from __future__ import annotations

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

from autopersona_flows.errors import InvalidUserIdError
from autopersona_flows.flows import persona_runtime
from autopersona_flows.flows.review import WARNING, memory_review
from autopersona_flows.memory import MemoryBank, PersonaMemory, WorkspaceMemory

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_the_review_shows_each_memory_once_under_a_warning_and_logs_no_contents(
    kit, caplog
) -> None:
    bank = MemoryBank(kit.store)
    tone = bank.update("ada", "persona", PersonaMemory(topic="tone", preference="dry | terse"))
    bank.update("ada", "persona", PersonaMemory(topic="citation style", preference="APA"))
    bank.update("ada", "workspace", WorkspaceMemory(task="thesis", state="chapter 3 drafted"))
    bank.update("bo", "persona", PersonaMemory(topic="tone", preference="warm and chatty"))
    assert tone.record is not None
    bank.bury("ada", tone.record.id)

    with persona_runtime(kit.agent):
        shown = memory_review(user_id="ada")

    assert shown == 3
    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["memory-review"])),
            sort=ArtifactSort.UPDATED_DESC,
            limit=1,
        )
    markdown = str(artifact.data)
    assert markdown.index(WARNING) < markdown.index("## Persona")
    assert "dry \\| terse" in markdown  # a table cell: the pipe is escaped
    assert f"| `{tone.record.id}` |" in markdown
    assert "| buried |" in markdown
    assert "chapter 3 drafted" in markdown
    assert "warm and chatty" not in markdown  # another person's memory
    assert "chapter 3" not in caplog.text
    assert "APA" not in caplog.text

    with persona_runtime(kit.agent), pytest.raises(InvalidUserIdError):
        memory_review(user_id="")
