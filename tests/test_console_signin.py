"""Console sign-in throttling (services/console/throttle.py) over real HTTP against the real
services: wrong keys in a row and at once are refused with 429 and Retry-After after the limit,
without the key being checked; a correct key from another address still signs in; the per key id
limit holds across addresses; the window ends. Other client addresses are other loopback
addresses (127.0.0.2, ...), which Linux routes to the console listening on 127.0.0.1."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest_asyncio
from prometheus_client import REGISTRY

from services.console.throttle import Refusal, SigninThrottle
from tests.harness.console import ConsoleEnv, start_console_env, stop_console_env
from tests.harness.helpers import eventually

LIMIT = 3


def throttled(by: str) -> float:
    return REGISTRY.get_sample_value("awooop_console_signin_throttled_total", {"by": by}) or 0.0


def failures() -> float:
    return REGISTRY.get_sample_value("awooop_console_signin_failures_total") or 0.0


class Client:
    """A browser at one client address: fetches the sign-in form (its CSRF cookie), posts a key."""

    def __init__(self, url: str, address: str) -> None:
        self.url = url
        connector = aiohttp.TCPConnector(local_addr=(address, 0), force_close=True)
        self.http = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def signin(self, key: str) -> tuple[int, str, dict[str, str]]:
        async with self.http.get(self.url + "/signin") as r:
            token = re.search(r'name="csrf" value="([^"]+)"', await r.text()).group(1)  # type: ignore[union-attr]
        data = {"csrf": token, "api_key": key, "next": "/"}
        async with self.http.post(self.url + "/signin", data=data, allow_redirects=False) as r:
            return r.status, await r.text(), dict(r.headers)

    async def close(self) -> None:
        await self.http.close()


@pytest_asyncio.fixture(loop_scope="session")
async def env(start_services: Any, make_key: Any, db: Any) -> AsyncIterator[ConsoleEnv]:
    e = await start_console_env(
        start_services, make_key, db, console_signin_max_failures=LIMIT, console_signin_window=60
    )
    yield e
    await stop_console_env(e)


@pytest_asyncio.fixture(loop_scope="session")
async def clients(env: ConsoleEnv) -> AsyncIterator[Any]:
    opened: list[Client] = []

    def at(address: str) -> Client:
        c = Client(env.url, address)
        opened.append(c)
        return c

    yield at
    for c in opened:
        await c.close()


def wrong(i: int) -> str:
    return f"awk_guess{i:04d}_not-the-secret"


async def test_wrong_keys_in_a_row_are_throttled_per_address(env: ConsoleEnv, clients: Any) -> None:
    a, b = clients("127.0.0.1"), clients("127.0.0.2")
    before_failures, before_throttled = failures(), throttled("address")
    for i in range(LIMIT):
        status, html, _ = await a.signin(wrong(i))
        assert status == 401 and "not accepted" in html
    assert failures() == before_failures + LIMIT
    for key in (wrong(99), "not-a-key", env.admin_key):  # refused unchecked: even the right key
        status, html, headers = await a.signin(key)
        assert status == 429 and "Too many failed sign-ins from your address" in html, (key, status)
        assert 0 < int(headers["Retry-After"]) <= 60
    assert throttled("address") == before_throttled + 3 and failures() == before_failures + LIMIT
    # another address is another count: its correct key signs in
    status, _, headers = await b.signin(env.admin_key)
    assert status == 303 and "awooop_console=" in headers.get("Set-Cookie", "")


async def test_wrong_secrets_of_one_key_id_are_throttled_across_addresses(env: ConsoleEnv, clients: Any) -> None:
    key_id = env.viewer_key.split("_")[1]
    before = throttled("key_id")
    for i in range(LIMIT):
        status, _, _ = await clients(f"127.0.0.{10 + i}").signin(f"awk_{key_id}_wrong-secret-{i}")
        assert status == 401
    status, html, headers = await clients("127.0.0.20").signin(f"awk_{key_id}_wrong-secret-x")
    assert status == 429 and "with this key id" in html and int(headers["Retry-After"]) > 0
    assert throttled("key_id") == before + 1
    # other key ids from a fresh address are unaffected
    status, _, _ = await clients("127.0.0.21").signin(env.approver_key)
    assert status == 303


async def test_concurrent_wrong_keys_are_throttled_like_sequential_ones(env: ConsoleEnv, clients: Any) -> None:
    attacker = [clients("127.0.0.30") for _ in range(40)]  # 40 connections, one address
    answers = await asyncio.gather(*(c.signin(wrong(i)) for i, c in enumerate(attacker)))
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [401] * LIMIT + [429] * (40 - LIMIT), statuses
    status, _, _ = await clients("127.0.0.31").signin(env.admin_key)
    assert status == 303


@pytest_asyncio.fixture(loop_scope="session")
async def short_window_env(start_services: Any, make_key: Any, db: Any) -> AsyncIterator[ConsoleEnv]:
    e = await start_console_env(
        start_services, make_key, db, console_signin_max_failures=LIMIT, console_signin_window=3.0
    )
    yield e
    await stop_console_env(e)


async def test_the_window_ends(short_window_env: ConsoleEnv) -> None:
    env = short_window_env
    c = Client(env.url, "127.0.0.40")
    try:
        # wrong secrets of a key id that exists: answered at once (an unknown key id waits for the
        # services' next refresh of live key ids), so the failures land well inside the window
        key_id = env.viewer_key.split("_")[1]
        for i in range(LIMIT):
            assert (await c.signin(f"awk_{key_id}_wrong-{i}"))[0] == 401
        status, _, _ = await c.signin(env.admin_key)
        assert status == 429

        async def signed_in() -> bool:
            return (await c.signin(env.admin_key))[0] == 303

        # refused attempts are not failures, so asking again does not extend the wait
        await eventually(signed_in, timeout=10, interval=0.2, what="the window to end")
    finally:
        await c.close()


async def test_no_limit_when_the_setting_is_zero(start_services: Any, make_key: Any, db: Any) -> None:
    env = await start_console_env(start_services, make_key, db, console_signin_max_failures=0)
    c = Client(env.url, "127.0.0.50")
    try:
        for i in range(LIMIT + 2):
            assert (await c.signin(wrong(i)))[0] == 401
        assert (await c.signin(env.admin_key))[0] == 303
    finally:
        await c.close()
        await stop_console_env(env)


def test_memory_is_bounded_and_the_least_recent_failure_goes_first() -> None:
    now = [0.0]
    t = SigninThrottle(2, 10.0, max_tracked=3, clock=lambda: now[0])
    for i in range(1000):  # a flood of addresses and key ids keeps at most 3 of each
        assert t.attempt(f"10.0.0.{i}", f"id{i}") is None
    assert len(t.by_address) == 3 and len(t.by_key_id) == 3
    assert t.attempt("a", None) is None
    now[0] = 5.0
    assert t.attempt("a", None) is None
    assert t.attempt("a", None) == Refusal("address", 5)  # until the first failure is 10 s old
    now[0] = 9.5
    assert t.attempt("a", None) == Refusal("address", 1)
    now[0] = 10.0  # the first failure left the window: one more attempt is checked
    assert t.attempt("a", None) is None and t.attempt("a", None) == Refusal("address", 5)
    t.take_back("a", None)  # a success takes its own attempt back, not the failures before it
    assert t.attempt("a", None) is None and t.attempt("a", None) is not None
