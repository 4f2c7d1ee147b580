"""The whole-request body limit: a body larger than ``max_request_bytes`` is answered 413 before it is parsed.

A declared ``Content-Length`` over the limit is refused without reading a byte (the server enforces that
the body matches it). A chunked body, which declares nothing, is read up to the limit and then replayed
to the app in one message; one byte more and it is refused. Starlette's own limiter answers in plain
text and replaces any response once the declared length is over, so it cannot give a problem document.

A client that did not ask ``Expect: 100-continue`` sends its whole body before it reads the answer: were the
server to answer and close with that body unread, the client's kernel would receive a reset and drop the 413
before the client read it. So the refused body is read and discarded first, up to :data:`DRAIN_BYTES`; a
longer one is answered at once with ``Connection: close`` (its client may then see only the reset). A client
that asked ``Expect: 100-continue`` is answered before it sends anything (the server sends ``100 Continue``
only when the app first reads the body).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sundial_api.problems import field_error, problem_response


async def _done() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


#: How much of a refused body is read and discarded so that its client can read the 413.
DRAIN_BYTES = 64 * 1024 * 1024


async def _drain(receive: Receive, already: int) -> bool:
    """Read and discard the rest of the body; False when it ran past :data:`DRAIN_BYTES` (or the client left)."""
    drained = already
    while drained <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return False
        drained += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, *, read: int = 0, declared: int = 0) -> None:
        message = f"the request body is larger than {self.max_bytes} bytes"
        expects = any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope["headers"])
        drained = False
        if not expects and declared <= DRAIN_BYTES:
            drained = await _drain(receive, read)
        headers = None if drained else {"Connection": "close"}
        await problem_response(413, message, [field_error("body", message)], headers)(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        chunked = False
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if declared is not None:
            if declared > self.max_bytes:
                await self._refuse(scope, receive, send, declared=declared)
            else:
                await self.app(scope, receive, send)
            return
        if not chunked:  # no body at all
            await self.app(scope, receive, send)
            return

        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                done = not message.get("more_body", False)
                await self._refuse(scope, receive if not done else _done, send, read=size)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)
