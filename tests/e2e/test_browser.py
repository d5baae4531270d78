"""The resume dialog as a person meets it: the real Prefect UI in headless Chromium.

A new user's run of the reading-group deployment needs two things memory lacks (a
citation style, one of three options; a sharing channel, free text), so it suspends
before any tool runs with ONE form. In the UI served by ``prefect server start`` we
open the run's page, click Resume, read the dialog, submit it blank and with a
whitespace answer (both refused, the run stays suspended), then answer and submit;
the run completes with every tool run once, both answers are in persona memory, and
the next run asks nothing.

Needs Debian's ``chromium`` (``/usr/bin/chromium``; ``.ci/run`` installs it) and
playwright (the ``dev`` extra), launched with ``executable_path``: nothing is
downloaded. Without either the test skips, saying which.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _runs import TOOLS, start, state_names, tool_calls, wait_for

from autopersona_flows.flows.events import flow_run_url
from autopersona_flows.memory import open_store

CHROMIUM = Path("/usr/bin/chromium")
# What Chromium needs on a machine with no network but loopback (machines/python.md):
# without the background-networking flags it keeps trying to reach Google's hosts.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USER = "grace"  # no history: both requirements of the graph are missing
STYLE = "To format the references, which citation style would you like? APA, MLA or Chicago?"
CHANNEL = "What sharing channel would you like?"
ANSWER = "Post it in the #reading-group channel"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"no {CHROMIUM}: apt-get install chromium (.ci/run does)"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None,
        reason="playwright is not installed: pip install -e '.[dev]'",
    ),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, with a fresh profile; playwright downloads nothing."""
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory() as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


def _open_resume_dialog(page: Any) -> Any:
    """Click Resume: a button in the classic UI, an item of the ⋮ menu in the V2 UI.

    The server serves the classic UI here (its page offers "Switch to V2 UI"); the
    ⋮ fallback follows PREFECT_NOTES §11 and has not been run against the V2 UI.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    resume = page.get_by_role("button", name="Resume")
    try:
        resume.wait_for(timeout=15_000)
    except PlaywrightTimeoutError:
        page.get_by_role("button", name="More actions").click()
        page.get_by_role("menuitem", name="Resume").click()
    else:
        resume.click()
    dialog = page.get_by_role("dialog").filter(has_text="Submit")
    dialog.wait_for(timeout=15_000)
    return dialog


def test_a_new_user_answers_both_questions_in_one_dialog_in_the_browser(
    ui_stack, browser: Any, tmp_path: Path
) -> None:
    run_id = start("persona-graph-runner/reading-group", {"user_id": USER})
    wait_for(run_id, "Suspended")
    assert tool_calls(ui_stack) == {}  # asked before the first tool runs

    page = browser.new_page()
    page.goto(flow_run_url(run_id))
    dialog = _open_resume_dialog(page)
    page.screenshot(path=tmp_path / "resume-dialog.png")
    text = dialog.inner_text()
    # Each question once, with the steps in plain words and no internal ids.
    assert (text.count(STYLE), text.count(CHANNEL)) == (1, 1)
    assert "Format the references" in text
    assert "Options:" not in text  # the select shows its options; the label does not repeat them
    for internal in ["gather_sources", "format_references", "clarify-", str(run_id)]:
        assert internal not in text

    # Blank: the form itself refuses it and names what is missing.
    dialog.get_by_role("button", name="Submit").click()
    page.get_by_text("'sharing_channel' is a required property").wait_for()
    # Whitespace: the form lets it through, Prefect's server refuses it (pattern \S).
    dialog.locator(".p-select-button__icon").click()  # the select opens from its chevron
    assert page.get_by_role("option").all_inner_texts() == ["APA", "MLA", "Chicago"]
    page.get_by_role("option", name="MLA").click()
    dialog.locator("textarea").fill("   ")
    dialog.get_by_role("button", name="Submit").click()
    page.get_by_text("Validation failed for field 'sharing_channel'").first.wait_for()
    assert wait_for(run_id, "Suspended").state.name == "Suspended"
    assert "Resuming" not in state_names(run_id)

    dialog.locator("textarea").fill(ANSWER)
    dialog.get_by_role("button", name="Submit").click()
    dialog.wait_for(state="hidden")
    wait_for(run_id, "Completed")
    page.close()

    assert tool_calls(ui_stack) == dict.fromkeys(TOOLS, 1)  # across both processes
    persona = {
        (m.content.topic, m.content.preference)
        for m in open_store(ui_stack.store).list(USER, "persona")
    }
    assert {("citation style", "MLA"), ("sharing channel", ANSWER)} <= persona

    again = start("persona-graph-runner/reading-group", {"user_id": USER})
    wait_for(again, "Completed")
    assert "Suspended" not in state_names(again)
    assert tool_calls(ui_stack) == dict.fromkeys(TOOLS, 2)
