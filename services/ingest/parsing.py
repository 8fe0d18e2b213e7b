"""Request validation: IngestEvent / IngestEvents / CreateRun messages -> plain values the
logic works on, with every bad field collected into one INVALID_ARGUMENT (BadRequest field
violations naming the full path, e.g. `events[3].payload.update_id`).

Payloads are turned into JSON text once here; that text is both the size that is checked and
what the store receives (cast to jsonb in SQL), so no request is encoded twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from services.common import jsonvalues, run_options
from services.common.limits import MAX_ATTEMPTS_LIMIT, MAX_IDEMPOTENCY_KEY, MAX_PROVIDER_EVENT_ID
from services.common.run_options import NO_OPTIONS, RunOptions
from services.common.validate import PROJECT_RE, Violations
from services.ingest import channels

MAX_HEADERS = 100
MAX_HEADER_NAME = 256
MAX_HEADER_VALUE = 8192

_CHANNEL_NAMES: dict[int, str] = {
    common_pb2.CHANNEL_TYPE_TELEGRAM: "telegram",
    common_pb2.CHANNEL_TYPE_ALERTMANAGER: "alertmanager",
    common_pb2.CHANNEL_TYPE_GITEA: "gitea",
    common_pb2.CHANNEL_TYPE_LINE: "line",
    common_pb2.CHANNEL_TYPE_API: "api",
}


@dataclass(slots=True)
class NewEvent:
    """One event ready for the store (a LINE delivery yields several)."""

    project_id: str
    channel: str
    provider_event_id: str
    input_json: str
    max_attempts: int  # 0: the run's retry policy decides
    options: RunOptions = NO_OPTIONS
    traceparent: str | None = None  # the span that received it (tracing on), stored with the run


@dataclass(slots=True)
class NewRun:
    """A validated CreateRun."""

    project_id: str
    key: str
    input: dict[str, Any]
    input_json: str
    max_attempts: int  # 0: the run's retry policy decides
    options: RunOptions = NO_OPTIONS


# ------------------------------------------------------------------ Struct <-> JSON


def to_json(v: Violations, field: str, data: Any, max_bytes: int) -> str:
    """Compact JSON of a value the server derived from caller input, under the JSON value rules."""
    try:
        return jsonvalues.check_plain(data, max_bytes)
    except jsonvalues.JsonValueError as exc:
        v.add(field, str(exc))
        return "{}"


def canonical_json(data: Any) -> bytes:
    """Canonical JSON (sorted keys, no whitespace, UTF-8): the input of request fingerprints."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


# ------------------------------------------------------------------ requests


def channel_name(v: Violations, field: str, value: int) -> str:
    name = _CHANNEL_NAMES.get(value)
    if name is None:
        v.enum(field, value, common_pb2.ChannelType)
        return ""
    return name


def max_attempts(v: Violations, field: str, value: int, default: int) -> int:
    return v.int_range(field, value, 1, MAX_ATTEMPTS_LIMIT, default=default)


def parse_event(
    req: ingest_pb2.IngestEventRequest,
    v: Violations,
    *,
    prefix: str,
    max_payload_bytes: int,
    default_max_attempts: int,
    metadata_key: str = "",
) -> list[NewEvent]:
    """The events of one delivery; problems go to v under `prefix` (e.g. "events[3].")."""
    start = len(v.items)
    project_id = v.project_id(prefix + "project_id", req.project_id)
    channel = channel_name(v, prefix + "channel_type", req.channel_type)
    pid = v.text(prefix + "provider_event_id", req.provider_event_id, max_len=MAX_PROVIDER_EVENT_ID)
    attempts = max_attempts(v, prefix + "max_attempts", req.max_attempts, default_max_attempts)
    if req.endpoint and not PROJECT_RE.match(req.endpoint):
        v.add(
            prefix + "endpoint",
            "an endpoint name: 1-64 letters, digits, '.', '_', '-', starting with a letter or digit",
        )
    options = run_options.parse(
        v,
        prefix,
        not_before=req.not_before if req.HasField("not_before") else None,
        priority=req.priority,
        policy=req.retry_policy if req.HasField("retry_policy") else None,
        concurrency_key=req.concurrency_key,
        concurrency_keys=req.concurrency_keys,
        versioning=req.versioning,
        required_labels=req.required_labels,
        preferred_labels=req.preferred_labels,
    )
    headers = req.headers
    _check_headers(v, prefix, headers)
    payload_json = v.json_text(prefix + "payload", req.payload, max_bytes=max_payload_bytes)
    input_json = None
    if req.HasField("input"):
        input_json = v.json_text(prefix + "input", req.input, max_bytes=max_payload_bytes)
    if not channel or len(v.items) > start:
        return []
    # the payload as data only when the channel derives the event id from it (a given id is used
    # as it is): JSON text straight from the Struct, read back only then
    payload = json.loads(payload_json) if not pid else {}
    return delivery_events(
        v,
        prefix=prefix,
        project_id=project_id,
        channel=channel,
        payload=payload,
        payload_json=payload_json,
        headers=headers,
        provider_event_id=pid,
        input_json=input_json,
        max_attempts=attempts,
        max_payload_bytes=max_payload_bytes,
        metadata_key=metadata_key,
        endpoint=req.endpoint,
        options=options,
    )


def _check_headers(v: Violations, prefix: str, headers: Mapping[str, str]) -> None:
    """A delivery's HTTP headers within their count and sizes (violations recorded in v)."""
    if len(headers) > MAX_HEADERS:
        v.add(prefix + "headers", f"at most {MAX_HEADERS} headers")
    for name, value in headers.items():
        if len(name) > MAX_HEADER_NAME:
            v.add(f"{prefix}headers", f"header names are at most {MAX_HEADER_NAME} characters")
        elif len(value) > MAX_HEADER_VALUE:
            v.add(f"{prefix}headers.{name}", f"at most {MAX_HEADER_VALUE} characters")


def delivery_events(
    v: Violations,
    *,
    prefix: str,
    project_id: str,
    channel: str,
    payload: dict[str, Any],
    payload_json: str,
    headers: Mapping[str, str],
    provider_event_id: str,
    input_json: str | None,
    max_attempts: int,
    max_payload_bytes: int,
    metadata_key: str = "",
    endpoint: str = "",
    options: RunOptions = NO_OPTIONS,
) -> list[NewEvent]:
    """The events of one validated delivery, whichever transport brought it (gRPC or HTTP)."""
    try:
        derived = channels.derive(
            channel,
            payload,
            headers,
            provider_event_id=provider_event_id,
            idempotency_key=metadata_key,
            endpoint=endpoint,
        )
    except channels.DerivationError as exc:
        for field, description in exc.violations:
            v.add(prefix + field, description)
        return []
    out = []
    for d in derived:
        if input_json is not None:
            text = input_json
        elif d.event is not None:
            text = to_json(v, prefix + "payload.events", d.event, max_payload_bytes)
        else:
            text = payload_json
        out.append(NewEvent(project_id, channel, d.provider_event_id, text, max_attempts, options))
    return out


def parse_create_run(
    req: ingest_pb2.CreateRunRequest,
    v: Violations,
    *,
    max_payload_bytes: int,
    default_max_attempts: int,
    metadata_key: str = "",
) -> NewRun:
    project_id = v.project_id("project_id", req.project_id)
    key = req.idempotency_key
    if key and metadata_key and key != metadata_key:
        v.add("idempotency_key", "differs from the idempotency-key metadata; send one or make them equal")
    key = key or metadata_key
    if not key:
        v.add("idempotency_key", "required (the field or `idempotency-key` metadata)")
    else:
        v.text("idempotency_key", key, max_len=MAX_IDEMPOTENCY_KEY)
    attempts = max_attempts(v, "max_attempts", req.max_attempts, default_max_attempts)
    options = run_options.parse(
        v,
        "",
        not_before=req.not_before if req.HasField("not_before") else None,
        priority=req.priority,
        policy=req.retry_policy if req.HasField("retry_policy") else None,
        concurrency_key=req.concurrency_key,
        concurrency_keys=req.concurrency_keys,
        versioning=req.versioning,
        required_labels=req.required_labels,
        preferred_labels=req.preferred_labels,
    )
    data, text = v.json("input", req.input, max_bytes=max_payload_bytes)
    return NewRun(project_id, key, data, text, attempts, options)
