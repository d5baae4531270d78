"""Telling a person a run waits for them: a Prefect automation on our clarification event.

A scheduled run that asks at 03:00 waits for nobody unless someone is told. Prefect
already has the machinery: an automation whose trigger is the run's
``autopersona.clarification.requested`` event (see `autopersona_flows.flows.events`)
and whose action sends through a notification block (Slack, email, Microsoft Teams,
a custom webhook). This module creates, lists and deletes those automations.

Why our own event and not Prefect's ``prefect.flow-run.Paused`` / ``Suspended``: those
carry no question, and ``{{ flow_run|ui_url }}`` renders "None" on a server started
before its API URL was configured; our event carries the question, the options and a
link computed where the run is.

Why a webhook URL is sent through a ``custom-webhook`` notification block and not
Prefect's ``Webhook`` block with a ``call-webhook`` action: in Prefect 3.9.1 every
``Webhook`` block shares one module-wide HTTP transport, and each call closes it on
its way out (``async with self._client``), cutting the connections of the calls
running beside it ("Webhook call failed: ReadError('')"); the action then counts as
failed and is never tried again, and an error status (a 503) counts as delivered.
The custom webhook block opens a client of its own per call, and raises on a failed
or refused request, which Prefect's action consumer retries (``ActionFailed`` is the
only failure it gives up on).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlsplit
from uuid import UUID

from prefect.automations import (
    Automation,
    AutomationCore,
    CallWebhook,
    EventTrigger,
    Posture,
    SendNotification,
)
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.events.schemas.automations import Automation as SavedAutomation
from prefect.exceptions import ObjectNotFound
from prefect.types import SecretDict
from pydantic import BaseModel, ConfigDict

from autopersona_flows import _json
from autopersona_flows.errors import NotificationError
from autopersona_flows.flows.events import CLARIFICATION_REQUESTED

__all__ = [
    "DEFAULT_AUTOMATION_NAME",
    "WEBHOOK_PAYLOAD",
    "ClarificationAutomation",
    "create_clarification_automation",
    "delete_clarification_automation",
    "list_clarification_automations",
]

DEFAULT_AUTOMATION_NAME = "autopersona: a run is waiting for an answer"
"""The automation's name; creating it again under the same name replaces it."""

WEBHOOK_PAYLOAD = (
    "{"
    '"text": {{ event.payload.message | tojson }}, '
    '"url": {{ event.payload.url | tojson }}, '
    '"flow_run_id": {{ event.payload.flow_run_id | tojson }}, '
    '"user_id": {{ event.payload.user_id | tojson }}, '
    '"questions": {{ event.payload.questions | tojson }}, '
    '"occurred": {{ event.occurred | string | tojson }}'
    "}"
)
"""The JSON a webhook receives: ``text`` (what Slack-style hooks show) is the message."""

_SUBJECT = "A run is waiting for your answer"
_BODY = "{{ event.payload.message }}"

# The blocks this module saves for a webhook URL (and, before, `Webhook` blocks): one
# per address, named by its digest. Only these are ever deleted with an automation.
_SAVED_BLOCK = re.compile(r"autopersona-[0-9a-f]{12}")
_PAGE = 200  # the Prefect API's default (and largest) page of automations


class ClarificationAutomation(BaseModel):
    """An automation that sends our questions, as `list_clarification_automations` sees it.

    Attributes:
        name: The automation's name.
        id: Its id in Prefect.
        enabled: Whether it fires (it can be switched off in the Prefect UI).
        sends_to: Where it sends: ``"webhook https://host/…"`` for a URL given to
            `create_clarification_automation` (the rest of the URL is a secret), else
            the notification block's slug, ``"<block type>/<block name>"``.
        outdated: Made by an earlier version with a ``call-webhook`` action, which
            loses notifications fired at the same moment: create it again under its
            name to replace it.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    id: UUID
    enabled: bool
    sends_to: str
    outdated: bool = False


def _webhook_block(url: str) -> UUID:
    if not url.startswith(("http://", "https://")):
        raise NotificationError(f"{url!r} is not an http(s) URL: give the webhook's full address")
    address = urlsplit(url)
    port = f":{address.port}" if address.port else ""
    block = CustomWebhookNotificationBlock(
        # Shown in the UI and by `notify ls`; a hook's path is often its credential, so
        # the URL itself is kept among the block's secrets.
        name=f"webhook {address.scheme}://{address.hostname}{port}/…",
        url="{{webhook_url}}",
        secrets=SecretDict({"webhook_url": url}),
        method="POST",
        headers={"Content-Type": "application/json"},
        form_data="{{body}}",  # the rendered WEBHOOK_PAYLOAD, sent as it is
    )
    # One block per address, so creating the automation again reuses it.
    name = f"autopersona-{_json.digest({'webhook': url})[:12]}"
    # `_sync`: run Prefect's sync implementation even when called inside an event loop.
    return cast(UUID, block.save(name, overwrite=True, _sync=True))  # type: ignore[call-arg]  # Prefect's dispatch flag, not in the signature


def _notification_block_id(slug: str) -> UUID:
    block_type, _, name = slug.partition("/")
    if not block_type or not name:
        raise NotificationError(
            f"{slug!r} is not a block slug: give '<block type>/<block name>', "
            "e.g. 'slack-webhook/team' (`prefect block ls` lists them)"
        )
    with get_client(sync_client=True) as client:
        try:
            document = client.read_block_document_by_name(name, block_type, include_secrets=False)
        except ObjectNotFound:
            raise NotificationError(
                f"there is no {block_type!r} block named {name!r}: create it in the Prefect "
                f"UI (Blocks) or with `prefect block create {block_type}`"
            ) from None
    capabilities = document.block_schema.capabilities if document.block_schema else []
    if "notify" not in capabilities:
        raise NotificationError(
            f"the {block_type!r} block {name!r} cannot send notifications: use a "
            "notification block (slack-webhook, email, ms-teams-webhook, "
            "custom-webhook, ...) or pass a webhook URL instead"
        )
    return document.id


def _all_automations(client: SyncPrefectClient) -> list[SavedAutomation]:
    found: list[SavedAutomation] = []
    while page := client.read_automations(limit=_PAGE, offset=len(found)):
        found += page
        if len(page) < _PAGE:
            break
    return found


def _is_ours(automation: SavedAutomation) -> bool:
    trigger = automation.trigger
    return isinstance(trigger, EventTrigger) and CLARIFICATION_REQUESTED in trigger.expect


def _block_ids(automations: Iterable[SavedAutomation]) -> Iterator[UUID]:
    for automation in automations:
        for action in [
            *automation.actions,
            *automation.actions_on_trigger,
            *automation.actions_on_resolve,
        ]:
            block_id = getattr(action, "block_document_id", None)
            if isinstance(block_id, UUID):
                yield block_id


def _describe(client: SyncPrefectClient, automation: SavedAutomation) -> ClarificationAutomation:
    places = []
    for block_id in _block_ids([automation]):
        try:
            document = client.read_block_document(block_id, include_secrets=False)
        except ObjectNotFound:
            places.append(f"a deleted block ({block_id})")
            continue
        data: dict[str, Any] = document.data
        slug = document.block_type.slug if document.block_type else "block"
        saved = document.name is not None and _SAVED_BLOCK.fullmatch(document.name)
        if saved and slug == "custom-webhook" and isinstance(data.get("name"), str):
            places.append(data["name"])
        else:
            places.append(f"{slug}/{document.name}")
    return ClarificationAutomation(
        name=automation.name,
        id=automation.id,
        enabled=automation.enabled,
        sends_to=", ".join(places) or "nowhere (no notification action)",
        outdated=any(isinstance(action, CallWebhook) for action in automation.actions),
    )


def _delete(
    client: SyncPrefectClient,
    doomed: list[SavedAutomation],
    kept: list[SavedAutomation],
    *also: UUID,
) -> None:
    """Delete ``doomed``, and the blocks saved for them that no automation still uses."""
    for automation in doomed:
        client.delete_automation(automation.id)
    in_use = {*_block_ids(kept), *also}
    for block_id in set(_block_ids(doomed)) - in_use:
        try:
            document = client.read_block_document(block_id, include_secrets=False)
        except ObjectNotFound:
            continue
        if document.name is not None and _SAVED_BLOCK.fullmatch(document.name):
            client.delete_block_document(block_id)


def create_clarification_automation(
    *,
    webhook_url: str | None = None,
    block_slug: str | None = None,
    name: str = DEFAULT_AUTOMATION_NAME,
) -> Automation:
    """Create the automation that tells a person when a run waits for their answer.

    It fires on every ``autopersona.clarification.requested`` event, within a fraction
    of a second, and sends the question and the run's link. An automation of the same
    ``name`` is replaced (the new one is created first, so no question falls between
    the two), so calling this again changes where notifications go, and turns one
    made by an earlier version into one that does not lose notifications.

    Args:
        webhook_url: POST a JSON body to this URL (``text``: the message with the
            question and link; also ``url``, ``flow_run_id``, ``user_id``, ``questions``,
            ``occurred``; see `WEBHOOK_PAYLOAD`). A Prefect ``custom-webhook``
            notification block named ``autopersona-<digest>`` is saved for it, with the
            URL among its secrets; the action is ``send-notification``. A request that
            fails or is answered with an error status is tried again.
        block_slug: Send through this Prefect notification block instead,
            ``"<block type>/<block name>"`` (e.g. ``"slack-webhook/team"``); the action
            is ``send-notification`` with the message as its body.
        name: The automation's name.

    Returns:
        The automation as created, with its ``id``.

    Raises:
        NotificationError: If neither or both of ``webhook_url`` and ``block_slug``
            are given, the URL is not http(s), or the block does not exist or cannot
            notify. Nothing is created then.
    """
    if (webhook_url is None) == (block_slug is None):
        raise NotificationError(
            "give exactly one of webhook_url (any URL that accepts a JSON POST) and "
            "block_slug (a Prefect notification block, '<type>/<name>')"
        )
    if webhook_url is not None:
        block_id, body = _webhook_block(webhook_url), WEBHOOK_PAYLOAD
    else:
        assert block_slug is not None  # exactly one was given
        block_id, body = _notification_block_id(block_slug), _BODY
    action = SendNotification(block_document_id=block_id, subject=_SUBJECT, body=body)
    automation = AutomationCore(
        name=name,
        description="Sends the question and the run's link when a run waits for an answer.",
        trigger=EventTrigger(
            expect={CLARIFICATION_REQUESTED},
            match={"prefect.resource.id": "prefect.flow-run.*"},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[action],
    )
    with get_client(sync_client=True) as client:
        existing = _all_automations(client)
        replaced = [a for a in existing if a.name == name]
        created = client.create_automation(automation)
        _delete(client, replaced, [a for a in existing if a.name != name], block_id)
    return Automation.model_validate({**automation.model_dump(), "id": created})


def list_clarification_automations() -> list[ClarificationAutomation]:
    """The automations that send our questions: every one triggered by our event.

    Those made by `create_clarification_automation` and any made by hand (in the
    Prefect UI, say) on ``autopersona.clarification.requested``, oldest first.

    Returns:
        One `ClarificationAutomation` each: name, id, whether it is enabled, where it
        sends, and whether it is an outdated ``call-webhook`` one.
    """
    with get_client(sync_client=True) as client:
        return [_describe(client, a) for a in _all_automations(client) if _is_ours(a)]


def delete_clarification_automation(
    name_or_id: str | UUID = DEFAULT_AUTOMATION_NAME,
) -> list[ClarificationAutomation]:
    """Delete the automations of this name (or this id) that send our questions.

    The ``custom-webhook`` block saved for a webhook URL goes with it, unless another
    automation still sends through it; a block of yours named by ``block_slug`` stays.
    An automation on other events is never deleted, whatever its name.

    Args:
        name_or_id: The automation's name or id, as `list_clarification_automations`
            gives them.

    Returns:
        The automations deleted.

    Raises:
        NotificationError: If no automation on our event has that name or id.
    """
    wanted = str(name_or_id)
    with get_client(sync_client=True) as client:
        everything = _all_automations(client)
        doomed = [
            a
            for a in everything
            if _is_ours(a) and (a.name == wanted or str(a.id) == wanted.strip().lower())
        ]
        if not doomed:
            raise NotificationError(
                f"no automation named or with id {wanted!r} sends our questions: "
                "`autopersona notify ls` lists them"
            )
        deleted = [_describe(client, a) for a in doomed]
        _delete(client, doomed, [a for a in everything if a.id not in {d.id for d in doomed}])
    return deleted
