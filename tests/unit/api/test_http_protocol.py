"""The API's HTTP protocol sends each response in one write, and still answers like uvicorn's own."""

from __future__ import annotations

import asyncio
import socket

import uvicorn
from starlette.types import Receive, Scope, Send
from sundial_api.http_protocol import CoalescingHttpToolsProtocol, CoalescingTransport


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 7


async def test_the_writes_of_one_step_leave_together_at_its_end() -> None:
    inner = Recording()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())

    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"body")
    assert inner.writes == []  # not before the step ends
    await asyncio.sleep(0)
    transport.write(b"next")
    transport.close()  # what is pending goes first

    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"next"]
    assert inner.closed and transport.get_write_buffer_size() == 7  # the rest is the transport's
    transport.write(b"late")
    await asyncio.sleep(0)
    assert inner.writes[-1] == b"next"  # nothing written to a closed connection


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b"echo " + body
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def test_uvicorn_answers_over_it_on_a_kept_alive_connection_and_on_a_closing_one() -> None:
    config = uvicorn.Config(app, http=CoalescingHttpToolsProtocol, lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # a port the kernel picks
    sock.listen()  # connections wait in the backlog until the server accepts them
    port = sock.getsockname()[1]
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n{}\r\n{}"
        writer.write(request.format(3, "", "one").encode() + request.format(3, "connection: close\r\n", "two").encode())
        answers = await asyncio.wait_for(reader.read(), 5)  # until the server closes the connection
        writer.close()
    finally:
        server.should_exit = True
        await serving

    assert answers.count(b"HTTP/1.1 200 OK") == 2
    assert answers.index(b"echo one") < answers.index(b"echo two") and answers.endswith(b"echo two")
