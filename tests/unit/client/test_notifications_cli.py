"""``sundial notifications`` without a server: what it sends, what it prints, its exit codes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sundial_client import Client
from sundial_client.cli import notifications
from sundial_client.cli.common import run
from sundial_common.stores.notifications import EVENTS

SUBSCRIPTION: dict[str, Any] = {
    "id": "0196f1c2-0000-7000-8000-00000000000a",
    "events": ["execution.dead"],
    "url": "https://hooks.example.com/sundial",
    "pool": "reports",
    "jobId": None,
    "description": None,
    "secret": "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I=",
    "createdAt": "2026-11-28T10:00:00Z",
}


def cli(argv: list[str], answer: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[Any]]:
    sent: list[Any] = []

    def api(request: httpx.Request) -> httpx.Response:
        sent.append((request.method, request.url.path, json.loads(request.content) if request.content else None))
        return httpx.Response(200, json=answer)

    with Client("http://api.test", token="t", transport=httpx.MockTransport(api)) as client:
        code = run(notifications.parser(), argv, client)
    return code, capsys.readouterr().out, sent


def test_the_cli_offers_the_servers_events() -> None:
    assert set(notifications.EVENTS) == set(EVENTS)


def test_subscribe_sends_the_events_and_prints_the_secret_once(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["subscribe", "https://hooks.example.com/sundial", "--event", "execution.dead"]
    argv += ["--event", "breaker.opened", "--pool", "reports"]
    code, out, sent = cli(argv, SUBSCRIPTION, capsys)
    assert code == 0
    assert sent == [
        (
            "POST",
            "/v1/notifications/subscriptions",
            {
                "url": "https://hooks.example.com/sundial",
                "events": ["execution.dead", "breaker.opened"],
                "pool": "reports",
            },
        )
    ]
    assert SUBSCRIPTION["secret"] in out and "shown this once" in out


def test_a_test_send_the_receiver_refused_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    answer = {"deliveryId": "d", "delivered": False, "status": 404, "error": None}
    code, out, sent = cli(["test", SUBSCRIPTION["id"]], answer, capsys)
    assert code == 1 and "not delivered: HTTP 404" in out
    assert sent[0][:2] == ("POST", f"/v1/notifications/subscriptions/{SUBSCRIPTION['id']}/test")
    answer = {"deliveryId": "d", "delivered": True, "status": 204, "error": None}
    assert cli(["test", SUBSCRIPTION["id"]], answer, capsys)[0] == 0


def test_an_admin_allows_one_tenants_destination_and_sees_it_listed(capsys: pytest.CaptureFixture[str]) -> None:
    allowance = {
        "tenant": "acme",
        "origin": "https://hooks.internal:8443",
        "addresses": ["10.0.0.7"],
        "allowedBy": "admin",
        "createdAt": "2026-11-28T10:00:00Z",
    }
    code, out, sent = cli(["allow", "acme", "https://hooks.internal:8443/in"], allowance, capsys)
    assert code == 0 and "https://hooks.internal:8443" in out and "10.0.0.7" in out
    assert sent == [
        ("POST", "/v1/admin/notification-destinations", {"tenant": "acme", "url": "https://hooks.internal:8443/in"})
    ]
    code, out, sent = cli(["allowed", "--tenant", "acme"], {"items": [allowance]}, capsys)
    assert code == 0 and "acme" in out and sent[0][:2] == ("GET", "/v1/admin/notification-destinations")
