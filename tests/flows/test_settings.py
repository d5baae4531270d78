"""Settings from ``PREFECT_INTEGRATIONS_AUTOPERSONA_*``: values, defaults, the agent they build.

A run with no `persona_runtime` block (a deployment run) builds its runtime from
`AutopersonaSettings`, which reads the environment each time it is constructed, so
``monkeypatch.setenv`` is enough. Only the graph run at the end needs the Prefect server.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from uuid import uuid4

import prefect.settings as ps
import pytest
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import validate
from pydantic import ValidationError

from autopersona_flows.agent import (
    EvidencePolicy,
    OpenAICompatiblePolicy,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.errors import EmbedderError, FlowConfigurationError, GraphError
from autopersona_flows.flows import (
    AutopersonaSettings,
    GraphSpec,
    TaskGraph,
    TaskNode,
    graph_runner,
    persona_graph,
    persona_runtime,
    runtime_from_settings,
    store_from_settings,
)
from autopersona_flows.flows.runtime import current_runtime
from autopersona_flows.memory import JsonlMemoryStore, MemoryBank, PersonaMemory
from autopersona_flows.memory.encoders import shared_encoder

PREFIX = "PREFECT_INTEGRATIONS_AUTOPERSONA_"
FIELDS = [name.upper() for name in AutopersonaSettings.model_fields]
USER = "ada"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No autopersona setting leaks in from the machine or from another test."""
    for name in FIELDS:
        monkeypatch.delenv(PREFIX + name, raising=False)


def setenv(monkeypatch: pytest.MonkeyPatch, **values: object) -> None:
    for name, value in values.items():
        monkeypatch.setenv(PREFIX + name.upper(), str(value))


# --------------------------------------------------------------------------- values


def test_every_setting_is_read_from_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    setenv(
        monkeypatch,
        store=tmp_path / "memory",
        embedder="minilm",
        policy="openai",
        pause_mode="suspend",
        pause_timeout=42,
        poll_interval=0.25,
        on_timeout="default",
        question_budget=3,
        results=tmp_path / "results",
        snapshots=tmp_path / "snapshots",
        step_lock_timeout=60,
        tool_modules="examples,my_company.tools",
    )

    settings = AutopersonaSettings()

    assert settings.store_address() == str(tmp_path / "memory")
    assert str(tmp_path / "memory") not in repr(settings)  # an address may hold a password
    secret = {"llm_api_key", "store"}
    assert settings.model_dump(include={n.lower() for n in FIELDS} - secret) == {
        "embedder": "minilm",
        "policy": "openai",
        "llm_base_url": None,
        "llm_model": None,
        "llm_timeout": 30.0,
        "pause_mode": "suspend",
        "pause_timeout": 42,
        "poll_interval": 0.25,
        "on_timeout": "default",
        "question_budget": 3,
        "results": tmp_path / "results",
        "snapshots": tmp_path / "snapshots",
        "step_lock_timeout": 60.0,
        "tool_modules": "examples,my_company.tools",
    }
    assert settings.store_address() == str(tmp_path / "memory")
    assert settings.snapshots_path() == tmp_path / "snapshots"


def test_store_and_snapshots_default_under_prefect_home(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    with ps.temporary_settings(updates={ps.PREFECT_HOME: home}):
        settings = AutopersonaSettings()
        assert settings.store_address() == str(home / "autopersona" / "memory")
        assert settings.snapshots_path() == home / "autopersona" / "snapshots"
        store = store_from_settings()
    assert isinstance(store, JsonlMemoryStore)
    assert store.root == home / "autopersona" / "memory"
    assert (settings.store, settings.snapshots, settings.results) == (None, None, None)
    assert (settings.embedder, settings.policy, settings.pause_mode) == (
        "semantic",
        "evidence",
        "auto",
    )


def test_a_home_relative_store_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    setenv(monkeypatch, store="~/memory", snapshots="~/snapshots")
    settings = AutopersonaSettings()
    assert settings.store_address() == str(tmp_path / "memory")
    assert settings.snapshots_path() == tmp_path / "snapshots"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("pause_mode", "sometimes"),
        ("pause_timeout", "0"),
        ("pause_timeout", "soon"),
        ("poll_interval", "0"),
        ("llm_timeout", "-1"),
        ("on_timeout", "guess"),
        ("question_budget", "-1"),
    ],
)
def test_invalid_values_are_validation_errors(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    setenv(monkeypatch, **{name: value})
    with pytest.raises(ValidationError, match=name) as info:
        AutopersonaSettings()
    assert [error["loc"] for error in info.value.errors()] == [(name,)]


# --------------------------------------------------------------------------- runtime


def test_the_runtime_carries_the_settings_and_an_agent_over_the_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    setenv(
        monkeypatch,
        store=tmp_path / "memory",
        pause_mode="pause",
        pause_timeout=42,
        poll_interval=0.25,
        on_timeout="default",
        question_budget=2,
        results=tmp_path / "results",
    )

    runtime = runtime_from_settings()
    assert (runtime.on_timeout, runtime.question_budget) == ("default", 2)

    assert (runtime.pause_mode, runtime.pause_timeout, runtime.poll_interval) == ("pause", 42, 0.25)
    assert runtime.result_storage == tmp_path / "results"
    assert (runtime.user_id, runtime.episode_id) == (None, None)
    agent = runtime.agent
    assert isinstance(agent.policy, EvidencePolicy)
    assert agent.retriever.embedder is shared_encoder()  # the default: the shipped encoder
    assert isinstance(agent.retriever.store, JsonlMemoryStore)
    assert agent.retriever.store.root == tmp_path / "memory"
    assert agent.updater.store is agent.retriever.store
    assert isinstance(agent.bank, MemoryBank)
    assert runtime.bank is agent.bank
    assert (agent.bank.retriever, agent.bank.updater) == (agent.retriever, agent.updater)
    # The agent's store and store_from_settings() are two objects on the same files.
    seeded = store_from_settings().add(USER, PersonaMemory(topic="tone", preference="terse"))
    assert agent.retriever.store.list(USER, "persona") == [seeded]


def test_the_agent_is_cached_per_configuration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    setenv(monkeypatch, store=tmp_path / "a")
    first = runtime_from_settings()
    assert runtime_from_settings().agent is first.agent
    assert runtime_from_settings(AutopersonaSettings()).agent is first.agent

    setenv(monkeypatch, pause_timeout=7)  # not part of the agent: same agent, new option
    again = runtime_from_settings()
    assert again.agent is first.agent
    assert again.pause_timeout == 7

    setenv(monkeypatch, store=tmp_path / "b")
    other = runtime_from_settings()
    assert other.agent is not first.agent
    assert other.agent.retriever.store.root == tmp_path / "b"


@pytest.mark.parametrize(
    "llm", [{}, {"llm_base_url": "http://127.0.0.1:9/v1"}, {"llm_model": "qwen2.5"}]
)
def test_the_openai_policy_without_its_server_and_model_names_the_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, llm: dict[str, str]
) -> None:
    setenv(monkeypatch, store=tmp_path / "memory", policy="openai", **llm)
    with pytest.raises(FlowConfigurationError) as info:
        runtime_from_settings()
    assert f"{PREFIX}LLM_BASE_URL" in str(info.value)
    assert f"{PREFIX}LLM_MODEL" in str(info.value)


def test_the_openai_policy_is_built_without_sending_a_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Nothing listens on port 9 (discard): a request at construction would fail.
    setenv(
        monkeypatch,
        store=tmp_path / "memory",
        policy="openai",
        llm_base_url="http://127.0.0.1:9/v1/",
        llm_model="qwen2.5",
        llm_api_key="sk-not-in-any-repr",
        llm_timeout=3.5,
    )

    policy = runtime_from_settings().agent.policy

    assert isinstance(policy, OpenAICompatiblePolicy)
    judge = policy.judge
    assert (judge.url, judge.model, judge.timeout) == (
        "http://127.0.0.1:9/v1/chat/completions",
        "qwen2.5",
        3.5,
    )
    assert "sk-not-in-any-repr" not in repr(policy)
    assert "sk-not-in-any-repr" not in repr(AutopersonaSettings())


POLICIES = """
import dataclasses

from autopersona_flows.agent import FinalDecision


class ScriptedPolicy:
    def __init__(self, word="class"):
        self.word = word

    def decide(self, request, memories):
        return FinalDecision(guidance=f"{self.word} for {request.user_id}")


POLICY = ScriptedPolicy("object")


def make_policy():
    return ScriptedPolicy("factory")


class Broken:
    def __init__(self):
        raise RuntimeError("no model configured")


def not_a_policy():
    return "evidence"


@dataclasses.dataclass
class DataPolicy:  # a dataclass with eq=True is not hashable
    word: str = "dataclass"

    def decide(self, request, memories):
        return FinalDecision(guidance=f"{self.word} for {request.user_id}")
"""


@pytest.fixture
def policies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A module of policies on sys.path; a fresh name, since policies are cached by path."""
    name = f"policies_{uuid4().hex}"
    folder = tmp_path / "importable"
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(POLICIES))
    monkeypatch.syspath_prepend(str(folder))
    return name


@pytest.mark.parametrize(
    ("attr", "word"),
    [
        ("POLICY", "object"),
        ("ScriptedPolicy", "class"),
        ("make_policy", "factory"),
        ("DataPolicy", "dataclass"),  # not hashable: the agent cache keys on the settings
    ],
)
def test_a_policy_import_path_names_an_object_a_class_or_a_factory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, policies: str, attr: str, word: str
) -> None:
    setenv(monkeypatch, store=tmp_path / "memory", policy=f"{policies}:{attr}")

    agent = runtime_from_settings().agent

    module = sys.modules[policies]
    expected = module.DataPolicy if attr == "DataPolicy" else module.ScriptedPolicy
    assert isinstance(agent.policy, expected)
    if attr == "POLICY":
        assert agent.policy is module.POLICY
    decision = agent.decide(PersonaRequest(user_id=USER, query="plan my trip"))
    assert decision.guidance == f"{word} for {USER}"


@pytest.mark.parametrize(
    ("policy", "match"),
    [
        ("llm", "unknown policy 'llm'"),
        ("no_such_module_xyz:Policy", "cannot import policy 'no_such_module_xyz:Policy'"),
        ("{module}:Missing", "cannot import policy"),
        ("{module}:Broken", "cannot build policy .*no model configured"),
        ("{module}:not_a_policy", "is not a Policy"),
    ],
)
def test_a_policy_that_cannot_be_built_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, policies: str, policy: str, match: str
) -> None:
    setenv(monkeypatch, store=tmp_path / "memory", policy=policy.format(module=policies))
    with pytest.raises(FlowConfigurationError, match=match):
        runtime_from_settings()


def test_an_unknown_embedder_is_an_embedder_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    setenv(monkeypatch, store=tmp_path / "memory", embedder="nope")
    with pytest.raises(EmbedderError, match="unknown embedder 'nope'"):
        runtime_from_settings()


# --------------------------------------------------------------------------- fallback


def test_without_a_block_the_runtime_comes_from_the_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kit
) -> None:
    setenv(monkeypatch, store=tmp_path / "memory", pause_mode="pause", pause_timeout=42)
    from_settings = runtime_from_settings()

    outside = current_runtime()
    assert outside.agent is from_settings.agent
    assert (outside.pause_mode, outside.pause_timeout) == ("pause", 42)

    with persona_runtime(user_id=USER, poll_interval=0.25) as runtime:
        assert current_runtime() is runtime
        assert runtime.agent is from_settings.agent
        assert (runtime.user_id, runtime.poll_interval) == (USER, 0.25)
        assert (runtime.pause_mode, runtime.pause_timeout) == ("pause", 42)  # from the settings
    assert current_runtime().user_id is None

    with persona_runtime(kit.agent):  # a block's agent wins over the settings
        assert current_runtime().agent is kit.agent
        with persona_runtime(user_id=USER) as inner:  # and is inherited, not rebuilt
            assert inner.agent is kit.agent
            assert inner.pause_timeout == 3600  # the block's default, not the setting


def test_a_graph_without_a_block_uses_the_store_named_by_the_environment(
    prefect_harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kit
) -> None:
    # A short pause timeout: if the node asked instead of using the memory, the run
    # would fail with ClarificationTimeoutError after 5 s.
    setenv(
        monkeypatch,
        store=tmp_path / "memory",
        pause_timeout=5,
        poll_interval=0.5,
        results=tmp_path / "results",
    )
    style = store_from_settings().add(USER, PersonaMemory(topic="citation style", preference="MLA"))
    citation = Requirement("citation style", options=["APA", "MLA"])
    graph = TaskGraph(
        [
            TaskNode(id="fetch", tool=kit.record),
            TaskNode(id="draft", tool=kit.record, depends_on=["fetch"], requires=[citation]),
        ]
    )

    result = persona_graph(graph=graph, user_id=USER, query="Finish my paper")

    assert kit.calls == {"fetch": 1, "draft": 1}
    assert result["metrics"]["clarifications"] == 0
    [draft] = kit.contexts["draft"]
    assert (draft.answer, draft.question) == (None, None)
    [constraint] = [c for c in draft.constraints if c.requirement == "citation style"]
    assert (constraint.memory_id, constraint.text) == (style.id, "citation style: MLA")
    assert "citation style: MLA" in draft.guidance
    assert result["decisions"]["draft"]["action"] == "final"
    # Results went to the folder the environment named; the kit's own store is untouched.
    assert any(
        p.name.startswith("autopersona-run-draft-") for p in (tmp_path / "results").iterdir()
    )
    assert kit.store.users() == []


# --------------------------------------------------------------------------- tool modules


@pytest.mark.parametrize(
    ("allowed", "tool", "ok"),
    [
        (None, "os:system", True),  # unset: any module
        ("examples", "examples.reading_group:draft", True),
        ("examples", "examples:draft", True),
        ("examples", "examplesx.tools:draft", False),  # a prefix of a name is not the name
        ("examples", "os:system", False),
        (" examples , my_company.tools ", "my_company.tools.mail:send", True),
        ("my_company.tools", "my_company:send", False),
    ],
)
def test_tool_modules_limit_where_tools_may_come_from(
    monkeypatch: pytest.MonkeyPatch, allowed: str | None, tool: str, ok: bool
) -> None:
    if allowed is not None:
        setenv(monkeypatch, tool_modules=allowed)
    assert AutopersonaSettings().allows_tool(tool) is ok


def test_a_graph_from_the_run_form_cannot_name_a_tool_outside_the_allowed_modules(
    prefect_harness, monkeypatch: pytest.MonkeyPatch, kit
) -> None:
    nodes = [
        {"id": "fine", "tool": "examples.reading_group:gather_sources"},
        {"id": "shell", "tool": "subprocess:getoutput", "depends_on": ["fine"]},
    ]
    # Built where any module may give tools, it still cannot run where one may not.
    graph = GraphSpec.model_validate({"nodes": nodes})
    setenv(monkeypatch, tool_modules="examples")

    with (
        persona_runtime(kit.agent),
        pytest.raises(GraphError, match=r"'shell' names tool 'subprocess:getoutput'"),
    ):
        graph_runner(graph=graph, user_id=USER, query="anything")
    # As a deployment's run gets it (JSON), the flow's parameter check refuses it.
    with (
        persona_runtime(kit.agent),
        pytest.raises(
            ParameterTypeError,
            match=r"graph.nodes: Value error, node 'shell' names tool 'subprocess:getoutput'",
        ),
    ):
        graph_runner(graph={"nodes": nodes}, user_id=USER, query="anything")
    assert kit.calls == {}


@pytest.mark.parametrize(
    ("allowed", "tool"),
    [("json", "json:codecs.sys.exit"), ("examples", "examples.reading_group:os.sys.exit")],
)
def test_a_tool_path_cannot_walk_from_an_allowed_module_into_another(
    prefect_harness, monkeypatch: pytest.MonkeyPatch, kit, allowed: str, tool: str
) -> None:
    exits: list[object] = []
    monkeypatch.setattr(sys, "exit", lambda *args: exits.append(args))  # what the path reaches
    setenv(monkeypatch, tool_modules=allowed)
    # As a deployment run gets it: parameters as JSON, validated by the flow.
    graph = {
        "nodes": [
            {"id": "fine", "tool": "examples.reading_group:gather_sources"},
            {"id": "exit", "tool": tool, "depends_on": ["fine"]},
        ]
    }

    with (
        persona_runtime(kit.agent),
        pytest.raises(
            ParameterTypeError, match=rf"graph.nodes.1.tool: .*'{tool}' .*not a dotted path"
        ),
    ):
        graph_runner(graph=graph, user_id=USER, query="anything")
    assert exits == []
    assert kit.calls == {}


def test_the_run_form_schema_refuses_a_dotted_tool_path_before_a_run_is_created() -> None:
    # Prefect's server checks a deployment run's parameters against this schema.
    schema = parameter_schema(graph_runner).model_dump_for_openapi()

    def problems(tool: str) -> list[str]:
        parameters = {"graph": {"nodes": [{"id": "a", "tool": tool}]}, "user_id": USER}
        return [error.message for error in validate(parameters, schema, ignore_required=True)]

    assert problems("examples.reading_group:draft") == []
    [problem] = problems("json:codecs.sys.exit")
    assert problem.startswith("'json:codecs.sys.exit' does not match")


def test_a_function_only_imported_into_an_allowed_module_is_refused_and_never_called(
    prefect_harness, monkeypatch: pytest.MonkeyPatch, kit, tool_modules
) -> None:
    setenv(monkeypatch, tool_modules=tool_modules.package)
    graph = GraphSpec.model_validate(
        {
            "nodes": [
                {"id": "fine", "tool": f"{tool_modules.allowed}:summarise"},
                {"id": "foreign", "tool": f"{tool_modules.allowed}:record"},
            ]
        }
    )

    with (
        persona_runtime(kit.agent),
        pytest.raises(
            GraphError,
            match=rf"'{tool_modules.allowed}:record' is defined in '{tool_modules.forbidden}'",
        ),
    ):
        graph_runner(graph=graph, user_id=USER, query="anything")
    assert tool_modules.forbidden_calls() == []


def test_a_tool_defined_in_an_allowed_package_runs(
    prefect_harness, monkeypatch: pytest.MonkeyPatch, kit, tool_modules
) -> None:
    setenv(monkeypatch, tool_modules=f"{tool_modules.package},examples")
    graph = GraphSpec.model_validate(
        {
            "nodes": [
                {"id": "gather", "tool": "examples.reading_group:gather_sources"},
                {"id": "sum", "tool": f"{tool_modules.allowed}:summarise"},
            ]
        }
    )

    with persona_runtime(kit.agent):
        result = graph_runner(graph=graph, user_id=USER, query="anything")

    assert result["outputs"]["sum"] == {"summary": "short", "node": "sum"}
    assert "papers" in result["outputs"]["gather"]
