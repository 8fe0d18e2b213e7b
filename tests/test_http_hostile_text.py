"""Text that is not Unicode at the ingest service's HTTP edge, as an adversary sends it: a JSON
lone surrogate escape ("\\ud800") in a webhook or API-channel body, and raw invalid UTF-8 bytes
in the headers the HTTP side reads (Idempotency-Key, Authorization, each provider's signature
and delivery id). Each answers a 4xx problem document naming what was wrong (never 5xx, which
a provider retries forever) and stores nothing. Over gRPC, protobuf itself refuses a string
that is not UTF-8: MALFORMED_REQUEST. Real ingest server, Postgres and Redis; requests are
written byte by byte over a socket (tests/harness/rawhttp.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from typing import Any

import grpc

from awooop.common.v1 import common_pb2 as CH
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from tests.harness import rawhttp
from tests.harness.helpers import key_of, reason_of
from tests.harness.saga import struct

PROJECT = "hostile"
# JSON escapes of a lone high surrogate, a lone low surrogate: valid JSON syntax, not Unicode text
LONE = [b'"\\ud800"', b'"\\udfff"', b'"a\\ud83d"']
BAD_BYTES = b"\xff\xfe"


def hex_hmac(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def line_signature(secret: str, body: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


async def stored(db: Any) -> tuple[int, int, int]:
    return tuple(
        await db.fetchrow(
            """SELECT (SELECT count(*) FROM awooop_run_state), (SELECT count(*) FROM awooop_idempotency_key),
                      (SELECT count(*) FROM awooop_channel_event_dedupe)"""
        )
    )


def assert_problem(answer: rawhttp.RawAnswer, status: int, what: Any) -> dict[str, Any]:
    assert answer.status == status, (what, answer.status, answer.body[:300])
    assert answer.headers["content-type"].startswith("application/problem+json"), what
    doc: dict[str, Any] = answer.json()
    assert doc["status"] == status, what
    return doc


async def setup(start_services: Any, channels: Any, make_key: Any) -> tuple[Any, Any, Any, int]:
    rt = await start_services("ingest")
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    admin = await make_key("ops", {PROJECT: ["admin"]})
    return rt, stub, admin, rt.http_ports["ingest"]


async def test_api_channel_lone_surrogates_and_invalid_utf8_headers_are_4xx_storing_nothing(
    start_services: Any, channels: Any, make_key: Any, db: Any
) -> None:
    _rt, _stub, admin, port = await setup(start_services, channels, make_key)
    auth = ("Bearer " + key_of(admin)).encode()
    target = f"/v1/projects/{PROJECT}/events".encode()

    async def send(body: bytes, key: bytes = b"k-1", authorization: bytes = auth, query: bytes = b"") -> Any:
        headers = [(b"Authorization", authorization), (b"Idempotency-Key", key)]
        return await rawhttp.request(port, "POST", target + query, headers, body)

    before = await stored(db)
    bodies = [b'{"x":' + s + b"}" for s in LONE]
    bodies += [b'{"\\udc00":1}', b'{"a":[1,{"b":' + LONE[0] + b"}]}"]
    for body in bodies:
        doc = assert_problem(await send(body), 400, body)
        assert doc["reason"] == "FIELD_INVALID" and doc["invalid_params"][0]["name"] == "body", doc
        assert "surrogate" in doc["invalid_params"][0]["reason"], doc
    doc = assert_problem(await send(b'{"a":1}', key=BAD_BYTES), 400, "key")
    assert doc["reason"] == "FIELD_INVALID" and doc["invalid_params"][0]["name"] == "headers.Idempotency-Key", doc
    for authorization in (b"Bearer " + BAD_BYTES, b"Bearer awk_" + BAD_BYTES + b"_x", auth + BAD_BYTES):
        doc = assert_problem(await send(b'{"a":1}', authorization=authorization), 401, authorization)
        assert doc["reason"] == "UNAUTHENTICATED", doc
    # a query string's bad bytes arrive as U+FFFD: an unknown or invalid parameter, not a failure
    for query in (b"?%FF=1", b"?concurrency_key=%FF%FE", b"?not_before=%ED%A0%80", b"?priority=%FF"):
        assert_problem(await send(b'{"a":1}', query=query), 400, query)
    assert await stored(db) == before

    # a surrogate pair is one character (U+1F600), and valid non-ASCII text in a key is a key
    ok = await send(b'{"x":"\\ud83d\\ude00"}', key="ключ-1".encode())
    assert ok.status == 200, ok.body
    assert ok.json()["outcomes"][0]["provider_event_id"] == "ключ-1"
    assert await db.fetchval("SELECT input->>'x' FROM awooop_run_state") == "\U0001f600"


async def test_webhooks_lone_surrogates_and_invalid_utf8_headers_are_4xx_storing_nothing(
    start_services: Any, channels: Any, make_key: Any, db: Any
) -> None:
    _rt, stub, admin, port = await setup(start_services, channels, make_key)
    secrets: dict[str, str] = {}
    for channel, name in ((CH.CHANNEL_TYPE_TELEGRAM, "telegram"), (CH.CHANNEL_TYPE_ALERTMANAGER, "alertmanager"),
                          (CH.CHANNEL_TYPE_GITEA, "gitea"), (CH.CHANNEL_TYPE_LINE, "line")):  # fmt: skip
        given = "line-channel-secret" if name == "line" else ""  # LINE's secret is the one LINE issued
        resp = await stub.CreateEndpoint(
            ingest_pb2.CreateEndpointRequest(project_id=PROJECT, channel_type=channel, name="e", secret=given),
            metadata=admin,
        )
        secrets[name] = resp.secret or "line-channel-secret"

    def signed(channel: str, body: bytes) -> list[tuple[bytes, bytes]]:
        s = secrets[channel]
        return {
            "telegram": [(b"X-Telegram-Bot-Api-Secret-Token", s.encode())],
            "alertmanager": [(b"Authorization", f"Bearer {s}".encode())],
            "gitea": [(b"X-Gitea-Signature", hex_hmac(s, body).encode()), (b"X-Gitea-Delivery", b"d-1")],
            "line": [(b"X-Line-Signature", line_signature(s, body).encode())],
        }[channel]

    async def post(channel: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> rawhttp.RawAnswer:
        return await rawhttp.request(port, "POST", f"/v1/webhooks/{PROJECT}/{channel}/e".encode(), headers, body)

    def bodies(s: bytes) -> dict[str, bytes]:
        return {
            "telegram": b'{"update_id":7,"message":{"text":' + s + b"}}",
            "alertmanager": b'{"groupKey":' + s + b',"alerts":[{"fingerprint":"f","status":"firing"}]}',
            "gitea": b'{"ref":"refs/heads/main","commits":[{"message":' + s + b"}]}",
            "line": b'{"events":[{"webhookEventId":' + s + b',"type":"message"}]}',
        }

    before = await stored(db)
    for s in LONE:
        for channel, body in bodies(s).items():
            doc = assert_problem(await post(channel, body, signed(channel, body)), 400, (channel, body))
            assert doc["reason"] == "FIELD_INVALID" and doc["invalid_params"][0]["name"] == "body", doc

    valid = {c: b.replace(b'"\\ud800"', b'"ok"') for c, b in bodies(LONE[0]).items()}
    # proofs that are not even UTF-8 are wrong proofs: 401, the delivery not looked at
    forged = {
        "telegram": [[(b"X-Telegram-Bot-Api-Secret-Token", BAD_BYTES)]],
        "alertmanager": [[(b"Authorization", b"Bearer " + BAD_BYTES)], [(b"Authorization", b"Basic " + BAD_BYTES)]],
        "gitea": [
            [(b"X-Gitea-Signature", BAD_BYTES), (b"X-Gitea-Delivery", b"d-2")],
            [(b"X-Hub-Signature-256", b"sha256=" + BAD_BYTES), (b"X-Gitea-Delivery", b"d-2")],
        ],
        "line": [[(b"X-Line-Signature", BAD_BYTES)]],
    }
    for channel, variants in forged.items():
        for headers in variants:
            doc = assert_problem(await post(channel, valid[channel], headers), 401, (channel, headers))
            assert doc["reason"] == "UNAUTHENTICATED", doc
    # a signed Gitea delivery whose delivery id is not UTF-8: 400 naming the header
    gitea_headers = [(b"X-Gitea-Signature", hex_hmac(secrets["gitea"], valid["gitea"]).encode())]
    answer = await post("gitea", valid["gitea"], [*gitea_headers, (b"X-Gitea-Delivery", BAD_BYTES)])
    doc = assert_problem(answer, 400, "delivery id")
    assert doc["reason"] == "FIELD_INVALID" and doc["invalid_params"][0]["name"] == "headers.X-Gitea-Delivery", doc
    assert await stored(db) == before

    # the same deliveries with valid text go through: the refusals above were about the text
    for channel, body in valid.items():
        answer = await post(channel, body, signed(channel, body))
        assert answer.status == 200, (channel, answer.body)


async def test_grpc_strings_that_are_not_utf8_are_malformed_requests(
    start_services: Any, channels: Any, make_key: Any, db: Any
) -> None:
    rt, _stub, _admin, _port = await setup(start_services, channels, make_key)
    md = await make_key("relay", {PROJECT: ["ingest"]})
    channel = channels(rt.ports["ingest"])
    event = ingest_pb2.IngestEventRequest(
        project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_API, provider_event_id="p-1", payload=struct({"x": "MARK"})
    )
    batch = ingest_pb2.IngestEventsRequest(events=[event])
    before = await stored(db)
    for method, message in (("IngestEvent", event), ("IngestEvents", batch)):
        # the CESU-8 bytes of U+D800 where the string was: what a lone surrogate would be on the wire
        raw = message.SerializeToString().replace(b"MARK", b"\xed\xa0\x80M")
        rpc = channel.unary_unary(f"/awooop.ingest.v1.IngestService/{method}")
        try:
            await rpc(raw, metadata=md)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and reason_of(err) == "MALFORMED_REQUEST", err
        else:
            raise AssertionError(f"{method} accepted a string that is not UTF-8")
    # and protobuf will not even build a message holding one
    try:
        struct({"x": "\ud800"}).SerializeToString()
    except (ValueError, UnicodeError):
        pass
    else:
        raise AssertionError("protobuf serialized a lone surrogate")
    assert await stored(db) == before


async def test_oversized_headers_cookies_and_lines_are_400_in_one_info_line_each(
    start_services: Any, channels: Any, make_key: Any, caplog: Any
) -> None:
    """Issue 41, item 6: what aiohttp cannot parse (a header, a cookie, a query string over its
    limits) is answered 400 and logged as one INFO line naming the peer, never an ERROR with a
    traceback: a client's mistake must not fill the error log."""
    rt, _stub, _admin, port = await setup(start_services, channels, make_key)
    huge = b"x" * 20_000
    sent = [
        ("header", b"/v1/projects/p/events", [(b"X-Padding", huge)]),
        ("cookie", b"/v1/projects/p/events", [(b"Cookie", b"session=" + huge)]),
        ("query", b"/v1/runs/r/events?after=" + huge, []),
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="awooop.http"):
        for what, target, headers in sent:
            answer = await rawhttp.request(port, "GET", target, headers)
            assert answer.status == 400, (what, answer.status)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == [], [r.getMessage() for r in errors]
    refused = [r for r in caplog.records if r.name == "awooop.http"]
    assert len(refused) == len(sent), [r.getMessage() for r in refused]
    for r in refused:
        assert r.levelno == logging.INFO and r.exc_info is None and r.exc_text is None
        assert r.getMessage().startswith("refused a malformed HTTP request from 127.0.0.1: 400"), r.getMessage()
    # the server goes on: an ordinary request is answered as before
    assert (await rawhttp.request(port, "POST", f"/v1/projects/{PROJECT}/events".encode(), body=b"{}")).status == 401
    del rt
