"""Provider event id derivation (services/ingest/channels.py) and request parsing, per channel:
pure functions, no server."""

from __future__ import annotations

import hashlib
import json

import pytest
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from services.common import limits
from services.common.idempotency import fingerprint
from services.common.validate import Violations
from services.ingest import channels, parsing
from services.ingest.channels import DerivationError, derive

# --- helpers -------------------------------------------------------------------------------


def fails(channel: str, payload: dict, headers: dict | None = None, **kw: str) -> list[tuple[str, str]]:
    with pytest.raises(DerivationError) as exc:
        derive(channel, payload, headers or {}, **kw)
    return exc.value.violations


def fields_of(violations: list[tuple[str, str]]) -> list[str]:
    return [f for f, _ in violations]


def parse(req: ingest_pb2.IngestEventRequest, prefix: str = "", **kw: object) -> tuple[list, list]:
    v = Violations()
    out = parsing.parse_event(req, v, prefix=prefix, max_payload_bytes=1024, default_max_attempts=3, **kw)  # type: ignore[arg-type]
    return out, v.items


def struct(data: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


# --- explicit ids ------------------------------------------------------------------------------


def test_explicit_provider_event_id_is_used_as_given_for_every_channel() -> None:
    for channel in ("telegram", "alertmanager", "gitea", "line", "api"):
        assert derive(channel, {}, {}, provider_event_id="given-1") == [channels.Derived("given-1")]


# --- telegram ----------------------------------------------------------------------------------


def test_telegram_update_id() -> None:
    assert derive("telegram", {"update_id": 123456789, "message": {}}, {}) == [channels.Derived("123456789")]
    assert derive("telegram", {"update_id": 42.0}, {})[0].provider_event_id == "42"
    assert derive("telegram", {"update_id": "77"}, {})[0].provider_event_id == "77"


def test_telegram_without_integer_update_id_names_the_field() -> None:
    assert fields_of(fails("telegram", {"message": {}})) == ["payload.update_id"]
    for bad in (1.5, "abc", True, None, {"x": 1}):
        assert fields_of(fails("telegram", {"update_id": bad})) == ["payload.update_id"]


# --- alertmanager ------------------------------------------------------------------------------


def am(group_key: str, *alerts: tuple[str, str]) -> dict:
    return {"groupKey": group_key, "alerts": [{"fingerprint": fp, "status": st} for fp, st in alerts]}


def test_alertmanager_group_key_plus_stable_hash_of_sorted_fingerprints() -> None:
    a = derive("alertmanager", am('{}:{alertname="Disk"}', ("b2", "firing"), ("a1", "firing")), {})
    b = derive("alertmanager", am('{}:{alertname="Disk"}', ("a1", "firing"), ("b2", "firing")), {})
    assert a == b  # order of alerts does not matter
    expected = hashlib.sha256(b"a1=firing\nb2=firing").hexdigest()
    assert a[0].provider_event_id == '{}:{alertname="Disk"}:' + expected
    other = derive("alertmanager", am('{}:{alertname="Disk"}', ("a1", "firing"), ("c3", "firing")), {})
    assert other != a  # a new alert in the group is a new event
    resolved = derive("alertmanager", am('{}:{alertname="Disk"}', ("a1", "resolved"), ("b2", "resolved")), {})
    assert resolved != a  # the resolved notification is not swallowed as a duplicate of the firing one
    bare = derive("alertmanager", {"groupKey": "g", "alerts": [{"fingerprint": "z"}, {"fingerprint": "y"}]}, {})
    assert bare[0].provider_event_id == "g:" + hashlib.sha256(b"y\nz").hexdigest()


def test_alertmanager_long_group_key_is_hashed_to_fit() -> None:
    long_key = "{}:{" + ",".join(f'label{i}="{"v" * 20}"' for i in range(30)) + "}"
    pid = derive("alertmanager", am(long_key, ("f1", "firing")), {})[0].provider_event_id
    assert len(pid) <= limits.MAX_PROVIDER_EVENT_ID
    assert pid.startswith("sha256:" + hashlib.sha256(long_key.encode()).hexdigest() + ":")


def test_alertmanager_missing_parts_name_their_fields() -> None:
    assert fields_of(fails("alertmanager", {})) == ["payload.groupKey", "payload.alerts"]
    assert fields_of(fails("alertmanager", {"groupKey": "g", "alerts": []})) == ["payload.alerts"]
    v = fails("alertmanager", {"groupKey": "g", "alerts": [{"fingerprint": "ok"}, {"status": "firing"}, "x"]})
    assert fields_of(v) == ["payload.alerts[1].fingerprint", "payload.alerts[2].fingerprint"]


# --- gitea -------------------------------------------------------------------------------------


def test_gitea_delivery_header_is_case_insensitive() -> None:
    for name in ("X-Gitea-Delivery", "x-gitea-delivery", "X-GITEA-DELIVERY"):
        assert derive("gitea", {"ref": "main"}, {name: "d-1", "X-Other": "o"}) == [channels.Derived("d-1")]


def test_gitea_without_delivery_header_or_with_an_oversized_one() -> None:
    assert fields_of(fails("gitea", {}, {"X-Gitea-Event": "push"})) == ["headers.X-Gitea-Delivery"]
    assert fields_of(fails("gitea", {}, {"X-Gitea-Delivery": "x" * 257})) == ["headers.X-Gitea-Delivery"]


# --- line --------------------------------------------------------------------------------------


def test_line_one_event_per_webhook_event_id() -> None:
    events = [{"type": "message", "webhookEventId": "E1"}, {"type": "follow", "webhookEventId": "E2"}]
    out = derive("line", {"destination": "U1", "events": events}, {})
    assert [d.provider_event_id for d in out] == ["E1", "E2"]
    assert [d.event for d in out] == events  # each event is its run's default input
    assert derive("line", {"destination": "U1", "events": []}, {}) == []  # LINE's URL verification


def test_line_missing_ids_name_each_event() -> None:
    assert fields_of(fails("line", {"destination": "U1"})) == ["payload.events"]
    v = fails("line", {"events": [{"webhookEventId": "E1"}, {"type": "x"}, {"webhookEventId": ""}]})
    assert fields_of(v) == ["payload.events[1].webhookEventId", "payload.events[2].webhookEventId"]


# --- api ---------------------------------------------------------------------------------------


def test_api_uses_the_idempotency_key_header_then_metadata() -> None:
    assert derive("api", {}, {"Idempotency-Key": "h-1"}, idempotency_key="m-1") == [channels.Derived("h-1")]
    assert derive("api", {}, {}, idempotency_key="m-1") == [channels.Derived("m-1")]
    assert fields_of(fails("api", {"a": 1})) == ["provider_event_id"]


# --- request parsing ---------------------------------------------------------------------------


def test_parse_event_defaults_input_to_payload_or_each_line_event() -> None:
    req = ingest_pb2.IngestEventRequest(
        project_id="p", channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM, payload=struct({"update_id": 5, "x": "y"})
    )
    out, problems = parse(req)
    assert problems == []
    assert out[0].provider_event_id == "5"
    assert json.loads(out[0].input_json) == {"update_id": 5, "x": "y"}  # ids stay integers
    assert out[0].max_attempts == 3
    line_req = ingest_pb2.IngestEventRequest(
        project_id="p",
        channel_type=common_pb2.CHANNEL_TYPE_LINE,
        payload=struct({"events": [{"webhookEventId": "A"}, {"webhookEventId": "B"}]}),
    )
    out, _ = parse(line_req)
    assert [e.input_json for e in out] == ['{"webhookEventId":"A"}', '{"webhookEventId":"B"}']
    line_req.input.update({"fixed": True})
    out, _ = parse(line_req)
    assert [e.input_json for e in out] == ['{"fixed":true}', '{"fixed":true}']


def test_parse_event_reports_every_bad_field_with_its_path() -> None:
    req = ingest_pb2.IngestEventRequest(
        project_id="bad project!",
        channel_type=99,  # type: ignore[arg-type]
        provider_event_id="x" * 257,
        max_attempts=101,
        payload=struct({"blob": "z" * 2000}),
    )
    _, problems = parse(req, prefix="events[3].")
    assert set(fields_of(problems)) == {
        "events[3].project_id",
        "events[3].channel_type",
        "events[3].provider_event_id",
        "events[3].max_attempts",
        "events[3].payload",
    }
    unspecified = ingest_pb2.IngestEventRequest(project_id="p")
    assert fields_of(parse(unspecified)[1]) == ["channel_type"]
    missing = ingest_pb2.IngestEventRequest(project_id="p", channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM)
    assert fields_of(parse(missing, prefix="events[1].")[1]) == ["events[1].payload.update_id"]


def test_parse_event_refuses_what_jsonb_cannot_store() -> None:
    nan = ingest_pb2.IngestEventRequest(project_id="p", channel_type=common_pb2.CHANNEL_TYPE_API, provider_event_id="k")
    nan.payload.update({"n": float("nan")})
    assert fields_of(parse(nan)[1]) == ["payload"]
    nul = ingest_pb2.IngestEventRequest(project_id="p", channel_type=common_pb2.CHANNEL_TYPE_API, provider_event_id="k")
    nul.input.update({"s": "a\x00b"})
    assert fields_of(parse(nul)[1]) == ["input"]
    escaped = ingest_pb2.IngestEventRequest(
        project_id="p", channel_type=common_pb2.CHANNEL_TYPE_API, provider_event_id="k"
    )
    escaped.input.update({"s": "a\\u0000b"})  # a backslash, then "u0000": harmless text
    assert parse(escaped)[1] == []


def test_request_fingerprint_is_canonical() -> None:
    a = fingerprint({"project_id": "p", "input": {"a": 1, "b": [1, 2]}, "max_attempts": 3})
    b = fingerprint({"max_attempts": 3, "input": {"b": [1, 2], "a": 1}, "project_id": "p"})
    assert a == b and len(a) == 64
    assert a != fingerprint({"project_id": "p", "input": {"a": 2, "b": [1, 2]}, "max_attempts": 3})


# --- coalescing (services/ingest/coalesce.py) ----------------------------------------------------


async def test_coalescer_shares_flushes_keeps_order_and_bounds_concurrency() -> None:
    import asyncio

    from services.ingest.coalesce import Coalescer

    flushes: list[list[int]] = []
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        flushes.append(items)
        await gate.wait()
        running -= 1
        return [i * 10 for i in items]

    c: Coalescer[int, int] = Coalescer(flush, max_in_flight=2, max_items=5)
    calls = [asyncio.ensure_future(c.submit([n, n + 100])) for n in range(6)]
    calls.append(asyncio.ensure_future(c.submit(list(range(200, 207)))))  # larger than max_items: never split
    for _ in range(20):  # let the loop turn: submissions queue, two flushes start, then block
        await asyncio.sleep(0)
    assert len(flushes) == 2 and peak == 2  # the rest waits for a free slot
    gate.set()
    results = await asyncio.gather(*calls)
    assert results[:6] == [[n * 10, (n + 100) * 10] for n in range(6)]
    assert results[6] == [i * 10 for i in range(200, 207)]
    assert peak == 2
    assert all(len(f) <= 5 or len(f) == 7 for f in flushes)
    assert sorted(i for f in flushes for i in f) == sorted(i for n in range(6) for i in (n, n + 100)) + list(
        range(200, 207)
    )


async def test_a_busy_coalescer_lingers_for_more_and_an_idle_one_flushes_at_once() -> None:
    import asyncio

    from services.ingest.coalesce import Coalescer

    flushes: list[list[int]] = []
    gate = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        flushes.append(items)
        if items == [1]:
            await gate.wait()  # the first flush is slow: what comes meanwhile waits
        return items

    async def turns() -> None:  # let the loop run what is ready: a submission, a flush's start
        for _ in range(10):
            await asyncio.sleep(0)

    loop = asyncio.get_running_loop()
    c: Coalescer[int, int] = Coalescer(flush, max_in_flight=1, max_items=100, linger=0.05)
    first = asyncio.ensure_future(c.submit([1]))
    await turns()
    assert flushes == [[1]]  # idle: flushed on the next turn, no linger
    waiting = asyncio.ensure_future(c.submit([2]))
    await turns()
    ended = loop.time()
    gate.set()
    await first
    late = [asyncio.ensure_future(c.submit([n])) for n in (3, 4)]  # come while the next flush lingers
    assert await waiting == [2] and [await f for f in late] == [[3], [4]]
    assert flushes == [[1], [2, 3, 4]]  # the lingering flush took them along
    assert loop.time() - ended >= 0.05

    # a full flush does not linger: max_items waiting start it at once
    gate.clear()
    flushes.clear()
    c = Coalescer(flush, max_in_flight=1, max_items=3, linger=3600.0)
    first = asyncio.ensure_future(c.submit([1]))
    await turns()
    queued = [asyncio.ensure_future(c.submit([n])) for n in (2, 3)]
    await turns()
    gate.set()
    await first  # the flush ends with two waiting: the next one lingers
    await turns()
    assert flushes == [[1]]
    queued.append(asyncio.ensure_future(c.submit([4])))  # the third makes it full
    assert [await f for f in queued] == [[2], [3], [4]]
    assert flushes == [[1], [2, 3, 4]]

    # drain() at shutdown starts a lingering flush instead of waiting out the linger
    gate.clear()
    flushes.clear()
    first = asyncio.ensure_future(c.submit([1]))
    await turns()
    c.submit_nowait([5])
    gate.set()
    await first
    await asyncio.wait_for(c.drain(), timeout=5)
    assert flushes == [[1], [5]]


async def test_coalescer_gives_every_caller_of_a_failed_flush_the_error() -> None:
    import asyncio

    from services.ingest.coalesce import Coalescer

    async def flush(items: list[int]) -> list[int]:
        raise RuntimeError("store down")

    c: Coalescer[int, int] = Coalescer(flush, max_in_flight=1, max_items=100)
    results = await asyncio.gather(*(c.submit([n]) for n in range(3)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)


# --- Alertmanager: which notification becomes which run (docs/channels.md) ----------------------


def _am(status: str, starts_at: str, *fps: str, group: str = '{}:{alertname="Disk"}') -> str:
    alerts = [{"fingerprint": fp, "status": status, "startsAt": starts_at} for fp in fps]
    return derive("alertmanager", {"groupKey": group, "alerts": alerts}, {})[0].provider_event_id


def test_alertmanager_incidents_repeats_resolution_refire_and_group_changes() -> None:
    t1, t2 = "2026-12-01T07:00:00Z", "2026-12-01T08:00:00Z"
    first = _am("firing", t1, "a1")
    assert _am("firing", t1, "a1") == first  # repeat_interval re-send or retry: duplicate
    resolved = _am("resolved", t1, "a1")
    assert resolved != first  # the resolution is its own event
    refire = _am("firing", t2, "a1")
    assert refire not in (first, resolved)  # a new incident of the same alert: a new run
    assert _am("firing", t1, "a1", "a2") != first  # an alert joined the group
    assert _am("firing", t1, "a1", group='{}:{alertname="Other"}') != first  # another group
