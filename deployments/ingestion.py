"""Deployable entrypoint: ingest a JSONL file of completed tasks into memory.

Deployed by ``prefect.yaml`` as ``ingest-task-history/from-file``. Give it the path of
a file the worker can read, one `RawTaskRecord` per line; the run validates the
whole file first, then writes in batches and reports its progress as an artifact.
"""

from autopersona_flows.flows import ingest_history

__all__ = ["ingest_history"]
