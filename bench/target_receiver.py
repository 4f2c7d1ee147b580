"""The HTTP target of the bench's ``http`` worker transport: answers every POST ``200 {}`` over keep-alive.

``python -m bench.target_receiver --port N`` listens on 127.0.0.1 only. It reads each request's head and body and
answers at once, so what a run measures is Sundial's side of an HTTP target (the delivery worker's request, its
signing, its outcome write), not a service's work. Its CPU is reported with the run's (``receiver``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            await reader.readexactly(length)
            writer.write(_ANSWER)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port)
    print(f"target receiver listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.target_receiver", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="The port on 127.0.0.1.")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(parser.parse_args().port))


if __name__ == "__main__":
    main()
