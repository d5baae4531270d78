"""Telling a person a run waits for them: a Prefect automation on our clarification event.

A scheduled run that asks at 03:00 waits for nobody unless someone is told. Prefect
already has the machinery: an automation whose trigger is the run's
``autopersona.clarification.requested`` event (see `autopersona_flows.flows.events`)
and whose action calls a webhook or sends through any notification block (Slack,
email, Microsoft Teams, a custom webhook). This module only creates it.

Why our own event and not Prefect's ``prefect.flow-run.Paused`` / ``Suspended``: those
carry no question, and ``{{ flow_run|ui_url }}`` renders "None" on a server started
before its API URL was configured; our event carries the question, the options and a
link computed where the run is.
"""

from __future__ import annotations

from datetime import timedelta
from typing import cast
from uuid import UUID

from prefect.automations import (
    Automation,
    AutomationCore,
    CallWebhook,
    EventTrigger,
    Posture,
    SendNotification,
)
from prefect.blocks.webhook import Webhook
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.types import SecretDict
from pydantic import SecretStr

from autopersona_flows import _json
from autopersona_flows.errors import NotificationError
from autopersona_flows.flows.events import CLARIFICATION_REQUESTED

__all__ = [
    "DEFAULT_AUTOMATION_NAME",
    "WEBHOOK_PAYLOAD",
    "create_clarification_automation",
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


def _webhook_block(url: str) -> UUID:
    if not url.startswith(("http://", "https://")):
        raise NotificationError(f"{url!r} is not an http(s) URL: give the webhook's full address")
    block = Webhook(
        method="POST",
        url=SecretStr(url),
        headers=SecretDict({"Content-Type": "application/json"}),
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


def create_clarification_automation(
    *,
    webhook_url: str | None = None,
    block_slug: str | None = None,
    name: str = DEFAULT_AUTOMATION_NAME,
) -> Automation:
    """Create the automation that tells a person when a run waits for their answer.

    It fires on every ``autopersona.clarification.requested`` event, within a fraction
    of a second, and sends the question and the run's link. An automation of the same
    ``name`` is replaced, so calling this again changes where notifications go.

    Args:
        webhook_url: POST a JSON body to this URL (``text``: the message with the
            question and link; also ``url``, ``flow_run_id``, ``user_id``, ``questions``,
            ``occurred``; see `WEBHOOK_PAYLOAD`). A Prefect ``Webhook`` block is saved
            for it, and the action is ``call-webhook``.
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
    action: CallWebhook | SendNotification
    if webhook_url is not None:
        action = CallWebhook(block_document_id=_webhook_block(webhook_url), payload=WEBHOOK_PAYLOAD)
    else:
        assert block_slug is not None  # exactly one was given
        action = SendNotification(
            block_document_id=_notification_block_id(block_slug), subject=_SUBJECT, body=_BODY
        )
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
        for existing in client.read_automations_by_name(name):
            client.delete_automation(existing.id)
        created = client.create_automation(automation)
    return Automation.model_validate({**automation.model_dump(), "id": created})
