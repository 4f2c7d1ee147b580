"""``python -m bench console``: the web console's page timings with one tenant's 100,000 jobs and 1,000,000 executions.

On a Postgres and a Redis of the bench's own (``BENCH_PORTS + --port-offset``), the schema migrated, one tenant
gets ``--jobs`` jobs (a tenth paused, a few names sharing a prefix) and ``--executions`` executions spread over
them (1 % DEAD, the rest SUCCEEDED; written with triggers off, as a restore would), plus as many of another
tenant's. Then a real ``sundial api`` process is started and signed in to, and each console page is fetched
``--requests`` times one after another: the time to the first byte (the pages are rendered whole, so that is
the page) as P50/P95/max in milliseconds. With Debian's chromium present, Playwright also loads the jobs list
in a real browser ``--loads`` times (navigation start to the load event).

One JSON line goes to stdout and ``bench/results/console.jsonl`` (:mod:`bench.results`). It measures; it never
passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import time
from typing import Any

import asyncpg
import httpx
from sundial_common.runtime.settings import DEV_SIGNING_KEY
from sundial_common.security.auth import issue_token
from sundial_infra.servers.redis import RedisServer
from sundial_infra.stack import BENCH_PORTS
from sundial_infra.supervisor import sundial_argv

from bench import results
from bench.figures import percentiles
from bench.harness import add_own_server_options, own_postgres

TENANT = "bench"
OTHER = "bench-other"
CHROMIUM = "/usr/bin/chromium"

#: A UUIDv7 of instant {ts}: executions are partitioned by day on the id's time, and pages key on the id.
_V7 = (
    "encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) placing "
    "substring(int8send((extract(epoch FROM {ts}) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid"
)
_SEED = """
SET session_replication_role = replica;  -- no triggers: no outbox rows, no dependency or breaker bookkeeping
INSERT INTO tenants (id) VALUES ('{tenant}') ON CONFLICT DO NOTHING;
INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, shard, state, schedule, timezone,
                  next_fire_at, next_nominal_at, created_at)
SELECT {job_id}, '{tenant}', CASE WHEN n % 1000 = 0 THEN 'nightly-' ELSE 'job-' END || n, 'CRON',
       'demo', 'h' || (n % 20), 60, n % 8, CASE WHEN n % 10 = 0 THEN 'PAUSED' ELSE 'ACTIVE' END,
       '*/5 * * * *', 'Europe/Paris', now() + (n % 300) * interval '1 second',
       now() + (n % 300) * interval '1 second', now() - (n * interval '1 second')
FROM generate_series(1, {jobs}) AS n;
INSERT INTO executions (id, tenant_id, job_id, scheduled_for, fire_at, shard, fence_token, pool, handler, state,
                        timeout_sec, attempt, max_attempts, started_at, finished_at, worker_id, created_at)
SELECT {execution_id}, '{tenant}', j.id, now() - (e * interval '1 minute'), now() - (e * interval '1 minute'),
       j.shard, 1, j.pool, j.handler, CASE WHEN e % 100 = 0 THEN 'DEAD' ELSE 'SUCCEEDED' END, 60, 1, 3,
       now() - (e * interval '1 minute'), now() - (e * interval '1 minute') + interval '20 ms', 'w',
       now() - (e * interval '1 minute')
FROM (SELECT id, shard, pool, handler, row_number() OVER () AS r FROM jobs WHERE tenant_id = '{tenant}') AS j,
     generate_series(1, {per_job}) AS k, LATERAL (SELECT (j.r * {per_job} + k) AS e) AS x;
"""


async def seed(dsn: str, jobs: int, executions: int) -> dict[str, float]:
    conn = await asyncpg.connect(dsn)
    took: dict[str, float] = {}
    try:
        for tenant in (TENANT, OTHER):
            started = time.monotonic()
            sql = _SEED.format(
                tenant=tenant,
                jobs=jobs,
                per_job=max(1, executions // jobs),
                job_id=_V7.format(ts="now() - n * interval '1 millisecond'"),
                execution_id=_V7.format(ts="now() - x.e * interval '1 millisecond'"),
            )
            await conn.execute(sql)
            took[tenant] = round(time.monotonic() - started, 1)
        for table in ("jobs", "executions"):
            await conn.execute(f"VACUUM ANALYZE {table}")
    finally:
        await conn.close()
    return took


async def _ids(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        job = await conn.fetchval("SELECT id FROM jobs WHERE tenant_id = $1 ORDER BY id DESC LIMIT 1", TENANT)
        execution = await conn.fetchval(
            "SELECT id FROM executions WHERE tenant_id = $1 AND state = 'DEAD' ORDER BY id DESC LIMIT 1", TENANT
        )
    finally:
        await conn.close()
    return {"job": str(job), "execution": str(execution)}


async def time_pages(base: str, token: str, ids: dict[str, str], requests: int) -> dict[str, Any]:
    pages = {
        "jobs": "/ui/jobs",
        "jobs_paused": "/ui/jobs?state=PAUSED",
        "jobs_name_prefix": "/ui/jobs?q=nightly-",
        "jobs_handler": "/ui/jobs?handler=h7",
        "jobs_next_fire": "/ui/jobs?sort=next-fire",
        "jobs_next_fire_paused": "/ui/jobs?sort=next-fire&state=PAUSED",
        "job": f"/ui/jobs/{ids['job']}",
        "execution": f"/ui/executions/{ids['execution']}",
        "dead_letters": "/ui/dead-letters",
        "pools": "/ui/pools",
        "job_edit": f"/ui/jobs/{ids['job']}/edit",
        "job_backfills": f"/ui/jobs/{ids['job']}/backfills",
    }
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        form = await client.get("/ui/sign-in")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf, form.text[:500]
        signed = await client.post("/ui/sign-in", data={"csrf": csrf.group(1), "token": token})
        assert signed.status_code == 303, signed.text[:500]
        timings: dict[str, Any] = {}
        for name, path in pages.items():
            samples = []
            for _ in range(requests):
                started = time.perf_counter()
                async with client.stream("GET", path) as response:
                    samples.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 200, (path, response.status_code)
                    await response.aread()
            timings[name] = percentiles(samples)
        return timings


async def browser_loads(base: str, token: str, loads: int) -> dict[str, float | None] | None:
    if shutil.which(CHROMIUM) is None:
        return None
    from playwright.async_api import async_playwright

    args = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]  # fmt: skip
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(f"{base}/ui/sign-in")
        await page.fill("#token", token)
        await page.click("form[action='/ui/sign-in'] button")
        await page.wait_for_url(re.compile(r"/ui/jobs$"))
        samples = []
        for _ in range(loads):
            await page.goto(f"{base}/ui/jobs", wait_until="load")
            samples.append(await page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
        await browser.close()
    return percentiles(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench console", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs of the measured tenant (default 100,000)")
    parser.add_argument("--executions", type=int, default=1_000_000, help="its executions (default 1,000,000)")
    parser.add_argument("--requests", type=int, default=40, help="fetches of each page (default 40)")
    parser.add_argument("--loads", type=int, default=10, help="browser loads of the jobs list (default 10)")
    add_own_server_options(parser, "console")
    args = parser.parse_args(argv)

    postgres = own_postgres(args.root, args.port_offset)
    redis = RedisServer(args.root / "redis", BENCH_PORTS.redis + args.port_offset)
    api: subprocess.Popen[bytes] | None = None
    try:
        redis.start()
        env = {**os.environ, "SUNDIAL_DATABASE_URL": postgres.dsn, "SUNDIAL_REDIS_URL": redis.url, "SUNDIAL_ENV": "dev"}
        seeded = asyncio.run(seed(postgres.dsn, args.jobs, args.executions))
        port = BENCH_PORTS.api + args.port_offset
        log = (args.root / "api.log").open("wb")
        api = subprocess.Popen(
            [*sundial_argv("api"), "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=log, stderr=log
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        token = issue_token(DEV_SIGNING_KEY, TENANT)
        ids = asyncio.run(_ids(postgres.dsn))
        pages = asyncio.run(time_pages(base, token, ids, args.requests))
        loads = asyncio.run(browser_loads(base, token, args.loads))
        figures = {"seed_sec": seeded, "first_byte_ms": pages, "browser_load_jobs_ms": loads}
        settings = {"jobs": args.jobs, "executions": args.executions, "requests": args.requests, "loads": args.loads}
        results.record("console", figures, settings, results=args.results)
    finally:
        if api is not None:
            api.terminate()
            api.wait(20)
        redis.stop()
        postgres.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
