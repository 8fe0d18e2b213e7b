"""Wake-ups for long-polling claims: one LISTEN connection per scheduler process on
RUN_READY_CHANNEL (payload: a project id), fanned out to the claims waiting on that project;
and on RUN_EVENT_CHANNEL (payload: a run id), fanned out to the WatchRun streams of that run.

Every transaction that makes a run claimable sends the NOTIFY (ingest's insert, the
reaper, approve, retry, release), so a waiting claim retries at once instead of polling.

A notification wakes ONE waiting claim of its project (the one waiting longest), not all of
them: a NOTIFY says "something is claimable", not how much, and waking every waiter turned each
ingested batch into one claim statement per waiting worker, nearly all of them empty (with
16 waiting workers, 15 empty claims and 15 SecondsUntilReady statements per NOTIFY), load that
delayed every other claim on the machine. The woken claim passes the wake on (`wake` again)
when it took a full batch (more may be waiting), when its call ended before it claimed, or when
it leaves while it counted on a retry backoff ending (only a woken claim looks for the earliest
backoff; claiming.py), so work that outnumbers one claim still reaches as many waiters as it
needs and a delayed run is never left to waiters that do not know of it.
If the connection drops, it reconnects in the background with back-off, and meanwhile
waiters fall back to a short poll (`poll_interval`). After a reconnect every waiter is
woken once, since notifications sent while it was down are lost.

A LISTEN that succeeds may still never deliver: through a transaction-mode pooler the
session that listens is not this client's once the statement ends. So after each connect
the listener sends itself a probe notification from a second connection; when it does not
arrive the scheduler says so once in its log (naming AWOOOP_DATABASE_DIRECT_URL) and in
`awooop_scheduler_listen_unavailable`, and claims poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator

import asyncpg

from services.common.runs import RUN_EVENT_CHANNEL, RUN_READY_CHANNEL
from services.scheduler import metrics, wakeup_sql

log = logging.getLogger("awooop.scheduler.wakeup")

POLL_WHEN_DOWN = 0.5  # seconds between claim retries while the LISTEN connection is down
PING_INTERVAL = 10.0  # seconds between liveness checks of an idle LISTEN connection
MAX_BACKOFF = 5.0
PROBE_CHANNEL = "awooop_listen_probe"
PROBE_TIMEOUT = 3.0  # seconds a probe notification may take before LISTEN counts as not working
RETRY_WHEN_UNDELIVERED = 60.0  # seconds before a LISTEN that did not deliver is tried again


class ListenUndelivered(Exception):
    """LISTEN was accepted but a notification sent to it never arrived."""


def _setter(event: asyncio.Event) -> Callable[[object], None]:
    return lambda _conn: event.set()


class RunReadyListener:
    def __init__(self, dsn: str, stopping: asyncio.Event, connect_timeout: float = 5.0) -> None:
        self.dsn = dsn
        self.stopping = stopping
        self.connect_timeout = connect_timeout
        self.connected = asyncio.Event()
        # per project, its waiters in the order they started waiting (a dict as an ordered set)
        self._waiters: dict[str, dict[asyncio.Event, None]] = {}
        self._run_waiters: dict[str, set[asyncio.Event]] = {}  # run id -> its watchers
        self._conn: asyncpg.Connection | None = None
        self._probes: dict[str, asyncio.Event] = {}
        self._warned_undelivered = False

    @property
    def poll_interval(self) -> float | None:
        """How often a waiter must re-check by itself: None while notifications arrive."""
        return None if self.connected.is_set() else POLL_WHEN_DOWN

    @contextlib.contextmanager
    def subscribe(self, projects: Iterable[str]) -> Iterator[asyncio.Event]:
        """An event set when any of projects may have a claimable run (or on shutdown).
        Subscribe BEFORE trying to claim, so a notify between the try and the wait is kept."""
        event = asyncio.Event()
        keys = list(projects)
        for p in keys:
            self._waiters.setdefault(p, {})[event] = None
        if self.stopping.is_set():
            event.set()
        try:
            yield event
        finally:
            for p in keys:
                waiters = self._waiters.get(p)
                if waiters is not None:
                    waiters.pop(event, None)
                    if not waiters:
                        del self._waiters[p]

    @contextlib.contextmanager
    def subscribe_run(self, run_id: str) -> Iterator[asyncio.Event]:
        """An event set when run_id's log may have new rows (or on shutdown, or when
        notifications may have been lost). Subscribe before reading the log."""
        event = asyncio.Event()
        self._run_waiters.setdefault(run_id, set()).add(event)
        if self.stopping.is_set():
            event.set()
        try:
            yield event
        finally:
            waiters = self._run_waiters.get(run_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._run_waiters[run_id]

    def _on_run_event(self, conn: object, pid: int, channel: str, payload: object) -> None:
        for event in self._run_waiters.get(str(payload), ()):
            event.set()

    def wake(self, project_id: str, besides: asyncio.Event | None = None, by: str = "notify") -> None:
        """Wakes one waiter of the project (but `besides`, the caller's own): the longest waiting
        that is not woken yet. None when every waiter is already woken (each of them claims
        next, and sees the new run)."""
        for event in self._waiters.get(project_id, ()):
            if event is not besides and not event.is_set():
                event.set()
                metrics.CLAIM_WAKEUPS.labels(by).inc()
                return

    def wake_all(self) -> None:
        for group in (self._waiters, self._run_waiters):
            for waiters in group.values():
                for event in waiters:
                    event.set()

    def _on_notify(self, conn: object, pid: int, channel: str, payload: object) -> None:
        self.wake(str(payload))

    def _on_probe(self, conn: object, pid: int, channel: str, payload: object) -> None:
        event = self._probes.get(str(payload))
        if event is not None:
            event.set()

    async def _probe(self) -> None:
        """Raises ListenUndelivered when a notification from another session does not arrive."""
        token = uuid.uuid4().hex
        arrived = self._probes[token] = asyncio.Event()
        try:
            sender = await asyncpg.connect(self.dsn, timeout=self.connect_timeout, statement_cache_size=0)
            try:
                await wakeup_sql.probe_notify(sender, channel=PROBE_CHANNEL, token=token)
            finally:
                await sender.close()
            try:
                await asyncio.wait_for(arrived.wait(), timeout=PROBE_TIMEOUT)
            except TimeoutError:
                raise ListenUndelivered from None
        finally:
            self._probes.pop(token, None)

    async def run(self) -> None:
        """Background loop: keeps the LISTEN connection up until shutdown."""
        backoff = 0.1
        while not self.stopping.is_set():
            lost = asyncio.Event()
            try:
                conn = await asyncpg.connect(
                    self.dsn,
                    timeout=self.connect_timeout,
                    server_settings={"application_name": "awooop-scheduler-listen"},
                )
                self._conn = conn
                conn.add_termination_listener(_setter(lost))
                await conn.add_listener(RUN_READY_CHANNEL, self._on_notify)
                await conn.add_listener(RUN_EVENT_CHANNEL, self._on_run_event)
                await conn.add_listener(PROBE_CHANNEL, self._on_probe)
                await self._probe()
                metrics.LISTEN_UNAVAILABLE.set(0)
                self.connected.set()
                metrics.LISTENER_UP.set(1)
                self.wake_all()  # anything sent while we were down is lost: look once
                backoff = 0.1
                await self._watch(conn, lost)
            except asyncio.CancelledError:
                raise
            except ListenUndelivered:
                metrics.LISTEN_UNAVAILABLE.set(1)
                if not self._warned_undelivered:
                    self._warned_undelivered = True
                    log.warning(
                        "LISTEN is accepted but delivers no notifications (a transaction-mode pooler in "
                        "front of Postgres?): claims poll every %.1f s instead of waking at once; set "
                        "AWOOOP_DATABASE_DIRECT_URL to a direct or session-mode connection",
                        POLL_WHEN_DOWN,
                    )
                backoff = RETRY_WHEN_UNDELIVERED
            except Exception as exc:  # connect failures, a dropped connection, a failed ping
                log.warning("LISTEN connection down; claims poll until it is back", extra={"error": repr(exc)})
            finally:
                self.connected.clear()
                metrics.LISTENER_UP.set(0)
                await self._close()
            if self.stopping.is_set():
                break
            self.wake_all()  # waiters switch to polling now
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=backoff)
            backoff = backoff if backoff >= RETRY_WHEN_UNDELIVERED else min(backoff * 2, MAX_BACKOFF)
        self.wake_all()

    async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Returns when the connection is lost (or on shutdown); pings it while idle, since a
        dead peer without a FIN would otherwise never be noticed."""
        while not self.stopping.is_set() and not lost.is_set():
            stop = asyncio.ensure_future(self.stopping.wait())
            gone = asyncio.ensure_future(lost.wait())
            try:
                await asyncio.wait({stop, gone}, timeout=PING_INTERVAL, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                gone.cancel()
            if self.stopping.is_set() or lost.is_set():
                return
            await wakeup_sql.ping(conn, query_timeout=self.connect_timeout)
        if lost.is_set():
            raise ConnectionError("LISTEN connection closed")

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), timeout=1.0)
        elif conn is not None:
            conn.terminate()

    async def close(self) -> None:
        self.wake_all()
        await self._close()
