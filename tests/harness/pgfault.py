"""A TCP proxy between the services and Postgres that reads the wire protocol and breaks the
connection at a chosen statement: a real fault at the store boundary, seen by asyncpg exactly
as a network failure or a crashed pooler is (no hook in the services' code).

A test arms a rule for one statement (its SQL text, or a part of it) and a fault:

- BEFORE: the statement never reaches the server; the connection is dropped when the client
  sends it (a transaction it was part of rolls back). The proxy ends the server side first and
  drops the client only once the backend has exited, so the caller learns of the failure after
  that transaction rolled back and its row locks are free: a retry that follows at once (a
  FOR UPDATE SKIP LOCKED pass) finds what a retry a moment later would, every time.
- AFTER_COMMIT: the statement runs and its transaction commits (the server has sent its
  CommandComplete and ReadyForQuery, idle); the proxy drops the connection instead of passing on
  that ReadyForQuery, so the caller learns only that the connection was lost.
- AFTER_COMMIT_TIMEOUT: as AFTER_COMMIT, but the proxy holds that ReadyForQuery back until the
  caller times out; the cancel request asyncpg then sends ends the held connection (a partition
  that does not heal), so the caller sees a timeout.

Only the framing is parsed: Parse (statement name -> text), Bind (the execution of a named or
unnamed statement), Query (simple protocol: BEGIN / COMMIT and statements without parameters),
ErrorResponse and ReadyForQuery. Everything else passes through untouched. The test's DSN
through the proxy disables TLS (the proxy must read the bytes).
"""

from __future__ import annotations

import asyncio
import enum
import struct
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

_CANCEL_REQUEST = 80877102
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_TERMINATE = b"X\x00\x00\x00\x04"
# how long a BEFORE fault waits for the backend to exit before it drops the client anyway
_BACKEND_EXIT_TIMEOUT = 10.0


class Fault(enum.Enum):
    BEFORE = "before"  # the statement never runs: dropped on its way to the server
    AFTER_COMMIT = "after_commit"  # committed, then the answer is lost with the connection
    # committed, then the answer never comes: the client times out (asyncpg's command_timeout)
    # and sends a cancel request, upon which the held connection is dropped
    AFTER_COMMIT_TIMEOUT = "after_commit_timeout"


@dataclass
class Rule:
    """One armed fault: the nth statement whose text contains `needle`."""

    needle: str
    fault: Fault
    nth: int = 1
    seen: int = 0
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    # AFTER_COMMIT only: the statement or its transaction failed on its own, so nothing was dropped
    failed_instead: bool = False

    def matches(self, query: str) -> bool:
        if self.fired.is_set() or self.failed_instead or self.needle not in query:
            return False
        self.seen += 1
        return self.seen == self.nth


def _cstring(body: bytes, start: int) -> tuple[str, int]:
    end = body.index(b"\0", start)
    return body[start:end].decode(), end + 1


class _Link:
    """One client connection and its server connection."""

    def __init__(self, proxy: PgFaultProxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.c_reader, self.c_writer = client
        self.statements: dict[str, str] = {}  # prepared statement name ("" unnamed) -> text
        self.pending: Rule | None = None  # AFTER_COMMIT* rule waiting for the commit's ReadyForQuery
        self.held = False  # AFTER_COMMIT_TIMEOUT: the answer is being withheld

    async def run(self, host: str, port: int) -> None:
        try:
            self.s_reader, self.s_writer = await asyncio.open_connection(host, port)
        except OSError:
            self.c_writer.transport.abort()
            return
        pumps = [asyncio.create_task(self._client_to_server()), asyncio.create_task(self._server_to_client())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self.drop()

    def drop(self) -> None:
        self.c_writer.transport.abort()
        if hasattr(self, "s_writer"):
            self.s_writer.transport.abort()

    async def _client_to_server(self) -> None:
        r, w = self.c_reader, self.s_writer
        # untyped start: a startup, cancel, or SSL/GSS request (answered by one byte from the server)
        while True:
            head = await r.readexactly(8)
            (length, code) = struct.unpack("!ii", head)
            w.write(head + await r.readexactly(length - 8))
            await w.drain()
            if code == _CANCEL_REQUEST:
                self.proxy.cancel_requested()
            if code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                break
            self.c_writer.write(await self.s_reader.readexactly(1))  # 'N': no TLS through the proxy
            await self.c_writer.drain()
        while True:
            head = await r.readexactly(5)
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = await r.readexactly(length - 4)
            query: str | None = None
            if kind == b"P":
                name, i = _cstring(body, 0)
                text, _ = _cstring(body, i)
                self.statements[name] = text  # prepared, not run: a rule matches its executions
            elif kind == b"B":
                _portal, i = _cstring(body, 0)
                name, _ = _cstring(body, i)
                query = self.statements.get(name, "")
            elif kind == b"Q":
                query, _ = _cstring(body, 0)
            if query is not None:
                rule = self.proxy.match(query)
                if rule is not None and rule.fault is Fault.BEFORE:
                    rule.fired.set()
                    # the backend rolls back, releases its locks and only then closes its socket
                    # (proc_exit: shmem_exit before the socket's on_proc_exit callback); the
                    # server pump reads that EOF and run() drops the client then
                    w.write(_TERMINATE)
                    await w.drain()
                    await asyncio.sleep(_BACKEND_EXIT_TIMEOUT)
                    return
                if rule is not None:
                    self.pending = rule
            w.write(head + body)
            await w.drain()

    async def _server_to_client(self) -> None:
        r, w = self.s_reader, self.c_writer
        while True:
            head = await r.readexactly(5)
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = await r.readexactly(length - 4)
            rule = self.pending
            if rule is not None and kind == b"E":
                rule.failed_instead = True  # the statement failed by itself: not the fault asked for
                self.pending = None
            elif rule is not None and kind == b"Z" and body == b"I":
                # idle again: the statement's transaction committed; its answer never arrives
                self.pending = None
                rule.fired.set()
                if rule.fault is Fault.AFTER_COMMIT_TIMEOUT:
                    self.held = True  # nothing more is passed on; a cancel request ends it
                    continue
                self.drop()
                return
            if self.held:
                continue
            w.write(head + body)
            await w.drain()


class PgFaultProxy:
    """Listens on 127.0.0.1:<port> and forwards to the Postgres of `upstream_dsn`."""

    def __init__(self, upstream_dsn: str) -> None:
        parts = urlsplit(upstream_dsn)
        self.upstream_dsn = upstream_dsn
        self.host = parts.hostname or "127.0.0.1"
        self.port_upstream = parts.port or 5432
        self.rules: list[Rule] = []
        self.links: set[_Link] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> PgFaultProxy:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def dsn(self) -> str:
        """upstream_dsn through the proxy, without TLS."""
        parts = urlsplit(self.upstream_dsn)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}"
        query = "&".join(q for q in (parts.query, "sslmode=disable") if q)
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))

    def arm(self, needle: str, fault: Fault, nth: int = 1) -> Rule:
        """Breaks the nth statement (counted from now) whose text contains needle; one shot."""
        rule = Rule(needle, fault, nth)
        self.rules.append(rule)
        return rule

    def match(self, query: str) -> Rule | None:
        """The rule an execution of query fires, taken off the list."""
        for rule in self.rules:
            if rule.matches(query):
                self.rules.remove(rule)
                return rule
        return None

    def cancel_requested(self) -> None:
        """A client gave up on a statement: the connections whose answer is withheld end."""
        for link in list(self.links):
            if link.held:
                link.drop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(self, (reader, writer))
        self.links.add(link)
        try:
            await link.run(self.host, self.port_upstream)
        except (OSError, asyncio.IncompleteReadError):
            link.drop()
        finally:
            self.links.discard(link)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for link in list(self.links):
            link.drop()
        if self.server is not None:
            await self.server.wait_closed()
