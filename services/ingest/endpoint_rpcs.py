"""The endpoint RPCs (CreateEndpoint, ListEndpoints, RotateEndpointSecret, RemoveEndpoint):
validation, the admin role, and the answers. A secret appears only in the answers to create
and rotate; the Endpoint message has no field for it."""

from __future__ import annotations

import math

import asyncpg
import grpc

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from services.common import errors
from services.common.access import require_role
from services.common.auth import current_principal
from services.common.runs import ts
from services.common.settings import Settings
from services.common.validate import PROJECT_RE, Violations
from services.ingest import endpoints
from services.ingest.parsing import channel_name

ROLE = "admin"


def endpoint_pb(row: endpoints.EndpointRow) -> ingest_pb2.Endpoint:
    return ingest_pb2.Endpoint(
        project_id=row.project_id,
        channel_type=common_pb2.ChannelType.Value(f"CHANNEL_TYPE_{row.channel.upper()}"),
        name=row.name,
        path=endpoints.path_of(row.project_id, row.channel, row.name),
        create_time=ts(row.created_at),
        rotate_time=ts(row.rotated_at),
        previous_secret_expire_time=ts(row.previous_expires_at),
    )


def _ident(v: Violations, project_id: str, channel_type: int, name: str) -> tuple[str, str, str]:
    v.project_id("project_id", project_id)
    channel = channel_name(v, "channel_type", channel_type)
    if channel and channel not in endpoints.WEBHOOK_CHANNELS:
        v.add("channel_type", "webhook endpoints exist for TELEGRAM, ALERTMANAGER, GITEA and LINE")
    if not name:
        v.add("name", "required")
    elif not PROJECT_RE.match(name):
        v.add("name", "1-64 chars of letters, digits, '.', '_', '-', starting with a letter or digit")
    return project_id, channel, name


def _secret(v: Violations, channel: str, value: str) -> str:
    if value:
        v.token("secret", value, max_len=endpoints.MAX_SECRET)
        return value
    if channel == "line":  # LINE signs with the channel secret it issued; a generated one never matches
        v.add("secret", "required for LINE: the channel secret from the LINE Developers console")
    return endpoints.new_secret()


class EndpointAdmin:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, directory: endpoints.Directory) -> None:
        self.pool = pool
        self.settings = settings
        self.directory = directory

    async def create(self, request: ingest_pb2.CreateEndpointRequest) -> ingest_pb2.CreateEndpointResponse:
        v = Violations()
        project_id, channel, name = _ident(v, request.project_id, request.channel_type, request.name)
        secret = _secret(v, channel, request.secret)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, ROLE)
        row = await endpoints.create(self.pool, project_id, channel, name, secret, principal.principal_id)
        if row is None:
            raise errors.ServiceError(
                grpc.StatusCode.ALREADY_EXISTS,
                errors.FIELD_INVALID,
                f"endpoint {channel}/{name} already exists in project {project_id}; rotate its secret or remove it",
                metadata={"project_id": project_id, "channel": channel, "name": name},
                violations=[("name", "already exists")],
            )
        self.directory.forget(project_id, channel, name)  # a cached "unknown" must not linger
        return ingest_pb2.CreateEndpointResponse(endpoint=endpoint_pb(row), secret=secret)

    async def list(self, request: ingest_pb2.ListEndpointsRequest) -> ingest_pb2.ListEndpointsResponse:
        v = Violations()
        v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_role(current_principal(), request.project_id, ROLE)
        rows = await endpoints.list_all(self.pool, request.project_id)
        return ingest_pb2.ListEndpointsResponse(endpoints=[endpoint_pb(r) for r in rows])

    async def rotate(self, request: ingest_pb2.RotateEndpointSecretRequest) -> ingest_pb2.RotateEndpointSecretResponse:
        v = Violations()
        project_id, channel, name = _ident(v, request.project_id, request.channel_type, request.name)
        secret = _secret(v, channel, request.secret)
        grace = request.grace_seconds or self.settings.endpoint_rotation_grace
        if not math.isfinite(grace) or grace < 0 or grace > endpoints.MAX_GRACE_SECONDS:
            v.add("grace_seconds", f"between 0 and {endpoints.MAX_GRACE_SECONDS:.0f} seconds")
        v.raise_if_any()
        require_role(current_principal(), project_id, ROLE)
        row = await endpoints.rotate(self.pool, project_id, channel, name, secret, grace)
        if row is None:
            raise errors.not_found("endpoint", f"{project_id}/{channel}/{name}")
        self.directory.forget(project_id, channel, name)
        return ingest_pb2.RotateEndpointSecretResponse(endpoint=endpoint_pb(row), secret=secret)

    async def remove(self, request: ingest_pb2.RemoveEndpointRequest) -> ingest_pb2.RemoveEndpointResponse:
        v = Violations()
        project_id, channel, name = _ident(v, request.project_id, request.channel_type, request.name)
        v.raise_if_any()
        require_role(current_principal(), project_id, ROLE)
        if not await endpoints.remove(self.pool, project_id, channel, name):
            raise errors.not_found("endpoint", f"{project_id}/{channel}/{name}")
        self.directory.forget(project_id, channel, name)
        return ingest_pb2.RemoveEndpointResponse()
