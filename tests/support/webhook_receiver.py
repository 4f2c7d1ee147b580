"""A real HTTP(S) receiver on 127.0.0.1 for the outbound tests: it keeps every request and answers as scripted.

Written on asyncio streams rather than a framework so a test can ask for what a framework would tidy away:
a response that never comes (timeouts), a body larger than the sender keeps, a redirect, a ``Retry-After``.
It listens on a port the system chooses on 127.0.0.1 only, so concurrent sessions never collide and no
test sends a packet past the loopback interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_sec: float = 0.0


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class WebhookReceiver:
    """Answers each request with the next scripted :class:`Reply` (the last one repeats; 200 when none)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.received: list[Received] = []
        self.replies: list[Reply] = []
        #: Replies by request path (without the query), tried before the scripted ones: ``{"/a": [Reply(503), ...]}``.
        self.routes: dict[str, list[Reply]] = {}
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def script(self, *replies: Reply) -> None:
        self.replies = list(replies)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def _next_reply(self, path: str = "") -> Reply:
        replies = self.routes.get(path.partition("?")[0]) or self.replies
        if not replies:
            return Reply()
        return replies.pop(0) if len(replies) > 1 else replies[0]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _version = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.received.append(Received(method, path, headers, body))
            reply = self._next_reply(path)
            if reply.delay_sec:
                await asyncio.sleep(reply.delay_sec)
            extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
            status = f"HTTP/1.1 {reply.status} X\r\ncontent-length: {len(reply.body)}\r\nconnection: close\r\n"
            writer.write(f"{status}{extra}\r\n".encode() + reply.body)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def running_receiver(tls: ssl.SSLContext | None = None) -> AsyncIterator[WebhookReceiver]:
    receiver = WebhookReceiver(tls)
    await receiver.start()
    try:
        yield receiver
    finally:
        await receiver.stop()
