"""One real Sundial stack for the whole docs suite, shaped like the one `make up` starts.

The session's servers (``stack``) with a database of the suite's own, and the processes `make up` runs for the
examples: the API, a dispatcher, a ``services`` host (hydrator, sweeper, replayer) and the demo workers (``demo``
and its staging pool ``staging-demo``), with the tenant
``demo`` and its pools registered by the same ``sundial migrate`` that `make up` runs. The examples run in a
sandbox directory laid out like a checkout after `make up` (``.venv`` and ``.sundial/dev-token``), so a block
reads exactly as a user types it; the one difference is the API's port, which :data:`DEV_API_URL` is replaced
with (the suite never uses the ports `make up` does).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from sundial_infra.stack import TEST_PORTS, LocalStack

from tests.conftest import ensure_running
from tests.support.ports import REPO_ROOT, port_offset
from tests.support.processes import SUNDIAL, Processes, free_port

#: The API address the documentation shows (`make up`'s).
DEV_API_URL = "http://127.0.0.1:8080"
#: The worker gateway's address the documentation shows (`make up`'s).
DEV_GATEWAY_URL = "http://127.0.0.1:8081"
#: How long each process of the stack may take to come up.
START_TIMEOUT = 150.0


#: Each command with its start time, in the sandbox's .trace.log (one page's run at a time): where a slow or failing
#: example spent its time.
_TIMED = "exec {trace}>.trace.log; BASH_XTRACEFD=$trace; PS4='+ $(date +%T.%N | cut -c1-12) '; set -x\n"
#: Instead, a terminal transcript on stdout: each command as typed after `$ `, then what it printed (stderr too).
_TRANSCRIPT = "exec 2>&1; PS4='$ '; set -x\n"


@dataclass(frozen=True)
class DocsStack:
    api_url: str
    gateway_url: str
    sandbox: Path
    env: dict[str, str]
    processes: Processes

    def trace(self, lines: int = 40) -> str:
        """The last commands the examples ran, with their start times."""
        path = self.sandbox / ".trace.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def run(
        self, script: str, *, timeout: float = 90.0, shell: str = "bash", transcript: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell script of the docs in the sandbox, as a user would, against this stack (``transcript``: its
        stdout is a terminal transcript, commands and their output together, instead of the timed trace)."""
        prefix = _TRANSCRIPT if transcript else _TIMED
        return subprocess.run(
            [
                shell,
                "-euo",
                "pipefail",
                "-c",
                prefix + script.replace(DEV_API_URL, self.api_url).replace(DEV_GATEWAY_URL, self.gateway_url),
            ],
            cwd=self.sandbox,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


async def _create_database(stack: LocalStack, template: str) -> str:
    name = f"docs_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    finally:
        await admin.close()
    return name


async def _drop_database(stack: LocalStack, name: str) -> None:
    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture(scope="package")
def docs_stack(stack: LocalStack, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsStack]:
    for server in (stack.postgres, stack.redis, stack.etcd, stack.broker):
        ensure_running(server)  # a test before this suite may have stopped one
    template = template_db.rsplit("/", 1)[-1].split("?", 1)[0]
    database = asyncio.run(_create_database(stack, template))
    sandbox = tmp_path_factory.mktemp("checkout")
    (sandbox / ".venv").symlink_to(REPO_ROOT / ".venv")
    (sandbox / ".sundial").mkdir()
    logs = tmp_path_factory.mktemp("docs-logs")
    api_port = TEST_PORTS.api + port_offset()
    api_url = f"http://127.0.0.1:{api_port}"
    gateway_url = f"http://127.0.0.1:{free_port()}"
    settings = {
        "SUNDIAL_DATABASE_URL": stack.postgres.dsn_for(database),
        "SUNDIAL_REDIS_URL": stack.redis_url,
        "SUNDIAL_ETCD_ENDPOINT": stack.etcd_endpoint,
        "SUNDIAL_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "SUNDIAL_ENV": "dev",
        "SUNDIAL_DEV_ROOT": str(sandbox / ".sundial"),
    }
    env = {**os.environ, **settings}
    subprocess.run(
        [SUNDIAL, "migrate", "--tenant", "demo", "--pool", "demo=demo", "--staging-pool", "staging-demo=demo"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    for name, args in (("dev-token", ()), ("admin-token", ("--admin",))):
        token = subprocess.run(
            [SUNDIAL, "token", "--tenant", "demo", *args], env=env, check=True, capture_output=True, text=True
        ).stdout.split()[-1]
        (sandbox / ".sundial" / name).write_text(token + "\n")
    processes = Processes(settings, logs)
    try:
        processes.start("api", "api", "--host", "127.0.0.1", "--port", str(api_port))
        processes.start("dispatcher", "dispatcher")
        processes.start("services", "services", "--run", "hydrator,sweeper,replayer")
        processes.start("worker", "worker", "--app", "sundial_worker.demo:worker")
        processes.start("worker-staging", "worker", "--app", "sundial_worker.demo:staging_worker")
        processes.start("gateway", "gateway", "--port", gateway_url.rsplit(":", 1)[1])
        # Generous: on a machine as loaded as a CI lane beside two others, a process takes tens of seconds to start.
        processes.wait_http_ok("api", f"{api_url}/readyz", timeout=START_TIMEOUT)
        processes.wait_for_log("dispatcher", "leading with fence token", timeout=START_TIMEOUT)
        processes.wait_for_log("worker", "partitions assigned", timeout=START_TIMEOUT)
        processes.wait_for_log("worker-staging", "serving staging-demo", timeout=START_TIMEOUT)
        processes.wait_http_ok("gateway", f"{gateway_url}/healthz", timeout=START_TIMEOUT)
        # The shell the examples run in: the CLI finds this stack as it finds `make up`'s (URL and token), and the
        # Python examples find the client package in the sandbox's .venv.
        shell_env = {
            **env,
            "SUNDIAL_URL": api_url,
            "PATH": f"{sandbox / '.venv' / 'bin'}:{os.environ['PATH']}",
            "HOME": str(sandbox),
        }
        # What a user's shell does not have: the examples say SUNDIAL_ENV=dev where a command needs it.
        for name in ("SUNDIAL_TOKEN", "SUNDIAL_ENV", "SUNDIAL_DEV_ROOT"):
            shell_env.pop(name, None)
        yield DocsStack(api_url=api_url, gateway_url=gateway_url, sandbox=sandbox, env=shell_env, processes=processes)
    finally:
        processes.stop_all()
        asyncio.run(_drop_database(stack, database))
