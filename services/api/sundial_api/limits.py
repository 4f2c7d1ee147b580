"""The whole-request body limit: a body larger than ``max_request_bytes`` is answered 413 before it is parsed.

A declared ``Content-Length`` over the limit is refused without reading a byte (the server enforces that
the body matches it). A chunked body, which declares nothing, is read up to the limit and then replayed
to the app in one message; one byte more and it is refused. Starlette's own limiter answers in plain
text and replaces any response once the declared length is over, so it cannot give a problem document.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sundial_api.problems import field_error, problem_response


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"the request body is larger than {self.max_bytes} bytes"
        await problem_response(413, message, [field_error("body", message)])(scope, receive, send)

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
                await self._refuse(scope, receive, send)
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
                await self._refuse(scope, receive, send)
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
