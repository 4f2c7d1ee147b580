"""The gateway transport's choice of gateway: moved off a failing one, back to its first choice later."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
from sundial_worker.gateway_client import GatewayClient

A, B = "http://gateway-a.test", "http://gateway-b.test"


def fresh_token() -> str:
    """A token an hour from expiry (the client reads only its claims; the gateway checks the signature)."""
    claims = json.dumps({"iat": int(time.time()), "exp": int(time.time()) + 3600}).encode()
    return "e30." + base64.urlsafe_b64encode(claims).decode().rstrip("=") + ".sig"


def switchable_gateways(up: dict[str, bool], served: list[str]) -> httpx.MockTransport:
    """Mock gateways A and B: one marked down in ``up`` refuses connections, one up answers an empty pull and is
    recorded in ``served``."""

    def answer(request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}"
        if not up[origin]:
            raise httpx.ConnectError("connection refused", request=request)
        served.append(origin)
        return httpx.Response(200, json={"executions": []})

    return httpx.MockTransport(answer)


def test_a_worker_moved_off_its_first_gateway_goes_back_to_it_once_it_answers() -> None:
    up = {A: False, B: True}
    served: list[str] = []
    gateways = switchable_gateways(up, served)

    async def scenario() -> None:
        client = GatewayClient([A, B], token=fresh_token(), transport=gateways, failback_sec=0.05, start_grace_sec=0)
        try:
            await client.call("/v1/worker/pull", {})  # A is not up (and no start grace): B serves
            await client.call("/v1/worker/pull", {})
            assert served == [B, B]
            up[A] = True
            await asyncio.sleep(0.06)
            await client.call("/v1/worker/pull", {})
            await client.call("/v1/worker/pull", {})
            assert served == [B, B, A, A]
        finally:
            await client.close()

    asyncio.run(scenario())


def test_calls_failing_at_once_move_the_worker_on_once() -> None:
    """Two pulls in flight fail at the same gateway: the worker moves to the next, not back to the failed one."""
    served: list[str] = []
    refused = asyncio.Event()

    async def gateways(request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}"
        if origin == A:
            await refused.wait()  # both calls are at A when it fails
            raise httpx.ConnectError("connection refused", request=request)
        served.append(origin)
        return httpx.Response(200, json={"executions": []})

    async def scenario() -> None:
        client = GatewayClient([A, B], token=fresh_token(), transport=httpx.MockTransport(gateways), start_grace_sec=0)
        try:
            calls = [asyncio.create_task(client.call("/v1/worker/pull", {})) for _ in range(2)]
            await asyncio.sleep(0.05)
            refused.set()
            await asyncio.wait_for(asyncio.gather(*calls), 5)
            assert served == [B, B] and client.url == B
        finally:
            await client.close()

    asyncio.run(scenario())


def test_a_worker_started_beside_its_gateway_waits_for_it_rather_than_moving_away_and_back() -> None:
    up = {A: False, B: True}
    served: list[str] = []
    gateways = switchable_gateways(up, served)

    async def scenario() -> None:
        client = GatewayClient([A, B], token=fresh_token(), transport=gateways, start_grace_sec=5)
        try:
            first = asyncio.create_task(client.call("/v1/worker/pull", {}))
            await asyncio.sleep(0.5)  # A starts half a second after its worker
            up[A] = True
            await asyncio.wait_for(first, 2)
            up[A] = False  # once a gateway has answered, a failure moves the worker at once
            await asyncio.wait_for(client.call("/v1/worker/pull", {}), 2)
            assert served == [A, B]
        finally:
            await client.close()

    asyncio.run(scenario())
