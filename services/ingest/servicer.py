"""gRPC transport of the ingest service: parse and validate, check the caller's role, call the
logic (events.EventIngestor, create_run.RunCreator), build the response.

Roles: every RPC needs the `ingest` role (admin implies it) in the project of each event; a
caller without it gets PERMISSION_DENIED / FORBIDDEN naming the project (ingest callers name
the project themselves, so nothing is revealed by saying it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import grpc

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common import errors
from services.common.access import require_role
from services.common.auth import current_principal
from services.common.runtime import AppContext
from services.common.validate import Violations
from services.ingest import endpoints, parsing
from services.ingest.channels import IDEMPOTENCY_KEY_HEADER
from services.ingest.create_run import ROLE, RunCreator
from services.ingest.endpoint_rpcs import EndpointAdmin
from services.ingest.events import DUPLICATE_CODE, EventIngestor, Outcome
from services.ingest.wakeup import Notifier

# BadRequest details travel in a trailer; keep them well under gRPC's 8 KiB metadata limit.
MAX_VIOLATIONS = 10


class IngestServicer(ingest_pb2_grpc.IngestServiceServicer):
    def __init__(self, ctx: AppContext, notifier: Notifier) -> None:
        s = ctx.settings
        self.max_payload_bytes = s.max_payload_bytes
        self.default_max_attempts = 0  # unset: the store takes the run's retry policy's
        self.max_batch = s.max_batch
        self.events = EventIngestor(ctx.pool, ctx.cache, s, notifier)
        self.runs = RunCreator(ctx.pool, s, notifier)
        self.directory = endpoints.Directory(ctx.pool, s.endpoint_cache_seconds)
        self.endpoints = EndpointAdmin(ctx.pool, s, self.directory)

    async def IngestEvent(
        self, request: ingest_pb2.IngestEventRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ingest_pb2.IngestEventResponse:
        v = Violations()
        key = ""
        if request.channel_type == common_pb2.CHANNEL_TYPE_API and not request.provider_event_id:
            key = _metadata(context, IDEMPOTENCY_KEY_HEADER)
        events = parsing.parse_event(
            request,
            v,
            prefix="",
            max_payload_bytes=self.max_payload_bytes,
            default_max_attempts=self.default_max_attempts,
            metadata_key=key,
        )
        self._check_expanded(v, "payload.events", len(events))
        _raise_if_invalid(v)
        principal = current_principal()
        require_role(principal, request.project_id, ROLE)
        outcomes = await self.events.ingest(
            events, principal_id=principal.principal_id, actor=principal.actor, principal=principal
        )
        response = ingest_pb2.IngestEventResponse()
        _add_outcomes(response, outcomes)
        return response

    async def IngestEvents(
        self, request: ingest_pb2.IngestEventsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ingest_pb2.IngestEventsResponse:
        v = Violations()
        n = len(request.events)
        if n == 0:
            v.add("events", "at least one event")
        elif n > self.max_batch:
            v.add("events", f"at most {self.max_batch} events per call (got {n})")
        _raise_if_invalid(v)
        events: list[parsing.NewEvent] = []
        bounds: list[tuple[int, int]] = []
        for i, req in enumerate(request.events):
            start = len(events)
            # the idempotency-key metadata names one request, so it is not used for batches
            events += parsing.parse_event(
                req,
                v,
                prefix=f"events[{i}].",
                max_payload_bytes=self.max_payload_bytes,
                default_max_attempts=self.default_max_attempts,
            )
            bounds.append((start, len(events)))
        self._check_expanded(v, "events", len(events))
        _raise_if_invalid(v)
        principal = current_principal()
        allowed: set[str] = set()
        for i, req in enumerate(request.events):
            if req.project_id in allowed:
                continue
            if principal.has(req.project_id, ROLE):
                allowed.add(req.project_id)
            else:
                raise errors.forbidden(
                    f"principal {principal.principal_id} has no {ROLE} role in project {req.project_id} "
                    f"(events[{i}]); nothing was ingested",
                    project_id=req.project_id,
                    role=ROLE,
                    event_index=str(i),
                )
        answers = await self.events.ingest_each(
            events, principal_id=principal.principal_id, actor=principal.actor, principal=principal
        )
        response = ingest_pb2.IngestEventsResponse()
        for a, b in bounds:
            result = response.results.add()
            outcomes = [x for x in answers[a:b] if isinstance(x, Outcome)]
            if len(outcomes) == b - a:
                _add_outcomes(result, outcomes)
            else:  # an API delivery is one event: its refusal answers the delivery
                refusal = next(x for x in answers[a:b] if isinstance(x, errors.ServiceError))
                result.error.CopyFrom(refusal.to_rpc_status())
        return response

    def _check_expanded(self, v: Violations, field: str, count: int) -> None:
        # a LINE delivery expands to one run per event: bound the total like a batch
        if count > self.max_batch:
            v.add(field, f"at most {self.max_batch} events per call, LINE events included (got {count})")

    async def CreateRun(
        self, request: ingest_pb2.CreateRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ingest_pb2.CreateRunResponse:
        v = Violations()
        run = parsing.parse_create_run(
            request,
            v,
            max_payload_bytes=self.max_payload_bytes,
            default_max_attempts=self.default_max_attempts,
            metadata_key=_metadata(context, IDEMPOTENCY_KEY_HEADER),
        )
        _raise_if_invalid(v)
        principal = current_principal()
        require_role(principal, request.project_id, ROLE)
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        return await self.runs.create(run, principal, deadline=deadline)

    async def CreateEndpoint(
        self, request: ingest_pb2.CreateEndpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ingest_pb2.CreateEndpointResponse:
        return await self.endpoints.create(request)

    async def ListEndpoints(
        self, request: ingest_pb2.ListEndpointsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ingest_pb2.ListEndpointsResponse:
        return await self.endpoints.list(request)

    async def RotateEndpointSecret(
        self, request: ingest_pb2.RotateEndpointSecretRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ingest_pb2.RotateEndpointSecretResponse:
        return await self.endpoints.rotate(request)

    async def RemoveEndpoint(
        self, request: ingest_pb2.RemoveEndpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ingest_pb2.RemoveEndpointResponse:
        return await self.endpoints.remove(request)


def _add_outcomes(response: ingest_pb2.IngestEventResponse, outcomes: Sequence[Outcome]) -> None:
    add = response.outcomes.add  # built in place: no intermediate messages to copy
    for o in outcomes:
        if o.duplicate:
            add(run_id=o.run_id, provider_event_id=o.provider_event_id, duplicate=True, code=DUPLICATE_CODE)
        else:
            add(run_id=o.run_id, provider_event_id=o.provider_event_id)


def _metadata(context: grpc.aio.ServicerContext[Any, Any], name: str) -> str:
    for item in context.invocation_metadata() or ():
        if item[0] == name:
            value = item[1]
            return value if isinstance(value, str) else ""
    return ""


def _raise_if_invalid(v: Violations) -> None:
    if len(v.items) > MAX_VIOLATIONS:
        more = len(v.items) - MAX_VIOLATIONS
        v.items = [*v.items[:MAX_VIOLATIONS], ("events", f"{more} more invalid fields not listed")]
    v.raise_if_any()
