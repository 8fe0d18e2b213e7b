"""HTTP/1.1 requests written byte by byte over a real socket: for what an ordinary client
refuses to send (invalid UTF-8 in a header, a cookie or a form body), as an adversary would."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def request(
    port: int,
    method: str,
    target: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    body: bytes = b"",
    *,
    host: str = "127.0.0.1",
    local_addr: tuple[str, int] | None = None,
) -> RawAnswer:
    """Sends one request (Connection: close) and reads the whole answer."""
    lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: " + f"{host}:{port}".encode()]
    lines += [name + b": " + value for name, value in headers or []]
    lines += [b"Content-Length: " + str(len(body)).encode(), b"Connection: close"]
    reader, writer = await asyncio.open_connection(host, port, local_addr=local_addr)
    try:
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        parsed[name.strip().lower()] = value.strip()
    if parsed.get("transfer-encoding") == "chunked":
        rest = _unchunk(rest)
    return RawAnswer(int(status_line.split()[1]), parsed, rest)


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out
