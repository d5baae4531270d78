"""The ``autopersona`` command line: Typer commands drawn with Rich, as Prefect's are.

One module per group of commands, each registering on the app of `root`:
`snapshots` (export, import, migrate, users, verify), `ingestion` (ingest,
reindex), `runs` (pending, answer), `evaluation` (eval) and `memories`
(memories, edit, forget, bury, unbury). Nothing of the package imports this one:
``import autopersona_flows.memory`` never pays for Typer.
"""

# Each module registers its commands on `app` as it is imported.
from autopersona_flows.cli import evaluation, ingestion, memories, runs, snapshots  # noqa: F401
from autopersona_flows.cli.root import app, main
from autopersona_flows.cli.snapshots import export_snapshot, import_snapshot

__all__ = ["app", "export_snapshot", "import_snapshot", "main"]
