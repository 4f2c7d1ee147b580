"""Which addresses outbound requests may reach: the pure check, and the sender's use of it with a stub resolver.

No test here sends a packet: the sender's transport is replaced by one that records what it was asked to do.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest
from sundial_common.delivery.address_policy import AddressPolicy, AddressRefused, IPAddress, check_addresses, refusal
from sundial_common.delivery.sender import OutboundRequest, Sender, SenderConfig, URLRefused, check_url
from sundial_common.delivery.signing import new_secret
from sundial_common.testing.clock import FakeClock

REFUSED = {
    "127.0.0.1": "loopback",
    "127.8.9.10": "loopback",
    "0.0.0.0": "unspecified",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "169.254.169.254": "metadata",
    "169.254.10.10": "link-local",
    "100.64.0.1": "carrier-grade NAT",
    "100.100.100.200": "carrier-grade NAT",
    "224.0.0.1": "multicast",
    "255.255.255.255": "reserved",
    "::": "unspecified",
    "::1": "loopback",
    "::ffff:127.0.0.1": "IPv4-mapped",
    "::ffff:8.8.8.8": "IPv4-mapped",
    "64:ff9b::a9fe:a9fe": "NAT64",
    "fd00:ec2::254": "metadata",
    "fc00::1": "private",
    "fd12:3456::1": "private",
    "fe80::1": "link-local",
    "ff02::1": "multicast",
    "2001:db8::1": "not a public address",
}


@pytest.mark.parametrize("text", sorted(REFUSED))
def test_internal_addresses_are_refused(text: str) -> None:
    reason = refusal(ipaddress.ip_address(text), AddressPolicy())
    assert reason is not None and REFUSED[text] in reason


@pytest.mark.parametrize("text", ["93.184.215.14", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_pass(text: str) -> None:
    assert refusal(ipaddress.ip_address(text), AddressPolicy()) is None


def test_an_administrator_can_allow_a_network() -> None:
    policy = AddressPolicy.from_strings(["127.0.0.1", "10.20.0.0/16"])
    assert refusal(ipaddress.ip_address("127.0.0.1"), policy) is None
    assert refusal(ipaddress.ip_address("10.20.3.4"), policy) is None
    assert refusal(ipaddress.ip_address("10.21.0.1"), policy) is not None
    assert refusal(ipaddress.ip_address("169.254.169.254"), policy) is not None
    with pytest.raises(ValueError, match="not-a-net"):
        AddressPolicy.from_strings(["not-a-net"])


def test_one_private_record_among_public_ones_refuses_the_name() -> None:
    addresses: list[IPAddress] = [ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("10.0.0.5")]
    with pytest.raises(AddressRefused, match=r"hooks\.example resolves to 10\.0\.0\.5, a private network"):
        check_addresses("hooks.example", addresses, AddressPolicy())
    with pytest.raises(AddressRefused, match="no address"):
        check_addresses("hooks.example", [], AddressPolicy())


@pytest.mark.parametrize(
    ("url", "allow_http", "why"),
    [
        ("http://hooks.example/x", False, "https://"),
        ("ftp://hooks.example/x", True, "https://"),
        ("https://user:pw@hooks.example/x", False, "user name or password"),
        ("https://hooks.example/x\r\nX-Evil: 1", False, "control characters"),
        ("https:///nohost", False, "host"),
    ],
)
def test_bad_urls_are_refused(url: str, allow_http: bool, why: str) -> None:
    with pytest.raises(URLRefused, match=why):
        check_url(url, allow_http)


class StubResolver:
    """Answers from a table and counts the questions (a rebinding attack needs a second one)."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.questions: list[str] = []

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        self.questions.append(host)
        return [ipaddress.ip_address(a) for a in self.table[host]]


class EmptyStream(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b""


def recording_transport(seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204, stream=EmptyStream())

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    "addresses", [["169.254.169.254"], ["10.0.0.7"], ["fe80::1"], ["::ffff:169.254.169.254"], ["8.8.8.8", "127.0.0.1"]]
)
async def test_the_sender_sends_nothing_to_a_refused_address(addresses: list[str]) -> None:
    seen: list[httpx.Request] = []
    resolver = StubResolver({"hooks.example": addresses})
    async with Sender(SenderConfig(), resolver=resolver, transport=recording_transport(seen)) as sender:
        outcome = await sender.send(
            OutboundRequest("https://hooks.example/in", b"{}", "msg_1", (new_secret(),), "test")
        )
    assert outcome.refused and not outcome.retryable and "unless an administrator allows it" in (outcome.error or "")
    assert seen == []


async def test_the_sender_connects_to_the_address_it_checked() -> None:
    seen: list[httpx.Request] = []
    resolver = StubResolver({"hooks.example": ["93.184.215.14"]})
    async with Sender(SenderConfig(), resolver=resolver, transport=recording_transport(seen)) as sender:
        outcome = await sender.send(
            OutboundRequest("https://hooks.example:8443/in?a=1", b"{}", "msg_1", (new_secret(),), "test")
        )
    assert outcome.status == 204 and outcome.address == "93.184.215.14"
    assert resolver.questions == ["hooks.example"]
    [request] = seen
    assert request.url.host == "93.184.215.14" and request.url.port == 8443 and request.url.path == "/in"
    assert request.headers["host"] == "hooks.example:8443"
    assert request.extensions["sni_hostname"] == "hooks.example"


async def test_an_ipv6_destination_is_reached_at_its_checked_address() -> None:
    seen: list[httpx.Request] = []
    resolver = StubResolver({"hooks.example": ["2606:4700::1111"]})
    async with Sender(SenderConfig(), resolver=resolver, transport=recording_transport(seen)) as sender:
        outcome = await sender.send(OutboundRequest("https://hooks.example/in", b"{}", "m", (new_secret(),), "test"))
    assert outcome.ok and str(seen[0].url).startswith("https://[2606:4700::1111]/in")
    assert seen[0].headers["host"] == "hooks.example"


async def test_header_values_with_line_breaks_are_refused() -> None:
    seen: list[httpx.Request] = []
    resolver = StubResolver({"hooks.example": ["93.184.215.14"]})
    async with Sender(SenderConfig(), resolver=resolver, transport=recording_transport(seen)) as sender:
        outcome = await sender.send(
            OutboundRequest(
                "https://hooks.example/in", b"{}", "m", (new_secret(),), "test", headers={"X-A": "1\r\nX-B: 2"}
            )
        )
    assert outcome.refused and "line break" in (outcome.error or "") and seen == []


async def test_a_resolution_is_reused_briefly_and_still_checked_on_every_request() -> None:
    seen: list[httpx.Request] = []
    clock = FakeClock()
    resolver = StubResolver({"hooks.example": ["93.184.215.14"]})
    request = OutboundRequest("https://hooks.example/in", b"{}", "msg_1", (new_secret(),), "test")
    config = SenderConfig(resolve_ttl_sec=5.0)
    async with Sender(config, resolver=resolver, clock=clock, transport=recording_transport(seen)) as sender:
        first = await sender.send(request)
        resolver.table["hooks.example"] = ["10.0.0.7"]  # the record changes within the TTL: not asked again
        second = await sender.send(request)
        clock.advance(5.1)
        third = await sender.send(request)  # asked again: the new answer is checked and refused
    assert first.status == second.status == 204 and second.address == "93.184.215.14"
    assert third.refused and "10.0.0.7" in (third.error or "")
    assert resolver.questions == ["hooks.example", "hooks.example"]
    assert [r.url.host for r in seen] == ["93.184.215.14", "93.184.215.14"]


async def test_a_kept_resolution_is_checked_against_each_request_s_own_policy() -> None:
    seen: list[httpx.Request] = []
    resolver = StubResolver({"hooks.internal": ["10.0.0.7"]})
    allowed = OutboundRequest(
        "https://hooks.internal/in",
        b"{}",
        "msg_1",
        (new_secret(),),
        "test",
        allowed=(ipaddress.ip_network("10.0.0.0/8"),),
    )
    async with Sender(SenderConfig(), resolver=resolver, transport=recording_transport(seen)) as sender:
        assert (await sender.send(allowed)).status == 204
        refused = await sender.send(replace(allowed, allowed=()))
    assert refused.refused and resolver.questions == ["hooks.internal"] and len(seen) == 1
