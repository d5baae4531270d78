"""Bad data never ends a command in a traceback, and every command says which store it used.

Every store command runs against every kind of damage a store can hold. A command
that reads the damaged part exits 1 with a message naming what is wrong; one that
does not read it succeeds. An exception escaping `main` fails the test.

Without ``--store`` a command works on the store deployments use (the setting as
Prefect reads it, else under ``PREFECT_HOME``) and says so on stderr; the store given
first, as scripts did before ``--store``, still works.
"""

import os
from collections.abc import Callable
from pathlib import Path

import orjson
import prefect.settings as ps
import pytest

from autopersona_flows import (
    JsonlMemoryStore,
    MemoryBank,
    MemoryRecord,
    PersonaMemory,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.cli import main
from autopersona_flows.flows import store_from_settings
from autopersona_flows.memory import MemoryChange
from autopersona_flows.memory.users import user_key


def _folder(root: Path, user: str) -> Path:
    return root / "users" / user_key(user)


def _append(path: Path, line: bytes) -> None:
    with path.open("ab") as file:
        file.write(line + b"\n")


def _foreign_record(root: Path) -> None:
    record = MemoryRecord.of(WorkspaceMemory(state={"file": "notes.md"}))
    _append(_folder(root, "ada") / "persona.jsonl", record.model_dump_json().encode())


def _foreign_change(root: Path) -> None:
    record = MemoryRecord.of(WorkspaceMemory(state={"file": "notes.md"}))
    change = MemoryChange(operation="delete", at=record.updated_at, before=record)
    _append(_folder(root, "ada") / "persona.history.jsonl", change.model_dump_json().encode())


def _marker(root: Path) -> None:
    (root / "store.json").write_bytes(orjson.dumps({"format": "something-else"}))


def _strays(root: Path) -> None:
    (root / "users" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "users" / user_key("carol")).write_text("a folder that became a file")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "a record of another layer in a bank": _foreign_record,
    "a change of another layer in a history": _foreign_change,
    "a line of a bank that is not JSON": lambda root: _append(
        _folder(root, "ada") / "persona.jsonl", b"{oops"
    ),
    "a line of a history that is not JSON": lambda root: _append(
        _folder(root, "ada") / "persona.history.jsonl", b"[1, 2"
    ),
    "a bank of another user": lambda root: (_folder(root, "ada") / "trajectory.jsonl").write_bytes(
        (_folder(root, "bob") / "trajectory.jsonl").read_bytes()
    ),
    "a store marker of another format": _marker,
    "a folder where a bank belongs": lambda root: (
        _folder(root, "ada") / "workspace.jsonl"
    ).mkdir(),
    "stray files in users": _strays,
}

COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "users": lambda root, tmp: ["users", str(root)],
    "verify": lambda root, tmp: ["verify", str(root)],
    "export": lambda root, tmp: ["export", str(root), "ada", str(tmp / "out" / "ada.json")],
    "import --replace": lambda root, tmp: ["import", "--replace", str(tmp / "ada.json"), str(root)],
    "reindex": lambda root, tmp: ["reindex", str(root)],
    "migrate": lambda root, tmp: ["migrate", "--from", str(root), "--to", str(tmp / "copy")],
    "ingest": lambda root, tmp: ["ingest", str(root), str(tmp / "tasks.jsonl")],
    "memories": lambda root, tmp: ["memories", str(root), "ada"],
    "memories --search --history": lambda root, tmp: [
        *("memories", str(root), "ada", "--search", "tone", "--history", "--json"),
    ],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_bad_data_is_an_error_message_never_a_traceback(
    tmp_path: Path, damage: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    for user in ("ada", "bob"):
        tone = store.add(user, PersonaMemory(topic="tone", preference="terse"))
        store.update(user, "persona", tone.id, PersonaMemory(topic="tone", preference="warm"))
        store.add(user, TrajectoryMemory(query="Summarise the paper", trace=["read"]))
    assert main(["export", str(root), "ada", str(tmp_path / "ada.json")]) == 0
    task = {
        "user_id": "ada",
        "query": "Plan a trip",
        "persona": [{"topic": "t", "preference": "p"}],
    }
    (tmp_path / "tasks.jsonl").write_bytes(orjson.dumps(task) + b"\n")
    capsys.readouterr()
    DAMAGE[damage](root)

    code = main(COMMANDS[command](root, tmp_path))  # raises if anything escapes

    err = capsys.readouterr().err
    assert code in (0, 1), err
    if code:
        last = err.splitlines()[-1]
        assert last.startswith("error: "), err
        assert str(root) in last, f"the message does not say where: {last}"
    if command == "verify":
        assert code == 1  # whatever the damage, verify finds it


# --- which store: --store, the setting as Prefect reads it, the default ----------------------

SETTING = "PREFECT_INTEGRATIONS_AUTOPERSONA_STORE"
TASK = {
    "user_id": "erin",
    "query": "Plan a trip",
    "persona": [{"topic": "seat", "preference": "aisle"}],
}


def _env(home: Path, **settings: str) -> dict[str, str]:
    """This environment without Prefect's settings, with a fresh PREFECT_HOME and ``settings``."""
    kept = {name: value for name, value in os.environ.items() if not name.startswith("PREFECT_")}
    return {**kept, "PREFECT_HOME": str(home), **settings}


def test_without_store_commands_use_the_store_deployments_use(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The issue: `autopersona memories erin` failed with "Missing argument 'USER'".
    home = tmp_path / "prefect-home"
    env = _env(home)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(orjson.dumps(TASK) + b"\n")
    default = home / "autopersona" / "memory"
    announced = f"store: {default} (the default: {SETTING} is not set; --store names another)"

    ingested = run_cli("ingest", str(tasks), env=env, cwd=tmp_path)
    assert ingested.returncode == 0, ingested.stderr
    assert ingested.stderr.splitlines() == [announced]
    assert ingested.stdout.startswith(f"ingested 1 task into {default}: ")

    # Where a deployment's runs read and write, as Prefect's settings give it.
    monkeypatch.delenv(SETTING, raising=False)
    with ps.temporary_settings(updates={ps.PREFECT_HOME: home}):
        assert store_from_settings().users() == ["erin"]

    shown = run_cli("memories", "erin", "--layer", "persona", "--json", env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    memories = orjson.loads(shown.stdout)["memories"]  # the notice is not in the JSON
    assert [m["content"]["preference"] for m in memories] == ["aisle"]
    assert shown.stderr.splitlines() == [announced]
    listed = run_cli("users", env=env, cwd=tmp_path)
    assert (listed.returncode, listed.stdout) == (0, "erin\n")


@pytest.mark.parametrize("where", ["environment", "prefect.toml"])
def test_the_store_setting_names_the_store_as_prefect_reads_it(
    run_cli, tmp_path: Path, where: str
) -> None:
    configured = tmp_path / "configured"
    JsonlMemoryStore(configured).add("erin", PersonaMemory(topic="seat", preference="aisle"))
    env = _env(tmp_path / "prefect-home")
    if where == "environment":
        env[SETTING] = str(configured)
    else:
        (tmp_path / "prefect.toml").write_text(
            f'[integrations.autopersona]\nstore = "{configured}"\n', encoding="utf-8"
        )

    result = run_cli("users", env=env, cwd=tmp_path)

    assert (result.returncode, result.stdout) == (0, "erin\n"), result.stderr
    assert result.stderr == f"store: {configured} (the {SETTING} setting)\n"


def test_store_given_wins_over_the_setting_and_is_not_announced(run_cli, tmp_path: Path) -> None:
    configured, given = tmp_path / "configured", tmp_path / "given"
    JsonlMemoryStore(configured).add("erin", PersonaMemory(topic="seat", preference="aisle"))
    JsonlMemoryStore(given).add("finn", PersonaMemory(topic="seat", preference="window"))
    env = _env(tmp_path / "prefect-home", **{SETTING: str(configured)})

    for args in (["users", "--store", str(given)], ["users", str(given)]):  # new form, old form
        result = run_cli(*args, env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout, result.stderr) == (0, "finn\n", "")


def test_a_store_password_is_never_printed(run_cli, tmp_path: Path) -> None:
    # Nothing listens on port 1: the command fails, and says where without the password.
    address = "postgresql://erin:s3cret-pw@127.0.0.1:1/memory?password=s3cret-pw"
    result = run_cli("users", env=_env(tmp_path / "home", **{SETTING: address}), cwd=tmp_path)
    assert result.returncode == 1
    assert "s3cret-pw" not in result.stdout + result.stderr
    assert result.stderr.startswith(
        f"store: postgresql://erin:***@127.0.0.1:1/memory?password=*** (the {SETTING} setting)\n"
    )
    assert "\nerror: cannot use PostgresMemoryStore" in result.stderr


OLD_AND_NEW: dict[
    str, tuple[Callable[[Path, Path], list[str]], Callable[[Path, Path], list[str]]]
] = {
    "users": (lambda s, t: ["users", str(s)], lambda s, t: ["users", "--store", str(s)]),
    "verify": (lambda s, t: ["verify", str(s)], lambda s, t: ["verify", "--store", str(s)]),
    "memories": (
        lambda s, t: ["memories", str(s), "ada", "--json"],
        lambda s, t: ["memories", "ada", "--json", "--store", str(s)],
    ),
    "export": (
        lambda s, t: ["export", str(s), "ada", str(t / "old.json")],
        lambda s, t: ["export", "--store", str(s), "ada", str(t / "new.json")],
    ),
    "import": (
        lambda s, t: ["import", "--replace", str(t / "ada.json"), str(s)],
        lambda s, t: ["import", "--replace", str(t / "ada.json"), "--store", str(s)],
    ),
    "reindex": (lambda s, t: ["reindex", str(s)], lambda s, t: ["reindex", "--store", str(s)]),
}


@pytest.mark.parametrize("command", OLD_AND_NEW)
def test_the_store_as_first_argument_still_works_as_store_does(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    MemoryBank(root).add("ada", PersonaMemory(topic="tone", preference="warm"))  # embedded
    assert main(["export", "--store", str(root), "ada", str(tmp_path / "ada.json")]) == 0
    capsys.readouterr()
    old, new = OLD_AND_NEW[command]

    outputs = []
    for args in (old(root, tmp_path), new(root, tmp_path)):
        assert main(args) == 0, capsys.readouterr().err
        out, err = capsys.readouterr()
        assert err == ""  # given, so not announced
        outputs.append(out.replace("old.json", "DEST").replace("new.json", "DEST"))
    assert outputs[0] == outputs[1]


def test_the_store_given_twice_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    JsonlMemoryStore(root).add("ada", PersonaMemory(topic="tone", preference="warm"))
    assert main(["memories", str(root), "ada", "--store", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "the store is given twice" in err
    assert str(root) in err


def test_usage_shows_the_store_option_not_the_old_argument(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["edit", "--help"]) == 0
    out = capsys.readouterr().out
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    assert usage.split() == ["Usage:", "autopersona", "edit", "[OPTIONS]", "{USER}", "{ID}"]
    assert "--store" in out
    assert "$PREFECT_HOME/autopersona/memory" in out
