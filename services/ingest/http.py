"""HTTP transport of the ingest service (aiohttp), on AWOOOP_HTTP_PORT:

    POST /v1/webhooks/{project_id}/{channel}/{endpoint}   telegram | alertmanager | gitea | line
    POST /v1/projects/{project_id}/events                  the API channel (bearer key, Idempotency-Key)

A webhook body is read raw and verified against the endpoint's secret (signatures.py) before it
is parsed; nothing is stored for a delivery that fails. Valid deliveries go through the same
logic as IngestEvent (parsing.delivery_events, then events.EventIngestor.ingest).

Answers (docs/channels.md): 200 {"outcomes": [...]} for new and duplicate deliveries alike;
400 application/problem+json (RFC 9457) with `invalid_params` naming each bad field; 401 a
missing or wrong signature or key; 403 no ingest role; 404 unknown endpoint; 405 not POST;
409 IDEMPOTENCY_CONFLICT; 413 body over AWOOOP_MAX_PAYLOAD_BYTES; 503 with Retry-After when
the store is unavailable. An unexpected failure is logged and answered 503 too (providers
retry), never 500.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp
from multidict import MultiMapping

from services.common import errors, run_options, tracing
from services.common.access import require_role
from services.common.auth import Authenticator, Principal
from services.common.db import store_error
from services.common.limits import MAX_IDEMPOTENCY_KEY
from services.common.run_options import RunOptions
from services.common.settings import Settings
from services.common.validate import PROJECT_RE, Violations
from services.ingest import endpoints, metrics, parsing, signatures
from services.ingest.create_run import ROLE
from services.ingest.events import DUPLICATE_CODE, EventIngestor, Outcome

log = logging.getLogger("awooop.ingest.http")

PROBLEM_TYPE = "application/problem+json"
RETRY_AFTER_SECONDS = "5"
IDEMPOTENCY_KEY = "Idempotency-Key"

_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,  # a run event stream past AWOOOP_MAX_WATCHERS
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 503,
}
_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    429: "Too Many Requests",
    503: "Service Unavailable",
}


def problem(
    status: int,
    detail: str,
    *,
    reason: str = "",
    violations: list[tuple[str, str]] | None = None,
    extra: dict[str, str] | None = None,
) -> web.Response:
    """An RFC 9457 problem document; `reason` is the gRPC ErrorInfo reason of the same failure."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if reason:
        body["reason"] = reason
    for k, v in (extra or {}).items():  # ErrorInfo metadata (e.g. first_seen_at), as extension members
        body.setdefault(k, v)
    if violations:
        body["invalid_params"] = [{"name": f, "reason": d} for f, d in violations]
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status == 503 else None
    return web.Response(status=status, text=json.dumps(body), content_type=PROBLEM_TYPE, headers=headers)


def from_service_error(exc: errors.ServiceError) -> web.Response:
    return problem(
        _STATUS.get(exc.code, 503), exc.message, reason=exc.reason, violations=exc.violations, extra=exc.metadata
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_body(body: bytes, field: str) -> dict[str, Any]:
    """The body as a JSON object; a ServiceError naming `field` otherwise. NaN and Infinity,
    which Python's json accepts, are refused like everywhere else."""
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise errors.invalid([(field, "must be JSON (UTF-8), numbers finite")]) from None
    if not isinstance(value, dict):
        raise errors.invalid([(field, "must be a JSON object")])
    return value


def run_options_from_query(v: Violations, query: MultiMapping[str]) -> RunOptions:
    """The API event's run options from its query string (`?not_before=2026-12-01T09:00:00Z&priority=5
    &concurrency_key=k8s:deployment/api&concurrency_key=llm:provider-x&require_label=gpu=a100`: a key or
    a label repeats, one per key or label), validated as IngestEvent's fields (run_options.parse; the
    i-th key is query.concurrency_keys[i] in errors)."""
    unknown = sorted(set(query) - set(QUERY_OPTIONS))
    if unknown:
        v.add("query", f"unknown parameters {unknown}: {', '.join(QUERY_OPTIONS)} are known")
    not_before = None
    if "not_before" in query:
        not_before = Timestamp()
        try:
            not_before.FromJsonString(query["not_before"])
        except ValueError:
            v.add("query.not_before", "an RFC 3339 time, e.g. 2026-12-01T09:00:00Z")
            not_before = None
    priority = 0
    if "priority" in query:
        try:
            priority = int(query["priority"])
        except ValueError:
            v.add("query.priority", "an integer")
    return run_options.parse(
        v,
        "query.",
        not_before=not_before,
        priority=priority,
        policy=None,
        concurrency_keys=query.getall("concurrency_key", []),
        required_labels=_labels(v, "query.require_label", query.getall("require_label", [])),
        preferred_labels=_labels(v, "query.prefer_label", query.getall("prefer_label", [])),
    )


QUERY_OPTIONS = ("not_before", "priority", "concurrency_key", "require_label", "prefer_label")


def _labels(v: Violations, field: str, pairs: Sequence[str]) -> dict[str, str]:
    """key=value query values as labels (validated by run_options.parse)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            v.add(field, f"{pair!r}: a label is key=value")
        out[key] = value
    return out


def outcomes_json(outcomes: Sequence[Outcome]) -> web.Response:
    items = []
    for o in outcomes:
        item: dict[str, Any] = {"run_id": o.run_id, "provider_event_id": o.provider_event_id, "duplicate": o.duplicate}
        if o.duplicate:
            item["code"] = DUPLICATE_CODE
        items.append(item)
    return web.json_response({"outcomes": items})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpIngest:
    def __init__(
        self,
        settings: Settings,
        events: EventIngestor,
        directory: endpoints.Directory,
        authenticator: Authenticator,
    ) -> None:
        self.settings = settings
        self.events = events
        self.directory = directory
        self.authenticator = authenticator

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_payload_bytes, middlewares=[self._answers])
        app.router.add_post("/v1/webhooks/{project_id}/{channel}/{endpoint}", self.webhook)
        app.router.add_post("/v1/projects/{project_id}/events", self.api_events)
        return app

    @web.middleware
    async def _answers(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        route = (
            "webhooks"
            if path.startswith("/v1/webhooks/")
            else "run_events"  # GET /v1/runs/<id>/events: a run's event stream (run_stream.py)
            if path.startswith("/v1/runs/")
            else "events"
            if path.endswith("/events")
            else "other"
        )
        # a W3C traceparent header continues the sender's trace (else a new one); the runs the
        # request creates store this span's context, as over gRPC (nothing while tracing is off)
        with tracing.span(f"{request.method} /v1/{route}", parent=request.headers.get("traceparent")):
            response = await self._answer(request, handler)
        metrics.HTTP_REQUESTS.labels(route, str(response.status)).inc()
        return response

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure as a problem document: service errors with their status, aiohttp's own
        (404, 405, 413) likewise, store failures 503, anything else 503 and a log line."""
        try:
            return await handler(request)
        except errors.ServiceError as exc:
            return from_service_error(exc)
        except web.HTTPRequestEntityTooLarge:
            limit = self.settings.max_payload_bytes
            return problem(413, f"the body is over {limit} bytes (AWOOOP_MAX_PAYLOAD_BYTES)", reason="FIELD_INVALID")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return problem(exc.status, exc.reason)
            raise
        except Exception as exc:
            mapped = store_error(exc)
            if mapped is not None:
                return from_service_error(mapped)
            log.exception("http request failed", extra={"path": request.path})
            return problem(503, "the request could not be handled; retry later", reason=errors.INTERNAL)

    # ---------------------------------------------------------------- webhooks

    async def webhook(self, request: web.Request) -> web.Response:
        project_id = request.match_info["project_id"]
        channel = request.match_info["channel"]
        name = request.match_info["endpoint"]
        if channel not in endpoints.WEBHOOK_CHANNELS or not PROJECT_RE.match(project_id) or not PROJECT_RE.match(name):
            raise errors.not_found("endpoint", f"{project_id}/{channel}/{name}")
        found = await self.directory.get(project_id, channel, name)
        if found is None:
            raise errors.not_found("endpoint", f"{project_id}/{channel}/{name}")
        body = await request.read()
        headers = request.headers
        if not signatures.verify(channel, headers, body, found.valid_now()):
            # the cache may predate a rotation: ask the store once before refusing
            found = await self.directory.get(project_id, channel, name, fresh=True)
            if found is None:
                raise errors.not_found("endpoint", f"{project_id}/{channel}/{name}")
            if not signatures.verify(channel, headers, body, found.valid_now()):
                metrics.SIGNATURE_FAILURES.labels(project_id, channel, name).inc()
                raise errors.unauthenticated(
                    f"the delivery's {_PROOF[channel]} does not match the secret of endpoint {name}"
                )
        payload = parse_body(body, "body")
        s = self.settings
        v = Violations()
        payload_json = parsing.to_json(v, "body", payload, s.max_payload_bytes)
        v.raise_if_any()
        events = parsing.delivery_events(
            v,
            prefix="",
            project_id=project_id,
            channel=channel,
            payload=payload,
            payload_json=payload_json,
            headers=headers,
            provider_event_id="",
            input_json=None,
            max_attempts=0,  # the project's retry policy decides
            max_payload_bytes=s.max_payload_bytes,
            endpoint=name,
        )
        if len(events) > s.max_batch:
            v.add("body.events", f"at most {s.max_batch} events per delivery (got {len(events)})")
        v.items = [(_http_field(f), d) for f, d in v.items]
        v.raise_if_any()
        principal = endpoint_principal(channel, name)
        outcomes = await self.events.ingest(events, principal_id=principal.principal_id, actor=principal.actor)
        return outcomes_json(outcomes)

    # ---------------------------------------------------------------- the API channel

    async def api_events(self, request: web.Request) -> web.Response:
        project_id = request.match_info["project_id"]
        principal = await self.authenticator.authenticate(request.headers.get("Authorization"))
        v = Violations()
        v.project_id("project_id", project_id)
        v.raise_if_any()
        require_role(principal, project_id, ROLE)
        key = request.headers.get(IDEMPOTENCY_KEY, "")
        if not key:
            v.add(f"headers.{IDEMPOTENCY_KEY}", "required: the key that makes a retry of this request safe")
        else:
            v.text(f"headers.{IDEMPOTENCY_KEY}", key, max_len=MAX_IDEMPOTENCY_KEY)
        v.raise_if_any()
        s = self.settings
        payload = parse_body(await request.read(), "body")
        input_json = parsing.to_json(v, "body", payload, s.max_payload_bytes)
        options = run_options_from_query(v, request.query)
        v.raise_if_any()
        # max_attempts 0: the run's retry policy decides, as for IngestEvent without the field
        event = parsing.NewEvent(project_id, "api", key, input_json, 0, options)
        outcomes = await self.events.ingest(
            [event], principal_id=principal.principal_id, actor=principal.actor, principal=principal
        )
        return outcomes_json(outcomes)


_PROOF = {
    "telegram": signatures.TELEGRAM_HEADER,
    "line": signatures.LINE_HEADER,
    "gitea": f"{signatures.GITEA_HEADER} (or {signatures.HUB_HEADER})",
    "alertmanager": "Authorization",
}


def _http_field(field: str) -> str:
    """The shared parser names the body `payload` (its gRPC field); over HTTP it is the body."""
    return "body" + field[len("payload") :] if field.startswith("payload") else field


def endpoint_principal(channel: str, name: str) -> Principal:
    """Who creates a webhook's runs: the endpoint (created_by "<channel>/<name>", audit actor
    "endpoint:<channel>/<name>"); the project is the run's own."""
    return Principal(f"{channel}/{name}", "endpoint")
