"""One trace per execution, as a person looking at Jaeger would see it, from real processes.

Every Sundial process (API, hydrator, dispatcher, sweeper, demo worker) exports over OTLP/HTTP to the
test's own receiver (:mod:`tests.support.otlp`, the protobuf Jaeger's OTLP endpoint receives). For each story —
success; failure, retry, success; dead after its last attempt (and its dead letter); cancel of a running
execution; a worker killed mid-handler and recovered by the sweeper; a recurring job's fire; a trigger —
the spans tagged with the execution are one trace whose id is the execution's ``traceId``, with one root,
no orphan and no trace id 0, and the parents are the ones docs/operations/observability.md describes. The reverse lookup
``GET /v1/executions?traceId=…`` finds the execution of each trace. With the sample ratio at 0, a failed
execution's failure spans still reach the receiver under its trace id, and a successful one sends nothing.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import DLQ_TOPIC

from tests.e2e.test_reliable_execution import QUICK, until
from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_env, tree_problems
from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

FAST = {
    "SUNDIAL_SWEEPER_INTERVAL_SEC": "0.5",
    "SUNDIAL_SWEEPER_LOST_CONFIRM_SEC": "1",
    "SUNDIAL_WORKER_HEARTBEAT_INTERVAL_SEC": "0.5",
    "SUNDIAL_WORKER_HEARTBEAT_TTL_SEC": "2",
}
TOPIC = "sundial.pool.demo"


def named(spans: list[ReceivedSpan], name: str, service: str | None = None) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name and (service is None or s.service == service)]


def parent_of(spans: list[ReceivedSpan], span: ReceivedSpan) -> ReceivedSpan:
    [parent] = [s for s in spans if s.span_id == span.parent_span_id]
    return parent


class Story:
    """The whole trace of one execution, once the receiver has all of it."""

    def __init__(self, otlp: OtlpReceiver, view: dict[str, Any]) -> None:
        self.otlp = otlp
        self.view = view
        self.trace_id: str = view["traceId"]
        self.spans: list[ReceivedSpan] = []

    async def complete(self, expected: Callable[[list[ReceivedSpan]], bool], within: float = 20) -> Story:
        async def whole() -> bool:
            self.spans = spans = self.otlp.trace(self.trace_id)
            # Spans of one trace come in separate exports (one per process and batch): wait for each
            # attempt's handler span and outcome write too.
            attempts_whole = all(
                sum(1 for s in spans if s.parent_span_id == p.span_id) >= 2 for p in spans if p.kind == "CONSUMER"
            )
            return expected(spans) and attempts_whole and not tree_problems(spans)

        try:
            await until(whole, within, f"the trace of {self.view['executionId']}")
        except AssertionError:
            raise AssertionError(f"{tree_problems(self.spans)}; spans: {self.spans}") from None
        # Every span tagged with the execution is in its trace: Jaeger's tag search and the link agree.
        about = self.otlp.about(self.view["executionId"])
        assert {s.trace_id for s in about} == {self.trace_id}, about
        return self

    def sends(self) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.kind == "PRODUCER" and s.name == f"send {TOPIC}"]

    def processes(self) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.kind == "CONSUMER"]

    def check_attempt(self, process: ReceivedSpan, attempt: int, handler: str) -> None:
        """An attempt's process span under its own send, its handler span under it, its outcome write too."""
        send = parent_of(self.spans, process)
        assert (send.kind, send.service, send.attributes["sundial.attempt"]) == (
            "PRODUCER",
            "sundial-dispatcher",
            attempt,
        )
        assert process.service == "sundial-worker" and process.instance
        for key, value in {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": TOPIC,
            "messaging.kafka.message.key": self.view["executionId"],
            "sundial.execution_id": self.view["executionId"],
            "sundial.job_id": self.view["jobId"],
            "sundial.attempt": attempt,
            "sundial.pool": "demo",
            "sundial.handler": handler,
        }.items():
            assert process.attributes[key] == value, (key, process.attributes)
        assert "messaging.kafka.offset" in process.attributes
        assert "messaging.destination.partition.id" in process.attributes
        assert send.attributes["messaging.operation.type"] == "send"
        assert send.attributes["messaging.kafka.message.key"] == self.view["executionId"]
        children = [s for s in self.spans if s.parent_span_id == process.span_id]
        assert sorted(s.name for s in children) == sorted([handler, "record outcome"]), children


@pytest.mark.e2e
async def test_every_story_of_an_execution_is_one_trace_in_jaeger(
    processes: Processes, otlp: OtlpReceiver, kafka_bootstrap: str
) -> None:
    ensure_topics(kafka_bootstrap, [DLQ_TOPIC])
    port = free_port()
    exporting = {**FAST, **otlp_env(otlp), "SUNDIAL_TRACE_LINK_TEMPLATE": "http://jaeger.test/trace/{trace_id}"}
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port), env=exporting)
    for name in ("hydrator", "dispatcher", "sweeper"):
        processes.start(name, name, env={**exporting, "SUNDIAL_INSTANCE_ID": f"{name}-1"})
    worker = ("worker", "--app", "sundial_worker.demo:worker", "--concurrency", "8")
    processes.start("worker-1", *worker, env={**exporting, "SUNDIAL_INSTANCE_ID": "worker-1"})
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker-1", "partitions assigned")
    token = tenant_token(processes.env["SUNDIAL_DATABASE_URL"], "e2e-traces", pools=("demo",))

    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:

        async def create(handler: str, payload: dict[str, Any], retry: dict[str, Any], **fields: Any) -> str:
            body = {
                "name": handler,
                "type": "DELAYED",
                "delaySeconds": 0,
                "target": {"pool": "demo", "handler": handler},
                "payload": payload,
                "retryPolicy": retry,
                **fields,
            }
            if body["type"] != "DELAYED":
                del body["delaySeconds"]
            response = await client.post("/v1/jobs", json=body)
            assert response.status_code == 201, response.text
            return str(response.json()["jobId"])

        async def execution(execution_id: str) -> dict[str, Any]:
            response = await client.get(f"/v1/executions/{execution_id}")
            assert response.status_code == 200, response.text
            view: dict[str, Any] = response.json()
            return view

        async def execution_of(job_id: str, state: str | None = None) -> dict[str, Any] | None:
            job = (await client.get(f"/v1/jobs/{job_id}")).json()
            if not job["latestExecutions"]:
                return None
            view = await execution(job["latestExecutions"][0]["executionId"])
            return view if state is None or view["state"] == state else None

        async def lookup(story: Story) -> None:
            response = await client.get("/v1/executions", params={"traceId": story.trace_id})
            assert [i["executionId"] for i in response.json()["items"]] == [story.view["executionId"]]
            assert story.view["traceLink"] == f"http://jaeger.test/trace/{story.trace_id}"

        echo = await create("echo", {"n": 1}, {"maxAttempts": 1})
        flaky = await create("flaky", {"failures": 1}, {"maxAttempts": 3, **QUICK})
        failing = await create("fail", {}, {"maxAttempts": 2, **QUICK})
        sleeper = await create("sleep", {"seconds": 60}, {"maxAttempts": 1})
        # Every second, once (maxRuns): a recurring job's first fire within a second.
        recurring = await create(
            "echo", {"fire": True}, {"maxAttempts": 1}, type="CRON", schedule="* * * * * *", maxRuns=1
        )
        later = await create("echo", {"later": True}, {"maxAttempts": 1}, type="CRON", schedule="0 0 1 1 *")
        triggered = await client.post(f"/v1/jobs/{later}/trigger")
        assert triggered.status_code == 202, triggered.text

        # 1. Success: POST /v1/jobs → send → process → {echo, record outcome}.
        view = await until(lambda: execution_of(echo, "SUCCEEDED"), 30, "echo to succeed")
        story = await Story(otlp, view).complete(lambda s: len(s) >= 5)
        [root] = [s for s in story.spans if not s.parent_span_id]
        assert (root.service, root.kind, root.name) == ("sundial-api", "SERVER", "POST /v1/jobs")
        [send] = story.sends()
        assert send.parent_span_id == root.span_id
        [process] = story.processes()
        story.check_attempt(process, 1, "echo")
        assert not any(s.error for s in story.spans)
        await lookup(story)

        # 2. Failure, retry, success: the retry's send is a child of the first send, in the same trace.
        view = await until(lambda: execution_of(flaky, "SUCCEEDED"), 30, "flaky to succeed")
        story = await Story(otlp, view).complete(lambda s: len(s) >= 9)
        first, retry = sorted(story.sends(), key=lambda s: s.attributes["sundial.attempt"])
        assert retry.parent_span_id == first.span_id and retry.attributes["sundial.retry"] is True
        for process in story.processes():
            story.check_attempt(process, process.attributes["sundial.attempt"], "flaky")
        [failed] = [s for s in named(story.spans, "flaky") if s.attributes["sundial.attempt"] == 1]
        assert failed.error and "exception" in failed.events  # the handler span records the exception
        await lookup(story)

        # 3. Dead after its last attempt: both attempts, the final write an error, the dead letter in the trace.
        view = await until(lambda: execution_of(failing, "DEAD"), 30, "fail to be DEAD")

        def dead_story(spans: list[ReceivedSpan]) -> bool:
            return bool(named(spans, f"send {DLQ_TOPIC}")) and len(named(spans, "record outcome")) == 2

        story = await Story(otlp, view).complete(dead_story)
        assert len(story.processes()) == 2 and all(p.error for p in story.processes())
        [letter] = named(story.spans, f"send {DLQ_TOPIC}", "sundial-sweeper")
        assert letter.parent_span_id == min(story.sends(), key=lambda s: s.attributes["sundial.attempt"]).span_id
        assert any(
            s.error and s.attributes.get("sundial.state") == "DEAD" for s in named(story.spans, "record outcome")
        )
        await lookup(story)

        # 4. Cancel of a running execution: the API's cancel span joins the execution's trace.
        running = await until(lambda: execution_of(sleeper, "RUNNING"), 30, "sleep to run")
        assert (await client.post(f"/v1/executions/{running['executionId']}/cancel")).status_code == 202
        view = await until(lambda: execution_of(sleeper, "CANCELLED"), 30, "sleep to be cancelled")
        story = await Story(otlp, view).complete(lambda s: bool(named(s, "cancel")) and bool(named(s, "sleep")))
        [cancel] = named(story.spans, "cancel", "sundial-api")
        [send] = story.sends()
        assert cancel.parent_span_id == send.span_id and cancel.links  # linked to the cancel request's own trace
        story.check_attempt(story.processes()[0], 1, "sleep")
        await lookup(story)

        # 5. A recurring job's fire: a trace of its own, rooted at its send, linked to the creating request.
        view = await until(lambda: execution_of(recurring, "SUCCEEDED"), 30, "the first fire to succeed")
        story = await Story(otlp, view).complete(lambda s: len(s) >= 4)
        [send] = story.sends()
        assert not send.parent_span_id
        [(linked_trace, linked_span)] = send.links
        request = await until(
            lambda: asyncio.sleep(0, [s for s in otlp.trace(linked_trace) if s.span_id == linked_span]),
            10,
            "the creating request's span",
        )
        assert (request[0].service, request[0].name) == ("sundial-api", "POST /v1/jobs")
        story.check_attempt(story.processes()[0], 1, "echo")
        await lookup(story)

        # 6. A trigger: its execution continues the trigger request's trace.
        view = await until(lambda: execution_of(later, "SUCCEEDED"), 30, "the triggered run to succeed")
        assert view["executionId"] == triggered.json()["executionId"]
        story = await Story(otlp, view).complete(lambda s: len(s) >= 5)
        [root] = [s for s in story.spans if not s.parent_span_id]
        assert (root.service, root.name) == ("sundial-api", "POST /v1/jobs/{job_id}/trigger")
        [send] = story.sends()
        assert send.parent_span_id == root.span_id and send.attributes["sundial.triggered"] is True
        story.check_attempt(story.processes()[0], 1, "echo")
        await lookup(story)

        # 7. A worker killed mid-handler: the sweeper's "worker lost" span and the retry on another worker.
        victim = await create("sleep", {"seconds": 3}, {"maxAttempts": 2, **QUICK})
        await until(lambda: execution_of(victim, "RUNNING"), 30, "the victim to run")
        processes.stop("worker-1", signal.SIGKILL)
        processes.start("worker-2", *worker, env={**exporting, "SUNDIAL_INSTANCE_ID": "worker-2"})
        view = await until(lambda: execution_of(victim, "SUCCEEDED"), 60, "the victim to succeed on worker-2")
        assert [a["state"] for a in view["attempts"]] == ["FAILED_WORKER_LOST", "SUCCEEDED"]
        story = await Story(otlp, view).complete(lambda s: bool(named(s, "sweep worker lost")) and len(s) >= 7)
        first, retry = sorted(story.sends(), key=lambda s: s.attributes["sundial.attempt"])
        [lost] = named(story.spans, "sweep worker lost", "sundial-sweeper")
        assert lost.parent_span_id == first.span_id and lost.error
        assert lost.attributes["sundial.worker_id"] and lost.attributes["sundial.attempt"] == 1
        assert retry.parent_span_id == first.span_id
        # The killed worker never exported its spans; the attempt that ran is worker-2's.
        [process] = story.processes()
        assert process.instance == "worker-2"
        story.check_attempt(process, 2, "sleep")
        await lookup(story)


@pytest.mark.e2e
async def test_a_failure_is_exported_even_when_the_ratio_samples_its_trace_away(
    processes: Processes, otlp: OtlpReceiver, kafka_bootstrap: str
) -> None:
    ensure_topics(kafka_bootstrap, [DLQ_TOPIC])
    port = free_port()
    exporting = {**FAST, **otlp_env(otlp), "SUNDIAL_TRACE_SAMPLE_RATIO": "0"}
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port), env=exporting)
    for name in ("hydrator", "dispatcher", "sweeper"):
        processes.start(name, name, env=exporting)
    processes.start("worker", "worker", "--app", "sundial_worker.demo:worker", env=exporting)
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("worker", "partitions assigned")
    token = tenant_token(processes.env["SUNDIAL_DATABASE_URL"], "e2e-traces", pools=("demo",))

    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:

        async def run(handler: str, state: str) -> dict[str, Any]:
            body = {
                "name": handler,
                "type": "DELAYED",
                "delaySeconds": 0,
                "target": {"pool": "demo", "handler": handler},
                "retryPolicy": {"maxAttempts": 1},
            }
            job_id = (await client.post("/v1/jobs", json=body)).json()["jobId"]

            async def ended() -> dict[str, Any] | None:
                latest = (await client.get(f"/v1/jobs/{job_id}")).json()["latestExecutions"]
                view: dict[str, Any] | None = latest[0] if latest and latest[0]["state"] == state else None
                return view

            return await until(ended, 30, f"{handler} to be {state}")

        dead = await run("fail", "DEAD")
        succeeded = await run("echo", "SUCCEEDED")

        async def failure_spans() -> list[ReceivedSpan] | None:
            spans = otlp.about(dead["executionId"])
            names = {s.name for s in spans}
            return spans if {"record outcome", f"send {DLQ_TOPIC}"} <= names else None

        spans = await until(failure_spans, 20, "the failure's spans")
        assert {s.trace_id for s in spans} == {dead["traceId"]}  # under the execution's trace id in Jaeger
        [write] = named(spans, "record outcome")
        assert write.error and write.attributes["sundial.failure"] is True
        # The error as stored: the exception class readable in Jaeger, the message sealed (the API opens it).
        assert write.attributes["sundial.error"].startswith("RuntimeError: sdl1:")
        # The ordinary spans of both traces, and the successful execution, were sampled away.
        assert not [s for s in spans if s.name not in ("record outcome", f"send {DLQ_TOPIC}")]
        assert otlp.about(succeeded["executionId"]) == []
