"""Every Python snippet of the README and the docs runs; the README stays short and linked.

Each page's ```python blocks run in order in one namespace (a page reads top to bottom),
in a fresh folder, so a snippet may use what an earlier one on its page defined but never
a file of this repository. A block whose first line is ``# not runnable: REASON`` is
shown, not run: it needs what a test cannot have (a Dask cluster, a Slack hook), and the
reason says which. Pages that run flows get a Prefect test server.
"""

from __future__ import annotations

import gc
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
NOT_RUNNABLE = re.compile(r"# not runnable: (?P<why>\S.*)")
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```", re.M | re.S
)
QUICK_START = (  # exactly as a newcomer copies them
    "python3 -m venv .venv && .venv/bin/pip install -e . "
    "&& .venv/bin/python examples/quickstart.py",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest",
)


def blocks(page: Path, lang: str = "python") -> list[tuple[int, str]]:
    """The ``lang`` blocks of ``page``: (line of the fence, code without its indent)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        if match["lang"] != lang:
            continue
        indent = len(match["indent"])
        code = "\n".join(line[indent:] for line in match["code"].splitlines())
        found.append((text.count("\n", 0, match.start()) + 1, code))
    return found


def runnable(page: Path) -> list[tuple[int, str]]:
    return [(line, code) for line, code in blocks(page) if not NOT_RUNNABLE.match(code)]


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# Prefect 3.9.1 leaves its async client's sockets open when an async flow's loop closes
# (see tests/flows/conftest.py, run_async); the persona-task page runs one.
@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")
@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=name)
def test_the_python_snippets_of_a_page_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    snippets = runnable(page)
    if any("autopersona_flows.flows" in code or "prefect" in code for _, code in snippets):
        request.getfixturevalue("prefect_harness")  # the session's test server
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for line, code in snippets:
        # A real file, so tracebacks and inspect.getsource (Prefect's task source) find it.
        source = tmp_path / f"{page.stem}_line_{line}.py"
        source.write_text(code, encoding="utf-8")
        try:
            exec(compile(code, str(source), "exec"), namespace)  # noqa: S102 - the snippets are ours
        except Exception as exc:
            raise AssertionError(f"{name(page)}, the block at line {line} failed: {exc!r}") from exc
    gc.collect()  # the sockets above are collected here, inside the filter


def test_a_block_not_run_says_why() -> None:
    for page in PAGES:
        for line, code in blocks(page):
            first = code.splitlines()[0] if code.strip() else ""
            if first.startswith("# not run"):
                assert NOT_RUNNABLE.match(first), f"{name(page)}:{line}: say '# not runnable: why'"


def test_the_readme_is_short_and_keeps_the_quick_start() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    commands = [code.strip() for _, code in blocks(README, "bash")]
    for command in QUICK_START:
        assert command in commands, f"the README lost its quick-start command: {command}"
        shlex.split(command)  # a shell can read it


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_relative_links_point_at_files(page: Path) -> None:
    # mkdocs build --strict checks the docs' links; the README is not part of the site.
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in re.findall(r"\]\((?!https?://|mailto:|#)([^)\s#]+)", text):
        assert (page.parent / target).exists(), f"{name(page)} links to a missing {target}"


def test_every_benchmark_section_is_shown_in_the_docs() -> None:
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    sections = re.findall(r"\[start:([-_0-9a-z]+)\]", results)
    assert sections
    included = "".join(page.read_text(encoding="utf-8") for page in DOCS.rglob("*.md"))
    for section in sections:
        assert f'--8<-- "benchmarks/RESULTS.md:{section}"' in included, section
