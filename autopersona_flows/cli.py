"""The ``autopersona`` command line.

Commands print counts and digests, never memory contents, so their output is safe
to paste into a ticket or a CI log.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autopersona_flows import _json
from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.evaluation import (
    cases_kind,
    evaluate_clarification_policy,
    evaluate_judgement,
    evaluate_timeline,
    read_clarification_cases,
    read_judgement_cases,
    read_timeline_cases,
    seed_memories,
)
from autopersona_flows.errors import (
    AutopersonaError,
    EvaluationError,
    IngestionError,
    MemoryStoreError,
    SnapshotError,
)
from autopersona_flows.memory.consolidation import promote_choices
from autopersona_flows.memory.embedders import get_embedder
from autopersona_flows.memory.ingestion import ingest_task_history, read_task_records
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import LAYERS
from autopersona_flows.memory.reindex import reindex_user
from autopersona_flows.memory.retrieval import MemoryRetriever
from autopersona_flows.memory.snapshots import MemorySnapshot, read_snapshot, write_snapshot
from autopersona_flows.memory.stores import is_postgres, migrate, open_store
from autopersona_flows.memory.updates import MemoryUpdater

__all__ = ["export_snapshot", "import_snapshot", "main"]


def _existing_store(address: str | Path) -> MemoryStore:
    if not is_postgres(address):
        root = Path(str(address).removeprefix("jsonl:"))
        if not root.is_dir():
            raise MemoryStoreError(f"no memory store at {root}: the folder does not exist")
    return open_store(address)


def _counts(snapshot: MemorySnapshot) -> str:
    total = sum(snapshot.counts.values())
    layers = ", ".join(f"{layer} {count}" for layer, count in snapshot.counts.items())
    return f"{total} memories ({layers})"


def export_snapshot(store_root: str | Path, user_id: str, dest: str | Path) -> MemorySnapshot:
    """Write one user's snapshot from a JSONL store to ``dest``, atomically.

    Nothing is written if the user's bank is corrupt, so an earlier export at
    ``dest`` stays as it was. A user without memories gives an explicitly empty
    snapshot.

    Raises:
        SnapshotError: If ``dest`` lies inside the store.
        MemoryStoreCorruptionError: If a bank of the user is malformed.
    """
    store = _existing_store(store_root)
    dest = Path(dest)
    if isinstance(store, JsonlMemoryStore) and dest.resolve().is_relative_to(store.root.resolve()):
        raise SnapshotError(
            f"refusing to export into the store itself ({dest}); choose a path outside {store.root}"
        )
    snapshot = store.snapshot(user_id)
    write_snapshot(snapshot, dest)
    return snapshot


def import_snapshot(
    snapshot_path: str | Path, store_root: str | Path, *, replace: bool = False
) -> MemorySnapshot:
    """Restore a snapshot file into a JSONL store (created if missing).

    Raises:
        SnapshotError: If the file is not a valid snapshot, or the user already has
            memories and ``replace`` is false.
    """
    snapshot = read_snapshot(snapshot_path)
    store = open_store(store_root)
    store.restore(snapshot, replace=replace)
    restored = store.snapshot_fingerprint(snapshot.user_id)
    if restored != snapshot.fingerprint:
        raise SnapshotError(
            f"restored data has fingerprint {restored}, expected {snapshot.fingerprint}"
        )
    return snapshot


def _cmd_export(args: argparse.Namespace) -> None:
    snapshot = export_snapshot(args.store, args.user, args.dest)
    note = " (the user has no memories: the snapshot is empty)" if snapshot.is_empty else ""
    print(f"exported {_counts(snapshot)} to {args.dest}{note}")
    print(f"fingerprint sha256:{snapshot.fingerprint}")


def _cmd_import(args: argparse.Namespace) -> None:
    snapshot = import_snapshot(args.snapshot, args.store, replace=args.replace)
    print(f"imported {_counts(snapshot)} into {args.store}")
    print(f"fingerprint sha256:{snapshot.fingerprint}")


def _cmd_ingest(args: argparse.Namespace) -> None:
    path = Path(args.file)
    try:
        with path.open("rb") as file:
            # Validate the whole file first: a bad line near the end must not leave
            # half of the file ingested.
            records = list(read_task_records(file, path))
    except OSError as exc:
        raise IngestionError(f"cannot read {path}: {exc.strerror}") from exc
    store = open_store(args.store)
    updater = MemoryUpdater(store, get_embedder(args.embedder))
    totals: Counter[str] = Counter()
    step = max(1, len(records) // 20)
    for done, record in enumerate(records, start=1):
        totals.update(ingest_task_history(store, updater, record).counts())
        if len(records) >= 100 and (done % step == 0 or done == len(records)):
            print(f"  {done}/{len(records)} tasks ({100 * done // len(records)}%)", file=sys.stderr)
    if args.promote:
        for user_id in dict.fromkeys(record.user_id for record in records):
            totals.update(f"persona:{d.operation}" for d in promote_choices(updater, user_id))
    summary = ", ".join(f"{key} {count}" for key, count in sorted(totals.items())) or "nothing"
    print(f"ingested {len(records)} tasks into {args.store}: {summary}")


def _cmd_reindex(args: argparse.Namespace) -> None:
    store = _existing_store(args.store)
    embedder = get_embedder(args.embedder)
    users = [args.user] if args.user is not None else store.users()
    changed = sum(reindex_user(store, user_id, embedder) for user_id in users)
    print(f"re-embedded {changed} memories of {len(users)} users with {embedder.name}")


def _cmd_pending(args: argparse.Namespace) -> None:
    # Imported here: the other commands must not pay for importing Prefect.
    from autopersona_flows.flows.answers import pending_clarifications  # noqa: PLC0415

    pending = pending_clarifications()
    for waiting in pending:
        options = f"  [{' | '.join(waiting.options)}]" if waiting.options else ""
        print(f"{waiting.flow_run_id}  {waiting.state}  {waiting.question}{options}")
    if not pending:
        print("no run is waiting for an answer")


def _cmd_answer(args: argparse.Namespace) -> None:
    from autopersona_flows.flows.answers import answer_clarification  # noqa: PLC0415

    answer_clarification(args.flow_run_id, args.answer)
    print(f"resumed {args.flow_run_id}")


def _cmd_migrate(args: argparse.Namespace) -> None:
    source = _existing_store(args.source)
    dest = open_store(args.dest)
    users = [args.user] if args.user is not None else None
    for snapshot in migrate(source, dest, users=users, replace=args.replace):
        print(f"{snapshot.user_id}: {_counts(snapshot)}, fingerprint sha256:{snapshot.fingerprint}")


def _cmd_users(args: argparse.Namespace) -> None:
    for user_id in _existing_store(args.store).users():
        print(user_id)


def _cmd_verify(args: argparse.Namespace) -> None:
    store = _existing_store(args.store)
    # Only JSONL stores have folders that other programs can leave things in.
    strays = store.strays() if isinstance(store, JsonlMemoryStore) else []
    for stray in strays:
        print(
            f"{'damage' if stray.damage else 'warning'}: {stray.path}: {stray.reason}",
            file=sys.stderr,
        )
    damaged = [stray.path for stray in strays if stray.damage]
    users = store.users()
    for user_id in users:
        store.snapshot(user_id)  # parses every line of every bank
        for layer in LAYERS:
            store.history(user_id, layer, "")  # and of every change history
    if damaged:
        names = ", ".join(path.name for path in damaged)
        raise MemoryStoreError(f"damage in {damaged[0].parent}: {names} (see above)")
    print(f"ok: {len(users)} users, every bank and history readable")


def _cmd_eval(args: argparse.Namespace) -> None:
    kind = cases_kind(args.cases)
    if kind in ("judgement", "timeline"):
        given = [
            flag
            for flag, value in (("--store", args.store), ("--seed", args.seed))
            if value is not None
        ]
        if given:
            raise EvaluationError(
                f"{args.cases} is a {kind} benchmark, whose cases bring their own memories: "
                f"{' and '.join(given)} apply to clarification sets only"
            )
        (_eval_judgement if kind == "judgement" else _eval_timeline)(args)
        return
    if args.store is None:
        raise EvaluationError(
            f"{args.cases} is a clarification set (its cases have no 'expect'), which runs "
            "against a store: give --store"
        )
    cases = read_clarification_cases(args.cases)  # all of it, before anything is written
    embedder = get_embedder(args.embedder)
    if args.seed is None:
        store = _existing_store(args.store)
    else:
        store = open_store(args.store)
        seeded = seed_memories(store, args.seed, embedder)
        print(
            f"seeded {sum(seeded.values())} memories of {len(seeded)} users into {args.store}",
            file=sys.stderr,
        )
    report = evaluate_clarification_policy(PersonaAgent(MemoryRetriever(store, embedder)), cases)
    # Names, labels, actions and metrics only: decisions quote memory contents.
    print(_json.dumps(report.to_dict()).decode())


_COLUMNS = (
    ("cases", "cases"),
    ("accuracy", "accuracy"),
    ("decision_accuracy", "decision"),
    ("clarification_precision", "ask P"),
    ("clarification_recall", "ask R"),
    ("clarification_f1", "ask F1"),
    ("unnecessary_question_rate", "unneeded"),
    ("repeat_question_rate", "repeat"),
    ("adherence", "adherence"),
    ("near_miss_acceptance", "near miss"),
    ("consistency", "consistent"),
    ("latency_p50_ms", "p50 ms"),
)


def _category_table(
    title: str,
    columns: Sequence[tuple[str, str]],
    categories: Mapping[str, Any],
    overall: Any,
    width: int,
) -> None:
    """Print scores per category, then overall, as a Rich table of ``columns``."""
    from rich.console import Console  # noqa: PLC0415 - only the eval command draws a table
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=title)
    table.add_column("category")
    for _, heading in columns:
        table.add_column(heading, justify="right")
    rows = [*categories.items(), ("all", overall)]
    for name, scores in rows:
        cells = [getattr(scores, field) for field, _ in columns]
        table.add_row(
            name,
            *(
                "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
                for value in cells
            ),
            end_section=name == rows[-2][0],
        )
    Console(width=width).print(table)


def _eval_judgement(args: argparse.Namespace) -> None:
    cases = read_judgement_cases(args.cases)
    embedder = get_embedder(args.embedder)
    report = evaluate_judgement(cases, embedder=embedder)
    if args.json:
        # Names, labels, actions and metrics only: decisions quote memory contents.
        print(_json.dumps(report.to_dict()).decode())
        return
    title = f"judgement benchmark: {args.cases} ({embedder.name})"
    _category_table(title, _COLUMNS, report.categories, report.overall, width=160)
    wrong = [result.name for result in report.results if not result.correct]
    if wrong:
        print(f"{len(wrong)} cases not right: {', '.join(wrong)}")


_TIMELINE_COLUMNS = (
    ("cases", "cases"),
    ("checks", "checks"),
    ("new_first", "new first"),
    ("stale", "stale first"),
    ("stale_live", "stale live"),
    ("expired", "expired"),
)


def _eval_timeline(args: argparse.Namespace) -> None:
    cases = read_timeline_cases(args.cases)
    embedder = get_embedder(args.embedder)
    report = evaluate_timeline(cases, embedder=embedder)
    if args.json:
        print(_json.dumps(report.model_dump(mode="json")).decode())
        return
    title = f"memory over time: {args.cases} ({embedder.name})"
    _category_table(title, _TIMELINE_COLUMNS, report.categories, report.overall, width=120)
    print(f"ingested {report.messages_per_second:.0f} messages/s")
    if report.failures:
        print(f"{len(report.failures)} checks not right: {'; '.join(report.failures)}")


_EMBEDDER_HELP = "hashing (default), minilm, or package.module:attr"
_STORE_HELP = "jsonl:FOLDER (or a folder) or postgresql://user:password@host:port/db"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autopersona", description="Manage autopersona-flows memory stores."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    export = commands.add_parser("export", help="write one user's memories to a snapshot file")
    export.add_argument("store", help=_STORE_HELP)
    export.add_argument("user", help="the user id, exactly as stored")
    export.add_argument("dest", help="the snapshot file to write (outside the store)")
    export.set_defaults(run=_cmd_export)

    restore = commands.add_parser("import", help="restore a snapshot file into a store")
    restore.add_argument("snapshot", help="a file written by `autopersona export`")
    restore.add_argument("store", help=_STORE_HELP + " (created if missing)")
    restore.add_argument(
        "--replace", action="store_true", help="overwrite the user's existing memories"
    )
    restore.set_defaults(run=_cmd_import)

    ingest = commands.add_parser("ingest", help="ingest a JSONL file of completed tasks")
    ingest.add_argument("store", help=_STORE_HELP + " (created if missing)")
    ingest.add_argument("file", help="one RawTaskRecord JSON object a line")
    ingest.add_argument("--embedder", default="hashing", help=_EMBEDDER_HELP)
    ingest.add_argument(
        "--no-promote",
        dest="promote",
        action="store_false",
        help="do not turn choices repeated in 3 past tasks into persona memories afterwards",
    )
    ingest.set_defaults(run=_cmd_ingest)

    reindex = commands.add_parser("reindex", help="re-embed memories made by another embedder")
    reindex.add_argument("store", help=_STORE_HELP)
    reindex.add_argument("--embedder", default="hashing", help=_EMBEDDER_HELP)
    reindex.add_argument("--user", help="only this user (default: every user)")
    reindex.set_defaults(run=_cmd_reindex)

    pending = commands.add_parser("pending", help="list runs waiting for an answer")
    pending.set_defaults(run=_cmd_pending)

    answer = commands.add_parser("answer", help="answer a waiting run and resume it")
    answer.add_argument("flow_run_id", help="the run's id, as `autopersona pending` lists it")
    answer.add_argument("answer", help="the answer (one of the options, if it lists any)")
    answer.set_defaults(run=_cmd_answer)

    move = commands.add_parser(
        "migrate", help="copy every user's memories to another store, checked by fingerprint"
    )
    move.add_argument("--from", dest="source", required=True, help=_STORE_HELP)
    move.add_argument("--to", dest="dest", required=True, help=_STORE_HELP + " (created)")
    move.add_argument("--user", help="only this user (default: every user)")
    move.add_argument(
        "--replace", action="store_true", help="overwrite users who already have memories there"
    )
    move.set_defaults(run=_cmd_migrate)

    users = commands.add_parser("users", help="list the users of a store")
    users.add_argument("store", help=_STORE_HELP)
    users.set_defaults(run=_cmd_users)

    verify = commands.add_parser("verify", help="read every bank; fail on the first corrupt one")
    verify.add_argument("store", help=_STORE_HELP)
    verify.set_defaults(run=_cmd_verify)

    evaluate = commands.add_parser(
        "eval",
        help="run the default agent on a judgement benchmark (a table per category) or a "
        "clarification set (a JSON report), or the default memory on a memory-over-time "
        "benchmark (a table per category)",
    )
    evaluate.add_argument(
        "cases", help="one JudgementCase (or ClarificationCase) JSON object a line"
    )
    evaluate.add_argument(
        "--store",
        help="a clarification set's store folder (created by --seed if missing); a judgement "
        "benchmark brings its own memories and runs in a temporary store",
    )
    evaluate.add_argument("--json", action="store_true", help="print a judgement report as JSON")
    evaluate.add_argument(
        "--seed",
        metavar="MEMORIES",
        help="JSONL memories to write into the store first; its users must have none yet",
    )
    evaluate.add_argument("--embedder", default="hashing", help=_EMBEDDER_HELP)
    evaluate.set_defaults(run=_cmd_eval)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (0 ok, 1 failed, 2 usage)."""
    args = _parser().parse_args(argv)
    # What the library warns about (e.g. a corrupt file a restore set aside) is for the
    # person at the terminal, whether or not anything configured logging.
    warnings = logging.StreamHandler(sys.stderr)
    warnings.setLevel(logging.WARNING)
    warnings.setFormatter(logging.Formatter("warning: %(message)s"))
    logger = logging.getLogger("autopersona_flows")
    logger.addHandler(warnings)
    try:
        args.run(args)
    except AutopersonaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the file system said no: say what and where, no traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    finally:
        logger.removeHandler(warnings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
