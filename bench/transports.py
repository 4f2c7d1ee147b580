"""How the bench's workers reach their work: directly, through worker gateways, or as an HTTP target's
delivery workers — the processes each transport starts and what the stack needs set for it."""

from __future__ import annotations

import sys

import httpx
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.auth import symmetric_keys
from sundial_common.security.pool_tokens import issue_pool_token
from sundial_infra.servers.postgres import PostgresServer
from sundial_infra.stack import Ports
from sundial_infra.supervisor import ProcessSpec, sundial_argv

from bench.registration import POOL

#: The id of the pool token the gateways' workers hold (its row is registered with the stack).
POOL_TOKEN_ID = "pt_bench"
#: Gateway i listens on the API's port + this + i.
GATEWAY_PORT_OFFSET = 60
#: The bench token's request limit on its gateways: far above what the run's workers send.
GATEWAY_RATE_PER_TOKEN = 100_000
#: The HTTP target of the ``http`` transport listens on the API's port + this.
RECEIVER_PORT_OFFSET = 59

_APP = ("worker", "--app", "sundial_worker.demo:worker")


def gateway_urls(transport: str, workers: int, ports: Ports) -> list[str]:
    if transport != "gateway":
        return []
    return [f"http://127.0.0.1:{ports.api + GATEWAY_PORT_OFFSET + i}" for i in range(workers)]


def worker_processes(transport: str, workers: int, ports: Ports) -> list[ProcessSpec]:
    if transport == "direct":
        return [ProcessSpec(f"worker-{i}", sundial_argv(*_APP)) for i in range(workers)]
    if transport == "http":
        port = str(ports.api + RECEIVER_PORT_OFFSET)
        receiver = ProcessSpec("receiver", (sys.executable, "-m", "bench.target_receiver", "--port", port))
        delivery = ("worker", "--http-target", POOL)
        return [receiver, *(ProcessSpec(f"worker-{i}", sundial_argv(*delivery)) for i in range(workers))]
    if transport != "gateway":
        raise ValueError(f"worker transport {transport!r}: `direct`, `gateway` or `http`")
    key = symmetric_keys(CommonSettings(env="dev"))[0]
    token = issue_pool_token(key, token_id=POOL_TOKEN_ID, pool=POOL, tenant="bench-api", subject="bench", ttl_sec=86400)
    gateways = gateway_urls(transport, workers, ports)
    specs = []
    for i, url in enumerate(gateways):
        port = url.rsplit(":", 1)[1]
        # The path's cost is measured, not the per-token request limit: at the default (50 requests a second)
        # the workers' one token is throttled (429, a second's wait) long before the gateways are busy.
        unlimited = (("SUNDIAL_GATEWAY_RATE_PER_TOKEN", str(GATEWAY_RATE_PER_TOKEN)),)
        specs.append(ProcessSpec(f"gateway-{i}", sundial_argv("gateway", "--port", port), env=unlimited))
        # Each worker starts with a gateway of its own and moves to the others if it fails.
        urls = ",".join(gateways[i:] + gateways[:i])
        env = (("SUNDIAL_WORKER_GATEWAY", urls), ("SUNDIAL_WORKER_TOKEN", token))
        specs.append(ProcessSpec(f"worker-{i}", sundial_argv(*_APP), env=env))
    return specs


def set_http_target(postgres: PostgresServer, ports: Ports, token: str) -> None:
    """Make the bench pool an HTTP pool whose target is the receiver (the pool's owner sets it over the API)."""
    postgres.psql(f"UPDATE pools SET delivery = 'http' WHERE name = '{POOL}'", database=postgres.database)
    receiver = f"http://127.0.0.1:{ports.api + RECEIVER_PORT_OFFSET}/run"
    answer = httpx.put(
        f"http://127.0.0.1:{ports.api}/v1/pools/{POOL}/target",
        json={"url": receiver},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"bench target not set: {answer.status_code} {answer.text}")
