"""The ingest service's HTTP side: webhook endpoints (objects, RPCs, provider verification),
the answers providers get, and per-endpoint Telegram ids. Bodies and headers come from the
providers' documentation and SDK test fixtures; signatures use the providers' real schemes.
Real ingest server, real Postgres and Redis, real HTTP over a socket (aiohttp client)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from typing import Any

import aiohttp
import grpc
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2 as CH
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.ingest import signatures
from tests.harness.helpers import eventually, expect_error
from tests.harness.saga import struct

PROJECT = "webhooks"

# Telegram's webhook guide (core.telegram.org/bots/webhooks, "Testing your bot with updates")
TELEGRAM_UPDATE = (
    b'{"update_id":10000,"message":{"date":1441645532,"chat":{"last_name":"Test Lastname","id":1111111,'
    b'"first_name":"Test","username":"Test"},"message_id":1365,"from":{"last_name":"Test Lastname",'
    b'"id":1111111,"first_name":"Test","username":"Test"},"text":"/start"}}'
)

# line-bot-sdk-python tests/test_signature.py: secret, body, and the signature LINE would send
LINE_SDK_SECRET = "channel_secret"
LINE_SDK_BODY = b"bodybodybodybody"
LINE_SDK_SIGNATURE = "/gg9a+LvFevTH1sd7XCQycD7tsWclCsInj7MhBHxN7k="
# line-bot-sdk-rust's webhook test: a real (older, pre-webhookEventId) delivery and its signature
LINE_RUST_SIGNATURE = "+uCVw4g3BuIOKnlseFJAYyFoVBFaMjxP8KXBbnIRRI0="
LINE_RUST_BODY = (
    b"\n          {\n"
    b'            "destination": "xxxxxxxxxx",\n'
    b'            "events": [\n'
    b"              {\n"
    b'                "replyToken": "nHuyWiB7yP5Zw52FIkcQobQuGDXCTA",\n'
    b'                "type": "message",\n'
    b'                "mode": "active",\n'
    b'                "timestamp": 1462629479859,\n'
    b'                "source": {\n'
    b'                  "type": "user",\n'
    b'                  "userId": "U4af4980629..."\n'
    b"                },\n"
    b'                "message": {\n'
    b'                  "id": "325708",\n'
    b'                  "type": "text",\n'
    b'                  "text": "@example Hello, world! (love)",\n'
    b'                  "emojis": [\n'
    b"                    {\n"
    b'                      "index": 14,\n'
    b'                      "length": 6,\n'
    b'                      "productId": "5ac1bfd5040ab15980c9b435",\n'
    b'                      "emojiId": "001"\n'
    b"                    }\n"
    b"                  ],\n"
    b'                  "mention": {\n'
    b'                    "mentionees": [\n'
    b"                      {\n"
    b'                        "index": 0,\n'
    b'                        "length": 8,\n'
    b'                        "userId": "U850014438e..."\n'
    b"                      }\n"
    b"                    ]\n"
    b"                  }\n"
    b"                }\n"
    b"              }\n"
    b"            ]\n"
    b"          }\n"
    b"        "
)
# The Messaging API reference's message event (current format, with webhookEventId)
LINE_DOCS_BODY = json.dumps(
    {
        "destination": "xxxxxxxxxx",
        "events": [
            {
                "replyToken": "nHuyWiB7yP5Zw52FIkcQobQuGDXCTA",
                "type": "message",
                "mode": "active",
                "timestamp": 1462629479859,
                "source": {"type": "group", "groupId": "Ca56f94637c...", "userId": "U4af4980629..."},
                "webhookEventId": "01FZ74A0TDDPYRVKNK77XKC3ZR",
                "deliveryContext": {"isRedelivery": False},
                "message": {"id": "444573844083572737", "type": "text", "text": "@All @example Good Morning!! (love)"},
            }
        ],
    },
    indent=2,
).encode()
LINE_VERIFICATION_BODY = b'{"destination":"xxxxxxxxxx","events":[]}'

# Gitea's webhook documentation (docs.gitea.com/usage/webhooks): the headers and a push body
GITEA_HEADERS = {
    "X-GitHub-Delivery": "f6266f16-1bf3-46a5-9ea4-602e06ead473",
    "X-GitHub-Event": "push",
    "X-Gogs-Delivery": "f6266f16-1bf3-46a5-9ea4-602e06ead473",
    "X-Gogs-Event": "push",
    "X-Gitea-Delivery": "f6266f16-1bf3-46a5-9ea4-602e06ead473",
    "X-Gitea-Event": "push",
    "Content-Type": "application/json",
}
GITEA_BODY = b"""{
  "ref": "refs/heads/develop",
  "before": "28e1879d029cb852e4844d9c718537df08844e03",
  "after": "bffeb74224043ba2feb48d137756c8a9331c449a",
  "compare_url": "http://localhost:3000/gitea/webhooks/compare/28e1879d029cb852e4844d9c718537df08844e03...bffeb74224043ba2feb48d137756c8a9331c449a",
  "commits": [
    {
      "id": "bffeb74224043ba2feb48d137756c8a9331c449a",
      "message": "Webhooks Yay!",
      "url": "http://localhost:3000/gitea/webhooks/commit/bffeb74224043ba2feb48d137756c8a9331c449a",
      "author": {"name": "Gitea", "email": "someone@gitea.io", "username": "gitea"},
      "committer": {"name": "Gitea", "email": "someone@gitea.io", "username": "gitea"},
      "timestamp": "2017-03-13T13:52:11-04:00"
    }
  ],
  "repository": {"id": 140, "name": "webhooks", "full_name": "gitea/webhooks"},
  "pusher": {"id": 1, "login": "gitea", "username": "gitea"},
  "sender": {"id": 1, "login": "gitea", "username": "gitea"}
}"""


def hex_hmac(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def line_signature(secret: str, body: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def failures(channel: str, endpoint: str) -> float:
    value = REGISTRY.get_sample_value(
        "awooop_webhook_signature_failures_total", {"project": PROJECT, "channel": channel, "endpoint": endpoint}
    )
    return value or 0.0


async def setup(start_services, channels, make_key, **overrides: Any):  # type: ignore[no-untyped-def]
    rt = await start_services("ingest", **overrides)
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    admin = await make_key("ops", {PROJECT: ["admin"]})
    base = f"http://127.0.0.1:{rt.http_ports['ingest']}"
    return rt, stub, admin, base


async def create(stub, md, channel: int, name: str, secret: str = "") -> str:  # type: ignore[no-untyped-def]
    resp = await stub.CreateEndpoint(
        ingest_pb2.CreateEndpointRequest(project_id=PROJECT, channel_type=channel, name=name, secret=secret),
        metadata=md,
    )
    assert resp.endpoint.path == f"/v1/webhooks/{PROJECT}/{CH.ChannelType.Name(channel)[13:].lower()}/{name}"
    return str(resp.secret)


async def post(base: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any], Any]:
    async with aiohttp.ClientSession() as http, http.post(base + path, data=body, headers=headers) as r:
        text = await r.text()
        return r.status, dict(r.headers), json.loads(text) if text else None


async def runs(db) -> int:  # type: ignore[no-untyped-def]
    return int(await db.fetchval("SELECT count(*) FROM awooop_run_state"))


# --- signature schemes, against the SDKs' own fixtures ------------------------------------------


def test_line_signature_matches_the_sdk_fixtures() -> None:
    sig = {signatures.LINE_HEADER: LINE_SDK_SIGNATURE}
    assert signatures.line(sig, LINE_SDK_BODY, LINE_SDK_SECRET)
    assert not signatures.line({signatures.LINE_HEADER: "invalid_signature"}, LINE_SDK_BODY, LINE_SDK_SECRET)
    assert signatures.line({signatures.LINE_HEADER: LINE_RUST_SIGNATURE}, LINE_RUST_BODY, LINE_SDK_SECRET)
    assert not signatures.line({signatures.LINE_HEADER: LINE_RUST_SIGNATURE}, LINE_RUST_BODY, "hogehoge")
    assert not signatures.line({}, LINE_SDK_BODY, LINE_SDK_SECRET)


def test_gitea_telegram_alertmanager_schemes() -> None:
    body, secret = GITEA_BODY, "s3cret"
    assert signatures.gitea({"x-gitea-signature": hex_hmac(secret, body)}, body, secret)
    assert signatures.gitea({"X-Hub-Signature-256": "sha256=" + hex_hmac(secret, body)}, body, secret)
    assert not signatures.gitea({"X-Gitea-Signature": hex_hmac(secret, body + b" ")}, body, secret)
    assert not signatures.gitea({"X-Gitea-Signature": "zz"}, body, secret)
    assert not signatures.gitea({"X-Hub-Signature-256": hex_hmac(secret, body)}, body, secret)  # prefix required
    assert signatures.telegram({"X-Telegram-Bot-Api-Secret-Token": "tok"}, b"", "tok")
    assert not signatures.telegram({"X-Telegram-Bot-Api-Secret-Token": "tok2"}, b"", "tok")
    basic = base64.b64encode(b"alertmanager:pw").decode()
    assert signatures.alertmanager({"Authorization": "Bearer pw"}, b"", "pw")
    assert signatures.alertmanager({"Authorization": f"Basic {basic}"}, b"", "pw")
    assert not signatures.alertmanager({"Authorization": "Bearer nope"}, b"", "pw")
    assert not signatures.alertmanager({"Authorization": "Basic !!!"}, b"", "pw")
    assert not signatures.alertmanager({}, b"", "pw")


# --- endpoint objects ----------------------------------------------------------------------------


async def test_endpoint_rpcs_secret_shown_once_admin_only_rotation_grace(
    start_services, channels, make_key, db
) -> None:
    _rt, stub, admin, base = await setup(start_services, channels, make_key)
    secret = await create(stub, admin, CH.CHANNEL_TYPE_TELEGRAM, "bot-a")
    assert len(secret) >= 32
    listed = await stub.ListEndpoints(ingest_pb2.ListEndpointsRequest(project_id=PROJECT), metadata=admin)
    assert [e.name for e in listed.endpoints] == ["bot-a"]
    assert secret.encode() not in listed.SerializeToString()  # reads never carry the secret
    assert not listed.endpoints[0].HasField("rotate_time")
    await expect_error(
        stub.CreateEndpoint(
            ingest_pb2.CreateEndpointRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, name="bot-a"),
            metadata=admin,
        ),
        grpc.StatusCode.ALREADY_EXISTS,
    )
    err = await expect_error(
        stub.CreateEndpoint(
            ingest_pb2.CreateEndpointRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_API, name="x y"),
            metadata=admin,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_INVALID",
    )
    assert "channel_type" in err.details() and "name" in err.details()
    ingest_only = await make_key("feeder", {PROJECT: ["ingest"]})
    for call in (
        stub.ListEndpoints(ingest_pb2.ListEndpointsRequest(project_id=PROJECT), metadata=ingest_only),
        stub.CreateEndpoint(
            ingest_pb2.CreateEndpointRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_GITEA, name="g"),
            metadata=ingest_only,
        ),
    ):
        await expect_error(call, grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN")

    path = f"/v1/webhooks/{PROJECT}/telegram/bot-a"
    tg = {"X-Telegram-Bot-Api-Secret-Token": secret, "Content-Type": "application/json"}
    status, _, body = await post(base, path, TELEGRAM_UPDATE, tg)
    assert status == 200 and body["outcomes"][0]["duplicate"] is False

    rotated = await stub.RotateEndpointSecret(
        ingest_pb2.RotateEndpointSecretRequest(
            project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, name="bot-a", grace_seconds=3600
        ),
        metadata=admin,
    )
    assert rotated.secret and rotated.secret != secret
    assert rotated.endpoint.HasField("rotate_time") and rotated.endpoint.HasField("previous_secret_expire_time")
    # both secrets verify during the grace period: the same update is a duplicate either way
    for token in (secret, rotated.secret):
        status, _, body = await post(base, path, TELEGRAM_UPDATE, {**tg, "X-Telegram-Bot-Api-Secret-Token": token})
        assert status == 200 and body["outcomes"][0]["duplicate"] is True
    # a rotation with a short grace: the old secret stops working when it ends, the new one keeps working
    short = await stub.RotateEndpointSecret(
        ingest_pb2.RotateEndpointSecretRequest(
            project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, name="bot-a", grace_seconds=0.5
        ),
        metadata=admin,
    )

    async def old_refused() -> bool:
        headers = {**tg, "X-Telegram-Bot-Api-Secret-Token": rotated.secret}
        return (await post(base, path, TELEGRAM_UPDATE, headers))[0] == 401

    await eventually(old_refused, what="the previous secret to expire after its grace")
    status, _, _ = await post(base, path, TELEGRAM_UPDATE, {**tg, "X-Telegram-Bot-Api-Secret-Token": short.secret})
    assert status == 200

    await stub.RemoveEndpoint(
        ingest_pb2.RemoveEndpointRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, name="bot-a"),
        metadata=admin,
    )
    status, headers, body = await post(base, path, TELEGRAM_UPDATE, tg)
    assert status == 404 and headers["Content-Type"].startswith("application/problem+json")
    await expect_error(
        stub.RemoveEndpoint(
            ingest_pb2.RemoveEndpointRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, name="bot-a"),
            metadata=admin,
        ),
        grpc.StatusCode.NOT_FOUND,
    )
    assert await runs(db) == 1


# --- providers -----------------------------------------------------------------------------------


async def test_telegram_two_bots_never_collide_and_grpc_keeps_the_seed_id(
    start_services, channels, make_key, db
) -> None:
    _rt, stub, admin, base = await setup(start_services, channels, make_key)
    secrets = {name: await create(stub, admin, CH.CHANNEL_TYPE_TELEGRAM, name) for name in ("bot-a", "bot-b")}
    out = {}
    for name, secret in secrets.items():
        status, _, body = await post(
            base, f"/v1/webhooks/{PROJECT}/telegram/{name}", TELEGRAM_UPDATE, {signatures.TELEGRAM_HEADER: secret}
        )
        assert status == 200
        out[name] = body["outcomes"][0]
    assert out["bot-a"]["provider_event_id"] == "bot-a:10000" and out["bot-b"]["provider_event_id"] == "bot-b:10000"
    assert out["bot-a"]["run_id"] != out["bot-b"]["run_id"]
    assert not out["bot-a"]["duplicate"] and not out["bot-b"]["duplicate"]

    # a bad or missing secret: 401, counted for the endpoint, nothing stored
    before = failures("telegram", "bot-a")
    for headers in ({signatures.TELEGRAM_HEADER: secrets["bot-b"]}, {}):
        status, hdrs, body = await post(base, f"/v1/webhooks/{PROJECT}/telegram/bot-a", b'{"update_id":7}', headers)
        assert status == 401 and hdrs["Content-Type"].startswith("application/problem+json")
        assert body["status"] == 401 and signatures.TELEGRAM_HEADER in body["detail"]
    assert failures("telegram", "bot-a") == before + 2
    assert await runs(db) == 2

    # gRPC: without an endpoint the id stays the update_id; with one it is the HTTP path's id
    md = await make_key("relay", {PROJECT: ["ingest"]})
    payload = json.loads(TELEGRAM_UPDATE)
    plain = (
        await stub.IngestEvent(
            ingest_pb2.IngestEventRequest(
                project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, payload=struct(payload)
            ),
            metadata=md,
        )
    ).outcomes[0]
    assert plain.provider_event_id == "10000" and not plain.duplicate
    scoped = (
        await stub.IngestEvent(
            ingest_pb2.IngestEventRequest(
                project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, payload=struct(payload), endpoint="bot-b"
            ),
            metadata=md,
        )
    ).outcomes[0]
    assert scoped.duplicate and scoped.run_id == out["bot-b"]["run_id"]


async def test_line_sdk_fixture_docs_event_verification_request_and_forgery(
    start_services, channels, make_key, db
) -> None:
    _rt, stub, admin, base = await setup(start_services, channels, make_key)
    # LINE issues the channel secret: the endpoint is created with it, and cannot be without
    err = await expect_error(
        stub.CreateEndpoint(
            ingest_pb2.CreateEndpointRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_LINE, name="shop"),
            metadata=admin,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_INVALID",
    )
    assert "secret" in err.details()
    assert await create(stub, admin, CH.CHANNEL_TYPE_LINE, "shop", secret=LINE_SDK_SECRET) == LINE_SDK_SECRET
    path = f"/v1/webhooks/{PROJECT}/line/shop"

    # the SDK fixture's signature verifies; the old-format event lacks webhookEventId -> 400 naming it
    status, hdrs, body = await post(base, path, LINE_RUST_BODY, {signatures.LINE_HEADER: LINE_RUST_SIGNATURE})
    assert status == 400 and hdrs["Content-Type"].startswith("application/problem+json")
    assert [p["name"] for p in body["invalid_params"]] == ["body.events[0].webhookEventId"]

    # the verification request of the LINE console (no events): 200, no run
    sig = line_signature(LINE_SDK_SECRET, LINE_VERIFICATION_BODY)
    status, _, body = await post(base, path, LINE_VERIFICATION_BODY, {signatures.LINE_HEADER: sig})
    assert (status, body) == (200, {"outcomes": []})

    # the documented message event: one run, its redelivery a duplicate
    sig = line_signature(LINE_SDK_SECRET, LINE_DOCS_BODY)
    answers = [await post(base, path, LINE_DOCS_BODY, {signatures.LINE_HEADER: sig}) for _ in range(2)]
    assert [a[0] for a in answers] == [200, 200]
    first, again = (a[2]["outcomes"][0] for a in answers)
    assert first["provider_event_id"] == "01FZ74A0TDDPYRVKNK77XKC3ZR" and not first["duplicate"]
    assert again["duplicate"] and again["run_id"] == first["run_id"] and again["code"] == "E-IDEMPOTENT-001"
    row = await db.fetchrow("SELECT input, created_by FROM awooop_run_state WHERE run_id = $1::uuid", first["run_id"])
    assert json.loads(row["input"])["webhookEventId"] == "01FZ74A0TDDPYRVKNK77XKC3ZR"
    assert row["created_by"] == "line/shop"

    # forged: signed with another secret, or the body changed after signing -> 401, nothing stored
    forged_body = LINE_DOCS_BODY.replace(b"01FZ74A0TDDPYRVKNK77XKC3ZR", b"01FZ74A0TDDPYRVKNK77XKC3ZX")
    before = failures("line", "shop")
    for body_, sig_ in ((forged_body, line_signature("hogehoge", forged_body)), (forged_body, sig)):
        status, _, _ = await post(base, path, body_, {signatures.LINE_HEADER: sig_})
        assert status == 401
    assert failures("line", "shop") == before + 2
    assert await runs(db) == 1


async def test_gitea_docs_delivery_both_signature_headers_and_forgery(start_services, channels, make_key, db) -> None:
    _rt, stub, admin, base = await setup(start_services, channels, make_key)
    secret = await create(stub, admin, CH.CHANNEL_TYPE_GITEA, "repo-hooks")
    path = f"/v1/webhooks/{PROJECT}/gitea/repo-hooks"
    sig = hex_hmac(secret, GITEA_BODY)
    # what Gitea sends: both headers
    status, _, body = await post(
        base, path, GITEA_BODY, {**GITEA_HEADERS, "X-Gitea-Signature": sig, "X-Hub-Signature-256": f"sha256={sig}"}
    )
    assert status == 200
    first = body["outcomes"][0]
    assert first["provider_event_id"] == "f6266f16-1bf3-46a5-9ea4-602e06ead473" and not first["duplicate"]
    # a GitHub-style sender (X-Hub-Signature-256 only) verifies too; the redelivery is a duplicate
    status, _, body = await post(base, path, GITEA_BODY, {**GITEA_HEADERS, "X-Hub-Signature-256": f"sha256={sig}"})
    assert status == 200 and body["outcomes"][0]["duplicate"] and body["outcomes"][0]["run_id"] == first["run_id"]
    # forged
    other = {**GITEA_HEADERS, "X-Gitea-Delivery": "11111111-2222-3333-4444-555555555555"}
    for headers in (
        {**other, "X-Gitea-Signature": hex_hmac("guess", GITEA_BODY)},
        {**other, "X-Gitea-Signature": sig[:-1] + ("0" if sig[-1] != "0" else "1")},
        other,
    ):
        assert (await post(base, path, GITEA_BODY, headers))[0] == 401
    # signed but without the delivery id: 400 naming the header
    no_delivery = {k: v for k, v in GITEA_HEADERS.items() if k != "X-Gitea-Delivery"}
    status, _, body = await post(base, path, GITEA_BODY, {**no_delivery, "X-Gitea-Signature": sig})
    assert status == 400 and body["invalid_params"][0]["name"] == "headers.X-Gitea-Delivery"
    assert await runs(db) == 1


async def test_http_answers_never_500(start_services, channels, make_key, db) -> None:
    rt, stub, admin, base = await setup(start_services, channels, make_key, max_payload_bytes=4096)
    secret = await create(stub, admin, CH.CHANNEL_TYPE_ALERTMANAGER, "am")
    path = f"/v1/webhooks/{PROJECT}/alertmanager/am"
    bearer = {"Authorization": f"Bearer {secret}"}
    cases: list[tuple[str, bytes, dict[str, str], int]] = [
        (f"/v1/webhooks/{PROJECT}/alertmanager/nope", b"{}", bearer, 404),
        (f"/v1/webhooks/{PROJECT}/smtp/am", b"{}", bearer, 404),
        ("/v1/webhooks/bad%20project/alertmanager/am", b"{}", bearer, 404),
        ("/elsewhere", b"{}", bearer, 404),
        (path, b"{}", {"Authorization": "Bearer wrong"}, 401),
        (path, b"{}", {"Authorization": "Basic " + base64.b64encode(b"u:wrong").decode()}, 401),
        (path, b"not json", bearer, 400),
        (path, b'{"groupKey": NaN}', bearer, 400),
        (path, b"[1, 2]", bearer, 400),
        (path, b'{"groupKey": "g", "alerts": []}', bearer, 400),
        (path, b"\xff\xfe", bearer, 400),
        (path, b"[" * 3000, bearer, 400),  # nesting deeper than the JSON parser's recursion
        (path, b'{"groupKey": "g", "alerts": [{"fingerprint": "f", "status": 1e400}]}', bearer, 400),
        (path, b'{"a": "' + b"x" * 5000 + b'"}', bearer, 413),
    ]
    for url, body, headers, expected in cases:
        status, hdrs, doc = await post(base, url, body, headers)
        assert status == expected, (url, body[:40], status, doc)
        assert hdrs["Content-Type"].startswith("application/problem+json") and doc["status"] == expected
    async with aiohttp.ClientSession() as http, http.get(base + path) as r:
        assert r.status == 405
    # Basic auth with the secret as password is accepted
    basic = {"Authorization": "Basic " + base64.b64encode(f"alertmanager:{secret}".encode()).decode()}
    alert = {"groupKey": '{}:{alertname="X"}', "alerts": [{"fingerprint": "f1", "status": "firing"}]}
    status, _, body = await post(base, path, json.dumps(alert).encode(), basic)
    assert status == 200 and not body["outcomes"][0]["duplicate"]
    assert await runs(db) == 1
    # store unavailable: 503 with Retry-After, so the provider retries
    await rt.ctx.pool.close()
    alert["alerts"][0]["fingerprint"] = "f2"
    status, hdrs, doc = await post(base, path, json.dumps(alert).encode(), basic)
    assert status == 503 and int(hdrs["Retry-After"]) > 0 and doc["reason"] == "STORE_UNAVAILABLE"


async def test_grpc_endpoint_field_is_validated(start_services, channels, make_key) -> None:
    _rt, stub, _admin, _base = await setup(start_services, channels, make_key)
    md = await make_key("relay", {PROJECT: ["ingest"]})
    req = ingest_pb2.IngestEventRequest(
        project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, payload=struct({"update_id": 1}), endpoint="a b"
    )
    err = await expect_error(stub.IngestEvent(req, metadata=md), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
    assert "endpoint" in err.details()


async def test_two_replicas_parallel_redeliveries_one_run_and_rotation_seen_at_once(
    start_services, channels, make_key, db
) -> None:
    """50 copies of one update, posted at once to two ingest servers: one run. Then a rotation
    made through server A is honoured by server B at once, although B cached the old secret."""
    _rt_a, stub, admin, base_a = await setup(start_services, channels, make_key, endpoint_cache_seconds=300)
    rt_b = await start_services("ingest", endpoint_cache_seconds=300)
    base_b = f"http://127.0.0.1:{rt_b.http_ports['ingest']}"
    secret = await create(stub, admin, CH.CHANNEL_TYPE_TELEGRAM, "bot")
    path = f"/v1/webhooks/{PROJECT}/telegram/bot"
    headers = {signatures.TELEGRAM_HEADER: secret}
    answers = await asyncio.gather(
        *(post(base_a if i % 2 else base_b, path, TELEGRAM_UPDATE, headers) for i in range(50))
    )
    assert [a[0] for a in answers] == [200] * 50
    outcomes = [a[2]["outcomes"][0] for a in answers]
    assert len({o["run_id"] for o in outcomes}) == 1 and sum(not o["duplicate"] for o in outcomes) == 1
    assert await runs(db) == 1

    rotated = await stub.RotateEndpointSecret(
        ingest_pb2.RotateEndpointSecretRequest(
            project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, name="bot", grace_seconds=3600
        ),
        metadata=admin,
    )
    update = TELEGRAM_UPDATE.replace(b"10000", b"10001")
    status, _, body = await post(base_b, path, update, {signatures.TELEGRAM_HEADER: rotated.secret})
    assert status == 200 and not body["outcomes"][0]["duplicate"]
    # and the previous secret still verifies on both during the grace period
    for base in (base_a, base_b):
        status, _, body = await post(base, path, update, headers)
        assert status == 200 and body["outcomes"][0]["duplicate"]
