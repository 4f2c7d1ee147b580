"""E-mail subscriptions end to end in process: the API sends a confirmation link through a real SMTP sink on
127.0.0.1 (``aiosmtpd``, with STARTTLS under a local CA), delivers nothing to an unconfirmed address and says
so, and once the link is followed delivers each incident as one message."""

from __future__ import annotations

import re
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from sundial_common.stores import Stores
from sundial_common.stores.notifications import Incident

from tests.integration.test_notifications import SUBSCRIPTIONS, deliveries_of
from tests.support.api import TENANT, Api, serving_api
from tests.support.processes import free_port


class Sink:
    """Keeps every message the relay is given."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], EmailMessage]] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content if isinstance(envelope.content, bytes) else str(envelope.content).encode()
        message = message_from_bytes(content, _class=EmailMessage, policy=policy.default)
        self.messages.append((list(envelope.rcpt_tos), message))
        return "250 OK"


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[tuple[Sink, int, Path]]:
    """An SMTP sink on 127.0.0.1 that requires STARTTLS, with a certificate from a local CA (its bundle)."""
    ca = trustme.CA()
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    sink = Sink()
    port = free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port, tls_context=tls, require_starttls=True)
    controller.start()
    try:
        yield sink, port, bundle
    finally:
        controller.stop()


@pytest.fixture
async def mail_api(database_url: str, redis_url: str, relay: tuple[Sink, int, Path]) -> AsyncIterator[Api]:
    _sink, port, bundle = relay
    async with serving_api(
        database_url,
        redis_url,
        smtp_host="127.0.0.1",
        smtp_port=port,
        smtp_from="sundial@example.com",
        delivery_ca_bundle=str(bundle),
        public_url="http://api.test",
    ) as stack:
        yield stack


async def _dead(stores: Stores) -> None:
    ident = uuid.uuid4()
    incident = Incident(TENANT, "execution.dead", f"execution.dead:{ident}", "demo", None, str(ident), {"jobName": "x"})
    assert (await stores.notifications.record_incidents([incident]))[0] == 1


async def _log(api: Api, subscription: str) -> list[dict[str, Any]]:
    response = await api.client.get(f"{SUBSCRIPTIONS}/{subscription}/deliveries", headers=api.auth())
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_an_address_gets_nothing_but_its_confirmation_link_until_it_is_followed(
    mail_api: Api, relay: tuple[Sink, int, Path], stores: Stores
) -> None:
    sink = relay[0]
    api = mail_api
    for body, field in (
        ({"email": "not an address", "events": ["execution.dead"]}, "email"),
        ({"email": "a@example.com", "url": "https://hooks.example/x", "events": ["execution.dead"]}, "email"),
        ({"events": ["execution.dead"]}, "url"),
    ):
        refused = await api.client.post(SUBSCRIPTIONS, json=body, headers=api.auth())
        assert refused.status_code == 422 and [e["field"] for e in refused.json()["errors"]] == [field], refused.text

    made = await api.client.post(
        SUBSCRIPTIONS, json={"email": "oncall@example.com", "events": ["execution.dead"]}, headers=api.auth()
    )
    assert made.status_code == 201, made.text
    created = made.json()
    assert (created["email"], created["emailConfirmed"], created["url"]) == ("oncall@example.com", False, None)
    [(to, confirmation)] = sink.messages
    assert to == ["oncall@example.com"] and confirmation["From"] == "sundial@example.com"
    link = re.search(r"http://api\.test(/v1/notifications/confirm\?token=\S+)", confirmation.get_content())
    assert link is not None, confirmation.get_content()

    # Unconfirmed: an incident's delivery sends nothing and says why, in the log.
    await _dead(stores)
    assert (await deliveries_of(api).run_once()).failed == 1
    [failed] = await _log(api, created["id"])
    assert failed["state"] == "FAILED" and "not confirmed" in failed["lastError"]
    assert len(sink.messages) == 1

    assert (await api.client.get("/v1/notifications/confirm?token=" + "x" * 40)).status_code == 404
    followed = await api.client.get(link.group(1))  # no sign-in: the token is the proof
    assert followed.status_code == 200 and "oncall@example.com is confirmed" in followed.text
    shown = (await api.client.get(f"{SUBSCRIPTIONS}/{created['id']}", headers=api.auth())).json()
    assert shown["emailConfirmed"] is True

    await _dead(stores)
    assert (await deliveries_of(api).run_once()).delivered == 1
    delivered = next(d for d in await _log(api, created["id"]) if d["state"] == "DELIVERED")
    assert delivered["lastStatus"] == 250
    [_confirmation, (to, message)] = sink.messages
    assert to == ["oncall@example.com"]
    assert message["Subject"] == "[Sundial] execution.dead: x"
    assert message["Message-ID"] == f"<msg_{delivered['id']}@sundial>"
    assert '"type": "execution.dead"' in message.get_content()


async def test_without_a_relay_an_email_subscription_is_refused_naming_the_field(
    database_url: str, redis_url: str
) -> None:
    async with serving_api(database_url, redis_url) as api:
        body = {"email": "oncall@example.com", "events": ["execution.dead"]}
        refused = await api.client.post(SUBSCRIPTIONS, json=body, headers=api.auth())
    assert refused.status_code == 422
    [error] = refused.json()["errors"]
    assert error["field"] == "email" and "SMTP" in error["message"]
