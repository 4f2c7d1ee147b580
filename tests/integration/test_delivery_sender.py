"""The outbound sender against real HTTP and HTTPS receivers on 127.0.0.1 (no Sundial server needed)."""

from __future__ import annotations

import ipaddress
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from standardwebhooks import Webhook
from sundial_common.delivery.address_policy import AddressPolicy
from sundial_common.delivery.sender import OutboundRequest, Sender, SenderConfig
from sundial_common.delivery.signing import new_secret
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.runtime.clock import SystemClock

from tests.support.webhook_receiver import Reply, WebhookReceiver, running_receiver

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)
BODY = b'{"event":"test"}'
POLICY = RetryPolicy(max_attempts=3, backoff="FIXED", initial_delay_ms=10, max_delay_ms=120_000, jitter=False)


class RecordingClock(SystemClock):
    """Real time, but a retry's wait is recorded instead of slept."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with running_receiver() as r:
        yield r


def request(url: str, secret: str, *, allowed: bool = True) -> OutboundRequest:
    return OutboundRequest(url, BODY, "msg_42", (secret,), "test", allowed=LOOPBACK if allowed else ())


async def test_loopback_is_refused_until_an_administrator_allows_it(receiver: WebhookReceiver) -> None:
    secret = new_secret()
    async with Sender(SenderConfig(allow_http=True)) as sender:
        refused = await sender.send(request(receiver.url + "/hook", secret, allowed=False))
        assert refused.refused and "127.0.0.1 is loopback" in (refused.error or "")
        assert receiver.received == []
    async with Sender(SenderConfig(allow_http=True, policy=AddressPolicy.from_strings(["127.0.0.0/8"]))) as sender:
        sent = await sender.send(request(receiver.url + "/hook", secret, allowed=False))
    assert sent.ok and len(receiver.received) == 1


async def test_the_receiver_verifies_the_signature_with_the_reference_library(receiver: WebhookReceiver) -> None:
    secret = new_secret()
    receiver.script(Reply(200, b'{"thanks":true}'))
    async with Sender(SenderConfig(allow_http=True)) as sender:
        outcome = await sender.send(request(receiver.url + "/hook?x=1", secret))
    assert outcome.ok and outcome.body == b'{"thanks":true}'
    [got] = receiver.received
    assert got.method == "POST" and got.path == "/hook?x=1" and got.headers["host"] == f"127.0.0.1:{receiver.port}"
    assert Webhook(secret).verify(got.body, got.headers) == {"event": "test"}
    assert abs(int(got.headers["webhook-timestamp"]) - time.time()) < 60


async def test_5xx_is_retried_and_4xx_is_not(receiver: WebhookReceiver) -> None:
    clock = RecordingClock()
    async with Sender(SenderConfig(allow_http=True), clock=clock) as sender:
        receiver.script(Reply(503), Reply(500), Reply(204))
        ok = await sender.deliver(request(receiver.url, new_secret()), POLICY)
        assert ok.ok and ok.attempts == 3 and clock.slept == [0.01, 0.01]
        receiver.script(Reply(404))
        failed = await sender.deliver(request(receiver.url, new_secret()), POLICY)
    assert failed.status == 404 and failed.attempts == 1 and not failed.retryable
    assert {r.headers["webhook-id"] for r in receiver.received} == {"msg_42"}  # stable across retries


async def test_429_waits_what_retry_after_asks(receiver: WebhookReceiver) -> None:
    clock = RecordingClock()
    receiver.script(Reply(429, headers={"Retry-After": "7"}), Reply(200))
    async with Sender(SenderConfig(allow_http=True), clock=clock) as sender:
        outcome = await sender.deliver(request(receiver.url, new_secret()), POLICY)
    assert outcome.ok and outcome.attempts == 2 and clock.slept == [7.0]


async def test_a_slow_receiver_times_out_and_is_retryable(receiver: WebhookReceiver) -> None:
    receiver.script(Reply(200, delay_sec=5))
    config = SenderConfig(allow_http=True, connect_timeout_sec=0.5, total_timeout_sec=0.5)
    async with Sender(config) as sender:
        started = time.monotonic()
        outcome = await sender.send(request(receiver.url, new_secret()))
    assert outcome.status is None and outcome.retryable and "no response within 0.5 s" in (outcome.error or "")
    assert time.monotonic() - started < 3


async def test_big_bodies_are_capped_and_redirects_not_followed(receiver: WebhookReceiver) -> None:
    async with Sender(SenderConfig(allow_http=True, max_response_bytes=1000)) as sender:
        receiver.script(Reply(200, b"x" * 100_000))
        big = await sender.send(request(receiver.url, new_secret()))
        assert big.ok and big.truncated and big.body == b"x" * 1000
        receiver.script(Reply(302, headers={"Location": "http://169.254.169.254/latest/meta-data/"}))
        moved = await sender.send(request(receiver.url, new_secret()))
    assert moved.status == 302 and not moved.ok and not moved.retryable
    assert len(receiver.received) == 2


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path]:
    ca = trustme.CA()
    bundle = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    return ca, bundle


async def test_https_with_a_ca_bundle(local_ca: tuple[trustme.CA, Path]) -> None:
    ca, bundle = local_ca
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    secret = new_secret()
    async with running_receiver(server_tls) as receiver:
        async with Sender(SenderConfig(ca_bundle=str(bundle))) as sender:
            outcome = await sender.send(request(receiver.url + "/tls", secret))
        assert outcome.ok, outcome.error
        Webhook(secret).verify(receiver.received[0].body, receiver.received[0].headers)
        async with Sender(SenderConfig()) as untrusting:  # the system's CAs do not know the local one
            refused = await untrusting.send(request(receiver.url + "/tls", secret))
        assert refused.status is None and "CERTIFICATE_VERIFY_FAILED" in (refused.error or "")
        async with Sender(SenderConfig(allow_http=False)) as sender:
            plain = await sender.send(request(receiver.url.replace("https", "http"), secret))
        assert plain.refused and "https://" in (plain.error or "")
