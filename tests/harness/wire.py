"""A TCP proxy that can lose answers: what a dropped connection or a stalled network does to a
call whose request arrived. While `held`, bytes from the server are kept back (the client sees
nothing and its deadline passes) while bytes to the server still flow, so the server handles the
call and answers it as usual, never learning that the answer did not arrive. reset() then drops
the connections, as a network that comes back does, and the client connects again."""

from __future__ import annotations

import asyncio
import contextlib


class HoldingProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.held = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> HoldingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self.reset()

    async def reset(self) -> None:
        """Closes the connections made so far (whatever they held back is lost) and lets
        answers through again: the client reconnects."""
        writers, self._writers = self._writers, []
        for w in writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await t
        self.held = False

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [client_w, server_w]
        for t in (self._pipe(client_r, server_w, back=False), self._pipe(server_r, client_w, back=True)):
            task = asyncio.ensure_future(t)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, *, back: bool) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await r.read(65536):
                if back and self.held:
                    continue  # the answer is lost on the way
                w.write(data)
                await w.drain()
        w.close()
