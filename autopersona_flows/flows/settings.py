"""Settings, the Prefect way: ``PREFECT_INTEGRATIONS_AUTOPERSONA_*`` and ``prefect.toml``.

A run started from a deployment (the UI, a schedule, ``run_deployment``) has no
Python caller to hand it a PersonaAgent, so it builds one from these settings.
Every value can be set as an environment variable (e.g. in a work pool's
``job_variables.env``), in ``prefect.toml`` under ``[integrations.autopersona]``
or in ``pyproject.toml`` under ``[tool.prefect.integrations.autopersona]``.
`agent_from_settings` builds the agent; `runtime_from_settings` (``runtime.py``,
which builds on this module) the runtime around it.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any, Literal

from prefect.settings import get_current_settings
from prefect.settings.base import PrefectBaseSettings, build_settings_config
from pydantic import Field, SecretStr, ValidationError

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.evidence import EvidencePolicy
from autopersona_flows.agent.openai import OpenAICompatiblePolicy
from autopersona_flows.agent.policies import Policy
from autopersona_flows.errors import FlowConfigurationError
from autopersona_flows.memory.bank import MemoryBank
from autopersona_flows.memory.embedders import get_embedder
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.stores import is_postgres, open_store

__all__ = [
    "AutopersonaSettings",
    "PauseMode",
    "agent_from_settings",
    "load_settings",
    "store_from_settings",
]

PauseMode = Literal["auto", "pause", "suspend"]
"""How a run waits for an answer: ``suspend`` frees the worker (deployments only),
``pause`` keeps the process polling, ``auto`` suspends when the run has a deployment."""


class AutopersonaSettings(PrefectBaseSettings):
    """Where memory lives and how persona-aware runs behave.

    Attributes:
        store: The memory store: a folder (or ``jsonl:FOLDER``) for the JSONL store,
            or ``postgresql://user:password@host:port/db`` for the PostgreSQL store
            (the ``postgres`` extra); ``$PREFECT_HOME/autopersona/memory`` if unset.
            Every worker that runs graphs for a user must reach it.
        embedder: ``semantic`` (default: the sentence encoder shipped in the package,
            nothing downloaded), ``hashing`` (no model), ``minilm`` (the extra) or
            ``package.module:attr``. Must be what the store was written with (the
            default embeds a bank written by another again, in memory).
        policy: ``evidence`` (default, no LLM), ``openai`` (an OpenAI-compatible
            server, see the ``llm_*`` settings) or ``package.module:attr`` naming a
            `Policy` or a factory of one.
        llm_base_url: The ``/v1`` URL of the chat-completions server.
        llm_model: The model to ask.
        llm_api_key: Its API key, if it needs one.
        llm_timeout: Seconds per request.
        pause_mode: ``auto`` (suspend runs of deployments, pause others), ``pause``
            or ``suspend``.
        pause_timeout: Seconds to wait for an answer before the run fails.
        poll_interval: Seconds between checks while a run is paused in-process.
        on_timeout: ``fail``, or ``default``: run with an unanswered requirement's
            declared default (see `PersonaRuntime`).
        question_budget: The most questions one run may ask; no limit if unset.
        results: Folder where node results are kept for replay; Prefect's default
            result storage if unset. A resumed run must see its first run's results.
        snapshots: Folder the maintenance flow exports snapshots to;
            ``$PREFECT_HOME/autopersona/snapshots`` if unset.
        step_lock_timeout: Seconds a run waits for a step that another run of the
            same episode is running (see `step_locks`) before it fails with
            `StepLockTimeoutError`: a stuck tool must not hang its replays forever.
        tool_modules: Comma-separated packages or modules whose functions a graph
            given as data (`graph_runner`, e.g. from the UI's run form) may name as
            tools, such as ``examples,my_company.tools``; any if unset. A tool must be
            defined in one of them or in a submodule (its ``__module__``), not only
            imported into one. Whoever may start the deployment can otherwise make
            the worker import any module and call any function.
    """

    model_config = build_settings_config(("integrations", "autopersona"))

    store: SecretStr | None = None  # an address may hold a password
    embedder: str = "semantic"
    policy: str = "evidence"
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_api_key: SecretStr | None = None
    llm_timeout: float = Field(default=30.0, gt=0)
    pause_mode: PauseMode = "auto"
    pause_timeout: int = Field(default=3600, gt=0)
    poll_interval: float = Field(default=1.0, gt=0)
    on_timeout: Literal["fail", "default"] = "fail"
    question_budget: int | None = Field(default=None, ge=0)
    results: Path | None = None
    snapshots: Path | None = None
    step_lock_timeout: float = Field(default=900.0, gt=0)
    tool_modules: str | None = None

    def allows_module(self, module: str) -> bool:
        """Whether functions defined in ``module`` may be tools.

        They may if it is an entry of `tool_modules` or a submodule of one; any
        module's may if `tool_modules` is unset.
        """
        if self.tool_modules is None:
            return True
        allowed = [name.strip() for name in self.tool_modules.split(",") if name.strip()]
        return any(module == name or module.startswith(f"{name}.") for name in allowed)

    def allows_tool(self, tool: str) -> bool:
        """Whether ``tool``'s module (``"package.module:function"``) may be imported.

        Only the first of two checks: `resolve_tool`, given `allows_module`, also
        refuses a function defined elsewhere and imported into an allowed module.
        """
        return self.allows_module(tool.partition(":")[0])

    def store_address(self) -> str:
        """The store's address (see `open_store`), defaulting under ``PREFECT_HOME``."""
        if self.store is None:
            return str(_home("memory"))
        address = self.store.get_secret_value()
        return address if is_postgres(address) else str(Path(address).expanduser())

    def snapshots_path(self) -> Path:
        """The snapshots folder, defaulting under ``PREFECT_HOME``."""
        return self.snapshots.expanduser() if self.snapshots else _home("snapshots")


def _home(name: str) -> Path:
    return get_current_settings().home / "autopersona" / name


def load_settings() -> AutopersonaSettings:
    """The settings as the environment and config files give them.

    Raises:
        FlowConfigurationError: If a value is invalid, naming the setting.
    """
    try:
        return AutopersonaSettings()
    except ValidationError as exc:
        raise FlowConfigurationError(
            f"invalid PREFECT_INTEGRATIONS_AUTOPERSONA_* setting:\n{exc}"
        ) from None


def store_from_settings(settings: AutopersonaSettings | None = None) -> MemoryStore:
    """The memory store the settings name."""
    settings = settings or load_settings()
    return open_store(settings.store_address())


def _policy(
    spec: str, base_url: str | None, model: str | None, api_key: str | None, timeout: float
) -> Policy:
    if spec == "evidence":
        return EvidencePolicy()
    if spec == "openai":
        if not base_url or not model:
            raise FlowConfigurationError(
                "policy 'openai' needs PREFECT_INTEGRATIONS_AUTOPERSONA_LLM_BASE_URL and "
                "PREFECT_INTEGRATIONS_AUTOPERSONA_LLM_MODEL"
            )
        return OpenAICompatiblePolicy(base_url, model, api_key, timeout=timeout)
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise FlowConfigurationError(
            f"unknown policy {spec!r}: use 'evidence', 'openai' or 'package.module:attr'"
        )
    try:
        target: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise FlowConfigurationError(f"cannot import policy {spec!r}: {exc}") from exc
    if isinstance(target, type) or not hasattr(target, "decide"):
        try:
            target = target()
        except Exception as exc:
            raise FlowConfigurationError(f"cannot build policy {spec!r}: {exc}") from exc
    if not hasattr(target, "decide"):
        raise FlowConfigurationError(f"{spec!r} is not a Policy (it has no decide method)")
    return target


@functools.lru_cache(maxsize=8)
def _agent(store: str, embedder: str, policy: tuple[Any, ...]) -> PersonaAgent:
    # One agent per configuration and process keeps its retrieval indexes warm across
    # the runs a long-lived worker or server process executes. Keyed on the settings,
    # not on the objects they build: a policy need not be hashable.
    return PersonaAgent(MemoryBank(open_store(store), get_embedder(embedder)), _policy(*policy))


def agent_from_settings(settings: AutopersonaSettings | None = None) -> PersonaAgent:
    """The PersonaAgent the settings describe: one per configuration and process.

    Its memory is a `MemoryBank` over the store and embedder the settings name
    (``agent.bank``; the runtime's ``bank``).

    Raises:
        FlowConfigurationError: If a setting has an invalid value or names a policy
            that cannot be built.
        EmbedderError: If the embedder setting names no embedder.
    """
    settings = settings or load_settings()
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    policy = (settings.policy, settings.llm_base_url, settings.llm_model, key, settings.llm_timeout)
    return _agent(settings.store_address(), settings.embedder, policy)
