"""Generated from endpoints.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "endpoints.sql")
CREATE_ENDPOINT = Q["CreateEndpoint"]
LIST_ENDPOINTS = Q["ListEndpoints"]
ROTATE_ENDPOINT = Q["RotateEndpoint"]
REMOVE_ENDPOINT = Q["RemoveEndpoint"]
ENDPOINT_SECRETS = Q["EndpointSecrets"]


class CreateEndpointRow(Protocol):
    """A row of CreateEndpoint."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["name"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["rotated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["previous_expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ListEndpointsRow(Protocol):
    """A row of ListEndpoints."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["name"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["rotated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["previous_expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class RotateEndpointRow(Protocol):
    """A row of RotateEndpoint."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["name"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["rotated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["previous_expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class EndpointSecretsRow(Protocol):
    """A row of EndpointSecrets."""

    @overload
    def __getitem__(self, key: Literal["secret"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["previous_secret"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["previous_left"], /) -> float | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def create_endpoint(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    channel: str | None,
    name: str | None,
    secret: str | None,
    created_by: str | None,
    query_timeout: float | None = None,
) -> CreateEndpointRow | None:
    """CreateEndpoint (endpoints.sql).

    A new webhook endpoint; nothing (no row) when one of that name exists. Answers the columns
    an endpoint is shown with (never a secret): previous_expires_at only while the previous
    secret is still valid.
    """
    return cast(
        "CreateEndpointRow | None",
        await db.fetchrow(CREATE_ENDPOINT.sql, project_id, channel, name, secret, created_by, timeout=query_timeout),
    )


async def list_endpoints(
    db: sql.Queryable, /, *, project_id: str | None, query_timeout: float | None = None
) -> list[ListEndpointsRow]:
    """ListEndpoints (endpoints.sql).

    A project's endpoints, as CreateEndpoint answers them.
    """
    return cast("list[ListEndpointsRow]", await db.fetch(LIST_ENDPOINTS.sql, project_id, timeout=query_timeout))


async def rotate_endpoint(
    db: sql.Queryable,
    /,
    *,
    grace: float | None,
    secret: str | None,
    project_id: str | None,
    channel: str | None,
    name: str | None,
    query_timeout: float | None = None,
) -> RotateEndpointRow | None:
    """RotateEndpoint (endpoints.sql).

    One statement: the current secret becomes the previous one until now() + :grace seconds.
    """
    return cast(
        "RotateEndpointRow | None",
        await db.fetchrow(ROTATE_ENDPOINT.sql, grace, secret, project_id, channel, name, timeout=query_timeout),
    )


async def remove_endpoint(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    channel: str | None,
    name: str | None,
    query_timeout: float | None = None,
) -> str:
    """RemoveEndpoint (endpoints.sql)."""
    return await db.execute(REMOVE_ENDPOINT.sql, project_id, channel, name, timeout=query_timeout)


async def endpoint_secrets(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    channel: str | None,
    name: str | None,
    query_timeout: float | None = None,
) -> EndpointSecretsRow | None:
    """EndpointSecrets (endpoints.sql).

    What verification needs: the secrets valid now, and for how long the previous one still is.
    """
    return cast(
        "EndpointSecretsRow | None",
        await db.fetchrow(ENDPOINT_SECRETS.sql, project_id, channel, name, timeout=query_timeout),
    )
